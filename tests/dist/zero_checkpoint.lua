-- Run under the launcher: dplua --nproc_per_node=N tests/dist/zero_checkpoint.lua MODE DIR
-- ZeroRedundancyOptimizer checkpoints (MODE zero1 or zero2, see
-- zero_equivalence.lua): training saved after K steps and resumed in a
-- fresh model and optimizer must end bit for bit where an uninterrupted
-- run ends, both through the consolidated state dict (saved by rank 0,
-- loaded by every rank) and through per-rank sharded ones; every rank's
-- shards read by a group of another size hold the same state. The
-- consolidated dict must also be the plain optimizer's state dict, in its
-- layout. float32 AdamW with a schedule; prints TAP.
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed

dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()
local MODE, DIR = arg[1] or "zero1", arg[2] or "/tmp"
local K, STEPS, BATCH = 4, 9, 16

torch.manual_seed(3)
local xs, ys = {}, {}
for s = 1, STEPS do
  xs[s] = torch.randn(BATCH, 12)
  ys[s] = torch.randint(0, 5, { BATCH })
end

local function build(seed, sharded)
  torch.manual_seed(seed)
  local model = nn.Sequential(nn.Linear(12, 31), nn.GELU(), nn.Linear(31, 5))
  local ddp = nn.parallel.DistributedDataParallel(model, {
    bucket_cap_mb = 0.001, sharding_strategy = (sharded and MODE == "zero2") and "SHARD_GRAD_OP" or nil })
  local o = { lr = 0.02, betas = { 0.8, 0.95 }, weight_decay = 0.05 }
  local opt
  if sharded then
    o.optimizer_class = optim.AdamW
    opt = dist.optim.ZeroRedundancyOptimizer(ddp:parameters(), o)
  else
    opt = optim.AdamW(ddp:parameters(), o)
  end
  return ddp, opt, optim.lr_scheduler.ExponentialLR(opt, { gamma = 0.9 })
end

local crit = nn.CrossEntropyLoss()
local per = math.floor(BATCH / world)
local function train(ddp, opt, sched, from, to)
  for s = from, to do
    opt:zero_grad()
    crit(ddp(xs[s]:narrow(0, rank * per, per)), ys[s]:narrow(0, rank * per, per)):backward()
    opt:step()
    sched:step()
  end
end

local function params_of(ddp)
  local out = {}
  for i, p in ipairs(ddp.module:parameters()) do out[i] = p:clone() end
  return out
end

local function max_diff(a, b)
  local worst = 0
  for i = 1, #a do worst = math.max(worst, (a[i] - b[i]):abs():max():item()) end
  return worst
end

-- Whether two optimizer state dicts hold the same entries (steps, names,
-- shapes), and the largest difference of their tensors.
local function same_state(want, got)
  local worst, same = 0, #got.param_groups == #want.param_groups
  for id, st in pairs(want.state) do
    local g = got.state[id]
    same = same and g ~= nil and g.step == st.step
    for k, v in pairs(st) do
      if torch.is_tensor(v) then
        same = same and g[k] ~= nil and table.concat(g[k]:size(), "x") == table.concat(v:size(), "x")
        if same then worst = math.max(worst, (g[k] - v):abs():max():item()) end
      end
    end
  end
  return same, worst
end

print("1..6")
local ddp, opt, sched = build(11, true)
train(ddp, opt, sched, 1, STEPS)
local whole = params_of(ddp)

-- consolidated: rank 0 saves, every rank loads
ddp, opt, sched = build(11, true)
train(ddp, opt, sched, 1, K)
opt:consolidate_state_dict(0)
local path = DIR .. "/zero_" .. MODE .. "_" .. world .. ".safetensors"
-- plain DDP and AdamW after the same K steps: the same state dict
local pddp, popt, psched = build(11, false)
train(pddp, popt, psched, 1, K)
if rank == 0 then
  torch.save({ model = ddp.module:state_dict(), optim = opt:state_dict(), sched = sched:state_dict() }, path)
  local same, worst = same_state(popt:state_dict(), opt:state_dict())
  print(string.format("%s 1 - the consolidated state dict is AdamW's (same entries, worst difference %.3e)",
                      (same and worst <= 1e-6) and "ok" or "not ok", worst))
