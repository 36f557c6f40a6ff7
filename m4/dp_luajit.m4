# dp_luajit.m4 -- find LuaJIT through pkg-config (required).
#
# DP_CHECK_LUAJIT
#   Sets and substitutes LUAJIT_CFLAGS, LUAJIT_LIBS. LuaJIT is the host of
#   every script, so there is no way to build without it.
AC_DEFUN([DP_CHECK_LUAJIT], [
  PKG_CHECK_MODULES([LUAJIT], [luajit >= 2.1], [],
    [AC_MSG_ERROR([LuaJIT 2.1 not found through pkg-config (luajit.pc).
On Debian/Ubuntu: apt-get install libluajit-5.1-dev luajit
Or set LUAJIT_CFLAGS and LUAJIT_LIBS by hand.])])

  dp_save_CPPFLAGS=$CPPFLAGS
  CPPFLAGS="$CPPFLAGS $LUAJIT_CFLAGS"
  AC_CHECK_HEADER([luajit.h], [],
    [AC_MSG_ERROR([luajit.h not usable with LUAJIT_CFLAGS=$LUAJIT_CFLAGS; install libluajit-5.1-dev luajit])])
  CPPFLAGS=$dp_save_CPPFLAGS
  dp_have_luajit="yes ($($PKG_CONFIG --modversion luajit 2>/dev/null))"
])
