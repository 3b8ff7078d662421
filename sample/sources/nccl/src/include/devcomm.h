/*************************************************************************
 * Kernel lookup: one generated translation unit per (collective, operation)
 * defines ncclDevKernel_<coll>_<op>; ncclDevKernel picks the right one.
 ************************************************************************/

#ifndef NCCL_DEVCOMM_H_
#define NCCL_DEVCOMM_H_

#include "enqueue.h"

typedef void (*ncclKernelFn)(const void* src, void* dst, size_t count, int nRanks);

#define DECL_COLL_KERNELS(coll) \
  ncclKernelFn ncclDevKernel_##coll##_sum(ncclDataType_t type, size_t count); \
  ncclKernelFn ncclDevKernel_##coll##_prod(ncclDataType_t type, size_t count); \
  ncclKernelFn ncclDevKernel_##coll##_max(ncclDataType_t type, size_t count); \
  ncclKernelFn ncclDevKernel_##coll##_min(ncclDataType_t type, size_t count); \
  ncclKernelFn ncclDevKernel_##coll##_avg(ncclDataType_t type, size_t count);

DECL_COLL_KERNELS(all_reduce)
DECL_COLL_KERNELS(reduce)
DECL_COLL_KERNELS(reduce_scatter)

ncclKernelFn ncclDevKernel(ncclFunc_t coll, ncclRedOp_t op, ncclDataType_t type, size_t count);

#endif
