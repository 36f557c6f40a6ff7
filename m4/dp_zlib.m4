# dp_zlib.m4 -- find zlib through pkg-config (required: gzip-compressed
# datasets, checkpoints).
#
# DP_CHECK_ZLIB
#   Sets and substitutes ZLIB_CFLAGS, ZLIB_LIBS (zlib.pc); dplua.pc names
#   the module in Requires.private.
AC_DEFUN([DP_CHECK_ZLIB], [
  PKG_CHECK_MODULES([ZLIB], [zlib], [],
    [AC_MSG_ERROR([zlib not found through pkg-config (zlib.pc).
On Debian/Ubuntu: apt-get install zlib1g-dev
Or set ZLIB_CFLAGS and ZLIB_LIBS by hand.])])
  dp_have_zlib=yes
])
