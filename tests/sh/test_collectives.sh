#!/bin/sh
# tests/sh/test_collectives.sh -- isend/irecv, batch_isend_irecv, scatter,
# gather, the object collectives (tests/dist/collectives.lua) and
# nn.SyncBatchNorm (tests/dist/sync_batchnorm.lua: the batch split across
# the ranks equals PyTorch's BatchNorm on the whole batch, and under DDP)
# on Gloo under the launcher, on 2, 3 and 4 ranks; and a gather that one
# rank calls as a scatter caught by DPLUA_DIST_DEBUG's check.
#
#   sh tests/sh/test_collectives.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

dist="$top_srcdir/tests/dist"
make_tmp collectives
need_dplua
diag_cut="tail -20"     # of each output, on a failure
dp_timeout=300

plan 6

for np in 2 3 4; do
    run --nproc_per_node=$np "$dist/collectives.lua"
    [ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.[1-9]' "$tmp/out"
    ok $? "isend/irecv, batch_isend_irecv, scatter, gather and object collectives on $np ranks"
done

for np in 2 4; do
    run --nproc_per_node=$np "$dist/sync_batchnorm.lua"
    [ $status -eq 0 ] && ! grep -q '^not ok' "$tmp/out" && grep -q '^1\.\.[1-9]' "$tmp/out"
    ok $? "SyncBatchNorm on $np ranks equals PyTorch's BatchNorm on the whole batch, also under DDP"
done

DPLUA_DIST_DEBUG=1 run --nproc_per_node=2 "$dist/collectives.lua" mismatch
[ $status -eq 0 ] && [ "$(grep -c 'collective mismatch at #1' "$tmp/out")" -eq 2 ] &&
    grep -q 'called gather(float32, 4 elements, root 0) but .* called scatter(float32, 4 elements, root 0)' "$tmp/out"
ok $? "a gather met by a scatter fails on every rank naming both (DPLUA_DIST_DEBUG=1)"
