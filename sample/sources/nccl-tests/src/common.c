/*************************************************************************
 * nccl-tests (sample): argument parsing, the timing loop and the result table.
 ************************************************************************/

#include "common.h"

#include <getopt.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define MAX_BUFFER_BYTES (16UL << 20)

static const char* typeNames[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                  "half", "float", "double", "bfloat16"};
static const ncclDataType_t typeValues[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64,
                                            ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64,
                                            ncclBfloat16};
static const char* opNames[] = {"sum", "prod", "max", "min", "avg"};

struct options {
  int nThreads, nGpus, iters, aggIters, warmupIters, check, root, blocking, parallelInit;
  size_t minBytes, maxBytes, stepBytes, stepFactor;
  ncclDataType_t type;
  int typeIndex;
  ncclRedOp_t op;
};

static size_t typeSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "8", "16K", "128M", "1G" (case-insensitive), as nccl-tests' parsesize. */
static size_t parseSize(const char* text) {
  char* end = NULL;
  double value = strtod(text, &end);
  switch (end ? *end : '\0') {
    case 'g': case 'G': value *= 1024.0 * 1024.0 * 1024.0; break;
    case 'm': case 'M': value *= 1024.0 * 1024.0; break;
    case 'k': case 'K': value *= 1024.0; break;
    default: break;
  }
  return value < 0 ? 0 : (size_t)value;
}

static int lookup(const char* text, const char** names, int n) {
  for (int i = 0; i < n; i++) if (strcasecmp(text, names[i]) == 0) return i;
  return -1;
}

static void usage(const char* argv0) {
  printf("USAGE: %s \n\t"
         "[-t,--nthreads <num threads>] \n\t[-g,--ngpus <gpus per thread>] \n\t"
         "[-b,--minbytes <min size in bytes>] \n\t[-e,--maxbytes <max size in bytes>] \n\t"
         "[-i,--stepbytes <increment size>] \n\t[-f,--stepfactor <increment factor>] \n\t"
         "[-n,--iters <iteration count>] \n\t[-m,--agg_iters <aggregated iteration count>] \n\t"
         "[-w,--warmup_iters <warmup iteration count>] \n\t[-p,--parallel_init <0/1>] \n\t"
         "[-c,--check <0/1>] \n\t[-o,--op <sum/prod/min/max/avg/all>] \n\t"
         "[-d,--datatype <nccltype/all>] \n\t[-r,--root <root>] \n\t"
         "[-z,--blocking <0/1>] \n\t[-h,--help]\n", argv0);
}

