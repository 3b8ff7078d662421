/*
 * Helpers shared by the plugin's MPI test programs.
 */

#ifndef TEST_COMMON_H_
#define TEST_COMMON_H_

#include "nccl_ofi.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

extern ncclNet_t NCCL_PLUGIN_SYMBOL;

static inline void test_logger(ncclDebugLogLevel level, unsigned long flags, const char *file,
			       int line, const char *fmt, ...)
{
	(void)flags;
	if (level > NCCL_LOG_INFO)
		return;
	va_list args;
	va_start(args, fmt);
	printf("%s %s:%d ", level == NCCL_LOG_WARN ? "WARN" : "INFO", file, line);
	vprintf(fmt, args);
	printf("\n");
	va_end(args);
}

#define OFINCCLCHECK(call) do {                                                   \
	ncclResult_t res_ = (call);                                               \
	if (res_ != ncclSuccess) {                                                \
		fprintf(stderr, "%s:%d: %s failed with %d\n", __FILE__, __LINE__,  \
			#call, (int)res_);                                        \
		MPI_Abort(MPI_COMM_WORLD, 1);                                     \
	}                                                                         \
} while (0)

static inline void wait_request(void *request, int *size)
{
	int done = 0;
	while (!done)
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.test(request, &done, size));
}

#endif /* TEST_COMMON_H_ */
