-- Run under the launcher: dplua --nproc_per_node=N tests/dist/fsdp.lua
-- FullyShardedDataParallel against DistributedDataParallel: the same
-- model (two blocks with LayerNorm, GELU and dropout, a Linear before and
-- after them) trained K steps with AdamW and clip_grad_norm_ from the same
-- weights and random stream ends with the same weights, the blocks'
-- parameters held as shards between uses; the whole state dict goes out
-- and back in; bad input says what is wrong. Prints TAP (rank 0; every
-- rank prints a failure). With DPLUA_TEST_BACKEND=nccl each rank runs on
-- its GPU.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed
local F = nn.functional
local fsdp = dist.fsdp

local backend = os.getenv("DPLUA_TEST_BACKEND") or "gloo"
dist.init_process_group(backend)
local rank, world = dist.get_rank(), dist.get_world_size()
local device, kind = "cpu", "cpu"
if backend == "nccl" then
  device, kind = "cuda:" .. dist.get_local_rank(), "cuda"
  torch.cuda.set_device(device)
end
local tap = dofile(here .. "/rank_tap.lua")
local ok, raises = tap.ok, tap.raises

local Block = nn.Module:extend("Block")
function Block:__init(d)
  self.ln = nn.LayerNorm(d)
  self.fc1 = nn.Linear(d, 2 * d)
  self.fc2 = nn.Linear(2 * d, d)
  self.drop = nn.Dropout(0.1)
end
function Block:forward(x) return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln(x))))) end

local function net()
  torch.manual_seed(5)
  return nn.Sequential(nn.Linear(12, 16), Block(16), Block(16), nn.Linear(16, 5)):to(device)
end

local K, BATCH = 5, 12
torch.manual_seed(3)
local xs, ys = {}, {}
for s = 1, K do xs[s], ys[s] = torch.randn(BATCH, 12):to(device), torch.randint(0, 5, { BATCH }):to(device) end
local per = math.floor(BATCH / world)
local crit = nn.CrossEntropyLoss()

local function train(model, opt, clip)
  torch.manual_seed(100 + rank)   -- the dropout masks: the same stream in both runs
  local norms = {}
  for s = 1, K do
    opt:zero_grad()
    crit(model(xs[s]:narrow(0, rank * per, per)), ys[s]:narrow(0, rank * per, per)):backward()
    norms[s] = clip(model)
    opt:step()
  end
  return norms
end
local function adamw(params) return optim.AdamW(params, { lr = 0.02, betas = { 0.8, 0.95 }, weight_decay = 0.05 }) end

if rank == 0 then print("1..26") end
local ddp = nn.parallel.DistributedDataParallel(net())
local ddp_norms = train(ddp, adamw(ddp:parameters()), function(m) return nn.utils.clip_grad_norm_(m:parameters(), 0.5):item() end)
local want = ddp.module:state_dict()

local model = fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) })
local fsdp_norms = train(model, adamw(model:parameters()), function(m) return m:clip_grad_norm_(0.5):item() end)
local got = model:state_dict()
local worst, same = 0, #got:keys() == #want:keys()
for _, k in ipairs(want:keys()) do
  same = same and got[k] ~= nil
  if same then worst = math.max(worst, (got[k] - want[k]):abs():max():item()) end
end
ok(same and worst < 1e-5, string.format("%d ranks: %d AdamW steps with dropout and clipping end where DDP's end " ..
                                        "(worst difference %.2e)", world, K, worst))
local nworst = 0
for s = 1, K do nworst = math.max(nworst, math.abs(fsdp_norms[s] - ddp_norms[s])) end
ok(nworst < 1e-5, string.format("clip_grad_norm_: the same total norms as DDP's (worst difference %.2e)", nworst))

