// The torch._C extension module (sample).

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "torch/csrc/cuda/nccl.h"
#include "torch/csrc/ops/registry.h"

#ifndef TORCH_CUDA_ARCH_FLAGS
#define TORCH_CUDA_ARCH_FLAGS ""
#endif

static PyObject* nccl_version(PyObject* self, PyObject* unused) {
  return PyLong_FromUnsignedLongLong(torch_nccl_version());
}

static PyObject* nccl_version_suffix(PyObject* self, PyObject* unused) {
  return PyBytes_FromString(torch_nccl_version_suffix());
}

static PyObject* nccl_header_version_code(PyObject* self, PyObject* unused) {
  return PyLong_FromLong(torch_nccl_header_version_code());
}

static PyObject* nccl_runtime_version(PyObject* self, PyObject* unused) {
  int code = 0;
  if (torch_nccl_runtime_version(&code) != 0) {
    PyErr_SetString(PyExc_RuntimeError, "ncclGetVersion failed");
    return NULL;
  }
  return PyLong_FromLong(code);
}

static PyObject* cuda_arch_flags(PyObject* self, PyObject* unused) {
  return PyUnicode_FromString(TORCH_CUDA_ARCH_FLAGS);
}

static PyObject* ops(PyObject* self, PyObject* unused) {
  int count = 0;
  const torch_op_entry* table = torch_ops_table(&count);
  PyObject* names = PyList_New(count);
  if (names == NULL) return NULL;
  for (int i = 0; i < count; i++) {
    PyObject* name = PyUnicode_FromString(table[i].name);
    if (name == NULL) {
      Py_DECREF(names);
      return NULL;
    }
    PyList_SET_ITEM(names, i, name);
  }
  return names;
}

static PyObject* run_op(PyObject* self, PyObject* args) {
  const char* wanted;
  int dtype = TORCH_DTYPE_FLOAT32;
  Py_ssize_t n = 1024;
  if (!PyArg_ParseTuple(args, "s|in", &wanted, &dtype, &n)) return NULL;
  if (dtype < 0 || dtype >= TORCH_DTYPE_COUNT || n < 0) {
    PyErr_SetString(PyExc_ValueError, "invalid dtype or size");
    return NULL;
  }
  int count = 0;
  const torch_op_entry* table = torch_ops_table(&count);
  for (int i = 0; i < count; i++) {
    if (strcmp(table[i].name, wanted) == 0) return PyFloat_FromDouble(table[i].fn(dtype, (size_t)n));
  }
  PyErr_Format(PyExc_KeyError, "no operator named %s", wanted);
  return NULL;
}

static PyMethodDef methods[] = {
    {"_nccl_version", nccl_version, METH_NOARGS, "NCCL version of the header torch was built with."},
    {"_nccl_version_suffix", nccl_version_suffix, METH_NOARGS, "NCCL_SUFFIX of that header."},
    {"_nccl_header_version_code", nccl_header_version_code, METH_NOARGS, "NCCL_VERSION_CODE of that header."},
    {"_nccl_runtime_version", nccl_runtime_version, METH_NOARGS, "ncclGetVersion of the loaded libnccl."},
    {"_cuda_getArchFlags", cuda_arch_flags, METH_NOARGS, "Architectures from TORCH_CUDA_ARCH_LIST."},
    {"_ops", ops, METH_NOARGS, "Names of the compiled operators."},
    {"_run_op", run_op, METH_VARARGS, "Run an operator on generated data; returns the sum."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "torch._C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) {
  return PyModule_Create(&module);
}
