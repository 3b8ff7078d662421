/*************************************************************************
 * nccl-tests (sample): shared declarations. Each <collective>.c defines ncclTestColl.
 ************************************************************************/

#ifndef NCCL_TESTS_COMMON_H_
#define NCCL_TESTS_COMMON_H_

#include <nccl.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef MPI_SUPPORT
#include <mpi.h>
#endif

#define NCCL_TESTS_VERSION "@@NCCL_TESTS_VERSION@@"

#define NCCLCHECK(cmd) do {                                         \
  ncclResult_t res_ = cmd;                                          \
  if (res_ != ncclSuccess) {                                        \
    fprintf(stderr, "Test NCCL failure %s:%d '%s'\n",               \
            __FILE__, __LINE__, ncclGetErrorString(res_));          \
    exit(EXIT_FAILURE);                                             \
  }                                                                 \
} while (0)

struct testColl {
  const char* name;
  int usesOp;    /* the redop column means something */
  int usesRoot;  /* the root column means something */
  /* Elements each rank sends and receives for a row of `bytes` bytes. */
  void (*getCounts)(size_t bytes, int typesize, int nranks, size_t* sendcount,
                    size_t* recvcount, size_t* paramcount);
  /* Bus bandwidth factor, as documented in nccl-tests' PERFORMANCE.md. */
  double (*busFactor)(int nranks);
  ncclResult_t (*run)(void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                      ncclRedOp_t op, int root, int rank, int nranks, ncclComm_t comm);
  /* Expected recv element i, given the input pattern every rank uses. */
  double (*expected)(size_t i, size_t count, ncclRedOp_t op, int root, int rank, int nranks);
};

extern struct testColl ncclTestColl;

/* Input element i, identical on every rank. */
static inline double inputValue(size_t i) { return (double)(i % 7) + 1.0; }

/* op folded over nranks contributions of the same value. */
static inline double foldValue(double x, ncclRedOp_t op, int nranks) {
  double acc = x;
  for (int r = 1; r < nranks; r++) {
    if (op == ncclSum || op == ncclAvg) acc += x;
    else if (op == ncclProd) acc *= x;
  }
  return op == ncclAvg ? acc / nranks : acc;
}

#endif
