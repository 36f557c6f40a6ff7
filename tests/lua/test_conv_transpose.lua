-- test_conv_transpose.lua: F.conv_transpose2d, F.conv_transpose1d and
-- their modules against PyTorch in float64 (tests/ref/conv_transpose.lua, written by
-- scripts/gen_conv_transpose_ref.py): outputs and input/weight/bias
-- gradients with strides, padding (to cropping), output_padding, groups,
-- dilation and no bias; unbatched input; the module; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)   -- random inputs, the same in every run
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/conv_transpose.lua")

local cases = {  -- name: input shape, weight shape, options
  plain = { { 2, 3, 4, 5 }, { 3, 2, 3, 3 }, {} },
  stride2_pad1_out1 = { { 2, 3, 4, 4 }, { 3, 4, 3, 3 }, { stride = 2, padding = 1, output_padding = 1 } },
  stride23_pad01 = { { 1, 2, 3, 4 }, { 2, 3, 2, 3 }, { stride = { 2, 3 }, padding = { 0, 1 } } },
  groups_dilation = { { 2, 4, 3, 3 }, { 4, 3, 3, 2 }, { stride = 2, groups = 2, dilation = 2 } },
  crop = { { 1, 2, 5, 5 }, { 2, 2, 2, 2 }, { padding = 2 } },
  no_bias = { { 2, 2, 3, 3 }, { 2, 1, 2, 2 }, { bias = false, stride = 3 } },
  transpose1d_plain = { { 2, 3, 6 }, { 3, 2, 3 }, {} },
  transpose1d_stride2_pad1_out1 = { { 2, 3, 5 }, { 3, 4, 3 }, { stride = 2, padding = 1, output_padding = 1 } },
  transpose1d_groups_dilation_no_bias = { { 1, 4, 4 }, { 4, 3, 2 }, { stride = 3, groups = 2, dilation = 2, bias = false } },
}

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local c, r = cases[name], ref[name]
    local o = c[3]
    local x = T.filled(torch, c[1], function(k) return math.sin(1 + 0.3 * k) end):requires_grad_()
    local w = T.filled(torch, c[2], function(k) return math.cos(2 + 0.7 * k) end):requires_grad_()
    local cout = c[2][2] * (o.groups or 1)
    local b = o.bias ~= false and T.filled(torch, { cout }, function(k) return math.sin(3 + k) end):requires_grad_() or nil
    local conv = #c[1] == 3 and F.conv_transpose1d or F.conv_transpose2d
    local y = conv(x, w, b, { stride = o.stride, padding = o.padding, output_padding = o.output_padding,
                              groups = o.groups, dilation = o.dilation })
    T.is(y:size(), r.shape, name .. ": the shape")
    local wt = torch.arange(0, y:numel(), { dtype = torch.float64 }):cos():reshape(y:size())
    local loss = (y * wt):sum()
    loss:backward()
    T.values_close(y:reshape(-1):tolist(), r.y, 1e-12, 1e-13, name .. ": output")
    T.values_close(x.grad:reshape(-1):tolist(), r.dx, 1e-12, 1e-13, name .. ": input gradient")
    T.values_close(w.grad:reshape(-1):tolist(), r.dw, 1e-12, 1e-13, name .. ": weight gradient")
    if b then T.values_close(b.grad:tolist(), r.db, 1e-12, 1e-13, name .. ": bias gradient") end
  end)
end

T.run("nn.ConvTranspose2d", function()
  local m = nn.ConvTranspose2d(4, 6, 3, { stride = 2, padding = 1, output_padding = 1, groups = 2 })
  T.is(m.weight:size(), { 4, 3, 3, 3 }, "weight (in, out/groups, kH, kW), as PyTorch's")
  T.is(m(torch.rand(2, 4, 5, 5)):size(), { 2, 6, 10, 10 }, "doubles the size")
  T.is(m(torch.rand(4, 5, 5)):size(), { 6, 10, 10 }, "an unbatched input")
  T.is(tostring(m), "ConvTranspose2d(4, 6, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1), groups=2)",
       "printed as PyTorch's")
end)

T.run("nn.ConvTranspose1d", function()
  local m = nn.ConvTranspose1d(4, 6, 3, { stride = 2, padding = 1, output_padding = 1, groups = 2 })
  T.is(m.weight:size(), { 4, 3, 3 }, "weight (in, out/groups, k), as PyTorch's")
  T.is(m(torch.rand(2, 4, 5)):size(), { 2, 6, 10 }, "doubles the length")
  T.is(m(torch.rand(4, 5)):size(), { 6, 10 }, "an unbatched input")
  T.is(tostring(m), "ConvTranspose1d(4, 6, kernel_size=(3,), stride=(2,), padding=(1,), output_padding=(1,), groups=2)",
       "printed as PyTorch's")
  T.raises(function() F.conv_transpose1d(torch.rand(1, 4, 5), torch.rand(4, 3, 3, 3)) end,
           "conv_transpose1d: expected weight of shape %(in_channels, out_channels/groups, kW%)", "a 4-D weight")
  T.raises(function() F.conv_transpose1d(torch.rand(5), torch.rand(4, 3, 3)) end,
           "conv_transpose1d: expected 2%-D %(C, L%) or 3%-D %(N, C, L%) input", "a 1-D input")
end)

T.run("errors", function()
  local w = torch.rand(3, 2, 3, 3)
  T.raises(function() F.conv_transpose2d(torch.rand(1, 4, 5, 5), w) end, "to have 3 channels, but got 4", "wrong channels")
  T.raises(function() F.conv_transpose2d(torch.rand(1, 3, 5, 5), w, nil, { stride = 2, output_padding = 2 }) end,
           "output padding must be smaller than either stride or dilation", "output_padding too large")
  T.raises(function() F.conv_transpose2d(torch.rand(5, 5), w) end, "expected 3%-D %(C, H, W%) or 4%-D", "a 2-D input")
  T.raises(function() F.conv_transpose2d(torch.rand(1, 3, 5, 5), torch.rand(3, 2, 3)) end, "expected weight of shape", "a 3-D weight")
  T.raises(function() F.conv_transpose2d(torch.rand(1, 3, 5, 5), w, torch.rand(3)) end, "expected bias of shape %[2%]", "a bias of the wrong size")
end)

T.done_testing()
