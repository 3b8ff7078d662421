/*************************************************************************
 * ncclGroupStart / ncclGroupEnd. Queued operations run at the outermost
 * ncclGroupEnd, sends before receives, so that a rank can talk to itself.
 ************************************************************************/

#include "enqueue.h"

#include <vector>

static thread_local int ncclGroupDepth = 0;
static thread_local std::vector<ncclInfo> ncclGroupOps;
static thread_local ncclResult_t ncclGroupError = ncclSuccess;

bool ncclGroupActive() { return ncclGroupDepth > 0; }

void ncclGroupQueue(const struct ncclInfo& info) { ncclGroupOps.push_back(info); }

NCCL_API(ncclResult_t, ncclGroupStart);
ncclResult_t ncclGroupStart() {
  ncclGroupDepth++;
  return ncclSuccess;
}

static ncclResult_t runQueued(bool sends) {
  for (const ncclInfo& info : ncclGroupOps) {
    if ((info.coll == ncclFuncRecv) == sends) continue;
    const ncclResult_t ret = ncclExecute(info);
    if (ret != ncclSuccess) return ret;
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd);
ncclResult_t ncclGroupEnd() {
  if (ncclGroupDepth == 0) {
    WARN("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--ncclGroupDepth > 0) return ncclSuccess;
  ncclResult_t ret = ncclGroupError;
  if (ret == ncclSuccess) ret = runQueued(true);
  if (ret == ncclSuccess) ret = runQueued(false);
  ncclGroupOps.clear();
  ncclGroupError = ncclSuccess;
  return ret;
}
