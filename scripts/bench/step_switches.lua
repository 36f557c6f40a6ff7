-- dplua's side of scripts/bench/step_switches: an in-place add to a
-- 16-element tensor (a launch's host cost), the eager seed (10-10-2,
-- batch 32) and MLP (784-256-128-10, batch 256) steps with SGD on the GPU
-- and both steps replayed from a CUDA graph: the median of 9 blocks of
-- 2000 steps after 3000 of warm-up, and the fusions of the deferred Linear
-- an eager step (torch.cuda._linear_fusions). arg[1] names the setting.
local torch = require("dplua")
local clock = torch.utils.progress.clock
if not torch.cuda.is_available() then print("no_gpu"); os.exit(0) end
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")

local function setup(which)
  torch.manual_seed(0)
  local model, x, y
  if which == "mlp" then
    model, x, y = models.mlp():cuda(), torch.rand(256, 784):cuda(), torch.randint(0, 10, { 256 }):cuda()
  else
    model, x, y = models.SimpleNN():cuda(), torch.rand(32, 10):cuda(), torch.randint(0, 2, { 32 }):cuda()
  end
  return models.sgd_step(model, x, y)
end

local WARM, BLOCKS, PER_BLOCK = 3000, 9, 2000

local function median_us(step)
  for _ = 1, WARM do step() end
  local times = {}
  for b = 1, BLOCKS do
    torch.cuda.synchronize()
    local t0 = clock()
    for _ = 1, PER_BLOCK do step() end
    torch.cuda.synchronize()
    times[b] = (clock() - t0) / PER_BLOCK * 1e6
  end
  table.sort(times)
  return times[math.floor((BLOCKS + 1) / 2)]
end

local function eager(which)
  local step = setup(which)
  local fusions = torch.cuda._linear_fusions()
  local us = median_us(step)
  return us, (torch.cuda._linear_fusions() - fusions) / (WARM + BLOCKS * PER_BLOCK)
end

-- one tiny op a call: what a launch costs the host
local a = torch.zeros(16):cuda()
local op_us = median_us(function() a:add_(1) end)
local seed_us, seed_fusions = eager("seed")
local mlp_us, mlp_fusions = eager("mlp")
-- replayed from a CUDA graph: the GPU's time for the step, the host's out of it
local function replayed(which)
  local step = setup(which)
  for _ = 1, 20 do step() end
  torch.cuda.synchronize()
  local graph = torch.cuda.graph(step)
  return median_us(function() graph:replay() end)
end
local replay_us, mlp_replay_us = replayed("seed"), replayed("mlp")
print(string.format("%-22s add_ %.2f us  seed %.1f us/step (%.2f fusions a step)  replayed %.1f  MLP %.1f us/step (%.2f)  replayed %.1f",
                    arg[1] or "default", op_us, seed_us, seed_fusions, replay_us, mlp_us, mlp_fusions, mlp_replay_us))
