-- Run under the launcher: dplua --nproc_per_node=N tests/dist/ddp_features.lua
-- TAP from rank 0 (the other ranks stay silent unless something fails).
-- no_sync accumulates locally and the next synchronised backward averages
-- the sum; gradient accumulation (loss / k over k micro-batches, no_sync
-- around all but the last, then one step), plain and checkpointed, equals
-- PyTorch's whole batch (tests/ref/train.lua, two ranks); an unused
-- parameter is an error naming it unless
-- find_unused_parameters=true; state_dict keys carry the "module." prefix;
-- parameters start equal on every rank (broadcast from rank 0);
-- register_comm_hook's bf16_compress_hook averages in bfloat16.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local torch = require("dplua")
local nn, dist = torch.nn, torch.distributed

dist.init_process_group("gloo")
local rank, world = dist.get_rank(), dist.get_world_size()
local tap = dofile(here .. "/rank_tap.lua")
local ok = tap.ok

-- every rank seeds differently: DDP must still start from rank 0's weights
torch.manual_seed(100 + rank)
local ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 3):to(torch.float64))
local w = ddp.module.weight:detach():clone()
local all = torch.empty({ world * w:numel() }, { dtype = torch.float64 })
dist.all_gather_into_tensor(all, w:reshape(-1):contiguous())
ok((all:view(world, -1) - w:reshape(1, -1)):abs():max():item() == 0, "parameters are broadcast from rank 0")

local keys = ddp:state_dict():keys()
ok(keys[1] == "module.weight" and keys[2] == "module.bias", "state_dict keys have the module. prefix")

-- no_sync: two local backward passes, then a synchronised third
torch.manual_seed(7)
local xs = {}
for i = 1, 3 do xs[i] = torch.rand(world, 2, 4, { dtype = torch.float64 }) end
ddp:no_sync(function()
  ddp(xs[1][rank]):sum():backward()
  ddp(xs[2][rank]):sum():backward()
end)
ddp(xs[3][rank]):sum():backward()
-- expected: the average over ranks of each rank's three-batch sum of gradients
local ref = nn.Linear(4, 3):to(torch.float64)
torch.no_grad(function() ref.weight:copy_(w); ref.bias:copy_(ddp.module.bias) end)
for r = 0, world - 1 do
  for i = 1, 3 do ref(xs[i][r]):sum():backward() end
end
local diff = (ddp.module.weight.grad - ref.weight.grad / world):abs():max():item()
ok(diff < 1e-12, "no_sync accumulates locally, the next backward averages (diff " .. diff .. ")")

-- gradient accumulation: each of 2 ranks takes 4 of the 8 rows of
-- PyTorch's batch in k = 2 micro-batches of loss / k
if world == 2 then
  local A = dofile(here .. "/../ref/train.lua").accumulate
  local function t(v, shape) return torch.tensor(v, { dtype = torch.float64 }):reshape(shape) end
  for _, ckpt in ipairs({ false, true }) do
    local m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)):to(torch.float64)
    torch.no_grad(function()
      m[0].weight:copy_(t(A.w1, { 6, 4 })); m[0].bias:copy_(t(A.b1, { 6 }))
      m[2].weight:copy_(t(A.w2, { 2, 6 })); m[2].bias:copy_(t(A.b2, { 2 }))
    end)
    local model = nn.parallel.DistributedDataParallel(m)
    local opt = torch.optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9 })
    local x, y = t(A.x, { 8, 4 }):narrow(0, 4 * rank, 4), t(A.y, { 8, 2 }):narrow(0, 4 * rank, 4)
    local k = 2
    local function micro(i)
      local xb, yb = x:narrow(0, 2 * i, 2), y:narrow(0, 2 * i, 2)
      local out = ckpt and torch.utils.checkpoint.checkpoint(model, xb) or model(xb)
      local loss = nn.functional.mse_loss(out, yb) / k
      loss:backward()
    end
    opt:zero_grad()
    model:no_sync(function() for i = 0, k - 2 do micro(i) end end)
    micro(k - 1)
    local worst = 0
    for i, p in ipairs(m:parameters()) do
      worst = math.max(worst, (p.grad - t(A.grads[i], p:size())):abs():max():item())
    end
    opt:step()
    for i, p in ipairs(m:parameters()) do
      worst = math.max(worst, (p:detach() - t(A.after_sgd[i], p:size())):abs():max():item())
    end
    ok(worst < 1e-12, string.format("accumulation over micro-batches with no_sync%s equals PyTorch's whole batch "
                                    .. "(diff %g)", ckpt and ", checkpointed," or "", worst))
  end
end

-- unused parameters
local Two = nn.Module:extend("Two")
function Two:__init() self.used = nn.Linear(3, 2); self.unused = nn.Linear(3, 2) end
function Two:forward(x) return self.used(x) end
local strict = nn.parallel.DistributedDataParallel(Two())
local okcall, err = pcall(function() strict(torch.rand(2, 3)):sum():backward() end)
ok(not okcall and tostring(err):find("unused.weight", 1, true) ~= nil and tostring(err):find("find_unused_parameters", 1, true) ~= nil,
   "an unused parameter is an error naming it")
local lenient = nn.parallel.DistributedDataParallel(Two(), { find_unused_parameters = true })
local okcall2, err2 = pcall(function() lenient(torch.rand(2, 3)):sum():backward() end)
ok(okcall2, "find_unused_parameters=true accepts it " .. tostring(err2 or ""))
ok(lenient.module.unused.weight.grad ~= nil and lenient.module.unused.weight.grad:abs():sum():item() == 0,
   "the unused parameter gets a zero gradient")

-- bf16_compress_hook: each bucket averaged in bfloat16: the mean of the
-- ranks' gradients rounded to bfloat16, then back in float32
do
  local hooks = dist.algorithms.ddp_comm_hooks.default_hooks
  torch.manual_seed(11)
  local xw = torch.randn(world, 5, 6)
  local function grads(compress)
    torch.manual_seed(12)
    local m = nn.Linear(6, 4)
    local d = nn.parallel.DistributedDataParallel(m)
    if compress then d:register_comm_hook(nil, hooks.bf16_compress_hook) end
    d(xw[rank]):square():sum():backward()
    return m.weight.grad:clone(), m
  end
  local plain, m = grads(false)
  local compressed = grads(true)
  -- each rank's own gradient, all gathered, then averaged as the hook does
  local mine = torch.func.grad(function(w) return torch.nn.functional.linear(xw[rank], w, m.bias:detach()):square():sum() end)(
    m.weight:detach():clone())
  local every = torch.empty({ world * mine:numel() })
  dist.all_gather_into_tensor(every, mine:reshape(-1):contiguous())
  local want = every:view(world, -1):to(torch.bfloat16):float():mean(0):to(torch.bfloat16):float():view(mine:size())
  ok(torch.equal(compressed, want), "bf16_compress_hook: the ranks' gradients averaged in bfloat16")
  ok(not torch.equal(compressed, plain) and (compressed - plain):abs():max():item() < 1e-2 * plain:abs():max():item(),
     "and not the float32 average, within bfloat16's precision of it")
  local d = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
  local bad = pcall(function() d:register_comm_hook(nil, function() end) end)
  local fp16, e16 = pcall(function() d:register_comm_hook(nil, hooks.fp16_compress_hook) end)
  ok(not bad and not fp16 and tostring(e16):find("no float16", 1, true) ~= nil,
     "a Lua hook of one's own and fp16_compress_hook are refused with the reason")
end

if rank == 0 then print("1.." .. tap.n) end
dist.destroy_process_group()
os.exit(tap.failed and 1 or 0)