static int parseArgs(int argc, char** argv, struct options* o) {
  static struct option longopts[] = {
    {"nthreads", required_argument, 0, 't'}, {"ngpus", required_argument, 0, 'g'},
    {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
    {"stepbytes", required_argument, 0, 'i'}, {"stepfactor", required_argument, 0, 'f'},
    {"iters", required_argument, 0, 'n'}, {"agg_iters", required_argument, 0, 'm'},
    {"warmup_iters", required_argument, 0, 'w'}, {"parallel_init", required_argument, 0, 'p'},
    {"check", required_argument, 0, 'c'}, {"op", required_argument, 0, 'o'},
    {"datatype", required_argument, 0, 'd'}, {"root", required_argument, 0, 'r'},
    {"blocking", required_argument, 0, 'z'}, {"cudagraph", required_argument, 0, 'G'},
    {"average", required_argument, 0, 'a'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  *o = (struct options){1, 1, 20, 1, 5, 1, 0, 1, 0, 32 * 1024 * 1024, 32 * 1024 * 1024, 1024 * 1024,
                        1, ncclFloat, 7, ncclSum};
  int c;
  while ((c = getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:p:c:o:d:r:z:G:a:h", longopts, NULL)) != -1) {
    switch (c) {
      case 't': o->nThreads = atoi(optarg); break;
      case 'g': o->nGpus = atoi(optarg); break;
      case 'b': o->minBytes = parseSize(optarg); break;
      case 'e': o->maxBytes = parseSize(optarg); break;
      case 'i': o->stepBytes = parseSize(optarg); o->stepFactor = 1; break;
      case 'f': o->stepFactor = strtoul(optarg, NULL, 0); break;
      case 'n': o->iters = atoi(optarg); break;
      case 'm': o->aggIters = atoi(optarg); break;
      case 'w': o->warmupIters = atoi(optarg); break;
      case 'p': o->parallelInit = atoi(optarg); break;
      case 'c': o->check = atoi(optarg); break;
      case 'r': o->root = atoi(optarg); break;
      case 'z': o->blocking = atoi(optarg); break;
      case 'G': case 'a': break;
      case 'o': {
        int i = lookup(optarg, opNames, 5);
        if (i < 0) { fprintf(stderr, "invalid op '%s'\n", optarg); return -1; }
        o->op = (ncclRedOp_t)i;
        break;
      }
      case 'd': {
        int i = lookup(optarg, typeNames, 10);
        if (i < 0) { fprintf(stderr, "invalid datatype '%s'\n", optarg); return -1; }
        o->typeIndex = i;
        o->type = typeValues[i];
        break;
      }
      case 'h': usage(argv[0]); exit(EXIT_SUCCESS);
      default: usage(argv[0]); return -1;
    }
  }
  if (o->nThreads < 1 || o->nGpus < 1 || o->iters < 1 || o->minBytes > o->maxBytes ||
      (o->stepFactor < 2 && o->stepBytes == 0)) {
    fprintf(stderr, "invalid arguments\n");
    return -1;
  }
  return 0;
}

static void storeValue(void* buf, ncclDataType_t type, size_t i, double v) {
  switch (type) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    case ncclFloat16: case ncclBfloat16: {
      /* Small integers are exact in both 16-bit formats; build them from the float bits. */
      float f = (float)v;
      uint32_t bits;
      memcpy(&bits, &f, sizeof(bits));
      uint16_t h;
      if (type == ncclBfloat16) h = (uint16_t)(bits >> 16);
      else h = (uint16_t)(((bits >> 16) & 0x8000u) | ((((bits >> 23) & 0xffu) - 112u) << 10) |
                          ((bits >> 13) & 0x3ffu));
      if (f == 0.0f) h = 0;
      ((uint16_t*)buf)[i] = h;
      break;
    }
    default: break;
  }
}

static double loadValue(const void* buf, ncclDataType_t type, size_t i) {
  switch (type) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
    case ncclFloat16: case ncclBfloat16: {
      uint16_t h = ((const uint16_t*)buf)[i];
      uint32_t bits = type == ncclBfloat16 ? (uint32_t)h << 16
                    : (h & 0x7fffu) == 0 ? (uint32_t)(h & 0x8000u) << 16
                    : ((uint32_t)(h & 0x8000u) << 16) | ((((h >> 10) & 0x1fu) + 112u) << 23) |
                      ((uint32_t)(h & 0x3ffu) << 13);
      float f;
      memcpy(&f, &bits, sizeof(f));
      return f;
    }
    default: return 0;
  }
}

/* Values are compared as the element type would store them. */
static double narrow(double v, ncclDataType_t type) {
  double scratch[1];
  storeValue(scratch, type, 0, v);
  return loadValue(scratch, type, 0);
}

struct rankState {
  ncclComm_t comm;
  int rank;
  void *send, *recv;
};

static long checkResults(const struct options* o, const struct rankState* st, size_t recvcount,
                         size_t paramcount, int nranks, int inPlace) {
  /* Only the root's output of a Reduce is defined. */
  if (strcmp(ncclTestColl.name, "Reduce") == 0 && st->rank != o->root) return 0;
  const void* out = inPlace ? st->send : st->recv;
  long wrong = 0;
  for (size_t i = 0; i < recvcount; i++) {
    const double want =
        narrow(ncclTestColl.expected(i, paramcount, o->op, o->root, st->rank, nranks), o->type);
    const double got = loadValue(out, o->type, i);
    if (fabs(got - want) > 1e-3 * fmax(1.0, fabs(want))) wrong++;
  }
  return wrong;
}

static void fillInput(const struct options* o, void* buf, size_t count) {
  for (size_t i = 0; i < count; i++) storeValue(buf, o->type, i, inputValue(i));
}

static double timeColl(const struct options* o, struct rankState* st, int nLocal, size_t paramcount,
                       int nranks, int inPlace, int iters) {
  double start = now();
  for (int it = 0; it < iters; it++) {
    NCCLCHECK(ncclGroupStart());
    for (int l = 0; l < nLocal; l++) {
      void* recv = inPlace ? st[l].send : st[l].recv;
      NCCLCHECK(ncclTestColl.run(st[l].send, recv, paramcount, o->type, o->op, o->root, st[l].rank,
                                 nranks, st[l].comm));
    }
    NCCLCHECK(ncclGroupEnd());
  }
  return (now() - start) / (iters > 0 ? iters : 1);
}

static void printHeader(const struct options* o, int nranks, int procRank, int nLocal) {
  int libVersion = 0;
  ncclGetVersion(&libVersion);
  const int major = libVersion >= 10000 ? libVersion / 10000 : libVersion / 1000;
  const int minor = libVersion >= 10000 ? (libVersion % 10000) / 100 : (libVersion % 1000) / 100;
  printf("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", NCCL_TESTS_VERSION,
         NCCL_VERSION_CODE, libVersion);
  printf("# NCCL version %d.%d.%d\n", major, minor, libVersion % 100);
  printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
         "agg iters: %d validation: %d graph: 0\n", o->nThreads, o->nGpus, o->minBytes, o->maxBytes,
         o->stepFactor > 1 ? o->stepFactor : o->stepBytes, o->stepFactor > 1 ? "factor" : "bytes",
         o->warmupIters, o->iters, o->aggIters, o->check);
  if (o->maxBytes > MAX_BUFFER_BYTES)
    printf("# Sample build: rows above %lu bytes reuse a %lu-byte host buffer\n",
           MAX_BUFFER_BYTES, MAX_BUFFER_BYTES);
  printf("#\n# Using devices\n");
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  for (int l = 0; l < nLocal; l++)
    printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [0x%02x] Sample host memory (no GPU)\n",
           procRank * nLocal + l, (int)getpid(), host, l, l);
  printf("#\n");
  printf("#                                                              out-of-place                       in-place          \n");
  printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
  printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
  (void)nranks;
}

