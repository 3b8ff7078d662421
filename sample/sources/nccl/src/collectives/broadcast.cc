/*************************************************************************
 * Broadcast: every rank ends with the root's buffer.
 ************************************************************************/

#include "enqueue.h"

#include <cstring>

ncclResult_t ncclRunBroadcast(const struct ncclInfo& info) {
  const size_t bytes = info.count * ncclTypeSize(info.datatype);
  if (bytes != 0 && info.sendbuff != info.recvbuff) std::memmove(info.recvbuff, info.sendbuff, bytes);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  struct ncclInfo info = { ncclFuncBroadcast, "Broadcast",
    sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream };
  return ncclEnqueueCheck(&info);
}

/* Deprecated API, kept for backwards compatibility. */
NCCL_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root,
    ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
    ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
