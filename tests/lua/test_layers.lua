-- test_layers.lua: GLU, Softmin, Softmax2d, PReLU, RMSNorm, InstanceNorm,
-- LocalResponseNorm, LPPool, Bilinear, ChannelShuffle, the Upsampling
-- modules, EmbeddingBag, F.pdist, F.grid_sample and F.affine_grid against
-- PyTorch in float64
-- (tests/ref/layers.lua, written by scripts/gen_layers_ref.py): outputs,
-- the inputs' and parameters' gradients, running statistics; then the
-- random layers (RReLU, the channel and alpha dropouts, gumbel_softmax)
-- by their properties, and bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
torch.manual_seed(0)
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/layers.lua")
local f64 = { dtype = torch.float64 }

local cases = {   -- as the generator's: the module, the input shapes
  glu = { nn.GLU(1), { { 2, 6, 3 } } },
  glu_last = { nn.GLU(), { { 3, 4 } } },
  softmin = { nn.Softmin(1), { { 3, 5 } } },
  softmax2d = { nn.Softmax2d(), { { 2, 3, 2, 2 } } },
  prelu_one = { nn.PReLU({ dtype = torch.float64 }), { { 2, 3, 4 } } },
  prelu_channels = { nn.PReLU({ num_parameters = 3, dtype = torch.float64 }), { { 2, 3, 4 } } },
  rms_norm = { nn.RMSNorm({ 4 }, { dtype = torch.float64 }), { { 2, 3, 4 } } },
  rms_norm_two_dims_eps = { nn.RMSNorm({ 3, 4 }, { eps = 1e-3, dtype = torch.float64 }), { { 2, 3, 4 } } },
  rms_norm_no_affine = { nn.RMSNorm(5, { elementwise_affine = false }), { { 3, 5 } } },
  instance_norm = { nn.InstanceNorm2d(3), { { 2, 3, 4, 5 } } },
  instance_norm_affine = { nn.InstanceNorm1d(3, { affine = true, dtype = torch.float64 }), { { 2, 3, 6 } } },
  instance_norm_running = { nn.InstanceNorm2d(3, { track_running_stats = true, momentum = 0.3, dtype = torch.float64 }),
                            { { 2, 3, 3, 4 } } },
  local_response_norm = { nn.LocalResponseNorm(3), { { 2, 5, 3, 4 } } },
  local_response_norm_3d = { nn.LocalResponseNorm(2, { alpha = 0.01, beta = 0.5, k = 2.0 }), { { 2, 4, 5 } } },
  lp_pool2d = { nn.LPPool2d(2, 2), { { 2, 3, 4, 6 } } },
  lp_pool1d_p4_stride = { nn.LPPool1d(4, 3, { stride = 2 }), { { 2, 3, 9 } } },
  bilinear = { nn.Bilinear(3, 2, 4, { dtype = torch.float64 }), { { 5, 3 }, { 5, 2 } } },
  bilinear_no_bias = { nn.Bilinear(2, 3, 2, { bias = false, dtype = torch.float64 }), { { 2, 3, 2 }, { 2, 3, 3 } } },
  channel_shuffle = { nn.ChannelShuffle(3), { { 2, 6, 2, 2 } } },
  upsampling_nearest = { nn.UpsamplingNearest2d({ scale_factor = 2 }), { { 1, 2, 3, 4 } } },
  upsampling_bilinear = { nn.UpsamplingBilinear2d({ size = { 5, 7 } }), { { 1, 2, 3, 4 } } },
}

