-- What an eager GPU step costs the host, beside what it costs in all: the
-- seed (10-10-2, batch 32) and MLP (784-256-128-10, batch 256) SGD steps,
-- and single products, each enqueued RUN times without a synchronisation
-- (fewer launches than a stream's queue holds, so that the GPU never holds
-- the host back): the host's µs a call is the time to enqueue them, the
-- whole µs a call the time until they have run. When the host's share is
-- near the whole, the eager step is bound by the host and a shorter GPU
-- time will not show; when it is well below, by the GPU. Best of 7.
-- usage: dplua scripts/bench/host_time.lua
local torch = require("dplua")
local clock = torch.utils.progress.clock
if not torch.cuda.is_available() then print("no_gpu"); os.exit(0) end
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")

local RUN, TRIES = 60, 7

local function measure(name, f)
  for _ = 1, 3 * RUN do f() end
  torch.cuda.synchronize()
  local host, whole = math.huge, math.huge
  for _ = 1, TRIES do
    local t0 = clock()
    for _ = 1, RUN do f() end
    local t1 = clock()
    torch.cuda.synchronize()
    local t2 = clock()
    host, whole = math.min(host, (t1 - t0) / RUN), math.min(whole, (t2 - t0) / RUN)
  end
  print(string.format("%-40s %10.1f %10.1f", name, host * 1e6, whole * 1e6))
end

torch.manual_seed(0)
print(string.format("%-40s %10s %10s", "call", "host us", "whole us"))
measure("seed step", models.sgd_step(models.SimpleNN():cuda(), torch.rand(32, 10):cuda(), torch.randint(0, 2, { 32 }):cuda()))
local x = torch.rand(256, 784):cuda()
measure("MLP step", models.sgd_step(models.mlp():cuda(), x, torch.randint(0, 10, { 256 }):cuda()))
local w1, b1 = torch.randn(256, 784):cuda(), torch.randn(256):cuda()
measure("linear+relu 256x784->256 (cuBLASLt)", function() return torch._linear_act(x, w1, b1, "relu") end)
local g1 = torch.randn(256, 256):cuda()
measure("mm (256x256)^T @ 256x784 (cuBLASLt)", function() return g1:t():mm(x) end)
local h, w2, b2 = torch.rand(256, 256):cuda(), torch.randn(128, 256):cuda(), torch.randn(128):cuda()
measure("linear+relu 256x256->128 (ours, tiles)", function() return torch._linear_act(h, w2, b2, "relu") end)
