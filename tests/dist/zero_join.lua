-- Run under the launcher: dplua --nproc_per_node=N tests/dist/zero_join.lua MODE
-- Join with uneven inputs: rank r has 3 + 2r batches. MODE ddp: plain DDP
-- with SGD (momentum), joined ranks shadow the others' all-reduces and take
-- the last rank's parameters at the end; zero1 / zero2: DDP (zero2:
-- sharding_strategy "SHARD_GRAD_OP") with ZeroRedundancyOptimizer(AdamW),
-- joined ranks keep stepping their shard. Every rank must finish (no hang)
-- with the parameters of one process that, at each step, averages the
-- gradients of the ranks still running over the whole group's size
-- (PyTorch's divide_by_initial_world_size). float64; prints TAP.
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed

dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()
local MODE = arg[1] or "zero1"
local PER = 6
local function batches(r) return 3 + 2 * r end

torch.manual_seed(5)
local xs, ys = {}, {}
for r = 0, world - 1 do
  xs[r], ys[r] = {}, {}
  for s = 1, batches(r) do
    xs[r][s] = torch.randn(PER, 10, { dtype = torch.float64 })
    ys[r][s] = torch.randint(0, 4, { PER })
  end
end

local function make_model()
  torch.manual_seed(21)
  return nn.Sequential(nn.Linear(10, 17), nn.Tanh(), nn.Linear(17, 4)):to(torch.float64)
end
local function make_opt(params, sharded)
  if MODE == "ddp" then return optim.SGD(params, { lr = 0.1, momentum = 0.9 }) end
  if sharded then
    return dist.optim.ZeroRedundancyOptimizer(params, { optimizer_class = optim.AdamW, lr = 0.01 })
  end
  return optim.AdamW(params, { lr = 0.01 })
end
local crit = nn.CrossEntropyLoss()

local ddp = nn.parallel.DistributedDataParallel(make_model(),
                                                { sharding_strategy = MODE == "zero2" and "SHARD_GRAD_OP" or nil })
local opt = make_opt(ddp:parameters(), true)
local joinables = MODE == "ddp" and { ddp } or { ddp, opt }
dist.algorithms.Join(joinables, function()
  for s = 1, batches(rank) do
    opt:zero_grad()
    crit(ddp(xs[rank][s]), ys[rank][s]):backward()
    opt:step()
  end
end)

local ref = make_model()
local ropt = make_opt(ref:parameters(), false)
for s = 1, batches(world - 1) do
  ropt:zero_grad()
  local loss
  for r = 0, world - 1 do
    if s <= batches(r) then
      local l = crit(ref(xs[r][s]), ys[r][s]) / world
      loss = loss and loss + l or l
    end
  end
  loss:backward()
  ropt:step()
end

print("1..1")
local worst = 0
local mine = ddp.module:parameters()
for i, p in ipairs(ref:parameters()) do
  worst = math.max(worst, (mine[i] - p):abs():max():item() / math.max(p:abs():max():item(), 1e-12))
end
print(string.format("%s 1 - %s on rank %d of %d (%d batches): joined, worst relative difference %.3e",
                    worst <= 1e-9 and "ok" or "not ok", MODE, rank, world, batches(rank), worst))
dist.destroy_process_group()
