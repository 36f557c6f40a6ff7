-- test_norm_extra.lua: F.group_norm, F.normalize, F.cosine_similarity and
-- F.pairwise_distance (and their modules) against PyTorch's
-- outputs and gradients in float64 (tests/ref/norm_extra.lua, written by
-- scripts/gen_norm_extra_ref.py), float32, and their modules; the padding
-- modules (ZeroPad, ConstantPad, ReflectionPad, ReplicationPad,
-- CircularPad in 1, 2 and 3 dims) against F.pad, and nn.Unflatten;
-- errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/norm_extra.lua")

local cases = {  -- as in the generator
  group_norm_2_of_6 = function(x, w, b) return F.group_norm(x, 2, w, b) end,
  group_norm_4d_eps = function(x, w, b) return F.group_norm(x, 4, w, b, 1e-3) end,
  group_norm_one_group = function(x, w, b) return F.group_norm(x, 1, w, b) end,
  group_norm_no_affine = function(x) return F.group_norm(x, 3) end,
  group_norm_2d_input = function(x, w, b) return F.group_norm(x, 3, w, b) end,
  normalize_p2 = function(x) return F.normalize(x) end,
  normalize_p1_last = function(x) return F.normalize(x, 1, -1) end,
  normalize_small_eps = function(x) return F.normalize(x, { dim = 0, eps = 1e-12 }) end,
  -- the second operand: cos(x) + 0.3
  cosine_similarity = function(x) return F.cosine_similarity(x, x:cos() + 0.3) end,
  cosine_similarity_last = function(x) return nn.CosineSimilarity(-1)(x, x:cos() + 0.3) end,
  pairwise_distance = function(x) return nn.PairwiseDistance()(x, x:cos() + 0.3) end,
  pairwise_distance_p1_keepdim = function(x)
    return F.pairwise_distance(x, x:cos() + 0.3, { p = 1, keepdim = true })
  end,
}