-- the generator's parameters: the i-th (sorted by name) cos(2 + 0.7 k + i)
local function fill_params(m)
  local named = {}
  for n, p in m:named_parameters() do named[#named + 1] = { n, p } end
  table.sort(named, function(a, b) return a[1] < b[1] end)
  for i, np in ipairs(named) do
    local v = T.filled(torch, np[2]:size(), function(k) return math.cos(2 + 0.7 * k + i - 1) end)
    torch.no_grad(function() np[2]:copy_(v) end)
  end
end

local function weights(y) return torch.arange(0, y:numel(), f64):cos():reshape(y:size()) end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local m, shapes = cases[name][1], cases[name][2]
    local r = ref[name]
    fill_params(m)
    m:train()
    local xs = {}
    for i, s in ipairs(shapes) do
      xs[i] = T.filled(torch, s, function(k) return math.sin(1 + 0.37 * k + i - 1) * 2 end):requires_grad_()
    end
    local y = m(unpack(xs))
    T.is(y:size(), r.shape, name .. ": shape")
    T.values_close(y:detach():reshape(-1):tolist(), r.y, 1e-12, 1e-12, name .. ": output")
    if r.dx1 then
      local loss = (y * weights(y)):sum()
      loss:backward()
      for i, x in ipairs(xs) do
        T.values_close(x.grad:reshape(-1):tolist(), r["dx" .. i], 1e-11, 1e-12, name .. ": gradient of input " .. i)
      end
      for n, p in m:named_parameters() do
        T.values_close(p.grad:reshape(-1):tolist(), r["d_" .. n], 1e-11, 1e-12, name .. ": gradient of " .. n)
      end
    end
    for n, b in m:named_buffers() do
      if r["buffer_" .. n] then
        T.values_close(b:reshape(-1):tolist(), r["buffer_" .. n], 1e-12, 1e-12, name .. ": buffer " .. n)
      end
    end
  end)
end

local bags = {   -- mode, input, offsets, per_sample_weights, padding_idx, include_last_offset
  bag_mean_offsets = { "mean", { 1, 2, 4, 5, 4, 3, 2, 9 }, { 0, 4, 4 } },
  bag_sum_2d_weights = { "sum", { { 1, 2, 0 }, { 4, 3, 2 } }, nil, { { 0.5, 1.0, 2.0 }, { -1.0, 0.25, 3.0 } } },
  bag_max = { "max", { 1, 2, 4, 5, 4, 3, 2, 9 }, { 0, 3, 5, 8 }, nil, nil, true },
  bag_mean_padding = { "mean", { { 1, 0, 4 }, { 0, 0, 2 } }, nil, nil, 0 },
}
for _, name in ipairs(T.sorted_keys(bags)) do
  T.run(name .. " against PyTorch", function()
    local mode, idx, offsets, psw, pad, last = unpack(bags[name], 1, 6)
    local m = nn.EmbeddingBag(10, 3, { mode = mode, padding_idx = pad, include_last_offset = last, dtype = torch.float64 })
    fill_params(m)
    if pad then torch.no_grad(function() m.weight[pad]:zero_() end) end
    local y = m(torch.tensor(idx, { dtype = torch.int64 }), offsets and torch.tensor(offsets, { dtype = torch.int64 }),
                psw and torch.tensor(psw, f64))
    local r = ref[name]
    T.is(y:size(), r.shape, name .. ": shape")
    T.values_close(y:detach():reshape(-1):tolist(), r.y, 1e-12, 1e-12, name .. ": output")
    ;(y * weights(y)):sum():backward()
    T.values_close(m.weight.grad:reshape(-1):tolist(), r.d_weight, 1e-12, 1e-12, name .. ": gradient of the weight")
  end)
end

T.run("pdist against PyTorch", function()
  local x = T.filled(torch, { 5, 3 }, function(k) return math.sin(1 + 0.37 * k) * 2 end):requires_grad_()
  local y = F.pdist(x, 1.5)
  T.values_close(y:detach():tolist(), ref.pdist.y, 1e-12, 1e-12, "pdist")
  ;(y * weights(y)):sum():backward()
  T.values_close(x.grad:reshape(-1):tolist(), ref.pdist.dx1, 1e-11, 1e-12, "pdist's gradient")
end)

