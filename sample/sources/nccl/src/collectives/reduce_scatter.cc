/*************************************************************************
 * ReduceScatter: rank i ends with block i of the reduction.
 ************************************************************************/

#include "enqueue.h"
#include "devcomm.h"

ncclResult_t ncclRunReduceScatter(const struct ncclInfo& info) {
  if (info.count == 0) return ncclSuccess;
  ncclKernelFn kernel = ncclDevKernel(info.coll, info.op, info.datatype, info.count);
  if (kernel == nullptr) return ncclInvalidArgument;
  const size_t block = info.count * ncclTypeSize(info.datatype);
  const char* src = static_cast<const char*>(info.sendbuff) + block * info.comm->rank;
  kernel(src, info.recvbuff, info.count, info.comm->nRanks);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm* comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
    ncclDataType_t datatype, ncclRedOp_t op, ncclComm* comm, cudaStream_t stream) {
  struct ncclInfo info = { ncclFuncReduceScatter, "ReduceScatter",
    sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream };
  return ncclEnqueueCheck(&info);
}
