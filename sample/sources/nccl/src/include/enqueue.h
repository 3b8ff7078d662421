/*************************************************************************
 * Collective descriptors, argument checks and execution.
 ************************************************************************/

#ifndef NCCL_ENQUEUE_H_
#define NCCL_ENQUEUE_H_

#include "comm.h"

typedef enum { ncclFuncBroadcast, ncclFuncReduce, ncclFuncAllGather, ncclFuncReduceScatter,
               ncclFuncAllReduce, ncclFuncSend, ncclFuncRecv, ncclNumFuncs } ncclFunc_t;

struct ncclInfo {
  ncclFunc_t coll;
  const char* opName;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  ncclDataType_t datatype;
  ncclRedOp_t op;
  int root;  // root for rooted collectives, peer for send/recv
  ncclComm_t comm;
  cudaStream_t stream;
};

ncclResult_t ArgsCheck(struct ncclInfo* info);
ncclResult_t PtrCheck(const void* ptr, const char* opname, const char* ptrname);

ncclResult_t ncclEnqueueCheck(struct ncclInfo* info);
ncclResult_t ncclExecute(const struct ncclInfo& info);

// Grouping: operations issued between ncclGroupStart and ncclGroupEnd run at ncclGroupEnd.
bool ncclGroupActive();
void ncclGroupQueue(const struct ncclInfo& info);

// One entry point per collective, each in its own translation unit like NCCL's kernels.
ncclResult_t ncclRunBroadcast(const struct ncclInfo& info);
ncclResult_t ncclRunReduce(const struct ncclInfo& info);
ncclResult_t ncclRunAllGather(const struct ncclInfo& info);
ncclResult_t ncclRunReduceScatter(const struct ncclInfo& info);
ncclResult_t ncclRunAllReduce(const struct ncclInfo& info);
ncclResult_t ncclRunSend(const struct ncclInfo& info);
ncclResult_t ncclRunRecv(const struct ncclInfo& info);

#endif
