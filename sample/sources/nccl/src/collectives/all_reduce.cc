/*************************************************************************
 * AllReduce: every rank ends with the reduction of all ranks' buffers.
 ************************************************************************/

#include "enqueue.h"
#include "devcomm.h"

ncclResult_t ncclRunAllReduce(const struct ncclInfo& info) {
  if (info.count == 0) return ncclSuccess;
  ncclKernelFn kernel = ncclDevKernel(info.coll, info.op, info.datatype, info.count);
  if (kernel == nullptr) return ncclInvalidArgument;
  kernel(info.sendbuff, info.recvbuff, info.count, info.comm->nRanks);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm* comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm* comm, cudaStream_t stream) {
  struct ncclInfo info = { ncclFuncAllReduce, "AllReduce",
    sendbuff, recvbuff, count, datatype, op, 0, comm, stream };
  return ncclEnqueueCheck(&info);
}
