/*************************************************************************
 * Definitions shared by every translation unit of the sample library.
 ************************************************************************/

#ifndef NCCL_CORE_H_
#define NCCL_CORE_H_

#include "nccl.h"
#include "nccl_net.h"
#include "debug.h"

#include <cstddef>
#include <cstdint>

// Exports func and its profiling alias pfunc, as NCCL does; everything else stays hidden.
#define NCCL_API(ret, func, args...)        \
    __attribute__ ((visibility("default"))) \
    __attribute__ ((alias(#func)))          \
    ret p##func (args);                     \
    extern "C"                              \
    __attribute__ ((visibility("default"))) \
    __attribute__ ((weak))                  \
    ret func(args)

#define NCCLCHECK(call) do { \
  ncclResult_t res = call; \
  if (res != ncclSuccess) { \
    INFO(NCCL_ALL, "%s:%d -> %d", __FILE__, __LINE__, res); \
    return res; \
  } \
} while (0)

#define STR2(v) #v
#define STR(v) STR2(v)

#define VERSION_STRING "NCCL version " STR(NCCL_MAJOR) "." STR(NCCL_MINOR) "." STR(NCCL_PATCH) \
  NCCL_SUFFIX "+cuda" STR(CUDA_MAJOR) "." STR(CUDA_MINOR)

#ifndef NCCL_SAMPLE_GENCODE
#define NCCL_SAMPLE_GENCODE ""
#endif
#ifndef NCCL_SAMPLE_CUDA_HOME
#define NCCL_SAMPLE_CUDA_HOME ""
#endif

size_t ncclTypeSize(ncclDataType_t type);
const char* ncclDatatypeToString(ncclDataType_t type);
const char* ncclOpToString(ncclRedOp_t op);
uint64_t getHash(const char* string, int n);
ncclResult_t getHostName(char* hostname, int maxlen, const char delim);
uint64_t getHostHash();
int64_t ncclParamInt(const char* name, int64_t deflt);

#endif
