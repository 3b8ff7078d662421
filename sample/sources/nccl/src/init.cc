/*************************************************************************
 * Version query, unique ids and communicator life cycle.
 ************************************************************************/

#include "enqueue.h"
#include "net.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unistd.h>

static std::once_flag initOnce;
static ncclResult_t initResult = ncclSuccess;

// Recorded build settings; NCCL compiles device code for these, the sample only keeps them.
extern "C" __attribute__ ((visibility("default")))
const char* ncclSampleBuildInfo() {
  return "NVCC_GENCODE=" NCCL_SAMPLE_GENCODE ";CUDA_HOME=" NCCL_SAMPLE_CUDA_HOME
         ";compiler=" __VERSION__;
}

static void showVersion() {
  static bool shown = false;
  if (!shown && ncclDebugLevel >= NCCL_LOG_VERSION) {
    if (ncclDebugLevel == NCCL_LOG_VERSION) {
      printf("%s\n", VERSION_STRING);
      fflush(stdout);
    } else {
      INFO(NCCL_ALL, "%s", VERSION_STRING);
      INFO(NCCL_INIT, "Sample build: %s", ncclSampleBuildInfo());
    }
    shown = true;
  }
}

static ncclResult_t ncclInit() {
  std::call_once(initOnce, []() {
    ncclDebugInit();
    initResult = bootstrapNetInit();
    if (initResult == ncclSuccess) initResult = ncclNetInit();
  });
  return initResult;
}

NCCL_API(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* out);
ncclResult_t ncclGetUniqueId(ncclUniqueId* out) {
  NCCLCHECK(ncclInit());
  NCCLCHECK(PtrCheck(out, "GetUniqueId", "out"));
  // An id only has to be unique; NCCL puts its bootstrap root address in it.
  std::memset(out, 0, sizeof(*out));
  const char* env = getenv("NCCL_COMM_ID");
  uint64_t seed[3] = {getHostHash(), (uint64_t)getpid(), (uint64_t)(uintptr_t)out};
  if (env != nullptr) seed[2] = getHash(env, (int)strlen(env));
  std::memcpy(out->internal, "NCCLSMPL", 8);
  std::memcpy(out->internal + 8, seed, sizeof(seed));
  return ncclSuccess;
}

static ncclResult_t commAlloc(ncclComm_t* comret, int nranks, const ncclUniqueId& commId, int rank) {
  ncclComm* comm = new (std::nothrow) ncclComm();
  if (comm == nullptr) {
    WARN("Failed to allocate a communicator");
    return ncclSystemError;
  }
  comm->magic = NCCL_COMM_MAGIC;
  comm->commHash = getHash(commId.internal, NCCL_UNIQUE_ID_BYTES);
  comm->rank = rank;
  comm->nRanks = nranks;
  comm->cudaDev = (int)ncclParamInt("NCCL_SAMPLE_DEVICE", rank);
  comm->asyncError = ncclSuccess;
  comm->netName = ncclNetName();
  *comret = comm;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int myrank);
ncclResult_t ncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int myrank) {
  NCCLCHECK(ncclInit());
  showVersion();
  NCCLCHECK(PtrCheck(newcomm, "CommInitRank", "newcomm"));
  if (nranks < 1 || myrank < 0 || myrank >= nranks) {
    WARN("Invalid rank requested : %d/%d", myrank, nranks);
    return ncclInvalidArgument;
  }
  ncclSetDebugRank(myrank);
  NCCLCHECK(commAlloc(newcomm, nranks, commId, myrank));
  INFO(NCCL_INIT, "comm %p rank %d nranks %d cudaDev %d busId %x - Init COMPLETE", (void*)*newcomm,
       myrank, nranks, (*newcomm)->cudaDev, 0x1000 + 0x100 * (*newcomm)->cudaDev);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  NCCLCHECK(PtrCheck(comms, "CommInitAll", "comms"));
  if (ndev < 0) {
    WARN("Invalid device count requested : %d", ndev);
    return ncclInvalidArgument;
  }
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  for (int rank = 0; rank < ndev; rank++) {
    NCCLCHECK(ncclCommInitRank(comms + rank, ndev, id, rank));
    if (devlist != nullptr) comms[rank]->cudaDev = devlist[rank];
  }
  return ncclSuccess;
}

static ncclResult_t commFree(ncclComm_t comm, const char* opName) {
  if (comm == nullptr) return ncclSuccess;
  NCCLCHECK(ncclCommCheck(comm, opName));
  INFO(NCCL_INIT, "comm %p rank %d nRanks %d - %s COMPLETE", (void*)comm, comm->rank,
       comm->nRanks, opName);
  comm->magic = 0;
  delete comm;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return commFree(comm, "Destroy"); }

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) { return commFree(comm, "Abort"); }

NCCL_API(const char*, ncclGetErrorString, ncclResult_t code);
const char* ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess                : return "no error";
    case ncclUnhandledCudaError     : return "unhandled cuda error";
    case ncclSystemError            : return "unhandled system error";
    case ncclInternalError          : return "internal error";
    case ncclInvalidArgument        : return "invalid argument";
    case ncclInvalidUsage           : return "invalid usage";
    default                         : return "unknown result code";
  }
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  NCCLCHECK(ncclCommCheck(comm, "ncclGetAsyncError"));
  NCCLCHECK(PtrCheck(asyncError, "ncclGetAsyncError", "asyncError"));
  *asyncError = comm->asyncError;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  NCCLCHECK(ncclCommCheck(comm, "CommCount"));
  NCCLCHECK(PtrCheck(count, "CommCount", "count"));
  *count = comm->nRanks;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* devid);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* devid) {
  NCCLCHECK(ncclCommCheck(comm, "CommCuDevice"));
  NCCLCHECK(PtrCheck(devid, "CommCuDevice", "devid"));
  *devid = comm->cudaDev;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  NCCLCHECK(ncclCommCheck(comm, "CommUserRank"));
  NCCLCHECK(PtrCheck(rank, "CommUserRank", "rank"));
  *rank = comm->rank;
  return ncclSuccess;
}
