/*************************************************************************
 * Reduce: the root ends with the reduction of all ranks' buffers.
 ************************************************************************/

#include "enqueue.h"
#include "devcomm.h"

ncclResult_t ncclRunReduce(const struct ncclInfo& info) {
  if (info.count == 0 || info.comm->rank != info.root) return ncclSuccess;
  ncclKernelFn kernel = ncclDevKernel(info.coll, info.op, info.datatype, info.count);
  if (kernel == nullptr) return ncclInvalidArgument;
  kernel(info.sendbuff, info.recvbuff, info.count, info.comm->nRanks);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  struct ncclInfo info = { ncclFuncReduce, "Reduce",
    sendbuff, recvbuff, count, datatype, op, root, comm, stream };
  return ncclEnqueueCheck(&info);
}