T.run("grid_sample and affine_grid against PyTorch", function()
  local grids = {
    grid_bilinear_zeros = { "bilinear", "zeros", false },
    grid_bilinear_border_align = { "bilinear", "border", true },
    grid_bilinear_reflection = { "bilinear", "reflection", false },
    grid_bilinear_reflection_align = { "bilinear", "reflection", true },
    grid_nearest_zeros = { "nearest", "zeros", false },
    grid_nearest_border_align = { "nearest", "border", true },
  }
  for _, name in ipairs(T.sorted_keys(grids)) do
    local mode, pad, align = unpack(grids[name])
    local r = ref[name]
    local x = T.filled(torch, { 2, 2, 3, 4 }, function(k) return math.sin(1 + 0.37 * k) * 2 end):requires_grad_()
    local grid = T.filled(torch, { 2, 5, 3, 2 }, function(k) return 1.3 * math.sin(0.7 + 1.9 * k) end):requires_grad_()
    local y = F.grid_sample(x, grid, { mode = mode, padding_mode = pad, align_corners = align })
    T.values_close(y:detach():reshape(-1):tolist(), r.y, 1e-12, 1e-12, name .. ": output")
    local loss = (y * weights(y)):sum()
    loss:backward()
    T.values_close(x.grad:reshape(-1):tolist(), r.dx1, 1e-12, 1e-12, name .. ": the input's gradient")
    T.values_close(grid.grad:reshape(-1):tolist(), r.dgrid, 1e-11, 1e-12, name .. ": the grid's gradient")
  end
  for _, align in ipairs({ false, true }) do
    local name = "affine_grid" .. (align and "_align" or "")
    local theta = T.filled(torch, { 2, 2, 3 }, function(k) return math.cos(0.3 + 1.1 * k) end):requires_grad_()
    local g = F.affine_grid(theta, { 2, 3, 4, 5 }, align)
    T.values_close(g:detach():reshape(-1):tolist(), ref[name].y, 1e-12, 1e-12, name)
    local loss = (g * weights(g)):sum()
    loss:backward()
    T.values_close(theta.grad:reshape(-1):tolist(), ref[name].dtheta, 1e-12, 1e-12, name .. ": theta's gradient")
  end
  T.raises(function() F.grid_sample(torch.randn(1, 1, 3, 3), torch.randn(1, 2, 2, 3)) end,
           "expected input %(N, C, H, W%) and grid %(N, Ho, Wo, 2%)", "a grid of triples")
  T.raises(function() F.grid_sample(torch.randn(1, 1, 3, 3), torch.randn(1, 2, 2, 2), { mode = "bicubic" }) end,
           'mode must be "bilinear" or "nearest"', "bicubic")
  T.raises(function() F.affine_grid(torch.randn(2, 2, 3), { 1, 1, 4, 4 }) end, "expected theta of shape %[1, 2, 3%]",
           "theta of another batch")
end)

