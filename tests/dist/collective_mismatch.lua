-- Run under the launcher by scripts/device-check multi (NCCL, each rank on
-- its GPU; Gloo on the CPU without DPLUA_TEST_BACKEND) and by
-- tests/sh/test_dist_failures.sh: rank 0 all-reduces 10 elements, the
-- others 20. With DPLUA_DIST_DEBUG=1 every rank must stop at once with an
-- error naming both calls; without it, with the same error once the
-- collective has stalled for DPLUA_DIST_STALL seconds (3 by default) or at
-- the group's timeout, whichever comes first. Never a hang. arg[1]: the
-- group's timeout in seconds (5 by default).
local torch = require("dplua")
local dist = torch.distributed
local backend = os.getenv("DPLUA_TEST_BACKEND") or "gloo"
dist.init_process_group(backend, { timeout = tonumber(arg[1]) or 5 })
local device = backend == "nccl" and ("cuda:" .. dist.get_local_rank()) or "cpu"
if backend == "nccl" then torch.cuda.set_device(device) end
dist.all_reduce(torch.ones(4, { device = device }))   -- a matched one first
local x = torch.ones(dist.get_rank() == 0 and 10 or 20, { device = device })
dist.all_reduce(x)
if backend == "nccl" then torch.cuda.synchronize() end
print("rank " .. dist.get_rank() .. ": the mismatched all_reduce returned (a bug)")
