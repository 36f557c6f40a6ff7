-- Run under the launcher: dplua --nproc_per_node=N tests/dist/ddp_equivalence.lua
-- DDP on N ranks, each taking its slice of the batch, must give the same
-- parameters as one process training on the whole batch (the average of
-- the ranks' mean losses is the whole batch's mean loss). float64, so the
-- comparison measures DDP and not float32 summation order. Gloo on the CPU;
-- with DPLUA_TEST_BACKEND=nccl, NCCL with each rank on its GPU.
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed

local backend = os.getenv("DPLUA_TEST_BACKEND") or "gloo"
dist.init_process_group(backend)
local rank, world = dist.get_rank(), dist.get_world_size()
local device = backend == "nccl" and ("cuda:" .. dist.get_local_rank()) or "cpu"
if backend == "nccl" then torch.cuda.set_device(device) end
local BATCH, STEPS = 48, tonumber(arg[1]) or 50

local function make_model()
  torch.manual_seed(1234)
  return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
           :to(device, torch.float64)
end

torch.manual_seed(7)
local xs, ys = {}, {}
for s = 1, STEPS do
  xs[s] = torch.rand(BATCH, 784, { dtype = torch.float64 }):to(device)
  ys[s] = torch.randint(0, 10, { BATCH }):to(device)
end

-- weight decay on the matrices only, as GPT trainers group them: the
-- groups must leave the parameters in the DDP's flat buffer
local function decay_groups(params)
  local decay, rest = {}, {}
  for _, p in ipairs(params) do
    if p:dim() >= 2 then decay[#decay + 1] = p else rest[#rest + 1] = p end
  end
  return { { params = decay, weight_decay = 0.01 }, { params = rest, weight_decay = 0 } }
end

local ddp = nn.parallel.DistributedDataParallel(make_model())
local opt = optim.SGD(decay_groups(ddp:parameters()), { lr = 0.05, momentum = 0.9 })
local crit = nn.CrossEntropyLoss()
local per = math.floor(BATCH / world)
for s = 1, STEPS do
  local x = xs[s]:narrow(0, rank * per, per)
  local y = ys[s]:narrow(0, rank * per, per)
  opt:zero_grad()
  crit(ddp(x), y):backward()
  opt:step()
end

-- the same training in one process, on every rank (it is cheap)
local ref = make_model()
local ropt = optim.SGD(decay_groups(ref:parameters()), { lr = 0.05, momentum = 0.9 })
for s = 1, STEPS do
  ropt:zero_grad()
  crit(ref(xs[s]:narrow(0, 0, per * world)), ys[s]:narrow(0, 0, per * world)):backward()
  ropt:step()
end

local worst = 0
local mine = ddp.module:parameters()
for i, p in ipairs(ref:parameters()) do
  local diff = (mine[i] - p):abs():max():item()
  local scale = p:abs():max():item()
  worst = math.max(worst, diff / math.max(scale, 1e-12))
end
print(string.format("rank %d of %d: worst relative difference %.3e", rank, world, worst))
if worst > 1e-6 then
  io.stderr:write(string.format("rank %d: DDP parameters differ from single-process training (%.3e > 1e-6)\n", rank, worst))
  os.exit(1)
end
dist.destroy_process_group()
