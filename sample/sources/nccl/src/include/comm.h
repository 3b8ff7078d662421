/*************************************************************************
 * The communicator. With no devices, a rank is a host thread or process that
 * holds the same data as every other rank of its communicator.
 ************************************************************************/

#ifndef NCCL_COMM_H_
#define NCCL_COMM_H_

#include "core.h"

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#define NCCL_COMM_MAGIC 0x5a3c9e17d2b4f608ULL

struct ncclComm {
  uint64_t magic;
  uint64_t commHash;
  int rank;
  int nRanks;
  int cudaDev;
  ncclResult_t asyncError;
  std::string netName;
  // Point-to-point messages "sent" to a peer; a receive from that peer takes them back,
  // which is what the peer would have received had it held the same data.
  std::mutex p2pLock;
  std::map<int, std::deque<std::vector<char>>> p2p;
};

ncclResult_t ncclCommCheck(const ncclComm* comm, const char* opName);

#endif
