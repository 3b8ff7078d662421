/* AllGather: block r of every output is rank r's input. */
#include "common.h"

static void getCounts(size_t bytes, int typesize, int nranks, size_t* sendcount, size_t* recvcount,
                      size_t* paramcount) {
  const size_t base = (bytes / (size_t)typesize) / (size_t)nranks;
  *sendcount = *paramcount = base;
  *recvcount = base * (size_t)nranks;
}

static double busFactor(int nranks) { return (double)(nranks - 1) / nranks; }

static ncclResult_t run(void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, int rank, int nranks, ncclComm_t comm) {
  (void)op; (void)root; (void)rank; (void)nranks;
  return ncclAllGather(sendbuff, recvbuff, count, type, comm, NULL);
}

static double expected(size_t i, size_t count, ncclRedOp_t op, int root, int rank, int nranks) {
  (void)op; (void)root; (void)rank; (void)nranks;
  return inputValue(count ? i % count : i);
}

struct testColl ncclTestColl = {"AllGather", 0, 0, getCounts, busFactor, run, expected};
