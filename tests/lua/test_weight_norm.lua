-- test_weight_norm.lua: nn.utils.weight_norm, remove_weight_norm and
-- spectral_norm on Linear, Conv2d and ConvTranspose2d against PyTorch's
-- outputs, gradients and power-iteration vectors (tests/ref/weight_norm.lua,
-- written by scripts/gen_weight_norm_ref.py) in float64 and float32; the
-- parameters and state dict keys they leave; errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local U = nn.utils
local ref = dofile(here .. "/../ref/weight_norm.lua")

local modules = {  -- as in the generator: constructor, input shape
  linear = { function(o) return nn.Linear(3, 4, o) end, { 2, 3 } },
  conv2d = { function(o) return nn.Conv2d(2, 3, 2, o) end, { 1, 2, 3, 3 } },
  conv_transpose2d = { function(o) return nn.ConvTranspose2d(2, 3, 2, o) end, { 1, 2, 2, 2 } },
}

-- the generator's module and input: weight 0.5 sin(1 + 0.7 k), bias 0.1 k,
-- input cos(0.3 k)
local function built(kind, dtype)
  return T.fixed_module(torch, modules[kind][1], modules[kind][2], dtype)
end

local function flat(t) return t:reshape(-1):tolist() end

for _, name in ipairs(T.sorted_keys(ref)) do
  if name:match("^fuse") then goto next_case end
  T.run(name .. " against PyTorch", function()
    local c = ref[name]
    for _, dt in ipairs({ torch.float64, torch.float32 }) do
      local what, tol = name .. " " .. tostring(dt) .. ": ", dt == torch.float64 and 1e-12 or 2e-5
      local m, x = built(c.module, dt)
      local before = m(x):detach()
      if c.dim then
        T.is(U.weight_norm(m, "weight", c.dim), m, what .. "returns the module")
        T.tensor_close(m(x), before, tol, tol, what .. "the output unchanged by the wrapping")
        T.values_close(flat(m.weight_g), c.g, tol, tol, what .. "weight_g")
      else
        U.spectral_norm(m, { n_power_iterations = c.n_power_iterations })
        torch.no_grad(function()
          m.weight_u:copy_(T.filled(torch, T.shape(m.weight_u), function(k) return 1 + 0.1 * k end))
          m.weight_v:copy_(T.filled(torch, T.shape(m.weight_v), function(k) return 2 - 0.2 * k end))
        end)
      end
      T.output_and_grad(torch, m(x), x, c, tol, what)
      T.values_close(m.bias.grad:tolist(), c.db, tol, tol, what .. "bias gradient")
      if c.dim then
        T.values_close(flat(m.weight_g.grad), c.dg, tol, tol, what .. "weight_g gradient")
        T.values_close(flat(m.weight_v.grad), c.dv, tol, tol, what .. "weight_v gradient")
      else
        T.values_close(m.weight_u:tolist(), c.u, tol, tol, what .. "u after the power iteration")
        T.values_close(m.weight_v:tolist(), c.v, tol, tol, what .. "v after the power iteration")
        T.values_close(flat(m.weight_orig.grad), c.dw, tol, tol, what .. "weight_orig gradient")
        m:eval()
        local u = m.weight_u:clone()
        T.values_close(flat(m(x)), c.y_eval, tol, tol, what .. "evaluation output")
        T.tensor_close(m.weight_u, u, 0, 0, what .. "no iteration in evaluation")
        U.remove_spectral_norm(m)
        T.values_close(flat(m.weight), c.removed_weight, tol, tol, what .. "remove_spectral_norm's weight")
        T.ok(nn.is_parameter(m.weight) and m.weight_orig == nil and m.weight_u == nil,
             what .. "removed: one Parameter, no weight_orig or weight_u")
      end
    end
  end)
  ::next_case::
end

