/*************************************************************************
 * Network selection: an external plugin (libnccl-net.so) or the internal socket transport.
 ************************************************************************/

#ifndef NCCL_INT_NET_H_
#define NCCL_INT_NET_H_

#include "core.h"

extern ncclNet_t* ncclNet;

ncclResult_t ncclNetInit();
const char* ncclNetName();
ncclResult_t bootstrapNetInit();

#endif
