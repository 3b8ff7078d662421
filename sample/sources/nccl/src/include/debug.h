/*************************************************************************
 * Logging controlled by NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE.
 ************************************************************************/

#ifndef NCCL_DEBUG_H_
#define NCCL_DEBUG_H_

#include "nccl_net.h"
#include <cstdio>

extern int ncclDebugLevel;
extern FILE* ncclDebugFile;

void ncclDebugInit();
void ncclDebugLog(ncclDebugLogLevel level, unsigned long flags, const char* filefunc, int line,
                  const char* fmt, ...) __attribute__ ((format (printf, 5, 6)));
void ncclSetDebugRank(int rank);

#define WARN(...) ncclDebugLog(NCCL_LOG_WARN, NCCL_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define INFO(FLAGS, ...) ncclDebugLog(NCCL_LOG_INFO, (FLAGS), __func__, __LINE__, __VA_ARGS__)

#ifdef ENABLE_TRACE
#define TRACE(FLAGS, ...) ncclDebugLog(NCCL_LOG_TRACE, (FLAGS), __func__, __LINE__, __VA_ARGS__)
#else
#define TRACE(...)
#endif

#endif
