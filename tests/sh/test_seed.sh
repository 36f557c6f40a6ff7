#!/bin/sh
# tests/sh/test_seed.sh -- the default seed: as PyTorch's CPU generator,
# each process starts from random bytes, so unseeded processes (and the
# ranks of a job) draw different numbers, and torch.manual_seed makes them
# draw the same; torch.get_rng_state of an unseeded process restores its
# stream.
#
#   sh tests/sh/test_seed.sh          # from the build directory

. "$(dirname "$0")/tap.sh"

make_tmp seed
need_dplua
dp_timeout=60

draw='local torch = require("dplua"); print(torch.rand(4):sum():item())'
run -e "$draw"; a=$(cat "$tmp/out")
run -e "$draw"; b=$(cat "$tmp/out")
[ -n "$a" ] && [ "$a" != "$b" ]; ok $? "two unseeded processes draw different numbers ($a, $b)"

seeded='local torch = require("dplua"); torch.manual_seed(7); print(torch.rand(4):sum():item())'
run -e "$seeded"; a=$(cat "$tmp/out")
run -e "$seeded"; b=$(cat "$tmp/out")
[ -n "$a" ] && [ "$a" = "$b" ]; ok $? "manual_seed makes them draw the same"

run -e 'local torch = require("dplua")
local s = torch.get_rng_state()
local x = torch.randn(5)
torch.set_rng_state(s)
print((torch.randn(5) - x):abs():max():item() == 0 and "same" or "different")'
[ "$(cat "$tmp/out")" = same ]; ok $? "an unseeded stream is saved and restored by get_rng_state/set_rng_state"

run --nproc_per_node=2 -e 'local torch = require("dplua"); print(torch.rand(3):sum():item())'
[ $status -eq 0 ] && [ "$(sort -u "$tmp/out" | wc -l)" -eq 2 ]; ok $? "the two ranks of a job draw different numbers"

done_testing
