-- Run under the launcher by tests/sh/test_ddp.sh: DDP training that does
-- not end by itself; each rank writes "<pid>" to $1/rank<R>.pid once it has
-- done a few synchronised steps, so the test can kill one mid-training.
-- Gloo on the CPU; with DPLUA_TEST_BACKEND=nccl, NCCL with each rank on
-- its GPU (scripts/device-check multi).
local ffi = require("ffi")
ffi.cdef("int getpid(void);")
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed
local backend = os.getenv("DPLUA_TEST_BACKEND") or "gloo"
dist.init_process_group(backend, { timeout = 30 })
local rank = dist.get_rank()
local device = backend == "nccl" and ("cuda:" .. dist.get_local_rank()) or "cpu"
if backend == "nccl" then torch.cuda.set_device(device) end
local ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)):to(device))
local opt = optim.SGD(ddp:parameters(), { lr = 0.01 })
local crit = nn.CrossEntropyLoss()
local x, y = torch.rand(16, 32):to(device), torch.randint(0, 4, { 16 }):to(device)
local step = 0
while true do
  opt:zero_grad()
  crit(ddp(x), y):backward()
  opt:step()
  step = step + 1
  if step == 20 then
    local f = assert(io.open(arg[1] .. "/rank" .. rank .. ".pid", "w"))
    f:write(tostring(ffi.C.getpid()))
    f:close()
  end
end
