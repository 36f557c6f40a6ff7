-- Run under the launcher by scripts/device-check multi (NCCL, each rank on
-- its GPU; Gloo on the CPU without DPLUA_TEST_BACKEND): rank 0 all-reduces
-- 10 elements, the others 20. With DPLUA_DIST_DEBUG=1 every rank must stop
-- with an error naming both calls; without it, within the group's timeout
-- (5 s here), with one naming the op and its sequence number. Never a hang.
local torch = require("dplua")
local dist = torch.distributed
local backend = os.getenv("DPLUA_TEST_BACKEND") or "gloo"
dist.init_process_group(backend, { timeout = 5 })
local device = backend == "nccl" and ("cuda:" .. dist.get_local_rank()) or "cpu"
if backend == "nccl" then torch.cuda.set_device(device) end
dist.all_reduce(torch.ones(4, { device = device }))   -- a matched one first
local x = torch.ones(dist.get_rank() == 0 and 10 or 20, { device = device })
dist.all_reduce(x)
if backend == "nccl" then torch.cuda.synchronize() end
print("rank " .. dist.get_rank() .. ": the mismatched all_reduce returned (a bug)")
