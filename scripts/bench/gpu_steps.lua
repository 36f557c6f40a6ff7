-- dplua's side of scripts/bench/gpu_steps: training steps on one GPU,
-- printed as "name value" lines (µs per step, TFLOP/s or MiB), or
-- "name error: message" when a measurement fails, so that one missing API
-- costs its row and not the table. Without a GPU it prints "no_gpu" only.
-- gpu_steps.py is the same on PyTorch: same shapes, seeds, step counts.
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim
local clock = torch.utils.progress.clock   -- seconds, monotonic
io.stdout:setvbuf("line")                  -- rows printed before a crash still reach the driver

local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end
local dev = "cuda"

local SMALL = { warm = 100, probe = 50, blocks = 7, block_s = 0.2, min = 20, max = 5000 }
local BIG = { warm = 2, probe = 1, blocks = 5, block_s = 0.3, min = 1, max = 20 }

-- Seconds per call of step(): warm up, time a few calls to choose how many
-- make a block of about o.block_s, then the median of o.blocks timed
-- blocks, each between two synchronize() calls.
local function measure(step, o)
  for _ = 1, o.warm do step() end
  torch.cuda.synchronize()
  local t0 = clock()
  for _ = 1, o.probe do step() end
  torch.cuda.synchronize()
  local per = (clock() - t0) / o.probe
  local n = math.max(o.min, math.min(o.max, math.floor(o.block_s / per)))
  local times = {}
  for b = 1, o.blocks do
    torch.cuda.synchronize()
    local t = clock()
    for _ = 1, n do step() end
    torch.cuda.synchronize()
    times[b] = (clock() - t) / n
  end
  table.sort(times)
  return times[math.floor((#times + 1) / 2)]
end

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local T = dofile(here .. "/timing.lua")
local row = T.row
local models = dofile(here .. "/models.lua")
local SimpleNN = models.SimpleNN

-- model on the GPU, SGD, cross-entropy, a fixed batch; step() is one
-- whole training step (zero_grad, forward, loss, backward, step)
local function setup(model, batch, in_features, classes, lr)
  torch.manual_seed(0)
  model = model():to(dev)
  local x = torch.rand(batch, in_features):to(dev)
  local y = torch.randint(0, classes, { batch }):to(dev)
  return models.sgd_step(model, x, y, lr)
end
local function mlp()
  return models.mlp()
end

local mib = 1024 * 1024
local mem = {}

row("seed_eager", function()
  return measure(setup(SimpleNN, 32, 10, 2, 0.001), SMALL) * 1e6
end)

row("mlp", function()
  collectgarbage(); collectgarbage()
  torch.cuda.reset_peak_memory_stats()
  local base = torch.cuda.memory_allocated()
  local t = measure(setup(mlp, 256, 784, 10, 0.01), SMALL)
  mem.peak = torch.cuda.max_memory_allocated()
  mem.step = mem.peak - base
  return t * 1e6
end)
-- pytorch/examples' MNIST CNN, batch 64 (inputs 1 x 28 x 28)
row("cnn", function()
  torch.manual_seed(0)
  local model = models.MnistCNN():to(dev)
  local x, y = torch.rand(64, 1, 28, 28):to(dev), torch.randint(0, 10, { 64 }):to(dev)
  return measure(models.sgd_step(model, x, y), SMALL) * 1e6
end)
row("mlp_peak_mib", function() return assert(mem.peak, "the MLP row failed") / mib end)
row("mlp_step_mib", function() return assert(mem.step, "the MLP row failed") / mib end)

-- 4 x Linear(8192, 8192, bias=false) with ReLU between, batch 8192, loss
-- mean(out^2), SGD: 6 * batch * 8192^2 * 4 FLOPs per step (fwd + bwd).
local N = 8192
for _, p in ipairs({ { "big_bf16", torch.bfloat16, false }, { "big_tf32", torch.float32, true },
                     { "big_fp32", torch.float32, false } }) do
  row(p[1], function()
    torch.backends.cuda.matmul.allow_tf32 = p[3]
    torch.manual_seed(0)
    local model = nn.Sequential(nn.Linear(N, N, false), nn.ReLU(), nn.Linear(N, N, false), nn.ReLU(),
                                nn.Linear(N, N, false), nn.ReLU(), nn.Linear(N, N, false))
    model:to(dev, p[2])
    local x = torch.rand(N, N):to(dev, p[2])
    local opt = optim.SGD(model:parameters(), { lr = 0.001 })
    local function step()
      opt:zero_grad()
      local loss = model(x):square():mean()
      loss:backward()
      opt:step()
    end
    local t = measure(step, BIG)
    torch.backends.cuda.matmul.allow_tf32 = false
    return 6 * N * N * N * 4 / t / 1e12
  end)
  torch.backends.cuda.matmul.allow_tf32 = false
end

-- last: a capture that fails may leave the stream unusable for what follows
row("seed_graph", function()
  if torch.cuda.graph == nil then error("torch.cuda.graph is not in this build", 0) end
  local step = setup(SimpleNN, 32, 10, 2, 0.001)
  for _ = 1, 20 do step() end   -- eager warm-up, as PyTorch's recipe does on a side stream
  torch.cuda.synchronize()
  local g = torch.cuda.graph(step)
  local function replay() g:replay() end
  return measure(replay, SMALL) * 1e6
end)
