/*************************************************************************
 * The table from (collective, operation) to the generated kernels.
 ************************************************************************/

#include "devcomm.h"

#define COLL_KERNELS(coll) \
  { ncclDevKernel_##coll##_sum, ncclDevKernel_##coll##_prod, ncclDevKernel_##coll##_max, \
    ncclDevKernel_##coll##_min, ncclDevKernel_##coll##_avg }

typedef ncclKernelFn (*ncclKernelSelect)(ncclDataType_t type, size_t count);

static const ncclKernelSelect kAllReduce[ncclNumOps] = COLL_KERNELS(all_reduce);
static const ncclKernelSelect kReduce[ncclNumOps] = COLL_KERNELS(reduce);
static const ncclKernelSelect kReduceScatter[ncclNumOps] = COLL_KERNELS(reduce_scatter);

ncclKernelFn ncclDevKernel(ncclFunc_t coll, ncclRedOp_t op, ncclDataType_t type, size_t count) {
  if (op < 0 || op >= ncclNumOps) return nullptr;
  switch (coll) {
    case ncclFuncAllReduce: return kAllReduce[op](type, count);
    case ncclFuncReduce: return kReduce[op](type, count);
    case ncclFuncReduceScatter: return kReduceScatter[op](type, count);
    default: return nullptr;
  }
}