-- prefetching: by default each unit's backward starts the gather of the
-- unit whose backward comes next (from the last step's order); with
-- forward_prefetch the forward does the same; either way the same steps
do
  local used = 0
  for _, u in ipairs(model._units) do used = used + (u.prefetches_used or 0) end
  ok(used == K - 1, string.format("backward prefetch: %d gathers prefetched in %d steps (one a step after the first)",
                                  used, K))
  local fwd = fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }),
                                                     forward_prefetch = true, backward_prefetch = false })
  train(fwd, adamw(fwd:parameters()), function(m) return m:clip_grad_norm_(0.5):item() end)
  local fsd, fworst = fwd:state_dict(), 0
  for _, k in ipairs(want:keys()) do fworst = math.max(fworst, (fsd[k] - want[k]):abs():max():item()) end
  local fused = 0
  for _, u in ipairs(fwd._units) do fused = fused + (u.prefetches_used or 0) end
  ok(fworst < 1e-5 and fused == K - 1,
     string.format("forward_prefetch (backward's off): %d prefetched gathers, DDP's weights (worst %.2e)", fused, fworst))
end

-- SHARD_GRAD_OP: the forward's graph is kept on the gathered parameters
-- until the backward, so a block runs once a step, and trains the same
do
  local keep = fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }),
                                                      sharding_strategy = fsdp.ShardingStrategy.SHARD_GRAD_OP })
  local calls = 0
  keep.module[1].fc1:register_forward_hook(function() calls = calls + 1 end)
  local keep_norms = train(keep, adamw(keep:parameters()), function(m) return m:clip_grad_norm_(0.5):item() end)
  local kept, kworst = keep:state_dict(), 0
  for _, k in ipairs(want:keys()) do kworst = math.max(kworst, (kept[k] - want[k]):abs():max():item()) end
  for s = 1, K do kworst = math.max(kworst, math.abs(keep_norms[s] - ddp_norms[s])) end
  ok(kworst < 1e-5, string.format("SHARD_GRAD_OP: the same weights and norms as DDP's (worst difference %.2e)", kworst))
  ok(calls == K, string.format("SHARD_GRAD_OP: a block runs once a step (%d calls in %d steps)", calls, K))
  ok(keep.module[1].fc1.weight:numel() == 0, "SHARD_GRAD_OP: between steps a block holds no parameters")
  local loss = crit(keep(xs[1]:narrow(0, rank * per, per)), ys[1]:narrow(0, rank * per, per))
  loss:backward(nil, true)
  local again, err = pcall(loss.backward, loss)
  ok(not again and tostring(err):find("serves one backward", 1, true) ~= nil,
     "SHARD_GRAD_OP: a second backward through a unit says it needs FULL_SHARD")
end

