-- dplua's side of scripts/bench/gpu_parts: what the GPU steps are made of,
-- printed as "name value" lines (µs or ms per call), "name error: ..."
-- when one fails, or only "no_gpu" without a GPU. gpu_parts.py is the same
-- on PyTorch. Host µs: calls in a loop, timed up to the last call's return
-- (the GPU then trails by at most its queue); ms: CUDA events around 5
-- calls of an 8192-wide bf16 op, after 5 untimed calls.
local torch = require("dplua")
local F = torch.nn.functional
local clock = torch.utils.progress.clock
io.stdout:setvbuf("line")

local ok_cuda, has_cuda = pcall(function() return torch.cuda.is_available() end)
if not (ok_cuda and has_cuda) then print("no_gpu"); os.exit(0) end
local d = "cuda"

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local T = dofile(here .. "/timing.lua")
local row, host_us, gpu_ms = T.row, T.host_us, T.gpu_ms

local a, b = torch.rand(32, 10):to(d), torch.rand(32, 10):to(d)
local w, bias = torch.rand(10, 10):to(d), torch.rand(10):to(d)
local y = torch.randint(0, 2, { 32 }):to(d)
local xm = torch.rand(256, 256):to(d)
row("empty", function() return host_us(function() return torch.empty(32, 10, { device = d }) end) end)
row("add", function() return host_us(function() return a + b end) end)
row("relu", function() return host_us(function() return a:relu() end) end)
row("add_", function() return host_us(function() a:add_(b) end) end)
row("linear_small", function() return host_us(function() return F.linear(a, w, bias) end) end)
row("mm_256", function() return host_us(function() return xm:mm(xm) end) end)
row("cross_entropy", function() return host_us(function() return F.cross_entropy(a, y) end) end)

-- A CUDA graph of k tiny kernels (add_ of a one-element tensor), replayed:
-- µs per replay, waited for. The floor under a replayed step of k kernels.
-- (A Python number as the operand would add a kernel that makes it a
-- tensor on the GPU.)
local function replay_us(k)
  local x, one = torch.zeros(1, { device = d }), torch.ones(1, { device = d })
  for _ = 1, 3 do for _ = 1, k do x:add_(one) end end
  torch.cuda.synchronize()
  local g = torch.cuda.graph(function() for _ = 1, k do x:add_(one) end end)
  for _ = 1, 50 do g:replay() end
  torch.cuda.synchronize()
  local n, t = 2000, clock()
  for _ = 1, n do g:replay() end
  torch.cuda.synchronize()
  return (clock() - t) / n * 1e6
end
row("graph_1", function() return replay_us(1) end)
row("graph_16", function() return replay_us(16) / 16 end)

local N = 8192
local x8 = torch.rand(N, N):to(d, torch.bfloat16)
local w8 = torch.rand(N, N):to(d, torch.bfloat16)
row("big_mm", function() return gpu_ms(function() return x8:mm(w8) end) end)
row("big_linear", function() return gpu_ms(function() return F.linear(x8, w8) end) end)
row("big_relu", function() return gpu_ms(function() return x8:relu() end) end)
row("big_mean", function() return gpu_ms(function() return x8:mean() end) end)
row("big_sum_float", function() return gpu_ms(function() return x8:float():sum() end) end)
