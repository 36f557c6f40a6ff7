# dp_openblas.m4 -- find OpenBLAS, its cblas.h and -lopenblas (required).
#
# DP_CHECK_OPENBLAS
#   --with-openblas=DIR  look in DIR/include and DIR/lib first.
#   Otherwise pkg-config `openblas` is tried, then the default paths.
#   Sets and substitutes OPENBLAS_CFLAGS, OPENBLAS_LIBS; dp_openblas_pc=yes
#   when they came from openblas.pc (dplua.pc then requires the module).
AC_DEFUN([DP_CHECK_OPENBLAS], [
  AC_ARG_WITH([openblas],
    [AS_HELP_STRING([--with-openblas=DIR], [OpenBLAS installation prefix (default: pkg-config, then system paths)])],
    [], [with_openblas=check])
  dp_openblas_pc=no
  AS_CASE([$with_openblas],
    [no], [AC_MSG_ERROR([OpenBLAS is required; --without-openblas is not supported])],
    [yes|check], [
      PKG_CHECK_MODULES([OPENBLAS], [openblas], [dp_openblas_pc=yes],
        [OPENBLAS_CFLAGS=; OPENBLAS_LIBS=-lopenblas])],
    [AS_IF([test -d "$with_openblas/include"], [],
       [AC_MSG_ERROR([--with-openblas=$with_openblas: no $with_openblas/include])])
     OPENBLAS_CFLAGS="-I$with_openblas/include"
     OPENBLAS_LIBS="-L$with_openblas/lib -lopenblas"
     AS_IF([test -d "$with_openblas/lib64"],
       [OPENBLAS_LIBS="-L$with_openblas/lib64 $OPENBLAS_LIBS"])])

  dp_save_CPPFLAGS=$CPPFLAGS
  dp_save_LIBS=$LIBS
  CPPFLAGS="$CPPFLAGS $OPENBLAS_CFLAGS"
  LIBS="$OPENBLAS_LIBS $LIBS"
  AC_CHECK_HEADER([cblas.h], [],
    [AC_MSG_ERROR([cblas.h (OpenBLAS) not found; on Debian/Ubuntu: apt-get install libopenblas-dev])])
  AC_MSG_CHECKING([for cblas_sgemm in $OPENBLAS_LIBS])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cblas.h>]],
      [[float a = 1, b = 1, c = 0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1,
                    1.0f, &a, 1, &b, 1, 0.0f, &c, 1);]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([cannot link OpenBLAS ($OPENBLAS_LIBS); on Debian/Ubuntu: apt-get install libopenblas-dev])])
  CPPFLAGS=$dp_save_CPPFLAGS
  LIBS=$dp_save_LIBS
  AC_SUBST([OPENBLAS_CFLAGS])
  AC_SUBST([OPENBLAS_LIBS])
  dp_have_openblas=yes
])
