/*************************************************************************
 * Argument checks run before any collective, with NCCL's messages.
 ************************************************************************/

#include "enqueue.h"

ncclResult_t PtrCheck(const void* pointer, const char* opname, const char* ptrname) {
  if (pointer == nullptr) {
    WARN("%s : %s argument is NULL", opname, ptrname);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommCheck(const ncclComm* comm, const char* opName) {
  if (comm == nullptr) {
    WARN("%s : comm argument is NULL", opName);
    return ncclInvalidArgument;
  }
  if (comm->magic != NCCL_COMM_MAGIC) {
    WARN("%s : comm argument is not a valid communicator", opName);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t ArgsCheck(struct ncclInfo* info) {
  NCCLCHECK(ncclCommCheck(info->comm, info->opName));
  if (info->datatype < 0 || info->datatype >= ncclNumTypes) {
    WARN("%s : invalid type %d", info->opName, info->datatype);
    return ncclInvalidArgument;
  }
  if (info->op < 0 || info->op >= ncclNumOps) {
    WARN("%s : invalid reduction operation %d", info->opName, info->op);
    return ncclInvalidArgument;
  }
  const bool rooted = info->coll == ncclFuncBroadcast || info->coll == ncclFuncReduce;
  const bool p2p = info->coll == ncclFuncSend || info->coll == ncclFuncRecv;
  if ((rooted || p2p) && (info->root < 0 || info->root >= info->comm->nRanks)) {
    WARN("%s : invalid %s %d (nranks %d)", info->opName, p2p ? "peer" : "root", info->root,
         info->comm->nRanks);
    return ncclInvalidArgument;
  }
  if (info->count == 0) return ncclSuccess;
  if (info->coll != ncclFuncRecv) NCCLCHECK(PtrCheck(info->sendbuff, info->opName, "sendbuff"));
  const bool needsRecv = info->coll != ncclFuncSend &&
                         (info->coll != ncclFuncReduce || info->comm->rank == info->root);
  if (needsRecv) NCCLCHECK(PtrCheck(info->recvbuff, info->opName, "recvbuff"));
  return ncclSuccess;
}
