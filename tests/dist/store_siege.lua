-- Run under the launcher by tests/sh/test_store_siege.sh: DDP training on
-- 2 Gloo ranks while strangers besiege rank 0's store. Rank 0 writes the
-- store's port and the job token to $1/port and $1/token; both ranks wait
-- for $1/go, train 30 fixed steps, wait for $1/done (the siege is over),
-- and rank 0 saves the model to $1/model.safetensors and prints the sum
-- of its parameters, its growth in resident memory (MiB) since before
-- the siege, and whether a collective still works.
local ffi = require("ffi")
ffi.cdef("int usleep(unsigned);")
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed
local dir = arg[1]

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end
local function wait_for(path)
  for _ = 1, 6000 do
    if exists(path) then return end
    ffi.C.usleep(20000)
  end
  error("no " .. path .. " within 120 s")
end
local function put(path, text)
  local f = assert(io.open(path .. ".tmp", "w"))
  f:write(text)
  f:close()
  assert(os.rename(path .. ".tmp", path))
end
local function rss_mib()
  for line in io.lines("/proc/self/status") do
    local kb = line:match("^VmRSS:%s+(%d+)")
    if kb then return tonumber(kb) / 1024 end
  end
end

dist.init_process_group("gloo", { timeout = 60 })
local rank = dist.get_rank()
torch.manual_seed(7)
local model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
local ddp = nn.parallel.DistributedDataParallel(model)
local opt = optim.SGD(ddp:parameters(), { lr = 0.05 })
local crit = nn.MSELoss()
torch.manual_seed(100 + rank)
local x, y = torch.rand(8, 16), torch.rand(8, 4)

if rank == 0 then
  put(dir .. "/port", os.getenv("MASTER_PORT"))
  put(dir .. "/token", os.getenv("DPLUA_JOB_TOKEN") or "")
end
local before = rss_mib()
wait_for(dir .. "/go")
for _ = 1, 30 do
  opt:zero_grad()
  crit(ddp(x), y):backward()
  opt:step()
  ffi.C.usleep(50000)
end
wait_for(dir .. "/done")
local one = torch.ones(1)
dist.all_reduce(one)
if rank == 0 then
  local sum = 0
  for _, p in ipairs(model:parameters()) do sum = sum + p:sum():item() end
  torch.save(model:state_dict(), dir .. "/model.safetensors")
  print(string.format("sum %.9g", sum))
  print(string.format("grew %.0f MiB", rss_mib() - before))
  print("all_reduce " .. one:item())
end
dist.destroy_process_group()
