/*************************************************************************
 * NCCL_DEBUG logging: levels VERSION, WARN, INFO, ABORT, TRACE; NCCL_DEBUG_SUBSYS
 * selects subsystems (INIT,COLL,P2P,SHM,NET,GRAPH,TUNING,ENV,ALLOC,ALL, "^" negates);
 * NCCL_DEBUG_FILE names a file, with %h for the host name and %p for the pid.
 ************************************************************************/

#include "core.h"

#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

int ncclDebugLevel = -1;
FILE* ncclDebugFile = stdout;
static unsigned long ncclDebugMask = NCCL_INIT;
static int ncclDebugRank = 0;
static std::mutex ncclDebugLock;
static std::once_flag ncclDebugOnce;

static int parseLevel(const char* env) {
  if (env == nullptr) return NCCL_LOG_NONE;
  if (strcasecmp(env, "VERSION") == 0) return NCCL_LOG_VERSION;
  if (strcasecmp(env, "WARN") == 0) return NCCL_LOG_WARN;
  if (strcasecmp(env, "INFO") == 0) return NCCL_LOG_INFO;
  if (strcasecmp(env, "ABORT") == 0) return NCCL_LOG_ABORT;
  if (strcasecmp(env, "TRACE") == 0) return NCCL_LOG_TRACE;
  return NCCL_LOG_NONE;
}

static unsigned long subsysMask(const char* name) {
  static const struct { const char* name; unsigned long mask; } table[] = {
    {"INIT", NCCL_INIT}, {"COLL", NCCL_COLL}, {"P2P", NCCL_P2P}, {"SHM", NCCL_SHM},
    {"NET", NCCL_NET}, {"GRAPH", NCCL_GRAPH}, {"TUNING", NCCL_TUNING}, {"ENV", NCCL_ENV},
    {"ALLOC", NCCL_ALLOC}, {"ALL", (unsigned long)NCCL_ALL},
  };
  for (const auto& entry : table)
    if (strcasecmp(name, entry.name) == 0) return entry.mask;
  return 0;
}

static unsigned long parseSubsys(const char* env) {
  if (env == nullptr) return NCCL_INIT;
  std::string list(env);
  const bool invert = !list.empty() && list[0] == '^';
  if (invert) list.erase(0, 1);
  unsigned long mask = invert ? (unsigned long)NCCL_ALL : 0;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const unsigned long bit = subsysMask(list.substr(start, comma - start).c_str());
    mask = invert ? (mask & ~bit) : (mask | bit);
    start = comma + 1;
  }
  return mask;
}

static FILE* openDebugFile(const char* pattern) {
  char host[1024];
  getHostName(host, sizeof(host), '.');
  std::string path;
  for (const char* p = pattern; *p; p++) {
    if (p[0] == '%' && p[1] == 'h') { path += host; p++; }
    else if (p[0] == '%' && p[1] == 'p') { path += std::to_string(getpid()); p++; }
    else path += *p;
  }
  FILE* file = fopen(path.c_str(), "w");
  if (file == nullptr) return stdout;
  setbuf(file, nullptr);  // lines must reach the file even if the process aborts
  return file;
}

void ncclDebugInit() {
  std::call_once(ncclDebugOnce, []() {
    ncclDebugMask = parseSubsys(getenv("NCCL_DEBUG_SUBSYS"));
    const char* file = getenv("NCCL_DEBUG_FILE");
    const int level = parseLevel(getenv("NCCL_DEBUG"));
    if (level > NCCL_LOG_VERSION && file != nullptr) ncclDebugFile = openDebugFile(file);
    ncclDebugLevel = level;
  });
}

void ncclSetDebugRank(int rank) { ncclDebugRank = rank; }

void ncclDebugLog(ncclDebugLogLevel level, unsigned long flags, const char* filefunc, int line,
                  const char* fmt, ...) {
  ncclDebugInit();
  if (ncclDebugLevel < level || ((flags & ncclDebugMask) == 0 && level >= NCCL_LOG_INFO)) return;
  char host[64];
  getHostName(host, sizeof(host), '.');
  const int pid = getpid();
  const int tid = (int)syscall(SYS_gettid);
  char buffer[1024];
  size_t len = 0;
  if (level == NCCL_LOG_WARN) {
    len = snprintf(buffer, sizeof(buffer), "\n%s:%d:%d [%d] %s:%d NCCL WARN ",
                   host, pid, tid, ncclDebugRank, filefunc, line);
  } else if (level == NCCL_LOG_TRACE) {
    len = snprintf(buffer, sizeof(buffer), "%s:%d:%d [%d] %s:%d NCCL TRACE ",
                   host, pid, tid, ncclDebugRank, filefunc, line);
  } else {
    len = snprintf(buffer, sizeof(buffer), "%s:%d:%d [%d] NCCL INFO ", host, pid, tid, ncclDebugRank);
  }
  if (len >= sizeof(buffer)) len = sizeof(buffer) - 1;
  va_list vargs;
  va_start(vargs, fmt);
  const int n = vsnprintf(buffer + len, sizeof(buffer) - len, fmt, vargs);
  va_end(vargs);
  if (n > 0) len += (size_t)n;
  if (len >= sizeof(buffer)) len = sizeof(buffer) - 1;
  std::lock_guard<std::mutex> lock(ncclDebugLock);
  fprintf(ncclDebugFile, "%.*s\n", (int)len, buffer);
  fflush(ncclDebugFile);
  if (level == NCCL_LOG_ABORT) abort();
}
