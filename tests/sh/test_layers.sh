#!/bin/sh
# tests/sh/test_layers.sh -- the layering of the folders (docs/CONTRIBUTING.md, Layers),
# checked in the sources: what cuda/, src/cpu and src/main.c include or
# call, that the Lua library reaches C only through the declarations of
# the headers, and that libdplua.so exports only the C API. TAP output;
# run by `make check` with top_srcdir and top_builddir set (default ".").

. "$(dirname "$0")/tap.sh"

plan 5
src="$top_srcdir/src"
make_tmp layers

# cuda/ includes CUDA, system headers, its own headers, config.h and src/common.
grep -n '#include' "$top_srcdir"/cuda/* |
    grep -v -e '#include <' -e '#include "common/' -e '#include "config.h"' \
            -e '#include "[a-z_]*\.cuh"' -e '#include "dp_cuda.h"' -e '#include "dpc_ops.h"' >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "cuda/ includes only CUDA, system and its own headers, and src/common" "$tmp/out"

grep -n 'tensor_new\|dp_empty\|dp_full\|malloc(.*dp_tensor' "$src"/cpu/*.c >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "src/cpu makes no tensors: the caller in src/core allocates" "$tmp/out"

grep -n '#include "' "$src/main.c" |
    grep -v -e '"dplua.h"' -e '"dplua_internal.h"' -e '"lua/host.h"' -e '"config.h"' >"$tmp/out"
grep -n 'dpc_\|openblas_' "$src/main.c" >>"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "src/main.c includes only dplua.h, dplua_internal.h and src/lua's header, and calls no layer below" "$tmp/out"

# The one ffi.cdef of the library is the headers' (lua/dplua/cdef.lua).
grep -rn -e '__asm__' -e 'ffi\.cdef' "$top_srcdir"/lua/dplua | grep -v '^[^:]*/base.lua:[0-9]*:ffi.cdef(require("dplua.cdef"))' >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "lua/dplua declares no C function of its own: libc is reached through the C API's headers" "$tmp/out"

# libdplua.so exports the DP_API functions of the headers, nothing else
# (ag_record, cpu_binary, gloo.cc's C++ instances... stay inside).
lib="${top_builddir:-.}/.libs/libdplua.so"
if [ -f "$lib" ] && command -v nm >/dev/null; then
    nm -D --defined-only "$lib" | awk '$3 !~ /^dp_/' >"$tmp/out"
    [ ! -s "$tmp/out" ]
    ok $? "libdplua.so exports only dp_ names" "$tmp/out"
else
    skip "libdplua.so exports only dp_ names" "no $lib or no nm"
fi
