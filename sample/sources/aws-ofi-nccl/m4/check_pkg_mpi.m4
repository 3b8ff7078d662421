# CHECK_PKG_MPI: --with-mpi=PATH; the test programs are MPI programs.
AC_DEFUN([CHECK_PKG_MPI], [
  AC_ARG_WITH([mpi],
     [AS_HELP_STRING([--with-mpi=PATH], [Path to non-standard MPI installation])])

  MPI_CPPFLAGS=
  MPI_LDFLAGS=
  AS_IF([test -n "${with_mpi}" && test "${with_mpi}" != "yes" && test "${with_mpi}" != "no"],
        [MPI_CPPFLAGS="-I${with_mpi}/include"
         MPI_LDFLAGS="-L${with_mpi}/lib"])

  save_CPPFLAGS="${CPPFLAGS}"
  save_LDFLAGS="${LDFLAGS}"
  save_LIBS="${LIBS}"
  CPPFLAGS="${MPI_CPPFLAGS} ${CPPFLAGS}"
  LDFLAGS="${MPI_LDFLAGS} ${LDFLAGS}"
  AC_CHECK_HEADERS([mpi.h], [],
      [AC_MSG_ERROR([mpi.h not found; set --with-mpi=PATH or --disable-tests])])
  AC_SEARCH_LIBS([MPI_Init], [mpi], [],
      [AC_MSG_ERROR([MPI library not found; set --with-mpi=PATH or --disable-tests])])
  CPPFLAGS="${save_CPPFLAGS}"
  LDFLAGS="${save_LDFLAGS}"
  LIBS="${save_LIBS}"
  MPI_LIBS="-lmpi"

  AC_SUBST([MPI_CPPFLAGS])
  AC_SUBST([MPI_LDFLAGS])
  AC_SUBST([MPI_LIBS])
])