else
  local ok = not pcall(opt.state_dict, opt)
  print(string.format("%s 1 - state_dict on a rank it was not consolidated on raises", ok and "ok" or "not ok"))
end
dist.barrier()
ddp, opt, sched = build(99, true)
local ck = torch.load(path)
ddp.module:load_state_dict(ck.model)
opt:load_state_dict(ck.optim)
sched:load_state_dict(ck.sched)
train(ddp, opt, sched, K + 1, STEPS)
local d = max_diff(params_of(ddp), whole)
print(string.format("%s 2 - %s on %d ranks: resumed from the consolidated checkpoint, difference %g",
                    d == 0 and "ok" or "not ok", MODE, world, d))

-- sharded: one file per rank
ddp, opt, sched = build(11, true)
train(ddp, opt, sched, 1, K)
local spath = DIR .. "/zero_" .. MODE .. "_" .. world .. "_rank" .. rank .. ".safetensors"
torch.save({ model = ddp.module:state_dict(), optim = opt:sharded_state_dict(), sched = sched:state_dict() }, spath)
ddp, opt, sched = build(98, true)
ck = torch.load(spath)
ddp.module:load_state_dict(ck.model)
opt:load_sharded_state_dict(ck.optim)
sched:load_state_dict(ck.sched)
train(ddp, opt, sched, K + 1, STEPS)
d = max_diff(params_of(ddp), whole)
print(string.format("%s 3 - %s on %d ranks: resumed from per-rank sharded checkpoints, difference %g",
                    d == 0 and "ok" or "not ok", MODE, world, d))

-- another rank's shard is refused by name
local other = DIR .. "/zero_" .. MODE .. "_" .. world .. "_rank" .. ((rank + 1) % world) .. ".safetensors"
dist.barrier()
local ok, err = pcall(opt.load_sharded_state_dict, opt, torch.load(other).optim)
print(string.format("%s 4 - loading another rank's shard raises: %s",
                    (not ok and tostring(err):find("shard", 1, true)) and "ok" or "not ok", tostring(err):sub(1, 120)))
-- resharded: every rank's shards, read back by a group of another size
-- (each rank alone), hold the same state as the plain optimizer's
do
  local shards = {}
  for r = 0, world - 1 do
    shards[r + 1] = torch.load(DIR .. "/zero_" .. MODE .. "_" .. world .. "_rank" .. r .. ".safetensors").optim
  end
  local solo = dist.new_subgroups(1)
  torch.manual_seed(97)
  local model = nn.Sequential(nn.Linear(12, 31), nn.GELU(), nn.Linear(31, 5))
  local alone = dist.optim.ZeroRedundancyOptimizer(model:parameters(), { optimizer_class = optim.AdamW, lr = 0.02,
                                                    betas = { 0.8, 0.95 }, weight_decay = 0.05, process_group = solo })
  alone:load_sharded_state_dict(shards)
  alone:consolidate_state_dict(rank)   -- (a global rank: the group of one is this rank)
  local same, worst = same_state(popt:state_dict(), alone:state_dict())
  print(string.format("%s 5 - the %d ranks' shards read by a group of 1 rank: AdamW's state (worst difference %.3e)",
                      (same and worst <= 1e-6) and "ok" or "not ok", world, worst))
  local swapped = { shards[2], shards[1] }
  for r = 3, world do swapped[r] = shards[r] end
  local ok2, err2 = pcall(alone.load_sharded_state_dict, alone, swapped)
  print(string.format("%s 6 - shards out of order are refused: %s",
                      (not ok2 and tostring(err2):find("in order", 1, true)) and "ok" or "not ok", tostring(err2):sub(1, 120)))
end
dist.destroy_process_group()
