-- test_pool.lua: F.avg_pool2d (stride, padding, ceil_mode,
-- count_include_pad, divisor_override) and F.adaptive_avg_pool2d (sizes that divide the input
-- and sizes that do not, nil for "keep") against PyTorch's outputs and
-- input gradients in float64 (tests/ref/pool.lua, written by
-- scripts/gen_pool_ref.py); nn.AvgPool2d and nn.AdaptiveAvgPool2d; 3-D
-- input; gradcheck; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/pool.lua")

-- the generator's input: x[n][c][h][w] = sin(1 + n + 2c + 3h + 5w)
local function input()
  local N, C, H, W = ref.shape[1], ref.shape[2], ref.shape[3], ref.shape[4]
  local v = {}
  for n = 0, N - 1 do for c = 0, C - 1 do for h = 0, H - 1 do for w = 0, W - 1 do
    v[#v + 1] = math.sin(1 + n + 2 * c + 3 * h + 5 * w)
  end end end end
  return torch.tensor(v, { dtype = torch.float64 }):reshape(N, C, H, W)
end

local cases = {
  avg_k2 = function(x) return F.avg_pool2d(x, 2) end,
  avg_k3_s2_p1 = function(x) return F.avg_pool2d(x, 3, 2, 1) end,
  avg_k3_s1_p1_nopad = function(x) return F.avg_pool2d(x, 3, { stride = 1, padding = 1, count_include_pad = false }) end,
  avg_k23_s12 = function(x) return F.avg_pool2d(x, { 2, 3 }, { 1, 2 }) end,
  avg_divisor = function(x) return nn.AvgPool2d(2, { divisor_override = 3 })(x) end,
  avg_ceil_k2 = function(x) return nn.AvgPool2d(2, { ceil_mode = true })(x) end,
  avg_ceil_k3_s2_p1 = function(x) return F.avg_pool2d(x, 3, 2, 1, true) end,
  avg_ceil_k3_s2_p1_nopad = function(x)
    return F.avg_pool2d(x, 3, { stride = 2, padding = 1, ceil_mode = true, count_include_pad = false })
  end,
  avg_ceil_k23_s2 = function(x) return F.avg_pool2d(x, { 2, 3 }, { stride = 2, ceil_mode = true }) end,
  adaptive_1 = function(x) return nn.AdaptiveAvgPool2d(1)(x) end,
  adaptive_3x3 = function(x) return F.adaptive_avg_pool2d(x, { 3, 3 }) end,
  adaptive_4x5 = function(x) return F.adaptive_avg_pool2d(x, { 4, 5 }) end,
  adaptive_7x3 = function(x) return nn.AdaptiveAvgPool2d({ 7, 3 })(x) end,
  adaptive_none_2 = function(x) return F.adaptive_avg_pool2d(x, { nil, 2 }) end,
}

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local x = input():requires_grad_()
    local y = cases[name](x)
    T.is(y:size(), ref[name].shape, name .. ": the shape")
    local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
    local loss = (y * wt):sum()
    loss:backward()
    local ok, why = T.compare_values(y:reshape(-1):tolist(), ref[name].y, 1e-13, 1e-15)
    T.ok(ok, name .. ": the output", why)
    ok, why = T.compare_values(x.grad:reshape(-1):tolist(), ref[name].dx, 1e-13, 1e-15)
    T.ok(ok, name .. ": the input gradient", why)
  end)
end

T.run("3-D input, gradcheck, printing", function()
  local x = input()[0]
  T.is(F.avg_pool2d(x, 2):size(), { 3, 3, 4 }, "a (C, H, W) input gives (C, Ho, Wo)")
  T.is(F.adaptive_avg_pool2d(x, { 2, 2 }):size(), { 3, 2, 2 }, "adaptive too")
  local small = torch.rand(1, 2, 5, 4, { dtype = torch.float64 }):requires_grad_()
  T.ok(torch.autograd.gradcheck(function(t) return F.avg_pool2d(t, 3, 1, 1, false, false) end, { small }),
       "gradcheck of avg_pool2d without the padding in the count")
  T.ok(torch.autograd.gradcheck(function(t) return F.adaptive_avg_pool2d(t, { 3, 3 }) end, { small }),
       "gradcheck of an adaptive pool that does not divide")
  T.is(tostring(nn.AvgPool2d(2)), "AvgPool2d(kernel_size=2, stride=2, padding=0)", "AvgPool2d prints as PyTorch's")
  T.is(tostring(nn.AdaptiveAvgPool2d({ 1, 1 })), "AdaptiveAvgPool2d(output_size=(1, 1))", "AdaptiveAvgPool2d too")
end)

T.run("errors", function()
  local x = torch.rand(1, 1, 4, 4)
  T.raises(function() F.avg_pool2d(x, 2, 2, 2) end, "pad should be at most half of effective kernel size", "too much padding")
  T.raises(function() F.avg_pool2d(torch.rand(4, 4), 2) end, "expected 3%-D %(C, H, W%) or 4%-D", "a 2-D input")
  T.raises(function() F.avg_pool2d(x, 2, { divisor_override = 0 }) end, "divisor must be not zero", "a zero divisor")
  T.raises(function() F.adaptive_avg_pool2d(x, 0) end, "output_size must be positive integers", "output size 0")
  T.raises(function() F.avg_pool2d(x, 5) end, "too small for kernel", "a kernel larger than the input")
end)

T.done_testing()