-- MixedPrecision(bf16, reduce in float32): each block computes in
-- bfloat16 from bfloat16 copies of its float32 parameters, as DDP over
-- blocks that cast their parameters and input to bfloat16 and their
-- result back (the same bf16 arithmetic; gradients averaged in float32)
do
  local Island = nn.Module:extend("Island")
  function Island:__init(block) self.block = block end
  function Island:forward(x)
    local low = {}
    for _, e in ipairs(self.block:named_parameters()) do low[e[1]] = e[2]:to(torch.bfloat16) end
    return torch.func.functional_call(self.block, low, x:to(torch.bfloat16)):to(x.dtype)
  end
  local function islands()
    local m = net()
    m:set_submodule("1", Island(m[1]))
    m:set_submodule("2", Island(m[2]))
    return m
  end
  local ref = nn.parallel.DistributedDataParallel(islands())
  train(ref, adamw(ref:parameters()), function(m) return nn.utils.clip_grad_norm_(m:parameters(), 0.5):item() end)
  local rsd = ref.module:state_dict()
  local mp = fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }),
      mixed_precision = fsdp.MixedPrecision({ param_dtype = torch.bfloat16, reduce_dtype = torch.float32 }) })
  local seen = {}
  mp.module[1].fc1:register_forward_hook(function(m, args, out)
    seen[#seen + 1] = m.weight.dtype.name .. "/" .. args[1].dtype.name .. "/" .. out.dtype.name
  end)
  train(mp, adamw(mp:parameters()), function(m) return m:clip_grad_norm_(0.5):item() end)
  local msd, mworst = mp:state_dict(), 0
  for _, k in ipairs(msd:keys()) do
    local rk = k:gsub("^(%d)%.", "%1.block.")
    if k:match("^[12]%.") then mworst = math.max(mworst, (msd[k] - rsd[rk]):abs():max():item())
    else mworst = math.max(mworst, (msd[k] - rsd[k]):abs():max():item()) end
  end
  ok(mworst < 1e-5, string.format("MixedPrecision(bf16): trains as DDP over bf16 blocks (worst difference %.2e)", mworst))
  ok(seen[1] == "bfloat16/bfloat16/bfloat16" and mp._units[1].shard.dtype == torch.float32 and
     msd["1.fc1.weight"].dtype == torch.float32,
     "MixedPrecision: a block computes in bfloat16, its shard and the state dict stay float32: " .. tostring(seen[1]))
end

-- summon_full_params: the whole parameters inside fn, written back
do
  local w = model.module[1].fc1.weight
  local inside = model:summon_full_params(function() return model.module[1].fc1.weight:clone() end)
  local sd = model:state_dict()
  ok(torch.equal(inside, sd["1.fc1.weight"]) and w:numel() == 0,
     "summon_full_params: a block's whole weight inside fn, the placeholder after")
  model:summon_full_params(function() model.module[1].fc1.bias:fill_(0.25) end, { writeback = false })
  local kept = model:state_dict()["1.fc1.bias"]
  model:summon_full_params(function() model.module[1].fc1.bias:fill_(0.5) end)
  local written = model:state_dict()["1.fc1.bias"]
  ok(torch.equal(kept, sd["1.fc1.bias"]) and written:eq(0.5):all():item(),
     "summon_full_params: changes go back to the shards unless writeback = false")
  -- the max-norm clip over shards and whole gradients
  local function inf_norm(m, clip)
    torch.manual_seed(100 + rank)
    for _, p in ipairs(m:parameters()) do p.grad = nil end
    crit(m(xs[1]:narrow(0, rank * per, per)), ys[1]:narrow(0, rank * per, per)):backward()
    return clip(m)
  end
  local d = nn.parallel.DistributedDataParallel(net())
  local want_inf = inf_norm(d, function(m) return nn.utils.clip_grad_norm_(m:parameters(), 1e9, math.huge):item() end)
  local f = fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) })
  local got_inf = inf_norm(f, function(m) return m:clip_grad_norm_(1e9, math.huge):item() end)
  ok(math.abs(got_inf - want_inf) < 1e-6 * want_inf,
     string.format("clip_grad_norm_ with norm_type = math.huge: DDP's max-norm (%.6f, %.6f)", got_inf, want_inf))
  if rank == 0 then f._units[1].shard.grad[0] = 0 / 0 end
  local nan = f:clip_grad_norm_(1e9, math.huge):item()
  ok(nan ~= nan, "a NaN in one rank's shard makes every rank's max-norm NaN")
end

local block = model.module[1]
local shard = model._units[1].shard
ok(block.fc1.weight:numel() == 0 and shard:numel() == math.ceil((16 * 32 + 32 + 32 * 16 + 16 + 32) / world),
   "between uses a block holds no parameters; its shard is 1/" .. world .. " of them")
ok(#model:parameters() == 2 + 4, "parameters(): the two shards, then the four whole ones")

local again = fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) })
again:load_state_dict(got)
local back, diff = again:state_dict(), 0
for _, k in ipairs(got:keys()) do diff = math.max(diff, (back[k] - got[k]):abs():max():item()) end
ok(diff == 0, "load_state_dict of the whole state dict: each rank keeps its shards, state_dict gives it back")

-- a parameter a block shares with the rest of the model stays whole (tied weights)
local function tied()
  local m = net()
  m[1].ln.weight = m[0].bias     -- the first block's LayerNorm scale is the input layer's bias
  return m
