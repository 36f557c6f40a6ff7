-- Training steps of the seed model (10-10-2, batch 32) or the MLP
-- (784-256-128-10, batch 256), SGD, on the GPU: what scripts/bench/
-- gpu_kernels profiles. arg[1]: "seed", "mlp", or "ddp_seed" (the seed
-- model under DistributedDataParallel, NCCL: run it under
-- dplua --nproc_per_node=1); arg[2]: how many steps.
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")
local which = arg[1] or "seed"
torch.manual_seed(0)
local model, x, y
if which == "seed" or which == "ddp_seed" then
  model, x, y = models.SimpleNN():cuda(), torch.rand(32, 10):cuda(), torch.randint(0, 2, { 32 }):cuda()
  if which == "ddp_seed" then
    torch.distributed.init_process_group("nccl")
    model = nn.parallel.DistributedDataParallel(model)
  end
else
  model, x, y = models.mlp():cuda(), torch.rand(256, 784):cuda(), torch.randint(0, 10, { 256 }):cuda()
end
local crit = nn.CrossEntropyLoss()
local opt = optim.SGD(model:parameters(), { lr = 0.01 })
local function step()
  opt:zero_grad()
  crit(model(x), y):backward()
  opt:step()
end
for _ = 1, tonumber(arg[2]) or 4 do step() end
torch.cuda.synchronize()
if which == "ddp_seed" then torch.distributed.destroy_process_group() end
