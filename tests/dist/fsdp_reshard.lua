-- Run under the launcher on 3 ranks: dplua --nproc_per_node=3 tests/dist/fsdp_reshard.lua DIR
-- A FullyShardedDataParallel run stopped after K steps on 2 ranks (a
-- subgroup) and resumed on 3 from its whole state dict and its
-- optim_state_dict() (the optimizer state by parameter name, written to
-- DIR by rank 0) ends where the same 2K steps on 2 ranks end; the
-- optimizer state's layout is PyTorch's (names, parameter shapes); a
-- round trip through optim_state_dict_to_load gives it back; bad input
-- says what is wrong; the same through every rank's own
-- sharded_state_dict() and load_sharded_state_dict. Without dropout (eval mode), so that the split of
-- the batch over the ranks does not change the steps. Prints TAP (rank 0;
-- every rank prints a failure).
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed
local F = nn.functional
local fsdp = dist.fsdp

dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()
assert(world == 3, "fsdp_reshard.lua runs on 3 ranks")
local dir = assert(arg[1], "usage: fsdp_reshard.lua DIR")
local tap = dofile(here .. "/rank_tap.lua")
local ok, raises = tap.ok, tap.raises

local Block = nn.Module:extend("Block")
function Block:__init(d)
  self.ln = nn.LayerNorm(d)
  self.fc1 = nn.Linear(d, 2 * d)
  self.fc2 = nn.Linear(2 * d, d)
end
function Block:forward(x) return x + self.fc2(F.gelu(self.fc1(self.ln(x)))) end

local function wrapped(group)
  torch.manual_seed(5)
  local m = nn.Sequential(nn.Linear(12, 16), Block(16), Block(16), nn.Linear(16, 5))
  local model = fsdp.FullyShardedDataParallel(m, { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }),
                                                   process_group = group })
  model:eval()
  return model
