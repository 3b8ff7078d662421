/* Reduce: the root gets the reduction of all inputs. */
#include "common.h"

static void getCounts(size_t bytes, int typesize, int nranks, size_t* sendcount, size_t* recvcount,
                      size_t* paramcount) {
  (void)nranks;
  *sendcount = *recvcount = *paramcount = bytes / (size_t)typesize;
}

static double busFactor(int nranks) { (void)nranks; return 1.0; }

static ncclResult_t run(void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, int rank, int nranks, ncclComm_t comm) {
  (void)rank; (void)nranks;
  return ncclReduce(sendbuff, recvbuff, count, type, op, root, comm, NULL);
}

static double expected(size_t i, size_t count, ncclRedOp_t op, int root, int rank, int nranks) {
  (void)count; (void)root; (void)rank;
  return foldValue(inputValue(i), op, nranks);
}

struct testColl ncclTestColl = {"Reduce", 1, 1, getCounts, busFactor, run, expected};
