--[[
test_flop_counter.lua -- torch.utils.flop_counter.FlopCounterMode against
the counts PyTorch's formulas give, worked out by hand for each case: 2 m k
n a product and the same for each gradient, a convolution's 2 x output
elements x (input channels / groups) x kernel, attention's two products;
by module, and forward only when there is no backward.

    ./dplua tests/lua/test_flop_counter.lua
--]]
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local FC = torch.utils.flop_counter

T.run("products and Linear layers, forward and backward, by module", function()
  local model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
  local x = torch.randn(5, 8)
  local c = FC.FlopCounterMode({ module = model })
  c:run(function() model(x):sum():backward() end)
  local f1, f2 = 2 * 5 * 8 * 16, 2 * 5 * 16 * 4
  -- backward: the first layer's input needs no gradient, so only its weight's
  T.is(c:get_total_flops(), f1 + f2 + f1 + 2 * f2, "forward f1 + f2, backward f1 (weight) + 2 f2")
  local counts = c:get_flop_counts()
  T.is(counts["Sequential.0"], { linear = f1, linear_backward = f1 }, "the first Linear's counts")
  T.is(counts["Sequential.2"], { linear = f2, linear_backward = 2 * f2 }, "the second's")
  T.ok(c:get_table():find("Sequential.2") and c:get_table():find("linear_backward"), "the table names modules and ops")
  local fwd = FC.FlopCounterMode()
  torch.no_grad(function() fwd:run(function() return model(x) end) end)
  T.is(fwd:get_total_flops(), f1 + f2, "without backward: the forward alone")
  T.ok(fwd:get_flop_counts()["Sequential.Linear"] ~= nil, "without a module given: class names")
end)

T.run("matmul, mm, bmm, convolutions and attention", function()
  local a, b = torch.randn(3, 4, { requires_grad = true }), torch.randn(4, 6, { requires_grad = true })
  local c = FC.FlopCounterMode()
  c:run(function()
    local y = a:matmul(b) + torch.mm(a, b)
    y:sum():backward()
    torch.bmm(torch.randn(2, 3, 4), torch.randn(2, 4, 5))
  end)
  local mm = 2 * 3 * 4 * 6
  T.is(c:get_flop_counts().Global, { matmul = mm, mm = mm, matmul_backward = 2 * mm, mm_backward = 2 * mm,
                                     bmm = 2 * 2 * 3 * 4 * 5 }, "each product and both gradients")
  local conv = FC.FlopCounterMode()
  local w = torch.randn(6, 4, 3, 3, { requires_grad = true })
  conv:run(function() F.conv2d(torch.randn(2, 8, 10, 10), w, nil, 1, 1, 1, 2):sum():backward() end)
  local out = 2 * 6 * 10 * 10
  T.is(conv:get_flop_counts().Global, { conv2d = 2 * out * 4 * 9, conv2d_backward = 2 * out * 4 * 9 },
       "conv2d with 2 groups: 2 x output x (8 / 2) x 9, the weight's gradient the same")
  local att = FC.FlopCounterMode()
  local q = torch.randn(2, 3, 7, 8, { requires_grad = true })
  local k, v = torch.randn(2, 3, 5, 8, { requires_grad = true }), torch.randn(2, 3, 5, 8, { requires_grad = true })
  att:run(function() F.scaled_dot_product_attention(q, k, v):sum():backward() end)
  local fa = 2 * (2 * 3 * 7 * 5 * 8) * 2
  T.is(att:get_flop_counts().Global, { scaled_dot_product_attention = fa, scaled_dot_product_attention_backward = 2 * fa },
       "attention: 4 b h q k d forward, four products of those sizes backward")
end)

T.run("bad input; the functions are put back", function()
  local mm = torch._methods.mm
  local c = FC.FlopCounterMode()
  T.raises(function() c:run(function() error("inside") end) end, "inside", "an error inside run is raised")
  T.ok(torch._methods.mm == mm, "after an error the counted functions are the original ones")
  T.raises(function() FC.FlopCounterMode({ bogus = 1 }) end, "unknown option 'bogus'", "an unknown option")
  T.raises(function() c:run(3) end, "expected a function", "run of a number")
  c:reset()
  T.is(c:get_total_flops(), 0, "reset clears the counts")
end)

T.done_testing()
