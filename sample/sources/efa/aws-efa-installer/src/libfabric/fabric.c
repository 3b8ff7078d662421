/*
 * Sample libfabric core: fi_getinfo over a fixed provider table (efa, efa;ofi_rxd,
 * tcp;ofi_rxm, shm), filtered by hints and by FI_PROVIDER like libfabric does.
 * There is no hardware behind it; the table is what an EFA instance reports.
 */

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PACKAGE_VERSION "@@LIBFABRIC_PACKAGE_VERSION@@"

struct prov_entry {
	const char *prov_name;
	const char *fabric;
	const char *domain;
	uint32_t prov_version;
	enum fi_ep_type type;
	uint32_t protocol;
	uint64_t caps;
};

#define EFA_FABRIC "EFA-fe80::e5:56ff:fe34:56a8"
#define EFA_CAPS (FI_MSG | FI_RMA | FI_TAGGED | FI_READ | FI_RECV | FI_SEND | \
		  FI_REMOTE_READ | FI_LOCAL_COMM | FI_REMOTE_COMM)

static const struct prov_entry providers[] = {
	{ "efa", EFA_FABRIC, "efa_0-rdm", FI_VERSION(2, 0), FI_EP_RDM, FI_PROTO_EFA,
	  EFA_CAPS | FI_HMEM },
	{ "efa", EFA_FABRIC, "efa_0-dgrm", FI_VERSION(2, 0), FI_EP_DGRAM, FI_PROTO_EFA,
	  FI_MSG | FI_RECV | FI_SEND },
	{ "efa;ofi_rxd", EFA_FABRIC, "efa_0-dgrm", FI_VERSION(1, 0), FI_EP_RDM, FI_PROTO_RXD,
	  FI_MSG | FI_TAGGED | FI_RECV | FI_SEND },
	{ "tcp;ofi_rxm", "127.0.0.0/8", "lo", FI_VERSION(1, 0), FI_EP_RDM, FI_PROTO_RXM,
	  FI_MSG | FI_RMA | FI_TAGGED | FI_RECV | FI_SEND },
	{ "shm", "shm", "shm", FI_VERSION(1, 1), FI_EP_RDM, FI_PROTO_SHM,
	  FI_MSG | FI_TAGGED | FI_RECV | FI_SEND | FI_LOCAL_COMM },
};

uint32_t fi_version(void)
{
	return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
}

/* A provider name matches a filter if the filter names it or any layer of it ("efa;ofi_rxd"). */
static int name_has_layer(const char *prov_name, const char *want)
{
	char copy[64];
	char *saveptr = NULL;
	snprintf(copy, sizeof(copy), "%s", prov_name);
	for (char *tok = strtok_r(copy, ";", &saveptr); tok; tok = strtok_r(NULL, ";", &saveptr)) {
		if (strcasecmp(tok, want) == 0)
			return 1;
	}
	return strcasecmp(prov_name, want) == 0;
}

/* FI_PROVIDER: a comma-separated list of providers to use, or to skip when it starts with ^. */
static int allowed_by_env(const char *prov_name)
{
	const char *env = getenv("FI_PROVIDER");
	if (env == NULL || *env == '\0')
		return 1;
	int exclude = env[0] == '^';
	char list[256];
	snprintf(list, sizeof(list), "%s", exclude ? env + 1 : env);
	int hit = 0;
	char *saveptr = NULL;
	for (char *tok = strtok_r(list, ",", &saveptr); tok; tok = strtok_r(NULL, ",", &saveptr)) {
		if (name_has_layer(prov_name, tok))
			hit = 1;
	}
	return exclude ? !hit : hit;
}

static int matches_hints(const struct prov_entry *entry, const struct fi_info *hints)
{
	if (hints == NULL)
		return 1;
	if (hints->fabric_attr && hints->fabric_attr->prov_name &&
	    !name_has_layer(entry->prov_name, hints->fabric_attr->prov_name))
		return 0;
	if (hints->fabric_attr && hints->fabric_attr->name &&
	    strcmp(hints->fabric_attr->name, entry->fabric) != 0)
		return 0;
	if (hints->domain_attr && hints->domain_attr->name &&
	    strcmp(hints->domain_attr->name, entry->domain) != 0)
		return 0;
	if (hints->ep_attr && hints->ep_attr->type != FI_EP_UNSPEC &&
	    hints->ep_attr->type != entry->type)
		return 0;
	return (hints->caps & entry->caps) == hints->caps;
}

static struct fi_info *info_from_entry(const struct prov_entry *entry)
{
	struct fi_info *info = fi_allocinfo();
	if (info == NULL)
		return NULL;
	info->caps = entry->caps;
	info->ep_attr->type = entry->type;
	info->ep_attr->protocol = entry->protocol;
	info->ep_attr->protocol_version = 1;
	info->ep_attr->max_msg_size = entry->type == FI_EP_DGRAM ? 8928 : (1ULL << 30);
	info->domain_attr->name = strdup(entry->domain);
	info->fabric_attr->name = strdup(entry->fabric);
	info->fabric_attr->prov_name = strdup(entry->prov_name);
	info->fabric_attr->prov_version = entry->prov_version;
	info->fabric_attr->api_version = fi_version();
	if (!info->domain_attr->name || !info->fabric_attr->name || !info->fabric_attr->prov_name) {
		fi_freeinfo(info);
		return NULL;
	}
	return info;
}

