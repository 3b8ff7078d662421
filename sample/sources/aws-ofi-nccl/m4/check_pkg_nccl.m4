# CHECK_PKG_NCCL: --with-nccl=PATH; needs nccl.h and nccl_net.h and a libnccl to link with.
AC_DEFUN([CHECK_PKG_NCCL], [
  AC_ARG_WITH([nccl],
     [AS_HELP_STRING([--with-nccl=PATH], [Path to non-standard NCCL installation])])

  AS_IF([test -n "${with_nccl}" && test "${with_nccl}" != "yes" && test "${with_nccl}" != "no"],
        [CPPFLAGS="-I${with_nccl}/include ${CPPFLAGS}"
         LDFLAGS="-L${with_nccl}/lib ${LDFLAGS}"])

  AC_CHECK_HEADERS([nccl.h nccl_net.h], [],
      [AC_MSG_ERROR([NCCL headers not found under ${with_nccl:-the default paths}/include; set --with-nccl=PATH])])

  AC_SEARCH_LIBS([ncclGetVersion], [nccl], [],
      [AC_MSG_ERROR([NCCL library not found under ${with_nccl:-the default paths}/lib])])
])
