/*************************************************************************
 * Small helpers: host names and hashes, type sizes, integer parameters.
 ************************************************************************/

#include "core.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

size_t ncclTypeSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* ncclDatatypeToString(ncclDataType_t type) {
  static const char* names[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64",
                                "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64",
                                "ncclBfloat16"};
  return (type >= 0 && type < ncclNumTypes) ? names[type] : "Unknown";
}

const char* ncclOpToString(ncclRedOp_t op) {
  static const char* names[] = {"Sum", "Prod", "Max", "Min", "Avg"};
  return (op >= 0 && op < ncclNumOps) ? names[op] : "Unknown";
}

// djb2 over the first n bytes, as NCCL uses to compare host names and ids.
uint64_t getHash(const char* string, int n) {
  uint64_t result = 5381;
  for (int c = 0; c < n; c++) result = ((result << 5) + result) ^ (unsigned char)string[c];
  return result;
}

ncclResult_t getHostName(char* hostname, int maxlen, const char delim) {
  if (gethostname(hostname, maxlen) != 0) {
    strncpy(hostname, "unknown", maxlen);
    return ncclSystemError;
  }
  hostname[maxlen - 1] = '\0';
  for (int i = 0; i < maxlen && hostname[i] != '\0'; i++) {
    if (hostname[i] == delim) {
      hostname[i] = '\0';
      break;
    }
  }
  return ncclSuccess;
}

uint64_t getHostHash() {
  char host[1024];
  const char* env = getenv("NCCL_HOSTID");
  if (env != nullptr) {
    strncpy(host, env, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
  } else {
    getHostName(host, sizeof(host), '\0');
  }
  return getHash(host, (int)strlen(host));
}

int64_t ncclParamInt(const char* name, int64_t deflt) {
  const char* str = getenv(name);
  if (str == nullptr || *str == '\0') return deflt;
  errno = 0;
  char* end = nullptr;
  const long long value = strtoll(str, &end, 0);
  if (errno != 0 || end == str || *end != '\0') {
    INFO(NCCL_ENV, "Invalid value %s for %s, using default %lld", str, name, (long long)deflt);
    return deflt;
  }
  INFO(NCCL_ENV, "%s set by environment to %lld.", name, value);
  return value;
}
