# dp_portable.m4 -- --enable-portable: a program that can be copied.
#
# DP_ARG_PORTABLE
#   Declares --enable-portable (other checks look at $enable_portable).
#
# DP_CHECK_PORTABLE
#   Run after DP_CHECK_LUAJIT, DP_CHECK_OPENBLAS and DP_CHECK_LIBEDIT. With
#   --enable-portable, links LuaJIT and OpenBLAS (with the Fortran runtime a
#   static libopenblas needs) statically into the program, and libedit too
#   when its static archive links; CUDA, cuBLASLt and NCCL stay dynamic. The
#   result runs on a Linux machine with the same or a newer glibc and its own
#   CUDA/NCCL (checked: Debian 12 build, Ubuntu 24.04 target).
#   Substitutes PORTABLE_LIBS (replaces LUAJIT_LIBS and OPENBLAS_LIBS in the
#   program's link); AM_CONDITIONAL PORTABLE. The shared library libdplua
#   is not affected: it always links the shared OpenBLAS.
AC_DEFUN([DP_ARG_PORTABLE], [
  AC_ARG_ENABLE([portable],
    [AS_HELP_STRING([--enable-portable],
      [link LuaJIT, OpenBLAS and libedit statically into the program so that it can be copied to another Linux machine; CUDA, cuBLASLt and NCCL stay dynamic])],
    [], [enable_portable=no])
])

AC_DEFUN([DP_CHECK_PORTABLE], [
  AC_REQUIRE([DP_ARG_PORTABLE])
  PORTABLE_LIBS=
  dp_portable_edit=
  AS_IF([test "x$enable_portable" = xyes], [
    dnl keep the -L directories, turn the -l names static
    dnl libtool moves a lone -Wl,-Bstatic away from the -l that follow it, so
    dnl each static group is one -Wl,-Bstatic,-lA,-lB,-Bdynamic argument.
    dp_L=; dp_l=
    for dp_f in $LUAJIT_LIBS $OPENBLAS_LIBS; do
      AS_CASE([$dp_f], [-L*], [dp_L="$dp_L $dp_f"], [-l*], [dp_l="$dp_l,$dp_f"])
    done
    dnl all of LuaJIT, so that C modules loaded at run time find every lua_*
    dp_lj=`echo "$dp_l" | sed 's/,\(-lluajit@<:@^,@:>@*\)/,--whole-archive,\1,--no-whole-archive/'`
    dp_l=$dp_lj
    dp_save_CPPFLAGS=$CPPFLAGS; dp_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $LUAJIT_CFLAGS $OPENBLAS_CFLAGS"
    dp_ok=no
    for dp_extra in ",-lgfortran,-lquadmath" ""; do
      PORTABLE_LIBS=`echo $dp_L -Wl,-Bstatic$dp_l$dp_extra,-Bdynamic`
      AC_MSG_CHECKING([for a static link with $PORTABLE_LIBS])
      LIBS="$PORTABLE_LIBS -lm -lpthread -ldl $dp_save_LIBS"
      AC_LINK_IFELSE([AC_LANG_PROGRAM(
          [[#include <lauxlib.h>
            #include <cblas.h>]],
          [[float a = 1, b = 1, c = 0;
            lua_State *L = luaL_newstate();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1,
                        1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
            return L == 0;]])],
        [dp_ok=yes])
      AC_MSG_RESULT([$dp_ok])
      AS_IF([test $dp_ok = yes], [break])
    done
    AS_IF([test $dp_ok = no],
      [AC_MSG_ERROR([--enable-portable: cannot link LuaJIT and OpenBLAS statically (need libluajit-5.1.a, libopenblas.a, libgfortran.a; on Debian: apt-get install libluajit-5.1-dev libopenblas-dev libgfortran-12-dev)])])

    dnl libedit: static when its archive and its own dependencies link.
    AS_IF([test "x$dp_have_libedit" = xyes], [
      dp_ok=no
      for dp_e in "-ledit,-ltinfo,-lbsd,-lmd" "-ledit,-ltinfo" "-ledit,-lncurses"; do
        AC_MSG_CHECKING([for a static libedit with $dp_e])
        CPPFLAGS="$dp_save_CPPFLAGS $LIBEDIT_CFLAGS"
        LIBS="-Wl,-Bstatic,$dp_e,-Bdynamic $dp_save_LIBS"
        AC_LINK_IFELSE([AC_LANG_CALL([], [readline])], [dp_ok=yes])
        AC_MSG_RESULT([$dp_ok])
        AS_IF([test $dp_ok = yes],
          [LIBEDIT_LIBS="-Wl,-Bstatic,$dp_e,-Bdynamic"; break])
      done
      AS_IF([test $dp_ok = no],
        [AC_MSG_WARN([--enable-portable: libedit stays dynamic; the target needs libedit.so.2])
         dp_portable_edit=" (libedit dynamic)"])
    ])
    CPPFLAGS=$dp_save_CPPFLAGS; LIBS=$dp_save_LIBS
  ])
  AM_CONDITIONAL([PORTABLE], [test "x$enable_portable" = xyes])
  AC_SUBST([PORTABLE_LIBS])
])
