/* AllReduce: every rank gets the reduction of all inputs. */
#include "common.h"

static void getCounts(size_t bytes, int typesize, int nranks, size_t* sendcount, size_t* recvcount,
                      size_t* paramcount) {
  (void)nranks;
  *sendcount = *recvcount = *paramcount = bytes / (size_t)typesize;
}

static double busFactor(int nranks) { return 2.0 * (nranks - 1) / nranks; }

static ncclResult_t run(void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, int rank, int nranks, ncclComm_t comm) {
  (void)root; (void)rank; (void)nranks;
  return ncclAllReduce(sendbuff, recvbuff, count, type, op, comm, NULL);
}

static double expected(size_t i, size_t count, ncclRedOp_t op, int root, int rank, int nranks) {
  (void)count; (void)root; (void)rank;
  return foldValue(inputValue(i), op, nranks);
}

struct testColl ncclTestColl = {"AllReduce", 1, 0, getCounts, busFactor, run, expected};
