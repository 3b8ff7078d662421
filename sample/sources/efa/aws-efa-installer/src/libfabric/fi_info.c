/*
 * fi_info: lists the fabric interfaces libfabric reports, in libfabric's format.
 */

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PACKAGE_VERSION "@@LIBFABRIC_PACKAGE_VERSION@@"

static void usage(const char *name)
{
	fprintf(stderr,
		"Usage: %s [OPTIONS]\n"
		"\n"
		"Options:\n"
		"  -n, --node=<name>          node name or address (ignored)\n"
		"  -P, --port=<service>       port number or service name (ignored)\n"
		"  -t, --ep_type=<type>       endpoint type: FI_EP_MSG, FI_EP_DGRAM, FI_EP_RDM\n"
		"  -p, --provider=<name>      provider name, e.g. efa\n"
		"  -d, --domain=<name>        domain name\n"
		"  -f, --fabric=<name>        fabric name\n"
		"  -l, --list                 list available providers\n"
		"  -v, --verbose              verbose output\n"
		"      --version              print version info and exit\n"
		"  -h, --help                 display this help and exit\n",
		name);
}

static int parse_ep_type(const char *text, enum fi_ep_type *type)
{
	static const struct { const char *name; enum fi_ep_type type; } names[] = {
		{ "FI_EP_MSG", FI_EP_MSG }, { "FI_EP_DGRAM", FI_EP_DGRAM }, { "FI_EP_RDM", FI_EP_RDM },
		{ "FI_EP_SOCK_STREAM", FI_EP_SOCK_STREAM }, { "FI_EP_SOCK_DGRAM", FI_EP_SOCK_DGRAM },
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcasecmp(text, names[i].name) == 0) {
			*type = names[i].type;
			return 0;
		}
	}
	return -1;
}

static void print_short(const struct fi_info *info, int verbose)
{
	for (const struct fi_info *cur = info; cur; cur = cur->next) {
		printf("provider: %s\n", cur->fabric_attr->prov_name);
		printf("    fabric: %s\n", cur->fabric_attr->name);
		printf("    domain: %s\n", cur->domain_attr->name);
		printf("    version: %d.%d\n", FI_MAJOR(cur->fabric_attr->prov_version),
		       FI_MINOR(cur->fabric_attr->prov_version));
		printf("    type: %s\n", fi_tostr(&cur->ep_attr->type, FI_TYPE_EP_TYPE));
		printf("    protocol: %s\n", fi_tostr(&cur->ep_attr->protocol, FI_TYPE_PROTOCOL));
		if (verbose) {
			printf("    max_msg_size: %zu\n", cur->ep_attr->max_msg_size);
			printf("    hmem: %s\n", (cur->caps & FI_HMEM) ? "yes" : "no");
		}
	}
}

static void print_list(const struct fi_info *info)
{
	for (const struct fi_info *cur = info; cur; cur = cur->next) {
		int seen = 0;
		for (const struct fi_info *prev = info; prev != cur; prev = prev->next)
			if (strcmp(prev->fabric_attr->prov_name, cur->fabric_attr->prov_name) == 0)
				seen = 1;
		if (seen)
			continue;
		printf("%s:\n", cur->fabric_attr->prov_name);
		printf("    version: %d.%d\n", FI_MAJOR(cur->fabric_attr->prov_version),
		       FI_MINOR(cur->fabric_attr->prov_version));
	}
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "node", required_argument, NULL, 'n' },
		{ "port", required_argument, NULL, 'P' },
		{ "ep_type", required_argument, NULL, 't' },
		{ "provider", required_argument, NULL, 'p' },
		{ "domain", required_argument, NULL, 'd' },
		{ "fabric", required_argument, NULL, 'f' },
		{ "list", no_argument, NULL, 'l' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct fi_info *hints = fi_allocinfo();
	struct fi_info *info = NULL;
	const char *name = basename(argv[0]);
	int list = 0, verbose = 0, op;

	if (hints == NULL) {
		fprintf(stderr, "%s: out of memory\n", name);
		return EXIT_FAILURE;
	}
	while ((op = getopt_long(argc, argv, "n:P:t:p:d:f:lvh", longopts, NULL)) != -1) {
		switch (op) {
		case 'n':
		case 'P':
			break;
		case 't':
			if (parse_ep_type(optarg, &hints->ep_attr->type) != 0) {
				fprintf(stderr, "Unknown endpoint type: %s\n", optarg);
				fi_freeinfo(hints);
				return EXIT_FAILURE;
			}
			break;
		case 'p':
			hints->fabric_attr->prov_name = strdup(optarg);
			break;
		case 'd':
			hints->domain_attr->name = strdup(optarg);
			break;
		case 'f':
			hints->fabric_attr->name = strdup(optarg);
			break;
		case 'l':
			list = 1;
			break;
		case 'v':
			verbose = 1;
			break;
		case 'V':
			printf("%s: %s\n", name, PACKAGE_VERSION);
			printf("libfabric: %s\n", fi_tostr("1", FI_TYPE_VERSION));
			printf("libfabric api: %d.%d\n", FI_MAJOR_VERSION, FI_MINOR_VERSION);
			fi_freeinfo(hints);
			return EXIT_SUCCESS;
		case 'h':
			usage(name);
			fi_freeinfo(hints);
			return EXIT_SUCCESS;
		default:
			usage(name);
			fi_freeinfo(hints);
			return EXIT_FAILURE;
		}
	}
	if (optind < argc) {
		usage(name);
		fi_freeinfo(hints);
		return EXIT_FAILURE;
	}

	int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints, &info);
	fi_freeinfo(hints);
	if (ret) {
		fprintf(stderr, "fi_getinfo: %d (%s)\n", ret, fi_strerror(-ret));
		return EXIT_FAILURE;
	}
	if (list)
		print_list(info);
	else
		print_short(info, verbose);
	fi_freeinfo(info);
	return EXIT_SUCCESS;
}
