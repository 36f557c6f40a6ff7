-- test_parametrize.lua: nn.utils.parametrize (register_parametrization,
-- chaining, assignment through right_inverse, remove_parametrizations,
-- cached) and nn.utils.parametrizations (spectral_norm against PyTorch,
-- tests/ref/parametrize.lua from scripts/gen_parametrize_ref.py; weight_norm
-- against nn.utils.weight_norm, itself checked against PyTorch), in
-- float64; state dict keys; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local P = nn.utils.parametrize
local ref = dofile(here .. "/../ref/parametrize.lua")
local f64 = { dtype = torch.float64 }

local Symmetric = nn.Module:extend("Symmetric")
function Symmetric:forward(X) return X:triu() + X:triu(1):transpose(-1, -2) end
function Symmetric:right_inverse(X) return X:triu() end
local Twice = nn.Module:extend("Twice")
function Twice:forward(X) return X * 2 end
function Twice:right_inverse(X) return X / 2 end

-- the generator's module and input
local function built(make, xshape) return T.fixed_module(torch, make, xshape) end
local function flat(t) return t:detach():reshape(-1):tolist() end

T.run("a chained parametrization against PyTorch", function()
  local m, x = built(function(o) return nn.Linear(3, 3, o) end, { 2, 3 })
  local w0 = m.weight:detach():clone()
  T.is(P.register_parametrization(m, "weight", Symmetric()), m, "returns the module")
  P.register_parametrization(m, "weight", Twice())
  T.ok(P.is_parametrized(m) and P.is_parametrized(m, "weight") and not P.is_parametrized(m, "bias"), "is_parametrized")
  T.is(T.sorted_keys(m:state_dict()), { "bias", "parametrizations.weight.original" }, "PyTorch's state dict keys")
  T.is(#m:parameters(), 2, "the original and the bias")
  local r = ref.symmetric
  T.output_and_grad(torch, m(x), x, r, 1e-12, "symmetric: ")
  T.values_close(flat(m.parametrizations.weight.original.grad), r.d_original, 1e-12, 1e-12, "the original's gradient")
  T.values_close(m.bias.grad:tolist(), r.db, 1e-12, 1e-12, "the bias's gradient")
  m.weight = w0 + w0:t()
  T.values_close(flat(m.parametrizations.weight.original), r.original_after_assign, 1e-12, 1e-12,
                 "assigning runs the right_inverses backwards")
  T.values_close(flat(m.weight), r.weight_after_assign, 1e-12, 1e-12, "and reads back")
  local calls = 0
  local Count = nn.Module:extend("Count")
  function Count:forward(X) calls = calls + 1; return X end
  P.register_parametrization(m, "weight", Count())
  calls = 0   -- (registration ran it once, to check the shape)
  P.cached(function() local _ = m.weight + m.weight end)
  T.is(calls, 1, "cached: computed once in the region")
  local _ = m.weight + m.weight
  T.is(calls, 3, "and on every read outside it")
  local w = m.weight:detach():clone()
  P.remove_parametrizations(m, "weight")
  T.ok(not P.is_parametrized(m), "removed")
  T.is(T.sorted_keys(m:state_dict()), { "bias", "weight" }, "a plain weight again")
  T.tensor_close(m.weight, w, 0, 0, "holding the parametrized value")
  T.ok(nn.is_parameter(m.weight), "as a Parameter")
  T.is(m._modules.map.parametrizations, nil, "no parametrizations left")
end)

for _, name in ipairs({ "linear", "conv_transpose2d" }) do
  T.run("parametrizations.spectral_norm against PyTorch: " .. name, function()
    local make = name == "linear" and function(o) return nn.Linear(3, 4, o) end
                 or function(o) return nn.ConvTranspose2d(2, 3, 2, o) end
    local m, x = built(make, name == "linear" and { 2, 3 } or { 1, 2, 2, 2 })
    nn.utils.parametrizations.spectral_norm(m, { n_power_iterations = 2 })
    local sn = m.parametrizations.weight[0]
    torch.no_grad(function()
      sn._u:copy_(T.filled(torch, T.shape(sn._u), function(k) return 1 + 0.1 * k end))
      sn._v:copy_(T.filled(torch, T.shape(sn._v), function(k) return 2 - 0.2 * k end))
    end)
    local r = ref["spectral_" .. name]
    T.output_and_grad(torch, m(x), x, r, 1e-12, name .. ": ")
    T.values_close(sn._u:tolist(), r.u, 1e-12, 1e-12, "_u after the power iteration")
    T.values_close(sn._v:tolist(), r.v, 1e-12, 1e-12, "_v after the power iteration")
    T.values_close(flat(m.parametrizations.weight.original.grad), r.d_original, 1e-12, 1e-12, "the original's gradient")
    m:eval()
    T.values_close(flat(m(x)), r.y_eval, 1e-12, 1e-12, "evaluation: no iteration")
    T.is(T.sorted_keys(m:state_dict()), { "bias", "parametrizations.weight.0._u", "parametrizations.weight.0._v",
                                           "parametrizations.weight.original" }, "PyTorch's state dict keys")
  end)
end

local function orthogonality(W)   -- the largest entry of Q^T Q - I, Q the tall side
  local Q = W:size(0) < W:size(1) and W:t() or W
  return (Q:t():matmul(Q) - torch.eye(Q:size(1), f64)):abs():max():item()
end

for _, case in ipairs({
    { "matrix_exp", { 4, 4 }, { 2, 4 } }, { "cayley", { 4, 4 }, { 2, 4 }, { orthogonal_map = "cayley" } },
    { "householder", { 4, 4 }, { 2, 4 }, { orthogonal_map = "householder" } }, { "tall", { 3, 5 }, { 2, 3 } },
    { "wide_cayley", { 5, 3 }, { 2, 5 }, { orthogonal_map = "cayley" } },
    { "plain_householder", { 3, 5 }, { 2, 3 }, { use_trivialization = false } },
    { "plain_matrix_exp", { 4, 4 }, { 2, 4 }, { use_trivialization = false } } }) do
  local name, dims, xshape, opts = case[1], case[2], case[3], case[4]
  T.run("parametrizations.orthogonal against PyTorch: " .. name, function()
    local m, x = built(function(o) return nn.Linear(dims[1], dims[2], o) end, xshape)
    torch.no_grad(function() m.weight:add_(torch.eye(dims[2], dims[1], f64)) end)
    local w0 = m.weight:detach():clone()
    T.is(nn.utils.parametrizations.orthogonal(m, opts), m, "returns the module")
    local r = ref["orthogonal_" .. name]
    T.values_close(flat(m.weight), r.weight, 1e-12, 1e-12, "the weight at registration")
    T.output_and_grad(torch, m(x), x, r, 1e-12, name .. ": ")
    local original = m.parametrizations.weight.original
    if r.d_original then
      T.values_close(flat(original.grad), r.d_original, 1e-11, 1e-12, "the original's gradient")
    end
    if r.weight_after_q0 then
      local n = w0:size(0)
      local q0 = torch.linalg.qr(T.filled(torch, { n, n }, function(k) return 0.3 * math.cos(0.5 * k * k) end) + torch.eye(n, f64))
      m.weight = q0
      T.values_close(flat(m.weight), r.weight_after_q0, 1e-12, 1e-12, "assigned an orthogonal matrix")
      m.weight = w0
      T.values_close(flat(m.weight), r.weight_after_w0, 1e-12, 1e-12, "assigned a matrix that is not: orthogonalized")
    end
    -- a step of the original keeps the weight orthogonal (off its diagonal,
    -- which holds the Householder map's signs and gets no gradient)
    local off = 1 - torch.eye(original:size(0), original:size(1), f64)
    torch.no_grad(function() original:add_(torch.randn(original:size(), f64) * off * 0.5) end)
    T.ok(orthogonality(m.weight) < 1e-12, "still orthogonal after moving the original", orthogonality(m.weight))
    local keys = T.sorted_keys(m:state_dict())
    local trivial = not (opts and opts.use_trivialization == false)
    T.is(keys, trivial and { "bias", "parametrizations.weight.0.base", "parametrizations.weight.original" }
               or { "bias", "parametrizations.weight.original" }, "PyTorch's state dict keys")
  end)
end

T.run("parametrizations.weight_norm", function()
  local a, x = built(function(o) return nn.Linear(3, 4, o) end, { 2, 3 })
  local b = built(function(o) return nn.Linear(3, 4, o) end, { 2, 3 })
  nn.utils.parametrizations.weight_norm(a)
  nn.utils.weight_norm(b)
  T.is(T.sorted_keys(a:state_dict()), { "bias", "parametrizations.weight.original0", "parametrizations.weight.original1" },
       "PyTorch 2's state dict keys: g then v")
  T.tensor_close(a.parametrizations.weight.original0, b.weight_g, 0, 0, "original0 is g")
  T.tensor_close(a.parametrizations.weight.original1, b.weight_v, 0, 0, "original1 is v")
  local ya, yb = a(x), b(x)
  T.tensor_close(ya, yb, 1e-15, 1e-15, "the output of nn.utils.weight_norm")
  ya:sum():backward()
  yb:sum():backward()
  T.tensor_close(a.parametrizations.weight.original0.grad, b.weight_g.grad, 1e-14, 1e-14, "g's gradient")
  T.tensor_close(a.parametrizations.weight.original1.grad, b.weight_v.grad, 1e-14, 1e-14, "v's gradient")
  local w = a.weight:detach():clone()
  P.remove_parametrizations(a, "weight")
  T.tensor_close(a.weight, w, 0, 0, "removed, the weight keeps its value")
  T.is(#a:parameters(), 2, "a plain Linear again")
end)

T.run("errors", function()
  local m = nn.Linear(2, 2)
  local Shrink = nn.Module:extend("Shrink")
  function Shrink:forward(X) return X:narrow(0, 0, 1) end
  T.raises(function() P.register_parametrization(m, "weight", Shrink()) end,
           "changes the tensor's shape or dtype %(%[2, 2%] float32 to %[1, 2%] float32", "a shape change")
  T.lives(function() P.register_parametrization(nn.Linear(2, 2), "weight", Shrink(), { unsafe = true }) end, "unless unsafe")
  T.raises(function() P.register_parametrization(m, "kernel", Symmetric()) end, "no parameter or buffer named 'kernel'",
           "a missing tensor")
  T.raises(function() P.register_parametrization(m, "weight", function() end) end, "expected the parametrization to be a module",
           "a function")
  T.raises(function() P.remove_parametrizations(m, "weight") end, "does not have a parametrization on weight", "nothing to remove")
  local NoInverse = nn.Module:extend("NoInverse")
  function NoInverse:forward(X) return X * 3 end
  P.register_parametrization(m, "weight", NoInverse())
  T.raises(function() m.weight = torch.zeros(2, 2) end, "NoInverse does not implement right_inverse", "assignment without inverse")
  local wn = nn.utils.parametrizations.weight_norm(nn.Linear(2, 2))
  T.raises(function() P.remove_parametrizations(wn, "weight", false) end, "in terms of several tensors",
           "leave_parametrized = false with two originals")
  T.raises(function() nn.utils.parametrizations.spectral_norm(nn.Linear(2, 2), { n_power_iterations = 0 }) end,
           "positive integer", "zero iterations")
  local O = nn.utils.parametrizations.orthogonal
  T.raises(function() O(nn.Linear(2, 2), { orthogonal_map = "qr" }) end, 'one of "matrix_exp", "cayley", "householder"',
           "an unknown map")
  T.raises(function() O(nn.Conv1d(1, 1, 1), "bias") end, "expected a matrix, got a tensor of 1 dims", "a vector")
  local plain = O(nn.Linear(3, 3), { use_trivialization = false })
  T.raises(function() plain.weight = torch.eye(3) end, "not possible to assign to the matrix exponential", "no inverse of exp")
  local trivial = O(nn.Linear(3, 3))
  T.raises(function() trivial.weight = torch.eye(2) end, "of shape %[3, 3%], got a tensor of shape %[2, 2%]", "a shape")
end)

T.done_testing()
