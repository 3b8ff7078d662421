// NCCL version queries used by torch._C (torch/csrc/cuda/nccl.cpp).

#ifndef TORCH_CSRC_CUDA_NCCL_H_
#define TORCH_CSRC_CUDA_NCCL_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// (major << 32) | (minor << 16) | patch of the nccl.h this build was compiled against.
uint64_t torch_nccl_version(void);
const char* torch_nccl_version_suffix(void);
int torch_nccl_header_version_code(void);
// ncclGetVersion of the libnccl loaded at run time; returns 0 on success.
int torch_nccl_runtime_version(int* code);

#ifdef __cplusplus
}
#endif

#endif  // TORCH_CSRC_CUDA_NCCL_H_
