/* Sample libfabric error codes: the same values as errno, returned negated. */

#ifndef FI_ERRNO_H
#define FI_ERRNO_H

#include <errno.h>

#define FI_SUCCESS 0
#define FI_ENOENT ENOENT
#define FI_ENOMEM ENOMEM
#define FI_EINVAL EINVAL
#define FI_ENOSYS ENOSYS
#define FI_ENODATA ENODATA
#define FI_EOTHER 256

#endif /* FI_ERRNO_H */