end
ddp = nn.parallel.DistributedDataParallel(tied())
train(ddp, adamw(ddp:parameters()), function(m) return nn.utils.clip_grad_norm_(m:parameters(), 0.5):item() end)
want = ddp.module:state_dict()
model = fsdp.FullyShardedDataParallel(tied(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) })
train(model, adamw(model:parameters()), function(m) return m:clip_grad_norm_(0.5):item() end)
got, worst = model:state_dict(), 0
for _, k in ipairs(want:keys()) do worst = math.max(worst, (got[k] - want[k]):abs():max():item()) end
ok(worst < 1e-5 and model.module[1].ln.weight:numel() == 16,
   string.format("a weight tied between a block and the rest stays whole and trains as DDP's (worst %.2e)", worst))

-- under bf16 autocast the recomputation casts as the forward did: a
-- block's first Linear gives bfloat16 in both runs of a step
local function autocast_step(model)
  local seen = {}
  model.module[1].fc1:register_forward_hook(function(_, _, out) seen[#seen + 1] = out.dtype.name end)
  torch.manual_seed(100 + rank)
  local y = torch.autocast(kind, { dtype = torch.bfloat16 }, function()
    return model(xs[1]:narrow(0, rank * per, per)):float()
  end)
  crit(y, ys[1]:narrow(0, rank * per, per)):backward()
  return seen
end
local seen = autocast_step(fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) }))
ok(#seen == 2 and seen[1] == "bfloat16" and seen[2] == "bfloat16",
   "under bf16 autocast a block runs twice a step (forward, recomputation), both in bfloat16: " .. table.concat(seen, ", "))

-- two micro-batches accumulated (inside no_sync, as PyTorch loops write
-- it) give the gradient of their mean: the clip norm of one step over the
-- whole batch
do
  local half = math.floor(per / 2)
  local function grad_norm(m, micro)
    torch.manual_seed(100 + rank)
    for _, p in ipairs(m:parameters()) do p.grad = nil end
    local x, y = xs[1]:narrow(0, rank * per, 2 * half), ys[1]:narrow(0, rank * per, 2 * half)
    m:eval()   -- (no dropout: the two ways draw different masks)
    if micro then
      m:no_sync(function()
        local first = crit(m(x:narrow(0, 0, half)), y:narrow(0, 0, half)) / 2
        first:backward()
      end)
      local second = crit(m(x:narrow(0, half, half)), y:narrow(0, half, half)) / 2
      second:backward()
    else
      crit(m(x), y):backward()
    end
    return m:clip_grad_norm_(1e9):item()
  end
  local m = fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) })
  local whole, accumulated = grad_norm(m, false), grad_norm(m, true)
  ok(math.abs(whole - accumulated) < 1e-5 * whole,
     string.format("micro-batches accumulated through no_sync: the whole batch's gradient (norms %.6f, %.6f)", whole,
                   accumulated))
end

raises(function() fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = 3 }) end,
       "expected auto_wrap_policy to be a function", "an auto_wrap_policy that is not a function")
raises(function() fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }),
                                                        sharding_strategy = "HYBRID_SHARD" }) end,
       'sharding_strategy "FULL_SHARD" and "SHARD_GRAD_OP" are implemented here, got HYBRID_SHARD', "an unknown strategy")
raises(function() fsdp.MixedPrecision({ buffer_dtype = torch.bfloat16 }) end,
       "option 'buffer_dtype' is not supported here", "MixedPrecision's buffer_dtype")
raises(function() fsdp.FullyShardedDataParallel(net(), { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }),
                                                        backward_prefetch = "EARLY" }) end,
       'expected backward_prefetch to be "BACKWARD_PRE"', "an unknown backward_prefetch")
raises(function() again:to("cpu") end, "move the model to its device and dtype before wrapping it",
       "moving the wrapped model says to move it first")
raises(function() nn.parallel.DistributedDataParallel(net(), { sharding_strategy = "FULL_SHARD" }) end,
       "use dist.fsdp.FullyShardedDataParallel", "DDP with FULL_SHARD points to FullyShardedDataParallel")
dist.destroy_process_group()
