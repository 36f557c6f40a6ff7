-- test_activations.lua: nn.LeakyReLU, ELU, Softplus, Hardtanh, ReLU6,
-- Mish, Hardsigmoid, Hardswish, SELU, Softsign, CELU, LogSigmoid,
-- Tanhshrink, Softshrink, Hardshrink and Threshold (and their F.* forms) against PyTorch's outputs and gradients in
-- float64 (tests/ref/activations.lua, written by
-- scripts/gen_activation_ref.py), over inputs up to 800 where exp
-- overflows; float64 gradcheck; float32; argument errors.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(here .. "/../ref/activations.lua")

local modules = {
  leaky_relu = nn.LeakyReLU(),
  leaky_relu_02 = nn.LeakyReLU(0.2),
  elu = nn.ELU(),
  elu_alpha = nn.ELU({ alpha = 0.5 }),
  softplus = nn.Softplus(),
  softplus_beta = nn.Softplus({ beta = 2.0, threshold = 5.0 }),
  hardtanh = nn.Hardtanh(),
  hardtanh_range = nn.Hardtanh(-2.0, 5.0),
  relu6 = nn.ReLU6(),
  mish = nn.Mish(),
  hardsigmoid = nn.Hardsigmoid(),
  hardswish = nn.Hardswish(),
  selu = nn.SELU(),
  softsign = nn.Softsign(),
  celu = nn.CELU(),
  celu_alpha = nn.CELU({ alpha = 2.5 }),
  logsigmoid = nn.LogSigmoid(),
  tanhshrink = nn.Tanhshrink(),
  softshrink = nn.Softshrink(),
  softshrink_lambd = nn.Softshrink(1.5),
  hardshrink = nn.Hardshrink(0.45),
  threshold = nn.Threshold(0.2, -7.0),
}

for _, name in ipairs(T.sorted_keys(modules)) do
  T.run(name .. " against PyTorch", function()
    local x = torch.tensor(ref.x, { dtype = torch.float64 }):requires_grad_()
    local y = modules[name](x)
    y:sum():backward()
    local ok, why = T.compare_values(y:tolist(), ref[name].y, 1e-14, 1e-300)
    T.ok(ok, name .. ": the output", why)
    -- PyTorch's hardsigmoid backward multiplies by 1/6 rounded to float32
    -- even in float64 (0.166666672); the gradient here is 1/6
    local rtol = name == "hardsigmoid" and 1e-7 or 1e-12
    ok, why = T.compare_values(x.grad:tolist(), ref[name].dx, rtol, 1e-300)
    T.ok(ok, name .. ": the gradient", why)
    T.ok(y:isfinite():all():item() and x.grad:isfinite():all():item(), name .. ": nothing overflows at 800")
  end)
end

T.run("the functional forms", function()
  local x = torch.tensor(ref.x, { dtype = torch.float64 })
  local function same(a, b, name) T.is((a - b):abs():max():item(), 0, name) end
  same(F.leaky_relu(x, 0.2), modules.leaky_relu_02(x), "F.leaky_relu(x, 0.2)")
  same(F.leaky_relu(x, { negative_slope = 0.2 }), modules.leaky_relu_02(x), "F.leaky_relu with an options table")
  same(F.elu(x, 0.5), modules.elu_alpha(x), "F.elu(x, 0.5)")
  same(F.softplus(x, 2.0, 5.0), modules.softplus_beta(x), "F.softplus(x, 2, 5)")
  same(F.softplus(x, { beta = 2.0, threshold = 5.0 }), modules.softplus_beta(x), "F.softplus with an options table")
  same(F.hardtanh(x, -2.0, 5.0), modules.hardtanh_range(x), "F.hardtanh(x, -2, 5)")
  same(F.relu6(x), modules.relu6(x), "F.relu6")
  same(F.mish(x), modules.mish(x), "F.mish")
  same(F.hardsigmoid(x), modules.hardsigmoid(x), "F.hardsigmoid")
  same(F.hardswish(x), modules.hardswish(x), "F.hardswish")
  same(F.selu(x), modules.selu(x), "F.selu")
  same(F.softsign(x), modules.softsign(x), "F.softsign")
end)

T.run("float64 gradcheck", function()
  local x = torch.tensor({ { -2.1, -0.4, 0.7 }, { 1.9, 3.3, -6.2 } }, { dtype = torch.float64 }):requires_grad_()
  for _, name in ipairs(T.sorted_keys(modules)) do
    T.ok(torch.autograd.gradcheck(function(t) return modules[name](t) end, { x }), name .. ": gradcheck")
  end
end)

-- softplus is smooth at 0, where its composite's abs and relu have no
-- gradient of their own
T.run("float64 gradcheck at 0", function()
  local x = torch.tensor({ -1e-3, 0, 1e-3 }, { dtype = torch.float64 }):requires_grad_()
  for _, name in ipairs({ "softplus", "softplus_beta", "mish", "elu" }) do
    T.ok(torch.autograd.gradcheck(function(t) return modules[name](t) end, { x }), name .. ": gradcheck at 0")
  end
end)

T.run("float32 within float32 rounding", function()
  local x = torch.tensor(ref.x)
  for _, name in ipairs({ "elu", "softplus", "mish" }) do
    local ok, why = T.compare_values(modules[name](x):tolist(), ref[name].y, 1e-6, 1e-30)
    T.ok(ok, name .. " in float32", why)
  end
end)

T.run("printing and errors", function()
  T.is(tostring(nn.LeakyReLU(0.2)), "LeakyReLU(negative_slope=0.2)", "LeakyReLU prints its slope")
  T.is(tostring(nn.Softplus({ beta = 2 })), "Softplus(beta=2, threshold=20)", "Softplus prints both")
  T.raises(function() F.leaky_relu(torch.zeros(2), "x") end, "leaky_relu: expected negative_slope to be a number",
           "a slope that is not a number")
  T.raises(function() F.hardtanh(torch.zeros(2), 1, -1) end, "max_val cannot be less than min_val", "an empty range")
  T.raises(function() F.elu(3) end, "elu", "a number as input")
end)

T.done_testing()
