-- test_pool.lua: F.avg_pool2d (stride, padding, ceil_mode,
-- count_include_pad, divisor_override), F.adaptive_avg_pool2d (sizes that
-- divide the input and sizes that do not, nil for "keep"), max_pool2d's and
-- adaptive_max_pool2d's indices, max_unpool2d, the 1-D pools, unfold, fold
-- and pixel_shuffle against PyTorch's outputs, indices and input gradients
-- in float64 (tests/ref/pool.lua, written by scripts/gen_pool_ref.py); the
-- modules; 3-D input; gradcheck; errors.
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
  max_idx_k2 = function(x) return F.max_pool2d(x, 2, { return_indices = true }) end,
  max_idx_k3_s2_p1 = function(x) return nn.MaxPool2d(3, { stride = 2, padding = 1, return_indices = true })(x) end,
  max_idx_dilation = function(x) return F.max_pool2d(x, 3, 1, 1, 2, false, true) end,
  max_idx_ceil = function(x) return F.max_pool2d(x, 3, { stride = 2, ceil_mode = true, return_indices = true }) end,
  max_idx_k23_s21 = function(x) return F.max_pool2d(x, { 2, 3 }, { stride = { 2, 1 }, return_indices = true }) end,
  adaptive_max_1 = function(x) return nn.AdaptiveMaxPool2d(1, true)(x) end,
  adaptive_max_7x3 = function(x) return F.adaptive_max_pool2d(x, { 7, 3 }, true) end,
  adaptive_max_4x5 = function(x) return F.adaptive_max_pool2d(x, { 4, 5 }, { return_indices = true }) end,
  unpool_k2 = function(x)
    return nn.MaxUnpool2d(2)(F.max_pool2d(x:narrow(2, 0, 6):narrow(3, 0, 8), 2, { return_indices = true }))
  end,
  unpool_k2_output_size = function(x)
    local y, i = F.max_pool2d(x, 2, { return_indices = true })
    return F.max_unpool2d(y, i, 2, { output_size = { 7, 9 } })
  end,
  unpool_k3_s2_p1 = function(x)
    local y, i = F.max_pool2d(x, 3, 2, 1, 1, false, true)
    return F.max_unpool2d(y, i, 3, 2, 1)
  end,
  max1d_k3_s2 = function(x) return nn.MaxPool1d(3, { stride = 2, return_indices = true })(x:reshape(2, 21, 9)) end,
  max1d_k4_s3_p2_ceil = function(x) return F.max_pool1d(x:reshape(2, 21, 9), 4, 3, 2, 1, true) end,
  avg1d_k3_s2_p1_nopad = function(x)
    return nn.AvgPool1d(3, { stride = 2, padding = 1, count_include_pad = false })(x:reshape(2, 21, 9))
  end,
  adaptive_avg1d_4 = function(x) return nn.AdaptiveAvgPool1d(4)(x:reshape(2, 21, 9)) end,
  adaptive_max1d_4 = function(x) return nn.AdaptiveMaxPool1d(4, true)(x:reshape(2, 21, 9)) end,
  unpool1d_k2 = function(x)
    local y, i = F.max_pool1d(x:reshape(2, 21, 9), 2, { return_indices = true })
    return nn.MaxUnpool1d(2)(y, i, { 9 })
  end,
  unfold_k23 = function(x) return nn.Unfold({ 2, 3 }, { dilation = { 1, 2 }, padding = 1, stride = { 2, 1 } })(x) end,
  fold_unfold_k3 = function(x) return F.fold(F.unfold(x, 3, { padding = 1 }), { 7, 9 }, 3, { padding = 1 }) end,
  fold_k22_s12 = function(x)
    return nn.Fold({ 5, 9 }, 2, { stride = { 1, 2 } })(x:reshape(2, 189):narrow(1, 0, 128):reshape(2, 8, 16))
  end,
  pixel_shuffle_3 = function(x) return nn.PixelShuffle(3)(x:reshape(2, 27, 7, 1)) end,
  pixel_unshuffle_3 = function(x) return F.pixel_unshuffle(x:narrow(2, 0, 6), 3) end,
}

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local x = input():requires_grad_()
    local y, indices = cases[name](x)
    T.is(y:size(), ref[name].shape, name .. ": the shape")
    if ref[name].indices then
      T.is(indices.dtype, torch.int64, name .. ": int64 indices")
      T.is(indices:reshape(-1):tolist(), ref[name].indices, name .. ": the indices")
    end
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

