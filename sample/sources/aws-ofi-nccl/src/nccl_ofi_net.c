/*
 * Sample aws-ofi-nccl: NCCL network plugin (v4) on top of libfabric. Initialisation picks a
 * libfabric provider the way the real plugin does and logs it; data moves through an
 * in-process loopback, since there is no EFA device to drive.
 */

#include "nccl_ofi.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void nccl_ofi_null_logger(ncclDebugLogLevel level, unsigned long flags, const char *file,
				 int line, const char *fmt, ...)
{
	(void)level; (void)flags; (void)file; (void)line; (void)fmt;
}

ncclDebugLogger_t ofi_log_function = nccl_ofi_null_logger;

static struct fi_info *selected;  /* entries of the chosen provider, one per device */
static int num_devices;

const char *aws_ofi_nccl_version(void)
{
	return PACKAGE_VERSION;
}

static const char *preferred_provider(void)
{
#ifdef ENABLE_PLATFORM_AWS
	return "efa";
#else
	return NULL;
#endif
}

/* Keeps the entries of the first suitable provider (the preferred one if it is there). */
static void select_provider(struct fi_info *list)
{
	const char *want = preferred_provider();
	const struct fi_info *first = list;
	for (const struct fi_info *cur = list; want && cur; cur = cur->next) {
		if (strcmp(cur->fabric_attr->prov_name, want) == 0) {
			first = cur;
			break;
		}
	}
	struct fi_info **tail = &selected;
	for (const struct fi_info *cur = list; cur; cur = cur->next) {
		if (strcmp(cur->fabric_attr->prov_name, first->fabric_attr->prov_name) != 0)
			continue;
		*tail = fi_dupinfo(cur);
		if (*tail == NULL)
			break;
		tail = &(*tail)->next;
		num_devices++;
	}
}

static ncclResult_t ofi_init(ncclDebugLogger_t log_function)
{
	int nccl_version = 0;
	ofi_log_function = log_function ? log_function : nccl_ofi_null_logger;
	NCCL_OFI_INFO(NCCL_INIT | NCCL_NET, "Using " PACKAGE_STRING);
	if (ncclGetVersion(&nccl_version) == ncclSuccess)
		NCCL_OFI_INFO(NCCL_INIT | NCCL_NET, "Loaded into NCCL version code %d", nccl_version);

	if (selected != NULL)
		return ncclSuccess;
	struct fi_info *hints = fi_allocinfo();
	struct fi_info *list = NULL;
	if (hints == NULL) {
		NCCL_OFI_WARN("Unable to allocate fi_info hints");
		return ncclSystemError;
	}
	hints->caps = FI_TAGGED | FI_MSG;
	hints->ep_attr->type = FI_EP_RDM;
	int ret = fi_getinfo(OFI_VERSION, NULL, NULL, 0, hints, &list);
	fi_freeinfo(hints);
	if (ret != 0) {
		NCCL_OFI_WARN("OFI call failed with RC %d, %s", ret, fi_strerror(-ret));
		return ncclSystemError;
	}
	select_provider(list);
	fi_freeinfo(list);
	if (selected == NULL) {
		NCCL_OFI_WARN("No libfabric provider could be selected");
		return ncclSystemError;
	}
	NCCL_OFI_INFO(NCCL_INIT | NCCL_NET, "Selected Provider is %s", selected->fabric_attr->prov_name);
	return ncclSuccess;
}

static ncclResult_t ofi_devices(int *ndev)
{
	*ndev = num_devices;
	return ncclSuccess;
}

static ncclResult_t ofi_get_properties(int dev, ncclNetProperties_v4_t *props)
{
	static char pci_path[] = "/sys/devices/pci0000:00/0000:00:1d.0";
	const struct fi_info *info = selected;
	for (int i = 0; info && i < dev; i++)
		info = info->next;
	if (info == NULL || dev < 0) {
		NCCL_OFI_WARN("Invalid device %d (have %d)", dev, num_devices);
		return ncclInternalError;
	}
	props->name = info->domain_attr->name;
	props->pciPath = pci_path;
	props->guid = (uint64_t)dev;
	props->ptrSupport = NCCL_PTR_HOST;
	props->speed = 100000;
	props->port = 1;
	props->maxComms = 65536;
	return ncclSuccess;
}

static ncclResult_t ofi_reg_mr(void *comm, void *data, int size, int type, void **mhandle)
{
	(void)comm; (void)data; (void)size;
	if (type != NCCL_PTR_HOST) {
		NCCL_OFI_WARN("Unable to register memory of type %d: only host memory is supported", type);
		return ncclInternalError;
	}
	*mhandle = NULL;
	return ncclSuccess;
}

static ncclResult_t ofi_dereg_mr(void *comm, void *mhandle)
{
	(void)comm; (void)mhandle;
	return ncclSuccess;
}

static ncclResult_t ofi_iflush(void *recv_comm, void *data, int size, void *mhandle, void **request)
{
	(void)recv_comm; (void)data; (void)size; (void)mhandle;
	*request = NULL;  /* host memory needs no flush */
	return ncclSuccess;
}

ncclNet_t NCCL_PLUGIN_SYMBOL = {
	.name = "AWS Libfabric",
	.init = ofi_init,
	.devices = ofi_devices,
	.getProperties = ofi_get_properties,
	.listen = nccl_ofi_loop_listen,
	.connect = nccl_ofi_loop_connect,
	.accept = nccl_ofi_loop_accept,
	.regMr = ofi_reg_mr,
	.deregMr = ofi_dereg_mr,
	.isend = nccl_ofi_loop_isend,
	.irecv = nccl_ofi_loop_irecv,
	.iflush = ofi_iflush,
	.test = nccl_ofi_loop_test,
	.closeSend = nccl_ofi_loop_close,
	.closeRecv = nccl_ofi_loop_close,
	.closeListen = nccl_ofi_loop_close,
};
