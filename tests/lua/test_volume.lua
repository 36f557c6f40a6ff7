-- test_volume.lua: F.conv3d, F.conv_transpose3d, F.max_pool3d,
-- F.avg_pool3d, F.adaptive_avg_pool3d and F.adaptive_max_pool3d against
-- PyTorch in float64 (tests/ref/volume.lua, written by
-- scripts/gen_volume_ref.py): outputs and the gradients of the input,
-- weight and bias with strides, padding, dilation, groups,
-- output_padding, ceil_mode, count_include_pad, divisor_override; the
-- modules; unbatched input; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/volume.lua")

local X = { 2, 3, 5, 6, 7 }
local function filled(shape, f) return T.filled(torch, shape, f) end

local conv = {  -- name: function, weight shape, bias, options (as the generator's)
  conv_plain = { F.conv3d, { 4, 3, 3, 3, 3 }, true, {} },
  conv_stride_pad = { F.conv3d, { 4, 3, 3, 2, 3 }, true, { stride = { 2, 1, 2 }, padding = { 1, 0, 1 } } },
  conv_dilation_groups = { F.conv3d, { 6, 1, 2, 2, 2 }, false, { dilation = { 2, 1, 2 }, groups = 3 } },
  transpose_plain = { F.conv_transpose3d, { 3, 2, 2, 3, 2 }, true, {} },
  transpose_stride_pad_out = { F.conv_transpose3d, { 3, 4, 3, 3, 3 }, true,
                               { stride = 2, padding = 1, output_padding = { 1, 0, 1 } } },
  transpose_groups_dilation = { F.conv_transpose3d, { 3, 2, 2, 2, 2 }, false, { groups = 3, dilation = { 2, 1, 1 } } },
}
local pool = {
  max_k2 = function(x) return F.max_pool3d(x, 2) end,
  max_k3_s2_p1 = function(x) return nn.MaxPool3d(3, { stride = 2, padding = 1 })(x) end,
  max_dilation_ceil = function(x)
    return F.max_pool3d(x, { 2, 3, 2 }, { stride = { 1, 2, 2 }, dilation = { 2, 1, 2 }, ceil_mode = true })
  end,
  avg_k2 = function(x) return nn.AvgPool3d(2)(x) end,
  avg_k3_s2_p1 = function(x) return F.avg_pool3d(x, 3, 2, 1) end,
  avg_k3_s2_p1_nopad = function(x) return F.avg_pool3d(x, 3, { stride = 2, padding = 1, count_include_pad = false }) end,
  avg_ceil = function(x) return F.avg_pool3d(x, { 2, 3, 3 }, { stride = 2, padding = { 1, 1, 0 }, ceil_mode = true }) end,
  avg_divisor = function(x) return F.avg_pool3d(x, 2, { divisor_override = 5 }) end,
  adaptive_avg_1 = function(x) return nn.AdaptiveAvgPool3d(1)(x) end,
  adaptive_avg_234 = function(x) return F.adaptive_avg_pool3d(x, { 2, 3, 4 }) end,
  adaptive_max_324 = function(x) return nn.AdaptiveMaxPool3d({ 3, 2, 4 })(x) end,
}

local function check(name, y, x, params)
  local r = ref[name]
  T.is(y:size(), r.shape, name .. ": the shape")
  local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
  ;(y * wt):sum():backward()
  T.values_close(y:reshape(-1):tolist(), r.y, 1e-12, 1e-12, name .. ": output")
  T.values_close(x.grad:reshape(-1):tolist(), r.dx, 1e-12, 1e-12, name .. ": input gradient")
  for key, p in pairs(params or {}) do
    T.values_close(p.grad:reshape(-1):tolist(), r[key], 1e-12, 1e-12, name .. ": " .. key)
  end
end

for _, name in ipairs(T.sorted_keys(conv)) do
  T.run(name .. " against PyTorch", function()
    local c = conv[name]
    local x = filled(X, function(k) return math.sin(1 + 0.3 * k) end):requires_grad_()
    local w = filled(c[2], function(k) return math.cos(2 + 0.7 * k) end):requires_grad_()
    local o = c[4]
    local cout = c[1] == F.conv_transpose3d and c[2][2] * (o.groups or 1) or c[2][1]
    local b = c[3] and filled({ cout }, function(k) return math.sin(3 + k) end):requires_grad_() or nil
    check(name, c[1](x, w, b, o), x, { dw = w, db = b })
  end)
end

for _, name in ipairs(T.sorted_keys(pool)) do
  T.run(name .. " against PyTorch", function()
    local x = filled(X, function(k) return math.sin(1 + 0.3 * k) end):requires_grad_()
    check(name, pool[name](x), x)
  end)
end

T.run("modules, unbatched input, float32", function()
  local m = nn.Conv3d(3, 4, 3, { padding = 1, bias = false })
  T.is(m.weight:size(), { 4, 3, 3, 3, 3 }, "Conv3d's weight (out, in/groups, kD, kH, kW)")
  T.is(tostring(m), "Conv3d(3, 4, kernel_size=(3, 3, 3), stride=(1, 1, 1), padding=(1, 1, 1), bias=False)",
       "Conv3d prints as PyTorch's")
  local x = torch.randn(3, 4, 5, 6)
  T.is(m(x):size(), { 4, 4, 5, 6 }, "an unbatched (C, D, H, W) input")
  T.tensor_close(m(x), m(x:unsqueeze(0))[0], 0, 0, "the same as a batch of one")
  local t = nn.ConvTranspose3d(4, 2, 2, { stride = 2 })
  T.is(t.weight:size(), { 4, 2, 2, 2, 2 }, "ConvTranspose3d's weight (in, out/groups, kD, kH, kW)")
  T.is(t(m(x)):size(), { 2, 8, 10, 12 }, "ConvTranspose3d doubles each size")
  T.is(tostring(nn.MaxPool3d(2)), "MaxPool3d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)",
       "MaxPool3d prints as PyTorch's")
  T.is(tostring(nn.AdaptiveAvgPool3d({ 1, 2, 2 })), "AdaptiveAvgPool3d(output_size=(1, 2, 2))",
       "AdaptiveAvgPool3d prints as PyTorch's")
  local small = torch.rand(1, 2, 4, 3, 3, { dtype = torch.float64 }):requires_grad_()
  T.ok(torch.autograd.gradcheck(function(a) return F.avg_pool3d(a, 2, 1, 1, true, false) end, { small }),
       "gradcheck of avg_pool3d")
end)

T.run("max_pool3d's indices and max_unpool3d against PyTorch", function()
  local x = filled(X, function(k) return math.sin(1 + 0.3 * k) end)
  local _, idx = F.max_pool3d(x, 3, { stride = 2, padding = 1, return_indices = true })
  T.is(idx:reshape(-1):tolist(), ref.unpool_k3_s2_p1.indices, "indices with padding")
  local _, idx2 = nn.MaxPool3d({ 2, 3, 2 }, { stride = { 1, 2, 2 }, dilation = { 2, 1, 2 }, ceil_mode = true,
                                              return_indices = true })(x)
  T.is(idx2:reshape(-1):tolist(), ref.indices_dilation_ceil.indices, "indices with dilation and ceil_mode")
  local xg = x:clone():requires_grad_()
  local y, i = F.max_pool3d(xg, 3, { stride = 2, padding = 1, return_indices = true })
  check("unpool_k3_s2_p1", nn.MaxUnpool3d(3, 2, 1)(y, i, { 5, 6, 7 }), xg)
  local unbatched = F.max_unpool3d(y[0], i[0], 3, { stride = 2, padding = 1, output_size = { 5, 6, 7 } })
  T.tensor_close(unbatched, F.max_unpool3d(y, i, 3, 2, 1, { 5, 6, 7 })[0], 0, 0, "an unbatched input")
  T.raises(function() F.max_unpool3d(y, i:narrow(0, 0, 1), 3) end, "expected int64 indices of the input's shape",
           "indices of another shape")
  T.raises(function() F.max_unpool3d(y, i, 3, 2, 1, { 9, 6, 7 }) end, "invalid output_size %(9, 6, 7%)", "a bad output_size")
end)

T.run("errors", function()
  local x = torch.randn(1, 3, 4, 4, 4)
  T.raises(function() F.conv3d(torch.randn(3, 4, 4), torch.randn(2, 3, 1, 1, 1)) end,
           "expected 4%-D %(C, D, H, W%) or 5%-D", "a 3-D input")
  T.raises(function() F.conv3d(x, torch.randn(2, 3, 3, 3)) end, "expected weight of shape %(out_channels", "a 4-D weight")
  T.raises(function() F.conv3d(x, torch.randn(2, 2, 1, 1, 1)) end, "to have 2 channels, but got 3", "channels")
  T.raises(function() F.conv3d(x, torch.randn(2, 3, 5, 1, 1)) end, "too small for a kernel depth of 5", "depth")
  T.raises(function() F.max_pool3d(x, 2, 2, 2) end, "pad should be at most half", "too much padding")
  T.raises(function() F.avg_pool3d(x, 2, { divisor_override = 0 }) end, "divisor must be not zero", "a zero divisor")
  T.raises(function() F.conv_transpose3d(x, torch.randn(3, 2, 2, 2, 2), nil, { output_padding = 1 }) end,
           "output padding must be smaller than either stride or dilation", "output_padding")
end)

T.done_testing()