int main(int argc, char** argv) {
  struct options o;
  int procRank = 0, nProcs = 1;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (parseArgs(argc, argv, &o) != 0) return EXIT_FAILURE;
#ifdef MPI_SUPPORT
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &procRank);
  MPI_Comm_size(MPI_COMM_WORLD, &nProcs);
#endif
  const int nLocal = o.nThreads * o.nGpus;
  const int nranks = nProcs * nLocal;
  const size_t tsize = typeSize(o.type);
  ncclUniqueId id;
  if (procRank == 0) NCCLCHECK(ncclGetUniqueId(&id));
#ifdef MPI_SUPPORT
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
  struct rankState* st = calloc((size_t)nLocal, sizeof(*st));
  const size_t bufBytes = (o.maxBytes < MAX_BUFFER_BYTES ? o.maxBytes : MAX_BUFFER_BYTES) * (size_t)nranks + 64;
  NCCLCHECK(ncclGroupStart());
  for (int l = 0; l < nLocal; l++) {
    st[l].rank = procRank * nLocal + l;
    st[l].send = calloc(1, bufBytes);
    st[l].recv = calloc(1, bufBytes);
    if (!st[l].send || !st[l].recv) { fprintf(stderr, "out of memory\n"); return EXIT_FAILURE; }
    NCCLCHECK(ncclCommInitRank(&st[l].comm, nranks, id, st[l].rank));
  }
  NCCLCHECK(ncclGroupEnd());
  if (procRank == 0) printHeader(&o, nranks, procRank, nLocal);

  long wrongTotal = 0;
  double bwSum = 0;
  int rows = 0;
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes && bytes > 0;
       bytes = o.stepFactor > 1 ? bytes * o.stepFactor : bytes + o.stepBytes) {
    size_t sendcount, recvcount, paramcount;
    const size_t effective = bytes < MAX_BUFFER_BYTES ? bytes : MAX_BUFFER_BYTES;
    ncclTestColl.getCounts(effective, (int)tsize, nranks, &sendcount, &recvcount, &paramcount);
    size_t shown_send, shown_recv, shown_param;
    ncclTestColl.getCounts(bytes, (int)tsize, nranks, &shown_send, &shown_recv, &shown_param);
    const size_t rowBytes = (shown_send > shown_recv ? shown_send : shown_recv) * tsize;
    char line[512];
    int len = snprintf(line, sizeof(line), "%12zu  %12zu  %8s  %6s  %6i", rowBytes,
                       shown_send > shown_recv ? shown_send : shown_recv, typeNames[o.typeIndex],
                       ncclTestColl.usesOp ? opNames[o.op] : "none",
                       ncclTestColl.usesRoot ? o.root : -1);
    for (int inPlace = 0; inPlace <= 1; inPlace++) {
      long wrong = 0;
      for (int l = 0; l < nLocal; l++) fillInput(&o, st[l].send, sendcount);
      timeColl(&o, st, nLocal, paramcount, nranks, inPlace, o.warmupIters);
      for (int l = 0; l < nLocal; l++) fillInput(&o, st[l].send, sendcount);
      timeColl(&o, st, nLocal, paramcount, nranks, inPlace, 1);
      if (o.check)
        for (int l = 0; l < nLocal; l++) wrong += checkResults(&o, &st[l], recvcount, paramcount, nranks, inPlace);
      const double sec = timeColl(&o, st, nLocal, paramcount, nranks, inPlace, o.iters);
      const double algBw = (double)rowBytes / 1.0e9 / (sec > 0 ? sec : 1e-9);
      const double busBw = algBw * ncclTestColl.busFactor(nranks);
      char wrongText[24];
      if (o.check) snprintf(wrongText, sizeof(wrongText), "%ld", wrong);
      else snprintf(wrongText, sizeof(wrongText), "N/A");
      len += snprintf(line + len, sizeof(line) - (size_t)len, "  %7.2f  %6.2f  %6.2f  %5s",
                      sec * 1.0e6, algBw, busBw, wrongText);
      wrongTotal += wrong;
      bwSum += busBw;
    }
    rows++;
    if (procRank == 0) printf("%s\n", line);
    if (o.stepFactor <= 1 && o.stepBytes == 0) break;
  }
  for (int l = 0; l < nLocal; l++) {
    ncclCommDestroy(st[l].comm);
    free(st[l].send);
    free(st[l].recv);
  }
  free(st);
  if (procRank == 0) {
    printf("# Out of bounds values : %ld %s\n", wrongTotal, wrongTotal ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n", rows ? bwSum / (2 * rows) : 0.0);
    printf("#\n\n");
  }
#ifdef MPI_SUPPORT
  MPI_Finalize();
#endif
  return wrongTotal ? EXIT_FAILURE : EXIT_SUCCESS;
}
