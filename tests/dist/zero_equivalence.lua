-- Run under the launcher: dplua --nproc_per_node=N tests/dist/zero_equivalence.lua MODE OPTIMIZER STEPS
-- ZeroRedundancyOptimizer (MODE zero1: over a plain DDP's parameters;
-- zero2: over a DDP with sharding_strategy "SHARD_GRAD_OP") must give the
-- parameters that DDP gives with the unsharded optimizer, that is, those
-- of one process training on the whole batch (tests/dist/ddp_equivalence.lua),
-- which this process also runs. Both train the same model from the same
-- data: gradients clipped by norm (ddp:clip_grad_norm_, over the shards
-- with zero2), two param groups
-- whose parameters interleave in the flat buffer, a StepLR schedule,
-- gradient accumulation with no_sync, and small buckets that cross the
-- shard boundaries. The model's 931 elements do not divide by 2 or 4, so
-- the last shard is short. float64; prints TAP.
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed

dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()
local MODE, OPT, STEPS = arg[1] or "zero1", arg[2] or "AdamW", tonumber(arg[3]) or 12
local BATCH, CLIP = 24, 0.4
local clipped = 0   -- steps whose gradient norm was over CLIP

local classes = {
  AdamW = { optim.AdamW, { lr = 0.01, weight_decay = 0.1, amsgrad = true } },
  SGD = { optim.SGD, { lr = 0.05, momentum = 0.9, nesterov = true } },
  RMSprop = { optim.RMSprop, { lr = 0.01, momentum = 0.5 } },
  Adam = { optim.Adam, { lr = 0.01 } },
}
local cls, opts = classes[OPT][1], classes[OPT][2]

local function make_model()
  torch.manual_seed(1234)
  return nn.Sequential(nn.Linear(20, 33), nn.Tanh(), nn.Linear(33, 7)):to(torch.float64)
end

torch.manual_seed(7)
local xs, ys = {}, {}
for s = 1, 2 * STEPS do
  xs[s] = torch.rand(BATCH, 20, { dtype = torch.float64 })
  ys[s] = torch.randint(0, 7, { BATCH })
end

-- weights decay, biases do not: the groups interleave in the flat buffer
local function groups(model)
  local decay, plain = {}, {}
  for name, p in model:named_parameters() do
    if name:match("weight$") then decay[#decay + 1] = p else plain[#plain + 1] = p end
  end
  return { { params = decay }, { params = plain, weight_decay = 0 } }
end

local function train(sharded)
  local ddp, opt
  local per = math.floor(BATCH / world)
  local function part(t) return t:narrow(0, rank * per, per) end
  if sharded then
    ddp = nn.parallel.DistributedDataParallel(make_model(), {
      bucket_cap_mb = 0.002, sharding_strategy = MODE == "zero2" and "SHARD_GRAD_OP" or nil })
    local o = { optimizer_class = cls }
    for k, v in pairs(opts) do o[k] = v end
    opt = dist.optim.ZeroRedundancyOptimizer(groups(ddp.module), o)
  else
    -- one process, the whole batch (the ranks' parts together)
    local model = make_model()
    ddp = { module = model, no_sync = function(_, fn) fn() end,
            clip_grad_norm_ = function(_, ...) return torch.nn.utils.clip_grad_norm_(model:parameters(), ...) end }
    setmetatable(ddp, { __call = function(_, x) return model(x) end })
    part = function(t) return t:narrow(0, 0, per * world) end
    opt = cls(groups(model), opts)
  end
  local sched = optim.lr_scheduler.StepLR(opt, { step_size = 4, gamma = 0.5 })
  local crit = nn.CrossEntropyLoss()
  for s = 1, STEPS do
    opt:zero_grad()
    ddp:no_sync(function() crit(ddp(part(xs[2 * s - 1])), part(ys[2 * s - 1])):backward() end)
    crit(ddp(part(xs[2 * s])), part(ys[2 * s])):backward()
    if ddp:clip_grad_norm_(CLIP):item() > CLIP then clipped = clipped + 1 end
    opt:step()
    sched:step()
  end
  return ddp.module:parameters(), opt
end

local ref = train(false)
local got, zopt = train(true)

print("1..4")
local worst = 0
for i, p in ipairs(ref) do
  local diff = (got[i] - p):abs():max():item()
  worst = math.max(worst, diff / math.max(p:abs():max():item(), 1e-12))
end
print(string.format("%s %d - %s %s on rank %d of %d: worst relative difference %.3e from one process", worst <= 1e-9 and "ok" or "not ok",
                    1, MODE, OPT, rank, world, worst))

-- the optimizer state per rank is its shard: 1/N of the elements
local mine = 0
for _, b in ipairs(zopt.optim._buckets) do
  for _, bb in ipairs(b) do mine = mine + bb.flat_param:numel() end
end
local want = math.min(math.ceil(931 / world), 931 - rank * math.ceil(931 / world))
print(string.format("%s 2 - rank %d steps %d of 931 elements (expected %d)", mine == want and "ok" or "not ok",
                    rank, mine, want))

-- the lr schedule reached the wrapped optimizer
local lr = zopt.optim.param_groups[1].lr
local expect = opts.lr * 0.5 ^ math.floor((STEPS - 1) / 4)   -- (the lr of the last step)
print(string.format("%s 3 - the wrapped optimizer's lr follows StepLR (%g, expected %g)",
                    math.abs(lr - expect) < 1e-15 and "ok" or "not ok", lr, expect))
print(string.format("%s 4 - clipping took effect (%d of the %d steps of both runs)", clipped > 0 and "ok" or "not ok",
                    clipped, 2 * STEPS))
dist.destroy_process_group()
