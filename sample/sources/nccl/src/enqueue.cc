/*************************************************************************
 * Checks a collective's arguments, then runs it now or queues it in the group.
 ************************************************************************/

#include "enqueue.h"

ncclResult_t ncclExecute(const struct ncclInfo& info) {
  TRACE(NCCL_COLL, "%s: opCount sendbuff %p recvbuff %p count %zi datatype %d op %d root %d comm %p",
        info.opName, info.sendbuff, info.recvbuff, info.count, info.datatype, info.op, info.root,
        (void*)info.comm);
  switch (info.coll) {
    case ncclFuncBroadcast: return ncclRunBroadcast(info);
    case ncclFuncReduce: return ncclRunReduce(info);
    case ncclFuncAllGather: return ncclRunAllGather(info);
    case ncclFuncReduceScatter: return ncclRunReduceScatter(info);
    case ncclFuncAllReduce: return ncclRunAllReduce(info);
    case ncclFuncSend: return ncclRunSend(info);
    case ncclFuncRecv: return ncclRunRecv(info);
    default:
      WARN("%s : unknown collective %d", info.opName, info.coll);
      return ncclInternalError;
  }
}

ncclResult_t ncclEnqueueCheck(struct ncclInfo* info) {
  ncclResult_t ret = ArgsCheck(info);
  if (ret != ncclSuccess) {
    if (info->comm != nullptr && info->comm->magic == NCCL_COMM_MAGIC) info->comm->asyncError = ret;
    return ret;
  }
  INFO(NCCL_COLL, "%s: sendbuff %p recvbuff %p count %zi datatype %s op %s root %d comm %p [nranks=%d]",
       info->opName, info->sendbuff, info->recvbuff, info->count,
       ncclDatatypeToString(info->datatype), ncclOpToString(info->op), info->root,
       (void*)info->comm, info->comm->nRanks);
  if (ncclGroupActive()) {
    ncclGroupQueue(*info);
    return ncclSuccess;
  }
  return ncclExecute(*info);
}
