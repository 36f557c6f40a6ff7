# dp_zlib.m4 -- find zlib (required: gzip-compressed datasets, checkpoints).
#
# DP_CHECK_ZLIB
#   Sets and substitutes ZLIB_LIBS.
AC_DEFUN([DP_CHECK_ZLIB], [
  AC_CHECK_HEADER([zlib.h], [],
    [AC_MSG_ERROR([zlib.h not found; on Debian/Ubuntu: apt-get install zlib1g-dev])])
  AC_CHECK_LIB([z], [inflateInit2_], [ZLIB_LIBS=-lz],
    [AC_MSG_ERROR([cannot link -lz; on Debian/Ubuntu: apt-get install zlib1g-dev])])
  AC_SUBST([ZLIB_LIBS])
  dp_have_zlib=yes
])