int fi_getinfo(uint32_t version, const char *node, const char *service,
	       uint64_t flags, const struct fi_info *hints, struct fi_info **info)
{
	(void)node;
	(void)service;
	(void)flags;
	if (info == NULL)
		return -FI_EINVAL;
	*info = NULL;
	if (FI_VERSION_LT(fi_version(), version))
		return -FI_ENOSYS;
	struct fi_info *head = NULL, **tail = &head;
	for (size_t i = 0; i < sizeof(providers) / sizeof(providers[0]); i++) {
		if (!allowed_by_env(providers[i].prov_name) || !matches_hints(&providers[i], hints))
			continue;
		struct fi_info *cur = info_from_entry(&providers[i]);
		if (cur == NULL) {
			fi_freeinfo(head);
			return -FI_ENOMEM;
		}
		*tail = cur;
		tail = &cur->next;
	}
	if (head == NULL)
		return -FI_ENODATA;
	*info = head;
	return 0;
}

void fi_freeinfo(struct fi_info *info)
{
	while (info) {
		struct fi_info *next = info->next;
		if (info->domain_attr)
			free(info->domain_attr->name);
		if (info->fabric_attr) {
			free(info->fabric_attr->name);
			free(info->fabric_attr->prov_name);
		}
		free(info->ep_attr);
		free(info->domain_attr);
		free(info->fabric_attr);
		free(info);
		info = next;
	}
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

struct fi_info *fi_dupinfo(const struct fi_info *src)
{
	struct fi_info *info = calloc(1, sizeof(*info));
	if (info == NULL)
		return NULL;
	info->ep_attr = calloc(1, sizeof(*info->ep_attr));
	info->domain_attr = calloc(1, sizeof(*info->domain_attr));
	info->fabric_attr = calloc(1, sizeof(*info->fabric_attr));
	if (!info->ep_attr || !info->domain_attr || !info->fabric_attr) {
		fi_freeinfo(info);
		return NULL;
	}
	if (src == NULL)
		return info;
	info->caps = src->caps;
	info->mode = src->mode;
	if (src->ep_attr)
		*info->ep_attr = *src->ep_attr;
	if (src->domain_attr) {
		*info->domain_attr = *src->domain_attr;
		info->domain_attr->name = dup_or_null(src->domain_attr->name);
	}
	if (src->fabric_attr) {
		*info->fabric_attr = *src->fabric_attr;
		info->fabric_attr->name = dup_or_null(src->fabric_attr->name);
		info->fabric_attr->prov_name = dup_or_null(src->fabric_attr->prov_name);
	}
	return info;
}

static const char *ep_type_str(enum fi_ep_type type)
{
	switch (type) {
	case FI_EP_MSG: return "FI_EP_MSG";
	case FI_EP_DGRAM: return "FI_EP_DGRAM";
	case FI_EP_RDM: return "FI_EP_RDM";
	case FI_EP_SOCK_STREAM: return "FI_EP_SOCK_STREAM";
	case FI_EP_SOCK_DGRAM: return "FI_EP_SOCK_DGRAM";
	default: return "FI_EP_UNSPEC";
	}
}

static const char *protocol_str(uint32_t protocol)
{
	switch (protocol) {
	case FI_PROTO_RXM: return "FI_PROTO_RXM";
	case FI_PROTO_RXD: return "FI_PROTO_RXD";
	case FI_PROTO_SHM: return "FI_PROTO_SHM";
	case FI_PROTO_SOCK_TCP: return "FI_PROTO_SOCK_TCP";
	case FI_PROTO_EFA: return "FI_PROTO_EFA";
	default: return "FI_PROTO_UNSPEC";
	}
}

/* Returns a static buffer, as libfabric's fi_tostr does (not thread safe there either). */
char *fi_tostr(const void *data, enum fi_type datatype)
{
	static char buf[256];
	switch (datatype) {
	case FI_TYPE_EP_TYPE:
		snprintf(buf, sizeof(buf), "%s", ep_type_str(*(const enum fi_ep_type *)data));
		break;
	case FI_TYPE_PROTOCOL:
		snprintf(buf, sizeof(buf), "%s", protocol_str(*(const uint32_t *)data));
		break;
	case FI_TYPE_VERSION:
		snprintf(buf, sizeof(buf), "%s", PACKAGE_VERSION);
		break;
	default:
		snprintf(buf, sizeof(buf), "(unsupported type %d)", (int)datatype);
		break;
	}
	return buf;
}

const char *fi_strerror(int errnum)
{
	if (errnum < 0)
		errnum = -errnum;
	switch (errnum) {
	case FI_SUCCESS: return "Success";
	case FI_ENODATA: return "No data available";
	case FI_ENOSYS: return "Function not implemented";
	case FI_ENOMEM: return "Cannot allocate memory";
	case FI_EINVAL: return "Invalid argument";
	default: return strerror(errnum);
	}
}
