// NCCL version information, as torch/csrc/cuda/nccl.cpp reports it: the version is the one
// of the header the build was compiled with, not of the library loaded at run time.

#include "torch/csrc/cuda/nccl.h"

#include <nccl.h>

#include <cstdint>

extern "C" std::uint64_t torch_nccl_version(void) {
  constexpr std::uint64_t ver = (((std::uint64_t)NCCL_MAJOR) << 32) |
                                (((std::uint64_t)NCCL_MINOR) << 16) |
                                ((std::uint64_t)NCCL_PATCH);
  return ver;
}

extern "C" const char* torch_nccl_version_suffix(void) { return NCCL_SUFFIX; }

extern "C" int torch_nccl_header_version_code(void) { return NCCL_VERSION_CODE; }

extern "C" int torch_nccl_runtime_version(int* code) {
  return ncclGetVersion(code) == ncclSuccess ? 0 : -1;
}
