# dp_cuda.m4 -- find the CUDA toolkit: nvcc, cuda_runtime.h, -lcudart.
#
# DP_CHECK_CUDA
#   --with-cuda=DIR   toolkit prefix (default: /usr/local/cuda, if found)
#   --without-cuda    build for CPU only
#   --with-cuda-arch=LIST  compute capabilities, comma separated (default 90):
#                     SASS for each, plus PTX for the last one
#   Defines DP_HAVE_CUDA; AM_CONDITIONAL HAVE_CUDA. Substitutes NVCC,
#   CUDA_DIR, CUDA_LIBDIR, CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBS,
#   CUDA_GENCODE. An error only when --with-cuda was given explicitly.
AC_DEFUN([DP_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda=DIR], [CUDA toolkit prefix (default: /usr/local/cuda if found); --without-cuda builds for CPU only])],
    [], [with_cuda=check])
  AC_ARG_WITH([cuda-arch],
    [AS_HELP_STRING([--with-cuda-arch=LIST], [CUDA compute capabilities, comma separated (default: 90); PTX is added for the last])],
    [], [with_cuda_arch=90])
  AC_ARG_VAR([NVCC], [CUDA compiler (default: DIR/bin/nvcc)])
  AC_ARG_VAR([NVCCFLAGS], [extra flags for nvcc])

  dp_have_cuda=no
  dp_cuda_why=
  dp_cuda_version=
  CUDA_DIR=; CUDA_LIBDIR=; CUDA_CPPFLAGS=; CUDA_LDFLAGS=; CUDA_LIBS=; CUDA_GENCODE=
  AS_CASE([$with_cuda],
    [no], [dp_cuda_why="--without-cuda"],
    [yes|check], [CUDA_DIR=/usr/local/cuda],
    [CUDA_DIR=$with_cuda])

  AS_IF([test -n "$CUDA_DIR"], [
    dnl nvcc: the user's NVCC, else DIR/bin/nvcc, else (auto mode) PATH.
    AS_IF([test -z "$NVCC"], [
      AS_IF([test "x$with_cuda" = xcheck || test "x$with_cuda" = xyes],
        [AC_PATH_PROG([NVCC], [nvcc], [], [$CUDA_DIR/bin$PATH_SEPARATOR$PATH])],
        [AC_PATH_PROG([NVCC], [nvcc], [], [$CUDA_DIR/bin])])])
    AS_IF([test -z "$NVCC"], [dp_cuda_why="no nvcc in $CUDA_DIR/bin"])

    for dp_d in "$CUDA_DIR/lib64" "$CUDA_DIR/lib" "$CUDA_DIR/targets/x86_64-linux/lib"; do
      AS_IF([test -e "$dp_d/libcudart.so"], [CUDA_LIBDIR=$dp_d; break])
    done
    AS_IF([test -z "$dp_cuda_why" && test -z "$CUDA_LIBDIR"],
      [dp_cuda_why="no libcudart.so under $CUDA_DIR"])

    AS_IF([test -z "$dp_cuda_why"], [
      CUDA_CPPFLAGS="-I$CUDA_DIR/include"
      CUDA_LDFLAGS="-L$CUDA_LIBDIR"
      dp_save_CPPFLAGS=$CPPFLAGS; dp_save_LDFLAGS=$LDFLAGS; dp_save_LIBS=$LIBS
      CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
      LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
      AC_CHECK_HEADER([cuda_runtime.h], [],
        [dp_cuda_why="cuda_runtime.h not usable in $CUDA_DIR/include"])
      AS_IF([test -z "$dp_cuda_why"], [
        AC_CHECK_LIB([cudart], [cudaGetDeviceCount], [],
          [dp_cuda_why="cannot link -lcudart from $CUDA_LIBDIR"])])
      CPPFLAGS=$dp_save_CPPFLAGS; LDFLAGS=$dp_save_LDFLAGS; LIBS=$dp_save_LIBS])

    dnl sm_XX for each listed capability, plus PTX (compute_XX) for the last.
    AS_IF([test -z "$dp_cuda_why"], [
      dp_last=
      for dp_a in `echo "$with_cuda_arch" | tr ',' ' '`; do
        CUDA_GENCODE="$CUDA_GENCODE -gencode arch=compute_$dp_a,code=sm_$dp_a"
        dp_last=$dp_a
      done
      AS_IF([test -z "$dp_last"], [AC_MSG_ERROR([--with-cuda-arch: empty list])])
      CUDA_GENCODE="$CUDA_GENCODE -gencode arch=compute_$dp_last,code=compute_$dp_last"
      AC_MSG_CHECKING([whether $NVCC compiles for sm_$dp_last])
      cat > conftest.cu <<_DP_EOF
__global__ void dp_k(float *x) { x@<:@threadIdx.x@:>@ += 1.0f; }
int main(void) { dp_k<<<1, 1>>>(0); return 0; }
_DP_EOF
      AS_IF([$NVCC -std=c++17 $CUDA_GENCODE $NVCCFLAGS -c conftest.cu -o conftest.$OBJEXT >&AS_MESSAGE_LOG_FD 2>&1],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no])
         dp_cuda_why="$NVCC cannot compile for $with_cuda_arch (see config.log)"])
      rm -f conftest.cu conftest.$OBJEXT])

    AS_IF([test -z "$dp_cuda_why"], [
      dp_have_cuda=yes
      dp_cuda_version=`$NVCC --version 2>/dev/null | sed -n 's/^.*release \(@<:@0-9.@:>@*\),.*$/\1/p'`
      dnl libstdc++: nvcc's host code may call into the C++ runtime, and the
      dnl program is linked by the C compiler.
      CUDA_LIBS="$CUDA_LDFLAGS -lcudart -lstdc++"
      AC_DEFINE([DP_HAVE_CUDA], [1], [Define to 1 to build the CUDA backend.])
      AC_DEFINE_UNQUOTED([DP_CUDA_DIR], ["$CUDA_DIR"], [CUDA toolkit prefix used at build time.])
    ], [
      AS_IF([test "x$with_cuda" != xcheck],
        [AC_MSG_ERROR([--with-cuda given but CUDA is not usable: $dp_cuda_why])])
      AC_MSG_NOTICE([CUDA not used: $dp_cuda_why])
      CUDA_CPPFLAGS=; CUDA_LDFLAGS=; CUDA_LIBS=; CUDA_GENCODE=
    ])
  ])
  AM_CONDITIONAL([HAVE_CUDA], [test $dp_have_cuda = yes])
  AC_SUBST([CUDA_DIR])
  AC_SUBST([CUDA_LIBDIR])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LDFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([CUDA_GENCODE])
])