T.run("indices and unpooling on other dtypes, gradcheck, printing", function()
  local x = input():float()
  local y, i = F.max_pool2d(x, 3, { stride = 2, return_indices = true })
  T.tensor_close(y, F.max_pool2d(x, 3, 2), 0, 0, "the values with indices are the fused op's")
  T.is(y:size(), i:size(), "one index a value")
  local u = F.max_unpool2d(y, i, 3, 2, 0, { 7, 9 })
  T.tensor_close(F.max_pool2d(u, 3, 2), y, 0, 0, "pooling the unpooled gives the values back")
  local small = torch.rand(1, 2, 5, 6, { dtype = torch.float64 }):requires_grad_()
  T.ok(torch.autograd.gradcheck(function(t) return F.adaptive_max_pool2d(t, { 2, 4 }) end, { small }),
       "gradcheck of an adaptive max pool that does not divide")
  T.ok(torch.autograd.gradcheck(function(t)
    local v, at = F.max_pool2d(t, 2, { return_indices = true })
    return F.max_unpool2d(v, at, 2, { output_size = { 5, 6 } })
  end, { small }), "gradcheck through max_pool2d's indices and max_unpool2d")
  T.ok(torch.autograd.gradcheck(function(t) return F.fold(t, { 4, 5 }, 2, { dilation = 2 }) end,
                                { torch.rand(1, 8, 6, { dtype = torch.float64 }):requires_grad_() }), "gradcheck of fold")
  T.is(tostring(nn.MaxPool1d(3, 2)), "MaxPool1d(kernel_size=3, stride=2, padding=0, dilation=1, ceil_mode=False)",
       "MaxPool1d prints as PyTorch's")
  T.is(tostring(nn.MaxUnpool2d(2)), "MaxUnpool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))",
       "MaxUnpool2d prints as PyTorch's")
  T.is(tostring(nn.PixelShuffle(2)), "PixelShuffle(upscale_factor=2)", "PixelShuffle prints as PyTorch's")
  T.is(tostring(nn.AdaptiveMaxPool1d(4)), "AdaptiveMaxPool1d(output_size=4)", "AdaptiveMaxPool1d prints as PyTorch's")
end)

T.run("errors", function()
  local x = torch.rand(1, 1, 4, 4)
  local y, i = F.max_pool2d(torch.arange(25):float():view(1, 1, 5, 5), 2, { return_indices = true })
  T.raises(function() F.max_unpool2d(y, i, 2) end,
           "max_unpool2d: index 18 is out of bounds for an output of 4 x 4 %(a pool of an input of another size needs output_size%)",
           "an index past the default output")
  T.raises(function() F.max_unpool2d(y, i, 2, { output_size = { 9, 9 } }) end,
           "invalid output_size %(9, 9%): dim 0 must be between 3 and 5", "an output_size out of range")
  T.raises(function() F.max_unpool2d(y, i:float(), 2) end, "expected int64 indices of the input's shape", "float indices")
  T.raises(function() F.max_pool1d(torch.rand(2, 3, 4, 5), 2) end, "expected 2%-D %(C, L%) or 3%-D %(N, C, L%) input",
           "a 4-D input to a 1-D pool")
  T.raises(function() F.max_pool1d(torch.rand(2, 3, 8), { 2, 2 }) end, "kernel_size to be an integer or a one%-element table",
           "a pair for a 1-D kernel")
  T.raises(function() F.fold(torch.rand(1, 7, 16), { 5, 5 }, 2) end, "expected input of shape %(N, C %* 4, 16%)",
           "fold: channels that are not C kh kw")
  T.raises(function() F.pixel_shuffle(torch.rand(1, 6, 2, 2), 2) end, "channels %(dim %-3%) divide by 4", "pixel_shuffle")
  T.raises(function() F.unfold(x, 5) end, "too small for kernel", "unfold: a kernel larger than the input")
  T.raises(function() F.avg_pool2d(x, 2, 2, 2) end, "pad should be at most half of effective kernel size", "too much padding")
  T.raises(function() F.avg_pool2d(torch.rand(4, 4), 2) end, "expected 3%-D %(C, H, W%) or 4%-D", "a 2-D input")
  T.raises(function() F.avg_pool2d(x, 2, { divisor_override = 0 }) end, "divisor must be not zero", "a zero divisor")
  T.raises(function() F.adaptive_avg_pool2d(x, 0) end, "output_size must be positive integers", "output size 0")
  T.raises(function() F.avg_pool2d(x, 5) end, "too small for kernel", "a kernel larger than the input")
end)

