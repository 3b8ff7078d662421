/*
 * Shared definitions of the sample aws-ofi-nccl plugin.
 */

#ifndef NCCL_OFI_H_
#define NCCL_OFI_H_

#include "config.h"

#include <nccl.h>
#include <nccl_net.h>
#include <rdma/fabric.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libfabric API version the plugin asks for. */
#define OFI_VERSION FI_VERSION(1, 6)

extern ncclDebugLogger_t ofi_log_function;

#define NCCL_OFI_WARN(fmt, ...) \
	(*ofi_log_function)(NCCL_LOG_WARN, NCCL_ALL, __FILE__, __LINE__, "NET/OFI " fmt, ##__VA_ARGS__)
#define NCCL_OFI_INFO(flags, fmt, ...) \
	(*ofi_log_function)(NCCL_LOG_INFO, flags, __func__, __LINE__, "NET/OFI " fmt, ##__VA_ARGS__)

/* The plugin's version string, e.g. "1.1.3-aws". */
const char *aws_ofi_nccl_version(void);

/* In-process transport behind listen/connect/accept/isend/irecv/test (nccl_ofi_loopback.c). */
ncclResult_t nccl_ofi_loop_listen(int dev, void *handle, void **listen_comm);
ncclResult_t nccl_ofi_loop_connect(int dev, void *handle, void **send_comm);
ncclResult_t nccl_ofi_loop_accept(void *listen_comm, void **recv_comm);
ncclResult_t nccl_ofi_loop_isend(void *send_comm, void *data, int size, void *mhandle, void **request);
ncclResult_t nccl_ofi_loop_irecv(void *recv_comm, void *data, int size, void *mhandle, void **request);
ncclResult_t nccl_ofi_loop_test(void *request, int *done, int *size);
ncclResult_t nccl_ofi_loop_close(void *comm);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_OFI_H_ */
