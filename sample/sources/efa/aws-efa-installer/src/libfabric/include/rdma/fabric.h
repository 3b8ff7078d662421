/*
 * Sample libfabric public header (the subset that fi_info, aws-ofi-nccl and MPI use).
 * Names and version macros follow libfabric's rdma/fabric.h; the structures are smaller.
 */

#ifndef FABRIC_H
#define FABRIC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FI_MAJOR_VERSION @@LIBFABRIC_MAJOR@@
#define FI_MINOR_VERSION @@LIBFABRIC_MINOR@@
#define FI_REVISION_VERSION @@LIBFABRIC_REVISION@@

#define FI_VERSION(major, minor) (((major) << 16) | (minor))
#define FI_MAJOR(version) ((version) >> 16)
#define FI_MINOR(version) ((version) & 0xFFFF)
#define FI_VERSION_GE(v1, v2) (FI_MAJOR(v1) > FI_MAJOR(v2) || \
                               (FI_MAJOR(v1) == FI_MAJOR(v2) && FI_MINOR(v1) >= FI_MINOR(v2)))
#define FI_VERSION_LT(v1, v2) (!FI_VERSION_GE(v1, v2))

#define FI_MSG          (1ULL << 1)
#define FI_RMA          (1ULL << 2)
#define FI_TAGGED       (1ULL << 3)
#define FI_ATOMIC       (1ULL << 4)
#define FI_READ         (1ULL << 8)
#define FI_WRITE        (1ULL << 9)
#define FI_RECV         (1ULL << 10)
#define FI_SEND         (1ULL << 11)
#define FI_REMOTE_READ  (1ULL << 12)
#define FI_REMOTE_WRITE (1ULL << 13)
#define FI_HMEM         (1ULL << 47)
#define FI_LOCAL_COMM   (1ULL << 53)
#define FI_REMOTE_COMM  (1ULL << 54)

enum fi_ep_type {
	FI_EP_UNSPEC,
	FI_EP_MSG,
	FI_EP_DGRAM,
	FI_EP_RDM,
	FI_EP_SOCK_STREAM,
	FI_EP_SOCK_DGRAM,
};

enum {
	FI_PROTO_UNSPEC,
	FI_PROTO_RDMA_CM_IB_RC,
	FI_PROTO_IWARP,
	FI_PROTO_IB_UD,
	FI_PROTO_PSMX,
	FI_PROTO_UDP,
	FI_PROTO_SOCK_TCP,
	FI_PROTO_MXM,
	FI_PROTO_IWARP_RDM,
	FI_PROTO_IB_RDM,
	FI_PROTO_GNI,
	FI_PROTO_RXM,
	FI_PROTO_RXD,
	FI_PROTO_MLX,
	FI_PROTO_NETWORKDIRECT,
	FI_PROTO_PSMX2,
	FI_PROTO_SHM,
	FI_PROTO_MRAIL,
	FI_PROTO_RSTREAM,
	FI_PROTO_RDMA_CM_IB_XRC,
	FI_PROTO_EFA,
};

enum fi_type {
	FI_TYPE_INFO,
	FI_TYPE_EP_TYPE,
	FI_TYPE_CAPS,
	FI_TYPE_OP_FLAGS,
	FI_TYPE_ADDR_FORMAT,
	FI_TYPE_TX_ATTR,
	FI_TYPE_RX_ATTR,
	FI_TYPE_EP_ATTR,
	FI_TYPE_DOMAIN_ATTR,
	FI_TYPE_FABRIC_ATTR,
	FI_TYPE_THREADING,
	FI_TYPE_PROGRESS,
	FI_TYPE_PROTOCOL,
	FI_TYPE_MSG_ORDER,
	FI_TYPE_MODE,
	FI_TYPE_AV_TYPE,
	FI_TYPE_ATOMIC_TYPE,
	FI_TYPE_ATOMIC_OP,
	FI_TYPE_VERSION,
};

struct fi_ep_attr {
	enum fi_ep_type type;
	uint32_t protocol;
	uint32_t protocol_version;
	size_t max_msg_size;
};

struct fi_domain_attr {
	char *name;
	size_t mr_key_size;
	size_t max_ep_tx_ctx;
};

struct fi_fabric_attr {
	char *name;
	char *prov_name;
	uint32_t prov_version;
	uint32_t api_version;
};

struct fi_info {
	struct fi_info *next;
	uint64_t caps;
	uint64_t mode;
	struct fi_ep_attr *ep_attr;
	struct fi_domain_attr *domain_attr;
	struct fi_fabric_attr *fabric_attr;
};

uint32_t fi_version(void);
int fi_getinfo(uint32_t version, const char *node, const char *service,
	       uint64_t flags, const struct fi_info *hints, struct fi_info **info);
void fi_freeinfo(struct fi_info *info);
struct fi_info *fi_dupinfo(const struct fi_info *info);
static inline struct fi_info *fi_allocinfo(void) { return fi_dupinfo(NULL); }
char *fi_tostr(const void *data, enum fi_type datatype);
const char *fi_strerror(int errnum);

#ifdef __cplusplus
}
#endif

#endif /* FABRIC_H */