T.run("fractional max pooling against PyTorch", function()
  local fref = dofile(here .. "/../ref/fractional.lua")
  local cases = {  -- as in the generator
    f2d_size = { F.fractional_max_pool2d, { 2, 3, 7, 9 }, { 2, 3, 2 }, { 2, 3 }, { output_size = { 4, 5 } } },
    f2d_ratio = { F.fractional_max_pool2d, { 2, 3, 7, 9 }, { 2, 3, 2 }, 2, { output_ratio = 0.5 } },
    f2d_one = { F.fractional_max_pool2d, { 1, 2, 5, 5 }, { 1, 2, 2 }, 3, { output_size = 1 } },
    f3d_size = { F.fractional_max_pool3d, { 1, 2, 5, 6, 7 }, { 1, 2, 3 }, { 2, 2, 3 }, { output_size = { 3, 4, 3 } } },
  }
  for _, name in ipairs(T.sorted_keys(cases)) do
    local f, xshape, sshape, k, opts = unpack(cases[name])
    local r = fref[name]
    local x = T.filled(torch, xshape, function(j) return math.sin(j) end):requires_grad_()
    local samples = T.filled(torch, sshape, function(j) return (0.37 * j + 0.11) % 1.0 end)
    local o = { return_indices = true, _random_samples = samples }
    for key, v in pairs(opts) do o[key] = v end
    local y, idx = f(x, k, o)
    T.is(T.shape(y), r.shape, name .. ": shape")
    T.is(idx:reshape(-1):tolist(), r.indices, name .. ": indices")
    T.output_and_grad(torch, y, x, r, 1e-12, name .. ": ")
    o.return_indices = nil
    local with = F[(f == F.fractional_max_pool2d and "fractional_max_pool2d" or "fractional_max_pool3d") .. "_with_indices"]
    local y2, idx2 = with(x:detach(), k, o)
    T.ok(idx2 ~= nil and idx2:reshape(-1):tolist()[1] == r.indices[1] and y2:equal(y:detach()),
         name .. ": the _with_indices form gives both")
  end
  torch.manual_seed(3)
  local m = nn.FractionalMaxPool2d(3, { output_ratio = { 0.5, 0.5 } })
  T.is(T.shape(m(torch.randn(2, 4, 10, 12))), { 2, 4, 5, 6 }, "FractionalMaxPool2d with drawn samples")
  T.is(T.shape(nn.FractionalMaxPool3d(2, { output_size = 2 })(torch.randn(3, 4, 5, 6))), { 3, 2, 2, 2 },
       "FractionalMaxPool3d on an unbatched input")
  T.raises(function() nn.FractionalMaxPool2d(2) end, "requires specifying either an output size, or a pooling ratio",
           "neither size nor ratio")
  T.raises(function() F.fractional_max_pool2d(torch.randn(1, 1, 4, 4), 3, { output_size = 3 }) end, "too large",
           "windows that do not fit")
  T.raises(function() F.fractional_max_pool2d(torch.randn(1, 1, 4, 4), 2, { output_ratio = 1.5 }) end,
           "output_ratio must be between 0 and 1", "a ratio above 1")
end)

T.done_testing()
