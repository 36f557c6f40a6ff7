-- One setting of gemm.cu's limits (DPLUA_GEMM_* in the environment, see
-- scripts/bench/gemm_tune): the GPU µs of the MLP's products one by one,
-- replayed from a CUDA graph of 20 calls, the seed step's µs replayed
-- from a CUDA graph (its two backward products run as a chain), and the
-- eager MLP step's µs and the same step replayed from a CUDA graph.
local torch = require("dplua")
local now = torch.utils.progress.clock
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")
torch.manual_seed(0)
local dev = "cuda"
local x, h = torch.rand(256, 784):to(dev), torch.rand(256, 256):to(dev)
local w1, b1 = torch.randn(256, 784):to(dev), torch.randn(256):to(dev)
local w2, b2 = torch.randn(128, 256):to(dev), torch.randn(128):to(dev)
local g1 = torch.randn(256, 256):to(dev)
-- µs a unit: the best of 5 timed calls of run(), each `units` units
local function best_us(run, units)
  local best = math.huge
  for _ = 1, 5 do
    local t0 = now()
    run()
    torch.cuda.synchronize()
    best = math.min(best, (now() - t0) / units)
  end
  return best * 1e6
end
local function gpu_us(name, f)
  f(); torch.cuda.synchronize()
  local graph = torch.cuda.graph(function() for _ = 1, 20 do f() end end)
  graph:replay(); torch.cuda.synchronize()
  io.write(string.format("  %-34s %8.2f\n", name, best_us(function() for _ = 1, 20 do graph:replay() end end, 400)))
end
gpu_us("L1 fwd 256x784->256 +relu, GPU us", function() return torch._linear_act(x, w1, b1, "relu") end)
gpu_us("L1 dw (256x256)^T @ 256x784, GPU us", function() return g1:t():mm(x) end)
gpu_us("L2 fwd 256x256->128 +relu, GPU us", function() return torch._linear_act(h, w2, b2, "relu") end)
local deep_a, deep_b = torch.randn(64, 2048):to(dev), torch.randn(2048, 64):to(dev)
gpu_us("deep 64x2048 @ 2048x64, GPU us", function() return deep_a:mm(deep_b) end)
local function seed_replay_us()
  local model, sx, sy = models.SimpleNN():to(dev), torch.rand(32, 10):to(dev), torch.randint(0, 2, { 32 }):to(dev)
  local step = models.sgd_step(model, sx, sy)
  for _ = 1, 20 do step() end
  torch.cuda.synchronize()
  local graph = torch.cuda.graph(step)
  return best_us(function() for _ = 1, 2000 do graph:replay() end end, 2000)
end
io.write(string.format("  %-34s %8.2f\n", "seed step replayed, us", seed_replay_us()))
local model, y = models.mlp():to(dev), torch.randint(0, 10, { 256 }):to(dev)
local step = models.sgd_step(model, x, y)
for _ = 1, 200 do step() end
torch.cuda.synchronize()
io.write(string.format("  %-34s %8.2f\n", "MLP eager step, us", best_us(function() for _ = 1, 500 do step() end end, 500)))
local graph = torch.cuda.graph(step)
io.write(string.format("  %-34s %8.2f\n", "MLP step replayed, us", best_us(function() for _ = 1, 500 do graph:replay() end end, 500)))