T.run("fuse_conv_bn_weights against PyTorch; fuse_conv_bn_eval and fuse_linear_bn_eval", function()
  local f64 = { dtype = torch.float64 }
  local function filled(shape, f) return T.filled(torch, shape, f) end
  local stats = { filled({ 3 }, function(k) return 0.2 * k - 0.1 end), filled({ 3 }, function(k) return 0.5 + 0.3 * k end),
                  filled({ 3 }, function(k) return 1 - 0.2 * k end), filled({ 3 }, function(k) return 0.05 * k end) }
  for name, c in pairs({ fuse_conv_bn = { { 3, 2, 2, 2 }, false, true }, fuse_conv_bn_no_bias = { { 3, 2, 2, 2 }, false, false },
                         fuse_conv_transpose_bn = { { 2, 3, 2, 2 }, true, true } }) do
    local w = filled(c[1], function(k) return 0.5 * math.sin(1 + 0.7 * k) end)
    local b = c[3] and filled({ 3 }, function(k) return 0.1 * k end) or nil
    local fw, fb = U.fuse_conv_bn_weights(w, b, stats[1], stats[2], 1e-3, stats[3], stats[4], c[2])
    T.values_close(flat(fw), ref[name].w, 1e-12, 1e-12, name .. ": weight")
    T.values_close(flat(fb), ref[name].b, 1e-12, 1e-12, name .. ": bias")
    T.ok(nn.is_parameter(fw) and nn.is_parameter(fb), name .. ": Parameters")
  end
  torch.manual_seed(5)
  local conv, bn = nn.Conv2d(3, 4, 3, f64), nn.BatchNorm2d(4, f64)
  bn(conv(torch.randn(8, 3, 6, 6, f64)))          -- running statistics that are not the initial ones
  T.raises(function() U.fuse_conv_bn_eval(conv, bn) end, "Fusion only for eval", "modules in training mode")
  conv:eval(); bn:eval()
  local x = torch.randn(2, 3, 6, 6, f64)
  local fused = U.fuse_conv_bn_eval(conv, bn)
  T.tensor_close(fused(x), bn(conv(x)), 1e-12, 1e-12, "fuse_conv_bn_eval: one convolution computes both")
  T.ok(fused ~= conv and conv.weight:size(0) == 4, "a copy: the convolution is left as it was")
  local lin, bn1 = nn.Linear(5, 3, f64), nn.BatchNorm1d(3, f64)
  bn1(lin(torch.randn(10, 5, f64)))
  lin:eval(); bn1:eval()
  local y = torch.randn(4, 5, f64)
  T.tensor_close(U.fuse_linear_bn_eval(lin, bn1)(y), bn1(lin(y)), 1e-12, 1e-12, "fuse_linear_bn_eval")
  T.raises(function() U.fuse_conv_bn_weights(torch.ones(3), nil, stats[1], stats[2], 1e-3) end,
           "expected conv_w to be a convolution's weight", "fuse_conv_bn_weights: a vector weight")
  T.raises(function() U.remove_spectral_norm(nn.Linear(2, 2)) end, "spectral_norm of 'weight' not found",
           "remove_spectral_norm without spectral_norm")
  T.is(T.shape(U.skip_init(nn.Linear, 3, 5).weight), { 5, 3 }, "skip_init builds the module")
end)

T.run("weight_norm's parameters and remove_weight_norm", function()
  local m, x = built("linear", torch.float64)
  local y = m(x):detach()
  U.weight_norm(m)
  T.is(T.sorted_keys(m:state_dict()), { "bias", "weight_g", "weight_v" }, "state dict keys as PyTorch's")
  T.is(#m:parameters(), 3, "three parameters")
  T.is(T.shape(m.weight_g), { 4, 1 }, "weight_g keeps dim 0")
  torch.no_grad(function() m.weight_g:mul_(2) end)
  T.tensor_close(m(x) - m.bias, (y - m.bias) * 2, 1e-12, 1e-12, "doubling g doubles the product")
  U.remove_weight_norm(m)
  T.is(T.sorted_keys(m:state_dict()), { "bias", "weight" }, "removed: weight again")
  T.ok(m.weight.requires_grad and nn.is_parameter(m.weight), "a Parameter")
  T.tensor_close(m(x) - m.bias, (y - m.bias) * 2, 1e-12, 1e-12, "with the recombined value")
  T.raises(function() U.remove_weight_norm(m) end, "weight_norm of 'weight' not found", "removing twice")
  local whole = U.weight_norm(nn.Linear(3, 4), "weight", -1)
  T.is(T.shape(whole.weight_g), {}, "dim -1 (PyTorch's None): one norm")
end)

T.run("spectral_norm's parameters and buffers", function()
  torch.manual_seed(3)
  local m = U.spectral_norm(nn.Linear(5, 7))
  T.is(T.sorted_keys(m:state_dict()), { "bias", "weight_orig", "weight_u", "weight_v" }, "state dict keys as PyTorch's")
  T.is(#m:parameters(), 2, "weight_orig and bias")
  local x = torch.randn(3, 5)
  for _ = 1, 30 do m(x) end
  -- after the iterations converge, the normalised weight's largest
  -- singular value is 1: |W v| = 1 for the unit v that maximises it
  local w = m.weight:detach()
  local v = m.weight_v
  T.close(w:mv(v):norm():item(), 1, 1e-6, 0, "sigma of the normalised weight is 1")
  local g = torch.randn(5)
  T.ok(w:mv(g / g:norm()):norm():item() <= 1 + 1e-6, "no direction grows")
end)

T.run("errors", function()
  T.raises(function() U.weight_norm(nn.Linear(2, 2), "kernel") end, "the module has no parameter 'kernel'", "a missing name")
  T.raises(function() U.weight_norm(nn.Linear(2, 2), "weight", 2) end, "expected dim in %[%-1, 2%), got 2", "a dim too large")
  T.raises(function() U.weight_norm({}, "weight") end, "expected a module", "not a module")
  T.raises(function() U.spectral_norm(nn.Linear(2, 2), { n_power_iterations = 0 }) end,
           "expected n_power_iterations to be a positive integer up to 2%^20, got 0", "zero iterations")
end)

T.done_testing()
