-- Run under the launcher: dplua --nproc_per_node=N tests/dist/sync_batchnorm.lua
-- TAP from rank 0 (the other ranks print only what fails).
--
-- nn.SyncBatchNorm with the batch split across the ranks (rank r takes
-- rows [r*N/W, (r+1)*N/W), uneven where N does not divide) against
-- PyTorch's BatchNorm on the whole batch (tests/ref/batch_norm.lua, from
-- scripts/gen_batch_norm_ref.py, float64): over three training steps and
-- one in eval mode, this rank's rows of the output and of the input
-- gradient, the weight and bias gradients summed over the ranks, and the
-- running statistics on every rank. Then convert_sync_batchnorm under
-- DistributedDataParallel: three SGD steps on half batches give the
-- parameters and running statistics of BatchNorm on the whole batch in
-- one process, and argument errors. With DPLUA_TEST_BACKEND=nccl
-- (scripts/device-check multi) each rank runs on its GPU.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local torch = require("dplua")
local nn, dist = torch.nn, torch.distributed
local ref = dofile(here .. "/../ref/batch_norm.lua")
torch.set_default_dtype(torch.float64)

local rank = tonumber(os.getenv("RANK") or "0")
local tap = dofile(here .. "/rank_tap.lua")
local ok, raises = tap.ok, tap.raises

-- the worst difference between two lists, relative to max(|want|, 1)
local function worst(got, want)
  if #got ~= #want then return math.huge end
  local w = 0
  for i = 1, #want do
    w = math.max(w, math.abs(got[i] - want[i]) / math.max(math.abs(want[i]), 1))
  end
  return w
end
local function close(got, want, what)
  local w = worst(got, want)
  ok(w <= 1e-12, string.format("%s (worst difference %.3g)", what, w))
end

local backend = os.getenv("DPLUA_TEST_BACKEND") or "gloo"
dist.init_process_group(backend)
local world = dist.get_world_size()
local device = "cpu"
if backend == "nccl" then
  device = "cuda:" .. dist.get_local_rank()
  torch.cuda.set_device(device)
end

local makers = {
  bn1d_nc = function() return nn.SyncBatchNorm(3) end,
  bn1d_ncl = function() return nn.SyncBatchNorm(4, { eps = 1e-3, momentum = 0.3 }) end,
  bn2d = function() return nn.SyncBatchNorm(3) end,
  bn2d_cumulative = function() return nn.SyncBatchNorm(2, { momentum = false }) end,
  bn2d_no_affine = function() return nn.SyncBatchNorm(2, { affine = false }) end,
}

local function x_of(shape, step)
  local count = 1
  for _, s in ipairs(shape) do count = count * s end
  local v = {}
  for k = 0, count - 1 do v[k + 1] = math.sin(1 + 0.37 * k + step) end
  return torch.tensor(v):reshape(shape):to(device)
end

local function flat(t) return t:detach():cpu():reshape(-1):tolist() end

local names = {}
for name in pairs(makers) do names[#names + 1] = name end
table.sort(names)
for _, name in ipairs(names) do
  local r = ref[name]
  local N = r.shape[1]
  if N >= world then
    local lo, hi = math.floor(rank * N / world), math.floor((rank + 1) * N / world)
    local m = makers[name]():to(device)
    for step = 0, 3 do
      if step == 3 then m:eval() end
      local what = string.format("%s step %d%s on %d ranks", name, step, step == 3 and " (eval)" or "", world)
      local whole = x_of(r.shape, step)
      local x = whole:narrow(0, lo, hi - lo):contiguous():requires_grad_()
      local y = m(x)
      local wt = torch.arange(0, whole:numel(), { dtype = torch.float64, device = device }):cos():reshape(whole:size())
      local loss = (y * wt:narrow(0, lo, hi - lo)):sum()
      loss:backward()
      local want = r.steps[step + 1]
      local per_row = whole:numel() / N
      local function rows(list)
        local out = {}
        for i = lo * per_row + 1, hi * per_row do out[#out + 1] = list[i] end
        return out
      end
      close(flat(y), rows(want.y), what .. ": this rank's rows of the output")
      close(flat(x.grad), rows(want.dx), what .. ": this rank's rows of the input gradient")
      if want.dweight then
        local dw, db = m.weight.grad:clone(), m.bias.grad:clone()
        dist.all_reduce(dw)
        dist.all_reduce(db)
        close(flat(dw), want.dweight, what .. ": weight gradient summed over the ranks")
        close(flat(db), want.dbias, what .. ": bias gradient summed over the ranks")
        m.weight.grad, m.bias.grad = nil, nil
      end
      if want.running_mean then
        close(flat(m.running_mean), want.running_mean, what .. ": running mean")
        close(flat(m.running_var), want.running_var, what .. ": running variance")
      end
    end
  end
end

-- convert_sync_batchnorm under DDP against BatchNorm1d on the whole batch
local function make_model()
  torch.manual_seed(7)
  return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)):to(device)
end
local plain = make_model()
local converted = nn.SyncBatchNorm.convert_sync_batchnorm(make_model())
ok(torch.nn.isinstance(converted[1], nn.SyncBatchNorm) and torch.nn.isinstance(plain[1], nn.BatchNorm1d),
   "convert_sync_batchnorm replaces the BatchNorm1d of a Sequential")
ok(converted[1].momentum == 0.1 and converted[1].eps == 1e-5 and converted[1].affine,
   "and keeps its options")
local model = nn.parallel.DistributedDataParallel(converted)
local opt = torch.optim.SGD(model:parameters(), { lr = 0.1 })
local ref_opt = torch.optim.SGD(plain:parameters(), { lr = 0.1 })
local N = 4 * world
local per = N / world
for step = 1, 3 do
  local X = x_of({ N, 4 }, step)
  local wt = torch.arange(0, N * 2, { dtype = torch.float64, device = device }):sin():reshape({ N, 2 })
  -- DDP averages the ranks' gradients: the whole batch's loss divided by the world size
  ref_opt:zero_grad()
  local whole_loss = (plain(X) * wt):sum() / world
  whole_loss:backward()
  ref_opt:step()
  opt:zero_grad()
  local loss = (model(X:narrow(0, rank * per, per)) * wt:narrow(0, rank * per, per)):sum()
  loss:backward()
  opt:step()
end
local got, want = {}, {}
for _, p in ipairs(converted:parameters()) do for _, v in ipairs(flat(p)) do got[#got + 1] = v end end
for _, p in ipairs(plain:parameters()) do for _, v in ipairs(flat(p)) do want[#want + 1] = v end end
close(got, want, "SyncBatchNorm under DDP: parameters after 3 SGD steps equal BatchNorm's on the whole batch")
close(flat(converted[1].running_var), flat(plain[1].running_var), "and so do the running variances")
converted:eval(); plain:eval()
local X = x_of({ 3, 4 }, 9)
close(flat(model(X)), flat(plain(X)), "and the outputs in eval mode (from the running statistics)")

raises(function() nn.SyncBatchNorm(3)(torch.ones(4, { device = device })) end, "expected at least 2D input", "a 1-D input")
raises(function() nn.SyncBatchNorm(3)(torch.ones(4, 2, { device = device })) end, "expected 3 channels", "an input of 2 channels")
raises(function() nn.SyncBatchNorm(3, { group = 1 }) end, "group", "an unknown option")
raises(function() nn.SyncBatchNorm.convert_sync_batchnorm(42) end, "expected an nn.Module", "converting a number")

dist.destroy_process_group()
if rank == 0 then print("1.." .. tap.n) end
