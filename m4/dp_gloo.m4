# dp_gloo.m4 -- find Gloo (collectives between CPU processes; C++).
#
# DP_CHECK_GLOO
#   --with-gloo=DIR  Gloo prefix (default: system paths, Debian's libgloo-dev)
#   --without-gloo   no Gloo backend
#   Defines DP_HAVE_GLOO; AM_CONDITIONAL HAVE_GLOO; substitutes GLOO_CPPFLAGS,
#   GLOO_LIBS. Debian ships only a shared libgloo (which pulls in ibverbs and
#   hiredis), so --enable-portable leaves Gloo out unless asked for.
AC_DEFUN([DP_CHECK_GLOO], [
  AC_REQUIRE([AC_PROG_CXX])
  AC_REQUIRE([DP_ARG_PORTABLE])
  AC_ARG_WITH([gloo],
    [AS_HELP_STRING([--with-gloo=DIR], [Gloo prefix (default: system paths, if found)])],
    [], [with_gloo=check])
  dp_have_gloo=no
  dp_gloo_why=
  GLOO_CPPFLAGS=; GLOO_LIBS=
  AS_CASE([$with_gloo],
    [no], [dp_gloo_why="--without-gloo"],
    [check], [AS_IF([test "x$enable_portable" = xyes],
                [dp_gloo_why="--enable-portable (libgloo is shared only)"])],
    [yes], [],
    [AS_IF([test -f "$with_gloo/include/gloo/config.h"], [],
       [AC_MSG_ERROR([--with-gloo=$with_gloo: no $with_gloo/include/gloo/config.h])])
     GLOO_CPPFLAGS="-I$with_gloo/include"
     for dp_l in "$with_gloo/lib64" "$with_gloo/lib"; do
       AS_IF([test -d "$dp_l"], [GLOO_LIBS="-L$dp_l"; break])
     done])
  AS_IF([test -z "$dp_gloo_why"], [
    GLOO_LIBS="$GLOO_LIBS -lgloo"
    AC_LANG_PUSH([C++])
    dp_save_CPPFLAGS=$CPPFLAGS; dp_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $GLOO_CPPFLAGS"
    LIBS="$GLOO_LIBS $LIBS"
    AC_MSG_CHECKING([for Gloo with the TCP transport])
    AC_LINK_IFELSE([AC_LANG_PROGRAM(
        [[#include <gloo/config.h>
          #include <gloo/transport/tcp/device.h>
          #if !GLOO_HAVE_TRANSPORT_TCP
          #error no TCP transport
          #endif]],
        [[gloo::transport::tcp::attr attr;
          attr.hostname = "localhost";
          auto dev = gloo::transport::tcp::CreateDevice(attr);
          (void)dev;]])],
      [dp_have_gloo=yes],
      [dp_gloo_why="gloo/transport/tcp/device.h or -lgloo not usable"])
    AC_MSG_RESULT([$dp_have_gloo])
    CPPFLAGS=$dp_save_CPPFLAGS; LIBS=$dp_save_LIBS
    AC_LANG_POP([C++])
  ])
  AS_IF([test $dp_have_gloo = no], [
    AS_IF([test "x$with_gloo" != xcheck && test "x$with_gloo" != xno],
      [AC_MSG_ERROR([--with-gloo given but Gloo is not usable: $dp_gloo_why; on Debian: apt-get install libgloo-dev])])
    GLOO_CPPFLAGS=; GLOO_LIBS=
  ], [
    AC_DEFINE([DP_HAVE_GLOO], [1], [Define to 1 to build the Gloo process group.])
    AS_IF([test "x$enable_portable" = xyes],
      [AC_MSG_WARN([--enable-portable with --with-gloo: the program needs libgloo.so (and its ibverbs, hiredis) where it runs])])
  ])
  AM_CONDITIONAL([HAVE_GLOO], [test $dp_have_gloo = yes])
  AC_SUBST([GLOO_CPPFLAGS])
  AC_SUBST([GLOO_LIBS])
])
