#!/bin/sh
# tests/sh/test_zero.sh -- sharded data parallelism on Gloo under the
# launcher, 2 and 4 ranks: ZeroRedundancyOptimizer over plain DDP (ZeRO-1)
# and over DDP with sharding_strategy "SHARD_GRAD_OP" (ZeRO-2) equal plain
# DDP; consolidated and per-rank checkpoints resume bit for bit; Join with
# uneven inputs finishes and matches one process; bad input raises; and
# FullyShardedDataParallel (ZeRO-3, tests/dist/fsdp.lua) trains as DDP on
# 2 and 3 ranks, and a run of it stopped on 2 ranks resumes on 3 from its
# whole state dict and optimizer state (tests/dist/fsdp_reshard.lua).
#
#   sh tests/sh/test_zero.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

dist="$top_srcdir/tests/dist"
make_tmp zero
need_dplua
diag_cut="tail -20"
dp_timeout=300

plan 23

# passes: every rank printed its TAP lines and none failed
passes() {
    [ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && [ "$(grep -c '^ok' "$tmp/out")" -eq "$1" ]
}

for ranks in 2 4; do
    for mode in zero1 zero2; do
        for o in AdamW SGD RMSprop; do
            run --nproc_per_node=$ranks "$dist/zero_equivalence.lua" $mode $o 12
            passes $((4 * ranks))
            ok $? "$mode with $o on $ranks ranks equals DDP with $o, that is one process on the whole batch (param groups, StepLR, no_sync, clip_grad_norm_, short last shard)"
        done
    done
done

for ranks in 2 4; do
    for mode in zero1 zero2; do
        run --nproc_per_node=$ranks "$dist/zero_checkpoint.lua" $mode "$tmp"
        passes $((6 * ranks))
        ok $? "$mode on $ranks ranks: consolidated and sharded checkpoints resume bit for bit; the shards read by a group of another size"
    done
done

for mode in ddp zero1 zero2; do
    run --nproc_per_node=4 "$dist/zero_join.lua" $mode
    passes 4
    ok $? "Join with uneven inputs ($mode, 4 ranks with 3, 5, 7 and 9 batches) finishes and matches one process"
done

run --nproc_per_node=2 "$dist/zero_errors.lua"
[ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.15' "$tmp/out"
ok $? "bad input to ZeroRedundancyOptimizer, SHARD_GRAD_OP and Join raises clear errors"

for ranks in 2 3; do
    run --nproc_per_node=$ranks "$dist/fsdp.lua"
    [ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.26' "$tmp/out" && [ "$(grep -c '^ok' "$tmp/out")" -eq 26 ]
    ok $? "FullyShardedDataParallel (FULL_SHARD and SHARD_GRAD_OP, MixedPrecision) on $ranks ranks trains as DDP (dropout, clipping and the max-norm, tied weights, bf16 autocast), its state dict out and in, summon_full_params, prefetching"
done

run --nproc_per_node=3 "$dist/fsdp_reshard.lua" "$tmp"
[ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.9' "$tmp/out" && [ "$(grep -c '^ok' "$tmp/out")" -eq 9 ]
ok $? "FullyShardedDataParallel stopped on 2 ranks resumes on 3 from its state dict and optim_state_dict (by parameter name), or from every rank's sharded_state_dict"
