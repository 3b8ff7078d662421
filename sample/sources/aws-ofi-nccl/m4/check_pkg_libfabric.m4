# CHECK_PKG_LIBFABRIC: --with-libfabric=PATH; needs rdma/fabric.h, libfabric >= 1.11.0 and
# a library that provides fi_getinfo.
AC_DEFUN([CHECK_PKG_LIBFABRIC], [
  AC_ARG_WITH([libfabric],
     [AS_HELP_STRING([--with-libfabric=PATH], [Path to non-standard libfabric installation])])

  AS_IF([test -n "${with_libfabric}" && test "${with_libfabric}" != "yes" && test "${with_libfabric}" != "no"],
        [AS_IF([test -d "${with_libfabric}/lib64"], [libfabric_libdir="${with_libfabric}/lib64"],
               [libfabric_libdir="${with_libfabric}/lib"])
         CPPFLAGS="-I${with_libfabric}/include ${CPPFLAGS}"
         LDFLAGS="-L${libfabric_libdir} ${LDFLAGS}"])

  AC_CHECK_HEADERS([rdma/fabric.h], [],
      [AC_MSG_ERROR([libfabric headers not found (rdma/fabric.h); set --with-libfabric=PATH])])

  AC_MSG_CHECKING([for libfabric version >= 1.11.0])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <rdma/fabric.h>]], [[
#if FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) < FI_VERSION(1, 11)
#error "libfabric is older than 1.11.0"
#endif
]])],
      [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([aws-ofi-nccl requires libfabric 1.11.0 or newer])])

  AC_SEARCH_LIBS([fi_getinfo], [fabric], [],
      [AC_MSG_ERROR([libfabric library not found; set --with-libfabric=PATH])])
])
