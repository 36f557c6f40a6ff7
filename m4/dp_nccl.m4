# dp_nccl.m4 -- find NCCL (collectives between GPUs).
#
# DP_CHECK_NCCL
#   --with-nccl=DIR  NCCL prefix (default: the CUDA toolkit, then system paths)
#   --without-nccl   no NCCL backend
#   Needs CUDA. Defines DP_HAVE_NCCL; AM_CONDITIONAL HAVE_NCCL; substitutes
#   NCCL_CPPFLAGS, NCCL_LIBS. An error only when --with-nccl was given.
AC_DEFUN([DP_CHECK_NCCL], [
  AC_REQUIRE([DP_CHECK_CUDA])
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl=DIR], [NCCL prefix (default: CUDA toolkit, then system paths)])],
    [], [with_nccl=check])
  dp_have_nccl=no
  dp_nccl_version=
  NCCL_CPPFLAGS=; NCCL_LIBS=
  AS_IF([test "x$with_nccl" != xno], [
    AS_IF([test $dp_have_cuda != yes], [
      AS_IF([test "x$with_nccl" != xcheck],
        [AC_MSG_ERROR([--with-nccl given but CUDA is not used (NCCL needs CUDA)])])
    ], [
      AS_CASE([$with_nccl],
        [yes|check], [dp_nccl_dirs="$CUDA_DIR system"],
        [dp_nccl_dirs=$with_nccl])
      for dp_d in $dp_nccl_dirs; do
        dnl system paths, or the CUDA toolkit whose flags are already in CUDA_*
        AS_IF([test "$dp_d" = system || test "$dp_d" = "$CUDA_DIR"],
          [dp_cpp=; dp_ld=],
          [dp_cpp="-I$dp_d/include"; dp_ld=
           for dp_l in "$dp_d/lib64" "$dp_d/lib"; do
             AS_IF([test -e "$dp_l/libnccl.so"], [dp_ld="-L$dp_l"; break])
           done])
        AC_MSG_CHECKING([for NCCL in $dp_d])
        dp_save_CPPFLAGS=$CPPFLAGS; dp_save_LIBS=$LIBS
        CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS $dp_cpp"
        LIBS="$dp_ld -lnccl $CUDA_LIBS $LIBS"
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]],
            [[ncclUniqueId id; return (int)ncclGetUniqueId(&id);]])],
          [dp_have_nccl=yes])
        AS_IF([test $dp_have_nccl = yes], [
          AC_COMPUTE_INT([dp_nccl_major], [NCCL_MAJOR], [[#include <nccl.h>]])
          AC_COMPUTE_INT([dp_nccl_minor], [NCCL_MINOR], [[#include <nccl.h>]])
          AC_COMPUTE_INT([dp_nccl_patch], [NCCL_PATCH], [[#include <nccl.h>]])
          dp_nccl_version="$dp_nccl_major.$dp_nccl_minor.$dp_nccl_patch"])
        CPPFLAGS=$dp_save_CPPFLAGS; LIBS=$dp_save_LIBS
        AC_MSG_RESULT([$dp_have_nccl $dp_nccl_version])
        AS_IF([test $dp_have_nccl = yes],
          [NCCL_CPPFLAGS=$dp_cpp; NCCL_LIBS="$dp_ld -lnccl"; break])
      done
      AS_IF([test "x$with_nccl" != xcheck && test $dp_have_nccl = no],
        [AC_MSG_ERROR([--with-nccl given but NCCL (nccl.h, -lnccl) was not found in $dp_nccl_dirs])])
    ])
  ])
  AS_IF([test $dp_have_nccl = yes],
    [AC_DEFINE([DP_HAVE_NCCL], [1], [Define to 1 to build the NCCL process group.])])
  AM_CONDITIONAL([HAVE_NCCL], [test $dp_have_nccl = yes])
  AC_SUBST([NCCL_CPPFLAGS])
  AC_SUBST([NCCL_LIBS])
])
