# CHECK_PKG_CUDA: --with-cuda=PATH is accepted for compatibility. The sample plugin only
# moves host memory, so CUDA is reported and never required.
AC_DEFUN([CHECK_PKG_CUDA], [
  AC_ARG_WITH([cuda],
     [AS_HELP_STRING([--with-cuda=PATH], [Path to CUDA (accepted, not used)])])

  AC_MSG_CHECKING([for CUDA])
  AS_IF([test -n "${with_cuda}" && test -d "${with_cuda}/include"],
        [AC_MSG_RESULT([${with_cuda} (not used: the sample plugin only registers host memory)])],
        [AC_MSG_RESULT([not found (not needed)])])
])
