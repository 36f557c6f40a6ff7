#!/bin/sh
# tests/sh/test_layers.sh -- the layering of the folders (README.md, Layout), checked in
# the sources: what cuda/, src/cpu and src/main.c include or call, that the
# codes in src/common/codes.h are those of src/dplua.h, and that the Lua
# library reaches C only through the declarations of src/dplua.h. TAP
# output; run by `make check` with top_srcdir set (default ".").

. "$(dirname "$0")/tap.sh"

plan 5
src="$top_srcdir/src"
make_tmp layers

# The enum that ends with "} NAME;" in FILE, from its "typedef enum {".
enum_of() {
    awk -v name="$2" '
        /^typedef enum \{/ { block = "" }
        { block = block $0 "\n" }
        $0 == "} " name ";" { printf "%s", block; found = 1; exit }
        END { if (!found) print "no enum " name }
    ' "$1"
}
: >"$tmp/out"
for e in dp_dtype dp_unop dp_binop dp_redop; do
    enum_of "$src/dplua.h" $e >"$tmp/public"
    enum_of "$src/common/codes.h" $e >"$tmp/common"
    diff -u "$tmp/public" "$tmp/common" >>"$tmp/out" || echo "$e differs" >>"$tmp/out"
done
[ ! -s "$tmp/out" ]
ok $? "src/common/codes.h holds src/dplua.h's dtype and op enums, line for line" "$tmp/out"

# cuda/ includes CUDA, system headers, its own headers, config.h and src/common.
grep -n '#include' "$top_srcdir"/cuda/* |
    grep -v -e '#include <' -e '#include "common/' -e '#include "config.h"' \
            -e '#include "[a-z_]*\.cuh"' -e '#include "dp_cuda.h"' -e '#include "dpc_ops.h"' >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "cuda/ includes only CUDA, system and its own headers, and src/common" "$tmp/out"

grep -n 'tensor_new\|dp_empty\|dp_full\|malloc(.*dp_tensor' "$src"/cpu/*.c >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "src/cpu makes no tensors: the caller in src/core allocates" "$tmp/out"

grep -n '#include "' "$src/main.c" | grep -v -e '"dplua.h"' -e '"lua/host.h"' -e '"config.h"' >"$tmp/out"
grep -n 'dpc_\|openblas_' "$src/main.c" >>"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "src/main.c includes only dplua.h and src/lua's header, and calls no layer below" "$tmp/out"

# The one ffi.cdef of the library is src/dplua.h's (lua/dplua/cdef.lua).
grep -rn -e '__asm__' -e 'ffi\.cdef' "$top_srcdir"/lua/dplua | grep -v '^[^:]*/base.lua:[0-9]*:ffi.cdef(require("dplua.cdef"))' >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "lua/dplua declares no C function of its own: libc is reached through src/dplua.h" "$tmp/out"
