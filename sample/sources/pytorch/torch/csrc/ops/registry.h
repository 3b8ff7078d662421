// Table of the generated operators (see tools/codegen).

#ifndef TORCH_CSRC_OPS_REGISTRY_H_
#define TORCH_CSRC_OPS_REGISTRY_H_

#include <stddef.h>

#define TORCH_DTYPE_FLOAT32 0
#define TORCH_DTYPE_FLOAT64 1
#define TORCH_DTYPE_INT32 2
#define TORCH_DTYPE_INT64 3
#define TORCH_DTYPE_INT16 4
#define TORCH_DTYPE_UINT8 5
#define TORCH_DTYPE_COUNT 6

typedef double (*torch_op_fn)(int dtype, size_t n);

typedef struct {
  const char* name;
  torch_op_fn fn;
} torch_op_entry;

#ifdef __cplusplus
extern "C" {
#endif

const torch_op_entry* torch_ops_table(int* count);

#ifdef __cplusplus
}
#endif

#endif  // TORCH_CSRC_OPS_REGISTRY_H_
