#!/bin/sh
# test_fuzz_asan.sh -- TAP: nothing a script does may crash the process.
#
# Runs tests/lua/fuzz.lua (random calls of the whole tensor API, with bad
# arguments) twice: under dplua-asan, the program built with AddressSanitizer
# and UBSan (this test builds it with `make dplua-asan`), and under the normal
# ./dplua with more calls. Each run is bounded by its number of calls, not by
# time: a slow or loaded machine only makes it take longer. A run passes only
# when the fuzzer exits 0: a crash, a sanitizer report, a hang or a failed
# check of the fuzzer all fail it, and the diagnostics quote the statement that was running
# (the last line of the fuzzer's trace) and the top of the sanitizer report.
# To replay a failure: run the fuzzer with the same seed and calls and
# DPLUA_FUZZ_TRACE=FILE, then `./dplua FILE` (see tests/lua/fuzz.lua).
#
#   DPLUA_FUZZ_ASAN_CALLS  calls under dplua-asan (default 50000)
#   DPLUA_FUZZ_CALLS       calls under ./dplua (default 200000)
#   DPLUA_FUZZ_SEED        seed of both runs; default fixed (1 and 2) so that
#                          CI is repeatable; "random" takes the time
#   DPLUA_FUZZ_HANG_GUARD  seconds after which a run is taken for a hang and
#                          killed (default 600, far beyond any normal run: a
#                          guard, not a measure of speed)
#
# When the compiler cannot link a sanitized program (no libasan/libubsan) the
# two dplua-asan tests are skipped and the ./dplua run still counts.
set -u
. "$(dirname "$0")/tap.sh"

fuzz=$top_srcdir/tests/lua/fuzz.lua
asan_calls=${DPLUA_FUZZ_ASAN_CALLS:-50000}
plain_calls=${DPLUA_FUZZ_CALLS:-200000}
hang_guard=${DPLUA_FUZZ_HANG_GUARD:-600}
seed_asan=1
seed_plain=2
case ${DPLUA_FUZZ_SEED:-} in
    '') ;;
    random) seed_asan=$(date +%s); seed_plain=$((seed_asan + 1)) ;;
    *) seed_asan=$DPLUA_FUZZ_SEED; seed_plain=$DPLUA_FUZZ_SEED ;;
esac

make_tmp fuzz

# Sanitizer settings.
# - detect_leaks=0: LuaJIT keeps its heap in its own mmap'd arenas, which
#   LeakSanitizer does not scan, so every tensor still referenced from Lua
#   when the fuzzer calls os.exit would be reported as leaked. Leaks are
#   test_autograd_memory.lua's business.
# - allocator_may_return_null=1, max_allocation_size_mb: the C layer treats a
#   NULL from malloc as an out-of-memory error, which is what the fuzzer
#   provokes with sizes like 2^40; ASan would otherwise report such a request
#   as an error itself, and (reserving with MAP_NORESERVE) let a mere 16 GB
#   one succeed and fill memory. (ulimit -v cannot be used under ASan: its
#   shadow memory alone takes terabytes of address space.)
# - abort_on_error=1 and halt_on_error=1: the first report ends the run.
# The caller's own ASAN_OPTIONS/UBSAN_OPTIONS come last and win.
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:max_allocation_size_mb=256${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS UBSAN_OPTIONS

# report N NAME RC OUT ERR TRACE: the TAP line of one fuzzer run.
report() {
    n=$1 name=$2 rc=$3 out=$4 err=$5 trace=$6
    summary=$(grep '^# [0-9]* calls in' "$out" | sed 's/^# //')
    if [ "$rc" -eq 0 ]; then
        echo "ok $n - $name${summary:+: $summary}"
        return
    fi
    case $rc in
        124|137) why="still running after ${hang_guard} s: a hang" ;;
        134) why="aborted (a sanitizer report or abort())" ;;
        139) why="segmentation fault" ;;
        1) why="the fuzzer reported failures" ;;
        *) why="exit status $rc" ;;
    esac
    echo "not ok $n - $name: $why"
    {
        echo "the statement that was running (last line of the trace):"
        tail -n 1 "$trace" 2>/dev/null | sed 's/^try(function() //; s/ end)$//'
        grep -E '^not ok|^#   |^# DPLUA_FUZZ|^# seed' "$out" | head -n 40
        grep -E 'ERROR: AddressSanitizer|runtime error|SUMMARY|^ *#[0-9]+ |^dplua:|stack traceback' "$err" |
            grep -v 'libluajit' | head -n 24
    } | diag
}

# run_fuzz NAME PROG CALLS SEED: runs the fuzzer; sets rc, out, err, trace.
run_fuzz() {
    out=$tmp/$1.out err=$tmp/$1.err trace=$tmp/$1.trace.lua
    DPLUA_FUZZ_TRACE=$trace timeout -k 10 "$hang_guard" "$2" "$fuzz" "$3" "$4" >"$out" 2>"$err"
    rc=$?
}

plan 3

# ---------------------------------------------------------------- dplua-asan

cc=$(sed -n 's/^CC = //p' "$top_builddir/Makefile")
printf 'int main(void) { return 0; }\n' >"$tmp/probe.c"
skip=
if ! ${cc:-cc} -fsanitize=address,undefined "$tmp/probe.c" -o "$tmp/probe" >"$tmp/probe.log" 2>&1 ||
   ! "$tmp/probe" >>"$tmp/probe.log" 2>&1; then
    skip="${cc:-cc} cannot build a program with -fsanitize=address,undefined (libasan/libubsan missing?)"
fi

if [ -n "$skip" ]; then
    echo "ok 1 - build dplua-asan # SKIP $skip"
    echo "ok 2 - fuzz under ASan and UBSan # SKIP $skip"
    diag <"$tmp/probe.log"
else
    jobs=$(nproc 2>/dev/null || echo 2)
    # -O1 after the configured flags: ASan's advice, and half the compile
    # time of -O3. A make of its own: a `make -j check` above keeps its
    # jobserver to itself.
    cflags=$(sed -n 's/^CFLAGS = //p' "$top_builddir/Makefile")
    cxxflags=$(sed -n 's/^CXXFLAGS = //p' "$top_builddir/Makefile")
    start=$(date +%s)
    if (cd "$top_builddir" && unset MAKEFLAGS MFLAGS MAKELEVEL &&
        make -j"$jobs" CFLAGS="$cflags -O1" CXXFLAGS="$cxxflags -O1" dplua-asan) >"$tmp/build.log" 2>&1; then
        echo "ok 1 - build dplua-asan ($(($(date +%s) - start)) s)"
        run_fuzz asan "$top_builddir/dplua-asan" "$asan_calls" "$seed_asan"
        report 2 "fuzz under ASan and UBSan, $asan_calls calls, seed $seed_asan" \
            "$rc" "$out" "$err" "$trace"
    else
        echo "not ok 1 - build dplua-asan"
        tail -n 30 "$tmp/build.log" | diag
        echo "not ok 2 - fuzz under ASan and UBSan: dplua-asan did not build"
    fi
fi

# ---------------------------------------------------------------- ./dplua

# a ceiling on single allocations instead of an address-space cap, which
# LuaJIT 2.1.0-beta3's JIT cannot survive running into
DPLUA_MAX_ALLOC_BYTES=${DPLUA_MAX_ALLOC_BYTES:-268435456}
export DPLUA_MAX_ALLOC_BYTES
run_fuzz plain "$top_builddir/dplua" "$plain_calls" "$seed_plain"
report 3 "fuzz ./dplua, $plain_calls calls, seed $seed_plain" "$rc" "$out" "$err" "$trace"
