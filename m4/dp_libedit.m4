# dp_libedit.m4 -- find libedit for line editing in the REPL (optional).
#
# DP_CHECK_LIBEDIT
#   --with-libedit (default: check) / --without-libedit.
#   Defines HAVE_LIBEDIT, sets and substitutes LIBEDIT_CFLAGS, LIBEDIT_LIBS.
#   Use <editline/readline.h> (its readline-compatible API) or <histedit.h>;
#   HAVE_EDITLINE_READLINE_H and HAVE_HISTEDIT_H say which exist.
AC_DEFUN([DP_CHECK_LIBEDIT], [
  AC_ARG_WITH([libedit],
    [AS_HELP_STRING([--with-libedit], [line editing in the REPL (default: if found)])],
    [], [with_libedit=check])
  dp_have_libedit=no
  AS_IF([test "x$with_libedit" != xno], [
    PKG_CHECK_MODULES([LIBEDIT], [libedit], [dp_have_libedit=yes], [
      LIBEDIT_CFLAGS=; LIBEDIT_LIBS=
      AC_CHECK_LIB([edit], [readline],
        [dp_have_libedit=yes; LIBEDIT_LIBS=-ledit])])
    AS_IF([test $dp_have_libedit = yes], [
      dp_save_CPPFLAGS=$CPPFLAGS
      CPPFLAGS="$CPPFLAGS $LIBEDIT_CFLAGS"
      AC_CHECK_HEADERS([editline/readline.h histedit.h])
      CPPFLAGS=$dp_save_CPPFLAGS
      AS_IF([test "x$ac_cv_header_editline_readline_h$ac_cv_header_histedit_h" = xnono],
        [dp_have_libedit=no])])
    AS_IF([test $dp_have_libedit = no], [
      LIBEDIT_CFLAGS=; LIBEDIT_LIBS=
      AS_IF([test "x$with_libedit" = xyes],
        [AC_MSG_ERROR([--with-libedit given but libedit was not found; on Debian/Ubuntu: apt-get install libedit-dev])])])
  ])
  AS_IF([test $dp_have_libedit = yes],
    [AC_DEFINE([HAVE_LIBEDIT], [1], [Define to 1 if the REPL can use libedit.])])
  AC_SUBST([LIBEDIT_CFLAGS])
  AC_SUBST([LIBEDIT_LIBS])
])
