/*************************************************************************
 * Send / Recv. A message sent to a peer is kept on the communicator; a receive
 * takes the oldest message sent to that peer, or else to any peer: every rank holds
 * the same data, so that is what the peer would have sent.
 ************************************************************************/

#include "enqueue.h"

#include <cstring>

ncclResult_t ncclRunSend(const struct ncclInfo& info) {
  const size_t bytes = info.count * ncclTypeSize(info.datatype);
  const char* data = static_cast<const char*>(info.sendbuff);
  std::lock_guard<std::mutex> lock(info.comm->p2pLock);
  info.comm->p2p[info.root].emplace_back(data, data + bytes);
  return ncclSuccess;
}

ncclResult_t ncclRunRecv(const struct ncclInfo& info) {
  const size_t bytes = info.count * ncclTypeSize(info.datatype);
  std::lock_guard<std::mutex> lock(info.comm->p2pLock);
  auto* queue = &info.comm->p2p[info.root];
  for (auto it = info.comm->p2p.begin(); queue->empty() && it != info.comm->p2p.end(); ++it)
    queue = &it->second;
  if (queue->empty()) {
    if (bytes) std::memset(info.recvbuff, 0, bytes);
    return ncclSuccess;
  }
  const std::vector<char>& message = queue->front();
  if (message.size() > bytes) {
    WARN("Recv : message of %zu bytes from peer %d does not fit in %zu bytes", message.size(),
         info.root, bytes);
    return ncclInvalidUsage;
  }
  if (!message.empty()) std::memcpy(info.recvbuff, message.data(), message.size());
  queue->pop_front();
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
    ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
    ncclComm_t comm, cudaStream_t stream) {
  struct ncclInfo info = { ncclFuncSend, "Send",
    sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream };
  return ncclEnqueueCheck(&info);
}

NCCL_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
    ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
    ncclComm_t comm, cudaStream_t stream) {
  struct ncclInfo info = { ncclFuncRecv, "Recv",
    nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream };
  return ncclEnqueueCheck(&info);
}
