/*************************************************************************
 * AllGather: block i of every rank's output is rank i's input.
 ************************************************************************/

#include "enqueue.h"

#include <cstring>
#include <vector>

ncclResult_t ncclRunAllGather(const struct ncclInfo& info) {
  const size_t bytes = info.count * ncclTypeSize(info.datatype);
  if (bytes == 0) return ncclSuccess;
  // In-place calls pass sendbuff inside recvbuff: copy it out before overwriting blocks.
  std::vector<char> input(static_cast<const char*>(info.sendbuff),
                          static_cast<const char*>(info.sendbuff) + bytes);
  char* out = static_cast<char*>(info.recvbuff);
  for (int r = 0; r < info.comm->nRanks; r++) std::memcpy(out + r * bytes, input.data(), bytes);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  struct ncclInfo info = { ncclFuncAllGather, "AllGather",
    sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream };
  return ncclEnqueueCheck(&info);
}
