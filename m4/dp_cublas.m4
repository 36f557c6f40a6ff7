# dp_cublas.m4 -- find cuBLASLt (and cuBLAS) in the CUDA toolkit.
#
# DP_CHECK_CUBLAS
#   Needs DP_CHECK_CUDA first. Auto-detected when CUDA is used;
#   --without-cublaslt turns it off, --with-cublaslt makes it required.
#   Defines DP_HAVE_CUBLASLT; AM_CONDITIONAL HAVE_CUBLASLT; substitutes
#   CUBLAS_LIBS (only -lcublasLt: GEMMs go through cuBLASLt, and libcublas
#   is large to load; add -lcublas here if a kernel ever needs it).
AC_DEFUN([DP_CHECK_CUBLAS], [
  AC_REQUIRE([DP_CHECK_CUDA])
  AC_ARG_WITH([cublaslt],
    [AS_HELP_STRING([--with-cublaslt], [GEMMs through cuBLASLt (default: with CUDA)])],
    [], [with_cublaslt=check])
  dp_have_cublaslt=no
  CUBLAS_LIBS=
  AS_IF([test "x$with_cublaslt" != xno && test $dp_have_cuda = yes], [
    dp_save_CPPFLAGS=$CPPFLAGS; dp_save_LDFLAGS=$LDFLAGS; dp_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
    LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
    AC_CHECK_HEADER([cublasLt.h],
      [AC_CHECK_LIB([cublasLt], [cublasLtCreate],
        [dp_have_cublaslt=yes; CUBLAS_LIBS=-lcublasLt], [], [-lcudart])])
    CPPFLAGS=$dp_save_CPPFLAGS; LDFLAGS=$dp_save_LDFLAGS; LIBS=$dp_save_LIBS
  ])
  AS_IF([test "x$with_cublaslt" = xyes && test $dp_have_cublaslt = no],
    [AC_MSG_ERROR([--with-cublaslt given but cuBLASLt (cublasLt.h, -lcublasLt) was not found with CUDA])])
  AS_IF([test $dp_have_cublaslt = yes],
    [AC_DEFINE([DP_HAVE_CUBLASLT], [1], [Define to 1 if cuBLASLt is used for GEMMs.])])
  AM_CONDITIONAL([HAVE_CUBLASLT], [test $dp_have_cublaslt = yes])
  AC_SUBST([CUBLAS_LIBS])
])