T.run("the random layers by their properties", function()
  local x = torch.randn(200, 8, f64)
  local rr = nn.RReLU(0.1, 0.3)
  local y = rr(x)
  local ratio = (y / x):masked_select(x:lt(0))
  T.ok(ratio:min():item() >= 0.1 - 1e-12 and ratio:max():item() <= 0.3 + 1e-12, "RReLU's training slopes in [lower, upper]")
  T.ok(ratio:std():item() > 0.01, "RReLU draws a slope an element")
  rr:eval()
  T.tensor_close(rr(x), F.leaky_relu(x, 0.2), 1e-15, 0, "RReLU in eval mode is leaky_relu with the mean slope")
  local ones = torch.ones(50, 16, 3, 3, f64)
  local d = nn.Dropout2d(0.25)(ones)
  local per_channel = d:sum({ 2, 3 })
  T.ok(per_channel:eq(0):logical_or(per_channel:sub(9 / 0.75):abs():lt(1e-9)):all():item(),
       "Dropout2d keeps or drops whole channels, scaling the kept by 1 / (1 - p)")
  T.close(per_channel:eq(0):double():mean():item(), 0.25, 0, 0.05, "Dropout2d's drop rate")
  local dm = nn.Dropout2d(0.25)
  dm:eval()
  T.tensor_close(dm(ones), ones, 0, 0, "Dropout2d in eval mode")
  T.is(T.shape(nn.Dropout1d(0.5)(torch.ones(3, 5))), { 3, 5 }, "Dropout1d takes an unbatched (C, L)")
  local z = torch.randn(20000, f64)
  local a = nn.AlphaDropout(0.2)(z)
  T.close(a:mean():item(), 0, 0, 0.03, "AlphaDropout keeps the mean")
  T.close(a:std():item(), 1, 0, 0.03, "AlphaDropout keeps the variance")
  local logits = torch.randn(4, 6, f64):requires_grad_()
  local g = F.gumbel_softmax(logits, { tau = 0.5, hard = true })
  T.tensor_close(g:sum(1), torch.ones(4, f64), 0, 1e-12, "gumbel_softmax hard rows are one-hot")
  ;(g * torch.arange(6, f64)):sum():backward()
  T.ok(logits.grad:abs():sum():item() > 0, "the straight-through gradient reaches the logits")
  local soft = F.gumbel_softmax(logits:detach(), 1.0)
  T.tensor_close(soft:sum(1), torch.ones(4, f64), 1e-12, 1e-12, "soft samples are distributions")
end)

T.run("printing and bad input", function()
  T.is(tostring(nn.InstanceNorm2d(3)), "InstanceNorm2d(3, eps=1e-05, momentum=0.1, affine=False, track_running_stats=False)",
       "InstanceNorm2d prints as PyTorch's")
  T.is(tostring(nn.RMSNorm(5)), "RMSNorm((5,), eps=None, elementwise_affine=True)", "RMSNorm prints as PyTorch's")
  T.is(tostring(nn.Bilinear(3, 2, 4)), "Bilinear(in1_features=3, in2_features=2, out_features=4, bias=True)",
       "Bilinear prints as PyTorch's")
  T.raises(function() nn.GLU()(torch.randn(2, 3)) end, "halving dimension must be even", "GLU of an odd size")
  T.raises(function() F.prelu(torch.randn(2, 3), torch.ones(2)) end, "one element or one per channel %(3%)", "PReLU's weight")
  T.raises(function() F.rms_norm(torch.randn(2, 3), { 4 }) end, "expected input with shape %[%*, 4%]", "RMSNorm's shape")
  T.raises(function() nn.InstanceNorm2d(3)(torch.randn(3, 4)) end, "expected a 3%-D or 4%-D input", "InstanceNorm2d's dims")
  T.raises(function() F.channel_shuffle(torch.randn(1, 5, 2, 2), 2) end, "expected groups to divide the 5 channels",
           "channel_shuffle's groups")
  T.raises(function() F.embedding_bag(torch.tensor({ 1, 2 }, { dtype = torch.int64 }), torch.randn(4, 2)) end,
           "a 1%-D input needs offsets", "embedding_bag without offsets")
  T.raises(function() F.embedding_bag(torch.tensor({ { 1 } }, { dtype = torch.int64 }), torch.randn(4, 2), nil,
                                      { mode = "max", per_sample_weights = torch.ones(1, 1) }) end,
           'per_sample_weights are only supported for mode "sum"', "weights with max")
  T.raises(function() F.dropout2d(torch.ones(2, 3), 0.5) end, "expected a 3%-D or 4%-D input", "dropout2d's dims")
  T.raises(function() F.rrelu(torch.ones(2), 0.5, 0.1) end, "lower bound should be less than or equal", "rrelu's bounds")
  T.raises(function() F.bilinear(torch.randn(2, 3), torch.randn(2, 2), torch.randn(4, 2, 2)) end,
           "expected weight %(out, 3, 2%)", "bilinear's weight")
end)

T.done_testing()
