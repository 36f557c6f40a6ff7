-- dplua's side of scripts/bench/ddp_seed: the seed step (10-10-2 MLP,
-- batch 32, SGD) under DistributedDataParallel on the GPU of this rank
-- (NCCL), µs per step, printed as "ddp_seed us_per_step" by rank 0.
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed
local now = torch.utils.progress.clock   -- seconds, monotonic

dist.init_process_group("nccl")
local rank = dist.get_rank()
local device = "cuda:" .. (dist.get_local_rank() or 0)
torch.cuda.set_device(device)
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")
local SimpleNN = models.SimpleNN
local model = nn.parallel.DistributedDataParallel(SimpleNN():to(device))
local criterion = nn.CrossEntropyLoss()
local optimizer = optim.SGD(model:parameters(), { lr = 0.01 })
local x = torch.rand(32, 10):to(device)
local y = torch.randint(0, 2, { 32 }):to(device)
local function step()
  optimizer:zero_grad()
  criterion(model(x), y):backward()
  optimizer:step()
end
for _ = 1, 200 do step() end
torch.cuda.synchronize()
local steps, best = 2000, math.huge
for _ = 1, 5 do
  local t0 = now()
  for _ = 1, steps do step() end
  torch.cuda.synchronize()
  best = math.min(best, (now() - t0) / steps)
end
if rank == 0 then print(string.format("ddp_seed %.2f", best * 1e6)) end
dist.destroy_process_group()
