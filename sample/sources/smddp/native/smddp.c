/*
 * libsmddp (sample): the shared library shipped inside the SMDDP wheel. It links against
 * libfabric, like the real one, so loading it needs /opt/amazon/efa/lib on the library path.
 */

#include <stdint.h>

extern uint32_t fi_version(void);

#define EXPORT __attribute__((visibility("default")))

EXPORT const char *smddp_version(void)
{
	return "@@SMDDP_VERSION@@";
}

EXPORT const char *smddp_built_for_torch(void)
{
	return "@@SMDDP_TORCH_VERSION@@";
}

/* libfabric's API version as FI_VERSION(major, minor), from the libfabric that was loaded. */
EXPORT uint32_t smddp_libfabric_api_version(void)
{
	return fi_version();
}
