-- The bench scripts/bench/ab runs by default, once per build: an
-- in-place add to a 16-element tensor (a launch's host cost), the eager
-- seed (10-10-2, batch 32), MLP (784-256-128-10, batch 256) and MNIST CNN
-- (batch 64) steps with SGD on the GPU, and the seed and MLP steps
-- replayed from a CUDA graph: the median of 9 timed blocks after a
-- warm-up. arg[1] names the build.
local torch = require("dplua")
local clock = torch.utils.progress.clock
if not torch.cuda.is_available() then print("no_gpu"); os.exit(0) end
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")

local function setup(which)
  torch.manual_seed(0)
  local model, x, y
  if which == "cnn" then
    model, x, y = models.MnistCNN():cuda(), torch.rand(64, 1, 28, 28):cuda(), torch.randint(0, 10, { 64 }):cuda()
  elseif which == "mlp" then
    model, x, y = models.mlp():cuda(), torch.rand(256, 784):cuda(), torch.randint(0, 10, { 256 }):cuda()
  else
    model, x, y = models.SimpleNN():cuda(), torch.rand(32, 10):cuda(), torch.randint(0, 2, { 32 }):cuda()
  end
  return models.sgd_step(model, x, y)
end

-- steps of warm-up and a block: fewer for the CNN, whose step is long
local SHORT = { warm = 3000, per_block = 2000 }
local LONG = { warm = 300, per_block = 200 }
local BLOCKS = 9

local function median_us(step, o)
  o = o or SHORT
  for _ = 1, o.warm do step() end
  local times = {}
  for b = 1, BLOCKS do
    torch.cuda.synchronize()
    local t0 = clock()
    for _ = 1, o.per_block do step() end
    torch.cuda.synchronize()
    times[b] = (clock() - t0) / o.per_block * 1e6
  end
  table.sort(times)
  return times[math.floor((BLOCKS + 1) / 2)]
end

-- one tiny op a call: what a launch costs the host
local a = torch.zeros(16):cuda()
local op_us = median_us(function() a:add_(1) end)
local seed_us, mlp_us = median_us(setup("seed")), median_us(setup("mlp"))
local cnn_us = median_us(setup("cnn"), LONG)
-- replayed from a CUDA graph: the GPU's time for the step, the host's out of it
local function replayed(which)
  local step = setup(which)
  for _ = 1, 20 do step() end
  torch.cuda.synchronize()
  local graph = torch.cuda.graph(step)
  return median_us(function() graph:replay() end)
end
local replay_us, mlp_replay_us = replayed("seed"), replayed("mlp")
print(string.format("%-40s add_ %.2f us  seed %.1f us/step  replayed %.1f  MLP %.1f  replayed %.1f  CNN %.1f",
                    arg[1] or "default", op_us, seed_us, replay_us, mlp_us, mlp_replay_us, cnn_us))
