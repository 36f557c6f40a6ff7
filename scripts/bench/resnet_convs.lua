-- dplua's side of scripts/bench/resnet_convs: each convolution of the
-- small ResNet of scripts/bench/examples (batch 128, float32, no bias) on
-- the CPU, one thread: ms per call forward and forward + backward (the
-- weight's gradient, and the input's except for the stem, whose input is
-- the data). Times are the process's CPU time, the best of a few repeats,
-- printed as "name ms" lines; resnet_convs.py measures PyTorch the same way.
local torch = require("dplua")
local F = torch.nn.functional
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local T = dofile(here .. "/timing.lua")
torch.set_num_threads(1)

-- name, input channels, output channels, input size (square), kernel,
-- stride, padding, whether the input needs a gradient, calls per repeat
local convs = {
  { "stem", 1, 16, 28, 3, 1, 1, false, 5 },
  { "c3_16_16", 16, 16, 28, 3, 1, 1, true, 3 },
  { "c3s2_16_32", 16, 32, 28, 3, 2, 1, true, 5 },
  { "c1s2_16_32", 16, 32, 28, 1, 2, 0, true, 10 },
  { "c3_32_32", 32, 32, 14, 3, 1, 1, true, 5 },
  { "c3s2_32_64", 32, 64, 14, 3, 2, 1, true, 5 },
  { "c1s2_32_64", 32, 64, 14, 1, 2, 0, true, 10 },
  { "c3_64_64", 64, 64, 7, 3, 1, 1, true, 5 },
}

torch.manual_seed(0)
for _, c in ipairs(convs) do
  local name, n = c[1], c[9]
  local x = torch.randn(128, c[2], c[4], c[4], { requires_grad = c[8] })
  local w = torch.randn(c[3], c[2], c[5], c[5], { requires_grad = true })
  local opts = { stride = c[6], padding = c[7] }
  local g = torch.randn(F.conv2d(x, w, nil, opts):size())
  -- a few calls and a collection first: until the collector has freed some
  -- outputs of this size, each call's output is fresh pages from the system
  for _ = 1, 10 do F.conv2d(x, w, nil, opts):backward(g); w.grad = nil; x.grad = nil end
  collectgarbage(); collectgarbage()
  T.row(name .. "_fwd", function() return T.cpu_ms(function() return F.conv2d(x, w, nil, opts) end, n) end, 3)
  T.row(name .. "_fwdbwd", function()
    return T.cpu_ms(function() F.conv2d(x, w, nil, opts):backward(g); w.grad = nil; x.grad = nil end, n)
  end, 3)
end
