/* ReduceScatter: rank r gets block r of the reduction. */
#include "common.h"

static void getCounts(size_t bytes, int typesize, int nranks, size_t* sendcount, size_t* recvcount,
                      size_t* paramcount) {
  const size_t base = (bytes / (size_t)typesize) / (size_t)nranks;
  *sendcount = base * (size_t)nranks;
  *recvcount = *paramcount = base;
}

static double busFactor(int nranks) { return (double)(nranks - 1) / nranks; }

static ncclResult_t run(void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, int rank, int nranks, ncclComm_t comm) {
  (void)root; (void)rank; (void)nranks;
  return ncclReduceScatter(sendbuff, recvbuff, count, type, op, comm, NULL);
}

static double expected(size_t i, size_t count, ncclRedOp_t op, int root, int rank, int nranks) {
  (void)root;
  return foldValue(inputValue((size_t)rank * count + i), op, nranks);
}

struct testColl ncclTestColl = {"ReduceScatter", 1, 0, getCounts, busFactor, run, expected};
