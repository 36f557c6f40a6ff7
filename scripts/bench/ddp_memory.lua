-- dplua's side of scripts/bench/ddp_memory: the bytes each rank holds
-- between steps for the optimizer's state and for gradients, under plain
-- DistributedDataParallel (ddp), ZeroRedundancyOptimizer over it (zero1)
-- and over DDP with sharding_strategy "SHARD_GRAD_OP" (zero2), Adam on a
-- wide MLP (1024-2048-2048-1024, float32, 8.4 M parameters). Every rank
-- prints "ddp_memory dplua MODE RANKS RANK STATE_BYTES GRAD_BYTES".
-- State: the optimizer's state tensors (for ZeRO, the wrapped optimizer's,
-- with its copy of the shard's parameters); gradients: every gradient
-- buffer alive (DDP's flat buffer, DDP's gradient shard; the wrapped
-- optimizer steps them where they lie).
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed

local mode = arg[1] or "ddp"
if mode ~= "ddp" and mode ~= "zero1" and mode ~= "zero2" then
  error("ddp_memory: the mode is ddp, zero1 or zero2, got " .. tostring(mode), 0)
end
dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
local model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1024))
local ddp = nn.parallel.DistributedDataParallel(model, { sharding_strategy = mode == "zero2" and "SHARD_GRAD_OP" or nil })
local opt
if mode == "ddp" then
  opt = optim.Adam(ddp:parameters(), { lr = 1e-3 })
else
  opt = dist.optim.ZeroRedundancyOptimizer(ddp:parameters(), { optimizer_class = optim.Adam, lr = 1e-3 })
end
local x = torch.randn(32, 1024)
for _ = 1, 2 do
  opt:zero_grad({ set_to_none = false })
  ddp(x):square():mean():backward()
  opt:step()
end

local function bytes(t) return t:numel() * t.dtype.itemsize end
local state, grads = 0, 0
local inner = mode == "ddp" and opt or opt.optim
for _, buckets in ipairs(inner._buckets) do
  for _, b in ipairs(buckets) do
    for _, s in pairs(b.state) do state = state + bytes(s) end
    if mode ~= "ddp" then
      state = state + bytes(b.flat_param)   -- the shard's parameters
      -- and their gradient, unless it is DDP's own (one param group)
      if not opt._direct then grads = grads + bytes(b.flat_grad) end
    end
  end
end
for _, p in ipairs(ddp:parameters()) do
  local g = p.grad
  if g ~= nil then grads = grads + bytes(g) end
end
if mode == "zero2" then grads = grads + bytes(ddp._grad_shard) end
print(string.format("ddp_memory dplua %s %d %d %d %d", mode, world, rank, state, grads))
dist.destroy_process_group()
