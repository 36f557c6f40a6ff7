-- Run under the launcher by tests/sh/test_ddp.sh: DDP training that does
-- not end by itself; each rank writes "<pid>" to $1/rank<R>.pid once it has
-- done a few synchronised steps, so the test can kill one mid-training.
local ffi = require("ffi")
ffi.cdef("int getpid(void);")
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed
dist.init_process_group("gloo", { timeout = 30 })
local rank = dist.get_rank()
local ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
local opt = optim.SGD(ddp:parameters(), { lr = 0.01 })
local crit = nn.CrossEntropyLoss()
local x, y = torch.rand(16, 32), torch.randint(0, 4, { 16 })
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
