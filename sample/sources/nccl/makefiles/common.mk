#
# Settings shared by src/ and pkg/. Variables given on the command line win, as in NCCL.
#

CUDA_HOME ?= /usr/local/cuda
PREFIX ?= /usr/local
VERBOSE ?= 0
DEBUG ?= 0
TRACE ?= 0

# There is no CUDA here: the version that names the package is a setting, not detected.
CUDA_MAJOR ?= 11
CUDA_MINOR ?= 3

# Accepted for compatibility with real build commands; recorded into the library.
NVCC_GENCODE ?= -gencode=arch=compute_35,code=sm_35 \
                -gencode=arch=compute_50,code=sm_50 \
                -gencode=arch=compute_60,code=sm_60 \
                -gencode=arch=compute_61,code=sm_61 \
                -gencode=arch=compute_70,code=sm_70 \
                -gencode=arch=compute_80,code=sm_80 \
                -gencode=arch=compute_80,code=compute_80

CXX ?= g++
CXXFLAGS := -DCUDA_MAJOR=$(CUDA_MAJOR) -DCUDA_MINOR=$(CUDA_MINOR) -fPIC -fvisibility=hidden \
            -Wall -Wno-unused-function -Wno-sign-compare -std=c++14 -pthread

ifeq ($(DEBUG), 0)
CXXFLAGS += -O3
else
CXXFLAGS += -O0 -g -ggdb3
endif

ifneq ($(TRACE), 0)
CXXFLAGS += -DENABLE_TRACE
endif

ifneq ($(VERBOSE), 0)
CXXFLAGS += -Wextra
else
.SILENT:
endif

LDFLAGS := -pthread -ldl -lrt
