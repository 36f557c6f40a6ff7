#!/bin/sh
# tests/sh/test_cuda_sources.sh -- the launch contract of cuda/launch.cuh,
# checked in the sources (it holds on machines without a GPU too): every
# kernel is launched through launch_kernel(), whose launches may be
# programmatic (PDL), so every kernel must begin with
# begin_after_previous_kernel() before it touches memory; a kernel
# without it could run beside the kernel before it in its stream. TAP
# output; run by `make check` with top_srcdir set (default ".").

. "$(dirname "$0")/tap.sh"

plan 3
cuda="$top_srcdir/cuda"
make_tmp cuda_sources

# Every __global__ function's body starts with the call: the first line
# after the body's opening brace (a line "{" alone, as the sources write
# it); or with its first half, let_next_kernel_start(), when the body
# (up to a line "}" alone) also calls the second, wait_for_previous_kernel().
# Prints FILE:LINE of each kernel that does not.
for f in "$cuda"/*.cu; do
    awk -v file="$(basename "$f")" '
        /__global__/ { kernel = FNR; want = 1; next }
        want == 1 && /^\{$/ { want = 2; next }
        want == 2 {
            want = 0
            if ($0 ~ /^    let_next_kernel_start\(\);$/) { want = 3; next }
            if ($0 !~ /^    begin_after_previous_kernel\(\);$/) print file ":" kernel
        }
        want == 3 && /^    wait_for_previous_kernel\(\);$/ { want = 0; next }
        want == 3 && /^\}$/ { print file ":" kernel " (no wait_for_previous_kernel)"; want = 0 }
    ' "$f"
done >"$tmp/out"
kernels=$(cat "$cuda"/*.cu | grep -c '__global__')
[ "$kernels" -gt 10 ] && [ ! -s "$tmp/out" ]
ok $? "each of the $kernels kernels of cuda/ begins with begin_after_previous_kernel() or its halves" "$tmp/out"

grep -n '<<<' "$cuda"/*.cu >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "no kernel is launched with <<<>>>: launch_kernel() is the one way" "$tmp/out"

grep -n 'cudaLaunchKernel\|cuLaunchKernel' "$cuda"/*.cu >"$tmp/out"
[ ! -s "$tmp/out" ]
ok $? "only cuda/launch.cuh launches (cudaLaunchKernel*, cuLaunchKernel*)" "$tmp/out"
