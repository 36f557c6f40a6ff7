-- dplua's side of scripts/bench/ddp_scaling: training steps under
-- DistributedDataParallel, one rank per GPU (NCCL), or on the CPU (Gloo),
-- with the same batch on every rank (weak scaling). Rank 0 prints
-- "ddp_scaling MODEL RANKS SAMPLES_PER_S_PER_RANK". arg[1]: "big" (4
-- Linear(8192, 8192) with ReLU between, bf16, batch 8192, loss mean(out^2),
-- SGD) or "mlp" (784-256-128-10, float32, batch 128, cross-entropy, Adam);
-- arg[2]: timed steps.
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed
local now = torch.utils.progress.clock   -- seconds, monotonic

local which, steps = arg[1] or "mlp", tonumber(arg[2]) or 50
if which ~= "big" and which ~= "mlp" then error("ddp_scaling: the model is \"big\" or \"mlp\", got " .. tostring(which), 0) end
if steps < 1 or steps % 1 ~= 0 then error("ddp_scaling: steps must be a positive whole number, got " .. tostring(arg[2]), 0) end
local gpu = torch.cuda.is_available()
dist.init_process_group(gpu and "nccl" or "gloo")
local device = gpu and ("cuda:" .. (dist.get_local_rank() or 0)) or "cpu"
if gpu then torch.cuda.set_device(device) end
local function sync() if gpu then torch.cuda.synchronize() end end

torch.manual_seed(0)
local model, batch, step_of
if which == "big" then
  local N = 8192
  batch = N
  model = nn.Sequential(nn.Linear(N, N, false), nn.ReLU(), nn.Linear(N, N, false), nn.ReLU(),
                        nn.Linear(N, N, false), nn.ReLU(), nn.Linear(N, N, false))
  model:to(device, torch.bfloat16)
  local ddp = nn.parallel.DistributedDataParallel(model)
  local opt = optim.SGD(ddp:parameters(), { lr = 0.001 })
  local x = torch.rand(batch, N):to(device, torch.bfloat16)
  step_of = function() opt:zero_grad(); ddp(x):square():mean():backward(); opt:step() end
else
  batch = 128
  model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)):to(device)
  local ddp = nn.parallel.DistributedDataParallel(model)
  local opt = optim.Adam(ddp:parameters(), { lr = 1e-3 })
  local crit = nn.CrossEntropyLoss()
  local x, y = torch.rand(batch, 784):to(device), torch.randint(0, 10, { batch }):to(device)
  step_of = function() opt:zero_grad(); crit(ddp(x), y):backward(); opt:step() end
end

for _ = 1, math.max(3, math.floor(steps / 10)) do step_of() end
sync()
dist.barrier()
local t0 = now()
for _ = 1, steps do step_of() end
sync()
local t = now() - t0
if dist.get_rank() == 0 then
  print(string.format("ddp_scaling %s %d %.2f", which, dist.get_world_size(), batch * steps / t))
end
dist.destroy_process_group()