-- the generator's tensors: x.flat[i] = sin(1 + 0.7 i) * scale + shift, the
-- weight 1 + 0.1 c and the bias 0.05 c
local function inputs(c, dtype)
  local n = 1
  for _, s in ipairs(c.shape) do n = n * s end
  local v, wv, bv = {}, {}, {}
  for i = 0, n - 1 do v[#v + 1] = math.sin(1 + 0.7 * i) * c.scale + c.shift end
  for ch = 0, c.shape[2] - 1 do wv[#wv + 1], bv[#bv + 1] = 1 + 0.1 * ch, 0.05 * ch end
  local function t(list, shape) return torch.tensor(list, { dtype = torch.float64 }):reshape(shape):to(dtype):requires_grad_() end
  return t(v, c.shape), t(wv, { #wv }), t(bv, { #bv })
end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local c = ref[name]
    for _, dt in ipairs({ torch.float64, torch.float32 }) do
      local what, tol = name .. " " .. tostring(dt) .. ": ", dt == torch.float64 and 1e-12 or 2e-5
      local x, w, b = inputs(c, dt)
      local y = cases[name](x, w, b)
      T.is(y.dtype, dt, what .. "dtype")
      T.output_and_grad(torch, y, x, c, tol, what)
      if c.dw then
        T.values_close(w.grad:tolist(), c.dw, tol, tol, what .. "weight gradient")
        T.values_close(b.grad:tolist(), c.db, tol, tol, what .. "bias gradient")
      end
    end
  end)
end

T.run("nn.GroupNorm", function()
  torch.manual_seed(1)
  local g = nn.GroupNorm(2, 6)
  T.is(tostring(g), "GroupNorm(2, 6, eps=1e-05, affine=True)", "prints as PyTorch's")
  T.is(T.sorted_keys(g:state_dict()), { "bias", "weight" }, "weight and bias")
  T.tensor_close(g.weight, torch.ones(6), 0, 0, "weight ones")
  g.weight.data:copy_(torch.randn(6))
  g.bias.data:copy_(torch.randn(6))
  local x = torch.randn(3, 6, 4, 4)
  T.tensor_close(g(x), F.group_norm(x, 2, g.weight, g.bias), 0, 0, "the functional form with its parameters")
  local plain = nn.GroupNorm(3, 6, { affine = false, eps = 1e-3 })
  T.is(#plain:parameters(), 0, "affine = false: no parameters")
  T.tensor_close(plain(x), F.group_norm(x, 3, nil, nil, 1e-3), 0, 0, "and no affine step")
  T.raises(function() nn.GroupNorm(4, 6) end, "num_channels must be divisible by num_groups", "groups that do not divide")
  T.raises(function() F.group_norm(x, 4) end, "divisible by num_groups, but got input of shape %[3, 6, 4, 4%] and num_groups=4",
           "input channels that do not divide")
  T.raises(function() F.group_norm(torch.randn(6), 2) end, "at least 2 dims", "a 1-D input")
  T.raises(function() F.group_norm(x, 2, torch.ones(5)) end, "expected weight of shape %[6%]", "a weight of 5")
  T.is(T.shape(F.group_norm(torch.randn(0, 6, 3), 2)), { 0, 6, 3 }, "an empty batch")
end)

T.run("the padding modules are F.pad", function()
  local x1, x2, x3 = torch.randn(2, 3, 5), torch.randn(2, 3, 4, 5), torch.randn(1, 2, 3, 4, 5)
  local xs = { x1, x2, x3 }
  for nd = 1, 3 do
    local p = {}
    for i = 1, 2 * nd do p[i] = i % 3 end
    local x = xs[nd]
    T.tensor_close(nn["ZeroPad" .. nd .. "d"](p)(x), F.pad(x, p), 0, 0, "ZeroPad" .. nd .. "d")
    T.tensor_close(nn["ConstantPad" .. nd .. "d"](p, 2.5)(x), F.pad(x, p, "constant", 2.5), 0, 0, "ConstantPad" .. nd .. "d")
    T.tensor_close(nn["ReflectionPad" .. nd .. "d"](p)(x), F.pad(x, p, "reflect"), 0, 0, "ReflectionPad" .. nd .. "d")
    T.tensor_close(nn["ReplicationPad" .. nd .. "d"](p)(x), F.pad(x, p, "replicate"), 0, 0, "ReplicationPad" .. nd .. "d")
    T.tensor_close(nn["CircularPad" .. nd .. "d"](p)(x), F.pad(x, p, "circular"), 0, 0, "CircularPad" .. nd .. "d")
  end
  T.tensor_close(nn.ZeroPad2d(1)(x2), F.pad(x2, { 1, 1, 1, 1 }), 0, 0, "an integer pads every side")
  T.is(tostring(nn.ZeroPad2d(1)), "ZeroPad2d((1, 1, 1, 1))", "ZeroPad2d prints as PyTorch's")
  T.is(tostring(nn.ConstantPad1d({ 1, 2 }, 3.5)), "ConstantPad1d(padding=(1, 2), value=3.5)", "ConstantPad1d too")
  T.raises(function() nn.ReflectionPad2d({ 1, 2 }) end, "expected padding to be an integer or 4 integers", "two sides for 2-D")
  T.raises(function() nn.ConstantPad2d(1) end, "expected value to be a number", "ConstantPad without a value")
end)

T.run("nn.Unflatten", function()
  local x = torch.randn(4, 6, 5)
  T.is(T.shape(nn.Unflatten(1, { 2, 3 })(x)), { 4, 2, 3, 5 }, "a middle dim")
  T.is(T.shape(nn.Unflatten(-1, { 5, -1 })(x)), { 4, 6, 5, 1 }, "the last dim, with -1")
  T.tensor_close(nn.Unflatten(1, { 3, 2 })(x):reshape(4, 6, 5), x, 0, 0, "the same values")
  T.is(tostring(nn.Unflatten(1, { 2, 3 })), "Unflatten(dim=1, unflattened_size=(2, 3))", "prints as PyTorch's")
  T.raises(function() nn.Unflatten(1, { 4, 2 })(x) end, "", "sizes that do not multiply to the dim's")
  T.raises(function() nn.Unflatten(3, { 1 })(x) end, "out of range", "a dim past the input's")
end)

T.done_testing()