end
local function adamw(model)
  local decay, no_decay = {}, {}
  for _, e in ipairs(model:named_parameters()) do
    if e[1]:match("_flat_shard$") or e[2]:dim() >= 2 then decay[#decay + 1] = e[2] else no_decay[#no_decay + 1] = e[2] end
  end
  return optim.AdamW({ { params = decay, weight_decay = 0.05 }, { params = no_decay, weight_decay = 0 } },
                     { lr = 0.02, betas = { 0.8, 0.95 } })
end

local K, BATCH = 3, 12
torch.manual_seed(3)
local xs, ys = {}, {}
for s = 1, 2 * K do xs[s], ys[s] = torch.randn(BATCH, 12), torch.randint(0, 5, { BATCH }) end
local crit = nn.CrossEntropyLoss()
local function train(model, opt, from, to, group_rank, group_size)
  local per = BATCH / group_size
  for s = from, to do
    opt:zero_grad()
    crit(model(xs[s]:narrow(0, group_rank * per, per)), ys[s]:narrow(0, group_rank * per, per)):backward()
    opt:step()
  end
end

if rank == 0 then print("1..9") end
local pair = dist.new_group({ 0, 1 })
local path = dir .. "/reshard.safetensors"
local whole
if rank < 2 then
  -- the uninterrupted run: 2K steps on 2 ranks
  local model = wrapped(pair)
  train(model, adamw(model), 1, 2 * K, rank, 2)
  whole = model:state_dict()
  -- the run stopped after K steps on 2 ranks
  model = wrapped(pair)
  local opt = adamw(model)
  train(model, opt, 1, K, rank, 2)
  local osd = model:optim_state_dict(opt)
  local sd = model:state_dict()
  if rank == 0 then
    local e = osd.state["1.fc1.weight"]
    ok(e ~= nil and torch.is_tensor(e.exp_avg) and table.concat(e.exp_avg:size(), ",") == "32,16" and e.step == K and
       osd.state["0.weight"] ~= nil and osd.param_groups[1].params[1] ~= nil,
       "optim_state_dict: the state by parameter name, in the parameters' shapes (PyTorch's layout)")
    local again = adamw(model)
    again:load_state_dict(model:optim_state_dict_to_load(again, osd))
    local back = again:state_dict()
    local same = true
    for id, st in pairs(opt:state_dict().state) do
      for k, v in pairs(st) do
        local w = back.state[id] and back.state[id][k]
        if torch.is_tensor(v) then same = same and torch.is_tensor(w) and torch.equal(v, w) else same = same and v == w end
      end
    end
    ok(same, "optim_state_dict_to_load on the same ranks gives the optimizer its state back")
    torch.save({ model = sd, optimizer = osd }, path)
  end
  -- and each rank's own part, gathering nothing
  torch.save(model:sharded_state_dict(opt), string.format("%s/sharded.rank%d.safetensors", dir, rank))
  -- (only rank 1 still has the pair's collectives to match: nothing left)
end
dist.barrier()

-- resumed on 3 ranks
local ck = torch.load(path)
local model = wrapped(nil)
local opt = adamw(model)
model:load_state_dict(ck.model)
opt:load_state_dict(model:optim_state_dict_to_load(opt, ck.optimizer))
ok(opt:state_dict().state[0].exp_avg:numel() == model._units[1].shard:numel(),
   "optim_state_dict_to_load on 3 ranks: each rank's shard of the state")
train(model, opt, K + 1, 2 * K, rank, 3)
local got = model:state_dict()
if rank < 2 then
  local worst = 0
  for _, k in ipairs(whole:keys()) do worst = math.max(worst, (got[k] - whole[k]):abs():max():item()) end
  ok(worst < 1e-5, string.format("stopped on 2 ranks after %d steps and resumed on 3: the uninterrupted run's weights "
                                 .. "(worst difference %.2e)", K, worst))
end

-- resumed on 3 ranks from the 2 ranks' own parts
do
  local parts = { torch.load(dir .. "/sharded.rank0.safetensors"), (torch.load(dir .. "/sharded.rank1.safetensors")) }
  local m2 = wrapped(nil)
  local o2 = adamw(m2)
  m2:load_sharded_state_dict(parts, o2)
  train(m2, o2, K + 1, 2 * K, rank, 3)
  local got2 = m2:state_dict()
  if rank < 2 then
    local worst = 0
    for _, k in ipairs(whole:keys()) do worst = math.max(worst, (got2[k] - whole[k]):abs():max():item()) end
    ok(worst < 1e-5, string.format("stopped on 2 ranks, each saving its sharded_state_dict, resumed on 3 by " ..
                                   "load_sharded_state_dict: the uninterrupted run's weights (worst difference %.2e)", worst))
  end
  torch.manual_seed(5)
  local narrow = fsdp.FullyShardedDataParallel(nn.Sequential(nn.Linear(12, 8), Block(8), Block(8), nn.Linear(8, 5)),
                                               { auto_wrap_policy = fsdp.ModuleWrapPolicy({ Block }) })
  local fits, why = pcall(narrow.load_sharded_state_dict, narrow, parts)
  ok(not fits and tostring(why):find("unit 1 has 1104 parameter elements, this model's 296", 1, true) ~= nil,
     "load_sharded_state_dict into another model names the unit that differs: " .. tostring(why):sub(1, 160))
  local swapped = { parts[2], parts[1] }
  local good, err = pcall(m2.load_sharded_state_dict, m2, swapped, o2)
  ok(not good and tostring(err):find("in rank order; entry 1 is rank 1 of 2", 1, true) ~= nil,
     "load_sharded_state_dict of shards out of order says so")
end

raises(function() model:optim_state_dict_to_load(opt, { state = {}, param_groups = {} }) end,
       "the state dict has 0 parameter groups, the optimizer 2", "a state dict of other groups")
raises(function() model:optim_state_dict(5) end, "expected an optimizer", "optim_state_dict of a number")
dist.destroy_process_group()
