/* SendRecv: each rank sends to the next rank and receives from the previous one. */
#include "common.h"

static void getCounts(size_t bytes, int typesize, int nranks, size_t* sendcount, size_t* recvcount,
                      size_t* paramcount) {
  (void)nranks;
  *sendcount = *recvcount = *paramcount = bytes / (size_t)typesize;
}

static double busFactor(int nranks) { (void)nranks; return 1.0; }

static ncclResult_t run(void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, int rank, int nranks, ncclComm_t comm) {
  (void)op; (void)root;
  ncclResult_t ret = ncclGroupStart();
  if (ret == ncclSuccess) ret = ncclSend(sendbuff, count, type, (rank + 1) % nranks, comm, NULL);
  if (ret == ncclSuccess) ret = ncclRecv(recvbuff, count, type, (rank - 1 + nranks) % nranks, comm, NULL);
  ncclResult_t end = ncclGroupEnd();
  return ret != ncclSuccess ? ret : end;
}

static double expected(size_t i, size_t count, ncclRedOp_t op, int root, int rank, int nranks) {
  (void)count; (void)op; (void)root; (void)rank; (void)nranks;
  return inputValue(i);
}

struct testColl ncclTestColl = {"SendRecv", 0, 0, getCounts, busFactor, run, expected};
