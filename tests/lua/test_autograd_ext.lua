--[[
test_autograd_ext.lua -- extending autograd: torch.autograd.Function,
torch.autograd.grad, Tensor:register_hook, the forward and backward hooks
of nn.Module, nn.ParameterList and nn.ParameterDict.

    ./dplua tests/lua/test_autograd_ext.lua

Values are compared with PyTorch's (tests/ref/autograd.lua, written by
scripts/gen_autograd_ref.py from the same fixed inputs) or with float64
finite differences (torch.autograd.gradcheck).
--]]
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn = torch.nn
local R = dofile(here .. "/../ref/autograd.lua")

local f64 = { dtype = torch.float64 }
local function x_of() return T.filled(torch, { 2, 3 }, function(i) return 0.3 * i - 0.7 end):requires_grad_(true) end
local function w_of() return T.filled(torch, { 3, 2 }, function(i) return math.sin(i + 1) end):requires_grad_(true) end
local function close(t, want, name) return T.tensor_close(t, want, 1e-10, 1e-12, name) end
local function lua_live() return tonumber(torch.C.dp_lua_nodes_live()) end

---------------------------------------------------------------- Function

local Exp = torch.autograd.Function:extend("MyExp")
function Exp.forward(ctx, x)
  local y = x:exp()
  ctx:save_for_backward(y)
  return y
end
function Exp.backward(ctx, g)
  local y = unpack(ctx.saved_tensors)
  return g * y
end

local MulAdd = torch.autograd.Function:extend("MulAdd")
function MulAdd.forward(ctx, a, b, k)
  ctx:save_for_backward(a, b)
  ctx.k = k
  return a * b * k, a + b
end
function MulAdd.backward(ctx, g1, g2)
  local a, b = unpack(ctx.saved_tensors)
  return g1 * b * ctx.k + g2, g1 * a * ctx.k + g2, nil
end

T.run("Function: a user-written exp", function()
  local x = torch.randn(2, 3, { dtype = torch.float64, requires_grad = true })
  local y = Exp.apply(x)
  T.is(tostring(y.grad_fn), "<MyExpBackward>", "grad_fn is named after the class")
  T.ok(y.requires_grad and not y.is_leaf, "the result requires grad")
  close(y, x:detach():exp(), "forward")
  T.ok(torch.autograd.gradcheck(function(a) return Exp.apply(a):sin() end, { x }), "gradcheck (float64 finite differences)")
  local z = Exp:apply(x)   -- the colon form
  z:sum():backward()
  close(x.grad, x:detach():exp(), "Exp:apply(x) works as Exp.apply(x)")
end)

T.run("Function: two results, a number argument (PyTorch reference)", function()
  local r = R.function_two_outputs
  local a = x_of()
  local b = T.filled(torch, { 2, 3 }, math.cos):requires_grad_(true)
  local p, s = MulAdd.apply(a, b, 3)
  close(p, r.p, "first result")
  close(s, r.s, "second result")
  T.ok(p.grad_fn.name == "MulAddBackward" and s.grad_fn.name == "MulAddBackward", "both results have the node's name")
  local loss = (p * s):sum() + (s * s):sum()
  loss:backward()
  close(a.grad, r.a_grad, "a.grad")
  close(b.grad, r.b_grad, "b.grad")
  local a2 = torch.randn(3, { dtype = torch.float64, requires_grad = true })
  local b2 = torch.randn(3, { dtype = torch.float64, requires_grad = true })
  T.ok(torch.autograd.gradcheck(function(u, v) return { MulAdd.apply(u, v, -2) } end, { a2, b2 }),
       "gradcheck of both results")
end)

T.run("Function: one result unused gets zeros; set_materialize_grads(false) gives nil", function()
  local a, b = x_of(), w_of():t():contiguous():detach():requires_grad_(true)
  local p = MulAdd.apply(a, b, 2)
  p:sum():backward()   -- s unused: its gradient is zeros
  close(a.grad, (b * 2):detach(), "unused result adds nothing")
  local Seen = torch.autograd.Function:extend("Seen")
  local got = {}
  function Seen.forward(ctx, x)
    ctx:set_materialize_grads(false)
    return x * 2, x * 3
  end
  function Seen.backward(ctx, g1, g2)
    got.g1, got.g2 = g1, g2
    return g1 * 2
  end
  local x = x_of()
  local u = Seen.apply(x)
  u:sum():backward()
  T.ok(got.g2 == nil and got.g1 ~= nil, "the unused result's gradient is nil")
end)

T.run("Function: needs_input_grad, nil gradients, only some inputs requiring grad", function()
  local Probe = torch.autograd.Function:extend("Probe")
  local needs
  function Probe.forward(ctx, a, n, b)
    needs = { unpack(ctx.needs_input_grad, 1, 3) }
    ctx.n = n
    return a * b + n
  end
  function Probe.backward(ctx, g)
    return nil, nil, g * 2   -- a needs none: nil is fine
  end
  local a = x_of():detach()
  local b = x_of()
  local y = Probe.apply(a, 5, b)
  T.is(needs, { false, false, true }, "needs_input_grad per argument")
  y:sum():backward()
  close(b.grad, T.filled(torch, { 2, 3 }, function() return 2 end), "the gradient of the input that needs one")
  -- no input requires grad: no node
  local z = Probe.apply(a, 1, a)
  T.ok(not z.requires_grad and z.grad_fn == nil, "no input requiring grad: a plain result")
  torch.no_grad(function()
    local w = Probe.apply(a, 1, b)
    T.ok(not w.requires_grad, "under no_grad: a plain result")
  end)
end)

T.run("Function: a forward that applies another Function", function()
  local Outer = torch.autograd.Function:extend("Outer")
  function Outer.forward(ctx, a, b)
    local w = torch.ones(2, { dtype = torch.float64, requires_grad = true })
    torch.enable_grad(function() return Exp.apply(w) end)
    return a * b
  end
  function Outer.backward(ctx, g) return g * 2, g * 3 end
  local a = torch.ones(2, { dtype = torch.float64, requires_grad = true })
  local b = torch.ones(2, f64)
  Outer.apply(a, b):sum():backward()
  close(a.grad, { 2, 2 }, "the outer node's inputs are its own")
end)

T.run("Function: mark_non_differentiable", function()
  local MaxIdx = torch.autograd.Function:extend("MaxIdx")
  function MaxIdx.forward(ctx, x)
    local v = x * 1
    local mask = x:gt(0):to(torch.float64)
    ctx:mark_non_differentiable(mask)
    ctx:save_for_backward(mask)
    return v, mask
  end
  function MaxIdx.backward(ctx, g, gm)
    T.ok(gm == nil or gm:abs():sum():item() == 0, "no gradient flows into the non-differentiable result")
    return g
  end
  local x = x_of()
  local v, m = MaxIdx.apply(x)
  T.ok(v.requires_grad, "the differentiable result requires grad")
  T.ok(not m.requires_grad, "the marked result does not")
  v:sum():backward()
  close(x.grad, T.filled(torch, { 2, 3 }, function() return 1 end), "gradient")
end)

T.run("Function: bad gradients are clear errors", function()
  local function fn(backward)
    local F = torch.autograd.Function:extend("Bad")
    function F.forward(ctx, a, k) return a * k end
    F.backward = backward
    return F
  end
  local x = x_of()
  local ok = pcall(function() fn(function(ctx, g) return g end).apply(x, 2):sum():backward() end)
  T.ok(ok, "omitting the trailing nil for a number argument is allowed")
  T.raises(function() fn(function(ctx, g) return g, nil, g end).apply(x, 2):sum():backward() end,
           "function BadBackward returned an incorrect number of gradients %(expected 2, got 3%)", "too many gradients")
  T.raises(function() fn(function(ctx, g) return g:sum() end).apply(x, 2):sum():backward() end,
           "function BadBackward returned an invalid gradient for argument 1: got shape %[%], expected %[2, 3%]",
           "wrong shape")
  T.raises(function() fn(function(ctx, g) return g, g end).apply(x, 2):sum():backward() end,
           "returned a gradient for argument 2, which is a number", "a gradient for a number")
  T.raises(function() fn(function(ctx, g) return 3 end).apply(x, 2):sum():backward() end,
           "returned a number as the gradient of argument 1", "a number as a gradient")
  T.raises(function() fn(function(ctx, g) error("boom") end).apply(x, 2):sum():backward() end, "boom",
           "an error inside backward reaches the caller")
  local NoBackward = torch.autograd.Function:extend("NoBackward")
  function NoBackward.forward(ctx, a) return a * 2 end
  T.raises(function() NoBackward.apply(x):sum():backward() end, "define backward", "a missing backward")
  T.raises(function() torch.autograd.Function:extend(3) end, "expected a class name string", "extend without a name")
  -- saved state is freed by a backward without retain_graph
  local y = Exp.apply(x)
  local l = y:sum()
  l:backward()
  T.raises(function() l:backward() end, "second time", "a second backward through a Function")
  local y2 = Exp.apply(x)
  local l2 = y2:sum()
  l2:backward({ retain_graph = true })
  T.lives(function() l2:backward() end, "retain_graph keeps a Function's saved tensors")
end)

---------------------------------------------------------------- grad

T.run("autograd.grad: PyTorch reference, .grad untouched", function()
  local r = R.grad
  local x, w = x_of(), w_of()
  local y = (x:matmul(w)):tanh()
  local z = (y * y):sum() + (x * x):sum()
  local g = torch.autograd.grad(z, { x, w, y }, { retain_graph = true })
  close(g[1], r.gx, "d z / d x")
  close(g[2], r.gw, "d z / d w")
  close(g[3], r.gy, "d z / d y (a tensor inside the graph)")
  T.ok(x.grad == nil and w.grad == nil, ".grad of the inputs stays nil")
  local go = T.filled(torch, { 2, 2 }, function(i) return 0.5 + i end)
  local gx = torch.autograd.grad(y, x, { grad_outputs = go })[1]
  close(gx, r.gx_go, "grad_outputs")
  T.ok(x.grad == nil and w.grad == nil, ".grad still nil")
  T.raises(function() torch.autograd.grad(y, x, { grad_outputs = go }) end, "second time",
           "the graph is freed without retain_graph")
end)

T.run("autograd.grad: several outputs", function()
  local r = R.grad_two_outputs
  local x, w = x_of(), w_of()
  local y = x:matmul(w)
  local a, b = y:sin():sum(), (y * y):mean()
  local g = torch.autograd.grad({ a, b }, { x, w }, { grad_outputs = { torch.tensor(2.0, f64), torch.tensor(-1.0, f64) } })
  close(g[1], r.gx, "x")
  close(g[2], r.gw, "w")
end)

T.run("autograd.backward: several roots, grad_tensors, inputs", function()
  local r = R.backward_several
  local x, w = x_of(), w_of()
  local y = x:matmul(w)
  local go = T.filled(torch, { 2, 2 }, function(i) return 0.5 + i end)
  torch.autograd.backward({ y:sin():sum(), y * y }, { nil, go })
  close(x.grad, r.gx, "x.grad from two roots")
  close(w.grad, r.gw, "w.grad from two roots")
  torch.autograd.backward({ x:matmul(w):exp():sum() }, { inputs = { w } })
  close(x.grad, r.gx_after, "x.grad untouched: not among inputs")
  close(w.grad, r.gw_after, "w.grad accumulated")
  T.raises(function() torch.autograd.backward({ y * y }) end, "grad can be implicitly created only for scalar outputs",
           "a non-scalar root without its gradient")
  T.raises(function() torch.autograd.backward(y:sum(), { bogus = true }) end, "unknown option 'bogus'",
           "an unknown option")
  T.raises(function() torch.autograd.backward({ y:sum(), 3 }) end, "expected tensors%[2%] to be a tensor",
           "a number among the roots")
  T.ok(torch.autograd.no_grad == torch.no_grad and torch.autograd.set_grad_enabled == torch.set_grad_enabled,
       "the grad modes are reachable through torch.autograd")
  local inside = torch.inference_mode(function() return torch.is_inference_mode_enabled() end)
  local off = torch.inference_mode(false, function() return torch.is_inference_mode_enabled() end)
  T.ok(inside and not off and not torch.is_inference_mode_enabled(), "is_inference_mode_enabled follows inference_mode")
end)

T.run("autograd.grad: leaves that already have .grad, finite differences, through a Function", function()
  local x = torch.randn(4, { dtype = torch.float64, requires_grad = true })
  x.grad = torch.ones(4, f64)
  local g = torch.autograd.grad(Exp.apply(x):sum(), x)[1]
  close(x.grad, { 1, 1, 1, 1 }, ".grad kept as it was")
  close(g, x:detach():exp(), "through a Function")
  -- finite differences of a small net
  local w = torch.randn(4, 3, { dtype = torch.float64, requires_grad = true })
  local function f() return (x:matmul(w)):sigmoid():pow(2):sum() end
  local gw = torch.autograd.grad(f(), w)[1]
  local eps = 1e-6
  local ok = true
  torch.no_grad(function()
    for i = 0, 3 do
      for j = 0, 2 do
        local e = w[{ i, j }]
        local v = e:item()
        e:fill_(v + eps); local fp = f():item()
        e:fill_(v - eps); local fm = f():item()
        e:fill_(v)
        local num = (fp - fm) / (2 * eps)
        if math.abs(num - gw[{ i, j }]:item()) > 1e-7 then ok = false end
      end
    end
  end)
  T.ok(ok, "matches central differences")
  -- an output that is its own input
  close(torch.autograd.grad(x, x, { grad_outputs = torch.full({ 4 }, 3, f64) })[1], { 3, 3, 3, 3 }, "grad(x, x)")
end)

T.run("autograd.grad: an input listed twice, a hooked leaf, inside a Function's backward", function()
  local x = torch.tensor({ 1, 2, 3 }, { dtype = torch.float64, requires_grad = true })
  local g = torch.autograd.grad((x * x):sum(), { x, x })
  close(g[1], { 2, 4, 6 }, "first place")
  close(g[2], { 2, 4, 6 }, "second place")
  local h = x:register_hook(function(gr) return gr * 10 end)
  close(torch.autograd.grad((x * 2 + x * 3):sum(), x)[1], { 50, 50, 50 }, "a leaf's hook sees its whole gradient")
  h:remove()
  -- a backward that asks autograd.grad about a leaf the outer backward also reaches
  local w = torch.tensor({ 0.5, -1, 2 }, { dtype = torch.float64, requires_grad = true })
  local Inner = torch.autograd.Function:extend("Inner")
  local inner_gw
  function Inner.forward(ctx, a) return a * 2 end
  function Inner.backward(ctx, gr)
    local u = torch.enable_grad(function() return (w * w):sum() end)
    inner_gw = torch.autograd.grad(u, w)[1]
    return gr * 2
  end
  local loss = (Inner.apply(x) * w):sum()
  loss:backward()
  close(inner_gw, { 1, -2, 4 }, "the inner autograd.grad got its gradient")
  close(w.grad, { 2, 4, 6 }, "the outer backward's gradient is untouched by it")
  close(x.grad, { 1, -2, 4 }, "and flows through the Function")
end)

T.run("autograd.grad: options and errors", function()
  local x, w = x_of(), w_of()
  local u = torch.randn(2, { dtype = torch.float64, requires_grad = true })
  local z = (x * x):sum()
  T.raises(function() torch.autograd.grad(z, { x, u }, { retain_graph = true }) end,
           "inputs%[2%] appears to not have been used in the graph", "unused input")
  local g = torch.autograd.grad(z, { x, u }, { allow_unused = true, retain_graph = true })
  T.ok(g[1] ~= nil and g[2] == nil, "allow_unused gives nil")
  T.raises(function() torch.autograd.grad(z, x, { create_graph = true }) end, "create_graph=true is not supported",
           "create_graph")
  T.raises(function() torch.autograd.grad(x:matmul(w), x) end, "grad can be implicitly created only for scalar outputs",
           "a non-scalar output needs grad_outputs")
  T.raises(function() torch.autograd.grad(z, x, { grad_outputs = torch.ones(2, f64), retain_graph = true }) end,
           "grad_outputs%[1%] has shape %[2%], expected the shape of outputs%[1%] %[%]", "wrong grad_outputs shape")
  T.raises(function() torch.autograd.grad(z, x:detach()) end, "inputs%[1%] does not require grad", "input without grad")
  T.raises(function() torch.autograd.grad(x:detach():sum(), x) end, "outputs%[1%] does not require grad",
           "output without grad")
  T.raises(function() torch.autograd.grad(z, { x, 3 }) end, "expected inputs%[2%] to be a tensor", "a number input")
  T.raises(function() torch.autograd.grad(z, x, { retian_graph = true }) end, "unknown option 'retian_graph'",
           "a misspelt option")
  local y = torch.utils.checkpoint.checkpoint(function(a) return a:matmul(w) end, x)
  T.raises(function() torch.autograd.grad(y:sum(), x) end, "cannot go through a checkpointed call",
           "checkpoint inside grad")
end)

---------------------------------------------------------------- tensor hooks

T.run("register_hook: PyTorch reference", function()
  local r = R.tensor_hooks
  local x, w = x_of(), w_of()
  local seen
  x:register_hook(function(g) return g + 1 end)
  local y = x:matmul(w):tanh()
  y:register_hook(function(g) seen = g:clone(); return g * 3 end)
  local h = y * 2
  local loss = (h * h):sum()
  loss:backward()
  close(x.grad, r.x_grad, "x.grad with both hooks")
  close(w.grad, r.w_grad, "w.grad")
  close(seen, r.y_seen, "the gradient the hook of y saw")
end)

T.run("register_hook: a ReLU's output sees its gradient unmasked", function()
  local r = R.relu_hook
  local x, w = x_of(), w_of()
  local y = (x:matmul(w) + T.filled(torch, { 2, 2 }, function(i) return 0.4 * i - 0.2 end)):relu()
  local seen
  y:register_hook(function(g) seen = g:clone(); return g * 0.5 end)
  local v = T.filled(torch, { 2, 4 }, function(i) return 1.0 - 0.25 * i end)
  local yv = y:matmul(v)
  local loss = (yv * yv):sum() + yv:sum()
  loss:backward()
  close(seen, r.y_seen, "seen")
  close(x.grad, r.x_grad, "x.grad")
  close(w.grad, r.w_grad, "w.grad")
end)

T.run("register_hook: a leaf used twice sees its whole gradient once; removal", function()
  local x = torch.ones(3, { dtype = torch.float64, requires_grad = true })
  local calls = 0
  local before = lua_live()
  local handle = x:register_hook(function(g) calls = calls + 1; return g * 10 end)
  ;(x * 2 + x * 3):sum():backward()
  T.is(calls, 1, "one call for two uses")
  close(x.grad, { 50, 50, 50 }, "the hook scaled the sum")
  T.is(lua_live(), before + 1, "a hooked tensor counts as Lua to run")
  handle:remove()
  handle:remove()   -- twice is harmless
  T.is(lua_live(), before, "its last hook removed, the tensor runs no Lua")
  x.grad = nil
  ;(x * 2 + x * 3):sum():backward()
  T.is(calls, 1, "no call after remove()")
  close(x.grad, { 5, 5, 5 }, "plain gradient after remove()")
  -- a hook that returns nothing observes only; hooks run in order
  local order = {}
  local z = torch.ones(2, { dtype = torch.float64, requires_grad = true })
  z:register_hook(function(g) order[#order + 1] = "a" end)
  z:register_hook(function(g) order[#order + 1] = "b"; return g + 1 end)
  z:register_hook(function(g) order[#order + 1] = "c"; T.tensor_close(g, { 3, 3 }, 0, 0, "a hook sees the one before's result") end)
  ;(z * 2):sum():backward()
  T.is(order, { "a", "b", "c" }, "registration order")
  close(z.grad, { 3, 3 }, "z.grad")
end)

T.run("register_hook: a parameter stepped by an optimizer (flat gradient buffers)", function()
  -- SGD with a hook doubling the gradient at lr equals SGD without it at 2 lr
  local function run(hooked, lr)
    torch.manual_seed(7)
    local m = nn.Linear(4, 3):double()
    local opt = torch.optim.SGD(m:parameters(), { lr = lr })
    if hooked then
      m.weight:register_hook(function(g) return g * 2 end)
      m.bias:register_hook(function(g) return g * 2 end)
    end
    local x = torch.randn(5, 4, f64)
    local grads = {}
    for step = 1, 3 do
      opt:zero_grad()
      m(x):pow(2):sum():backward()
      grads[step] = m.weight.grad:clone()
      opt:step()
    end
    return grads, m.weight:detach():clone()
  end
  local plain, wp = run(false, 0.02)
  local hooked, wh = run(true, 0.01)
  for step = 1, 3 do
    T.tensor_close(hooked[step], plain[step] * 2, 1e-12, 1e-12, "step " .. step .. ": the gradient doubled")
  end
  T.tensor_close(wh, wp, 1e-12, 1e-12, "the same weights")
end)

T.run("register_hook: a hook in autograd.grad, and errors", function()
  local x = torch.ones(3, { dtype = torch.float64, requires_grad = true })
  local y = x * 2
  y:register_hook(function(g) return g * 5 end)
  close(torch.autograd.grad(y:sum(), x)[1], { 10, 10, 10 }, "autograd.grad runs hooks on the way")
  T.raises(function() torch.ones(2):register_hook(function() end) end,
           "cannot register a hook on a tensor that doesn't require gradient", "a tensor without grad")
  T.raises(function() x:register_hook(3) end, "register_hook: expected a function", "not a function")
  local h = x:register_hook(function(g) return g:sum() end)
  T.raises(function() (x * 2):sum():backward() end, "a hook returned a gradient of shape %[%], expected", "wrong shape")
  h:remove()
  h = x:register_hook(function(g) return "no" end)
  T.raises(function() (x * 2):sum():backward() end, "a hook returned string", "not a tensor")
  h:remove()
end)

---------------------------------------------------------------- module hooks

local function linear()
  local m = nn.Linear(3, 2):double()
  torch.no_grad(function()
    m.weight:copy_(T.filled(torch, { 2, 3 }, function(i) return 0.1 * i - 0.2 end))
    m.bias:copy_(torch.tensor({ 0.3, -0.4 }, f64))
  end)
  return m
end

T.run("module forward hooks: PyTorch reference, removal", function()
  local r = R.module_forward_hooks
  local m = linear()
  local h1 = m:register_forward_pre_hook(function(mod, args) return { args[1] + 1 } end)
  local h2 = m:register_forward_hook(function(mod, args, out) return out * 2 end)
  local x = x_of()
  local y = m(x)
  close(y, r.y, "output altered by both hooks")
  y:sum():backward()
  close(x.grad, r.x_grad, "x.grad through the altered call")
  close(m.weight.grad, r.weight_grad, "weight.grad")
  h1:remove()
  T.ok(rawget(m, "_hooks") ~= nil, "one hook left: still called through the hooks")
  h2:remove()
  T.ok(rawget(m, "_hooks") == nil, "no hook left: called straight again")
  close(m(x), torch.nn.functional.linear(x, m.weight, m.bias), "after remove(): the plain forward")
  local args_seen
  m:register_forward_pre_hook(function(mod, args) args_seen = args end)
  m(x)
  T.ok(args_seen[1] == x, "a pre-hook that returns nothing sees the arguments")
  T.raises(function() m:register_forward_hook("x") end, "register_forward_hook: expected a function", "not a function")
end)

T.run("register_full_backward_hook: PyTorch reference, removal", function()
  local r = R.module_backward_hook
  local m = linear()
  local gi, go
  local h = m:register_full_backward_hook(function(mod, grad_input, grad_output)
    gi, go = grad_input[1]:clone(), grad_output[1]:clone()
    T.ok(mod == m, "the hook gets the module")
    return { grad_input[1] * 0.5 }
  end)
  local x = x_of()
  local y = m(x)
  local loss = (y:tanh() * T.filled(torch, { 2, 2 }, function(i) return i + 1 end)):sum()
  loss:backward()
  close(x.grad, r.x_grad, "x.grad halved by the hook")
  close(m.weight.grad, r.weight_grad, "weight.grad")
  close(m.bias.grad, r.bias_grad, "bias.grad")
  close(gi, r.grad_input, "grad_input")
  close(go, r.grad_output, "grad_output")
  h:remove()
  x.grad = nil
  m(x):sum():backward()
  close(x.grad, m.weight:detach():sum(0):unsqueeze(0):expand(2, 3), "after remove(): the plain gradient")
  -- an input without grad: grad_input holds nil, the hook still runs
  local calls = 0
  m:register_full_backward_hook(function(mod, grad_input, grad_output)
    calls = calls + 1
    T.ok(grad_input[1] == nil and grad_output[1] ~= nil, "grad_input nil for an input without grad")
  end)
  m(x:detach()):sum():backward()
  T.is(calls, 1, "the hook ran once")
end)

---------------------------------------------------------------- ParameterList, ParameterDict

T.run("ParameterList and ParameterDict: registered, named as PyTorch", function()
  local Holder = nn.Module:extend("Holder")
  function Holder:__init()
    self.scale = nn.Parameter(torch.ones(2))
    self.plist = nn.ParameterList({ nn.Parameter(torch.zeros(3)), nn.Parameter(torch.ones(2, 2)) })
    self.pdict = nn.ParameterDict({ alpha = nn.Parameter(torch.zeros(1)), beta = nn.Parameter(torch.ones(4)) })
    self.inner = nn.Sequential(nn.Linear(2, 2))
  end
  local h = Holder()
  h.plist:append(torch.zeros(5))   -- a plain tensor becomes a Parameter
  T.is(h:state_dict():keys(), R.state_dict_names.keys, "state_dict keys")
  local names = {}
  for name in h:named_parameters() do names[#names + 1] = name end
  T.is(names, R.state_dict_names.named_parameters, "named_parameters")
  T.is(h.plist:len(), 3, "len")
  T.ok(h.plist[2].requires_grad and nn.is_parameter(h.plist[2]), "an appended tensor is a Parameter")
  T.is(T.shape(h.plist[-2]), { 2, 2 }, "negative index")
  T.raises(function() return h.plist[3] end, "ParameterList: index 3 is out of range %(expected 0..2%)", "index out of range")
  local n = 0
  for i, p in ipairs(h.plist) do n = n + 1; T.ok(p == h.plist[i - 1], "ipairs gives entry " .. i) end
  T.is(n, 3, "ipairs visits every parameter")
  T.is(h.pdict:keys(), { "alpha", "beta" }, "dict keys")
  T.ok(h.pdict.beta == h.pdict["beta"] and h.pdict:contains("alpha"), "dict access")
  T.raises(function() nn.ParameterDict({ a = 3 }) end, "ParameterDict.update: expected a tensor", "not a tensor")
  T.raises(function() nn.ParameterList({ "a" }) end, "ParameterList.append: expected a tensor", "not a tensor")
  -- an optimizer sees them, and a state dict loads back
  local opt = torch.optim.SGD(h:parameters(), { lr = 0.5 })
  local loss = h.plist[0]:sum() + h.pdict.beta:sum() * 2
  loss:backward()
  opt:step()
  close(h.plist[0], { -0.5, -0.5, -0.5 }, "SGD stepped a ParameterList entry")
  close(h.pdict.beta, { 0, 0, 0, 0 }, "SGD stepped a ParameterDict entry")
  local h2 = Holder()
  h2.plist:append(torch.zeros(5))
  h2:load_state_dict(h:state_dict())
  close(h2.pdict.beta, { 0, 0, 0, 0 }, "load_state_dict")
end)

T.run("register_full_backward_pre_hook", function()
  local function grads(with_hook)
    local m = linear()
    local seen
    local h
    if with_hook then
      h = m:register_full_backward_pre_hook(function(_, go)
        seen = go[1]:clone()
        return { go[1] * 2 }
      end)
    end
    local x = x_of()
    ;(m(x) * torch.arange(0, 4, f64):reshape(2, 2)):sum():backward()
    return x.grad, m.weight.grad, seen, h, m
  end
  local gx, gw = grads(false)
  local hx, hw, seen, h, m = grads(true)
  close(seen, { 0, 1, 2, 3 }, "the hook sees the gradient of the output")
  close(hx, (gx * 2):reshape(-1):tolist(), "a doubled grad_output doubles the input's gradient")
  close(hw, (gw * 2):reshape(-1):tolist(), "and the weight's")
  h:remove()
  T.is(rawget(m, "_hooks"), nil, "removed: the module is called straight again")
  T.raises(function()
    local m2 = linear()
    m2:register_full_backward_pre_hook(function() return 3 end)
    m2(x_of()):sum():backward()
  end, "a hook returned number", "a hook returning a number")
end)

---------------------------------------------------------------- autograd.functional

T.run("autograd.functional: jacobian, vjp, jvp against PyTorch", function()
  local AF = torch.autograd.functional
  local r = R.functional
  local x, w = x_of():detach(), w_of():detach()
  local J = AF.jacobian(function(a, b) return a:matmul(b):tanh() end, { x, w })
  T.is(T.shape(J[1]), { 2, 2, 2, 3 }, "one Jacobian per input: the output's shape then the input's")
  T.is(T.shape(J[2]), { 2, 2, 3, 2 }, "and for w")
  close(J[1], r.jacobian_x, "d tanh(x w) / dx")
  close(J[2], r.jacobian_w, "d tanh(x w) / dw")
  close(AF.jacobian(function(a) return a:square():sum(1) end, x), r.jacobian_single, "one input, one output: a tensor")
  local weights = torch.arange(0, 6, f64):cos():reshape(2, 3)
  local y, g = AF.vjp(function(a) return a:sin() * a end, x, weights)
  close(y, r.vjp_y, "vjp: the outputs")
  close(g, r.vjp, "vjp: v^T J")
  local y2, jv = AF.jvp(function(a, b) return a:matmul(b):exp() end, { x, w }, { torch.ones(2, 3, f64) * 0.5, w:cos() })
  close(y2, r.jvp_y, "jvp: the outputs")
  close(jv, r.jvp, "jvp: J v")
  T.ok(not g.requires_grad and not y.requires_grad, "results need no gradient")
  T.raises(function() AF.hessian(function(a) return a:sum() end, x) end, "need create_graph", "hessian says why")
  T.raises(function() AF.vjp(function(a) return a * 2 end, x) end, "v is needed for output 1", "vjp without v")
  T.raises(function() AF.jacobian(function(a) return a end, { torch.ones(2, { dtype = torch.int64 }) }) end,
           "expected inputs%[1%] to be floating point", "integer inputs")
  T.raises(function() AF.jacobian(function() return 3 end, x) end, "func's output 1 is a number", "a non-tensor output")
end)

---------------------------------------------------------------- anomaly detection

-- the messages are PyTorch 1.13's for the same graphs, word for word
T.run("detect_anomaly: the node whose backward made NaN, and where its forward ran", function()
  local A = torch.autograd
  local x = torch.tensor({ 0.0, 1.0, 4.0 }, { dtype = torch.float64, requires_grad = true })
  local function model(a) return (a:sqrt() * 0):sum() end   -- d sqrt at 0 is inf, times 0: NaN
  model(x):backward()
  T.ok(x.grad[0]:isnan():item(), "off by default: the NaN reaches .grad")
  T.is(A.is_anomaly_enabled(), false, "is_anomaly_enabled: off")
  x.grad = nil
  local err = T.strip_location(select(2, pcall(A.detect_anomaly, function()
    T.is(torch.is_anomaly_enabled(), true, "on inside")
    model(x):backward()
  end)))
  T.ok(err:find("^Function 'SqrtBackward0' returned nan values in its 0th output%.") ~= nil, "the node", err)
  local here = debug.getinfo(1, "S").short_src:match("[^/]*$")
  T.ok(err:find("Traceback of forward call that caused the error:\nstack traceback:\n\t[^\n]*" .. here:gsub("%p", "%%%0")
                .. ":%d+: in function 'model'") ~= nil, "and the traceback of its forward, from the user's frame", err)
  T.is(A.is_anomaly_enabled(), false, "the mode is restored after the error")
  T.is(x.grad, nil, "the failed backward accumulated nothing into the leaf")

  local a = torch.tensor({ math.huge }, { dtype = torch.float64, requires_grad = true })
  local b = torch.tensor({ 2.0 }, { dtype = torch.float64, requires_grad = true })
  A.set_detect_anomaly(true)
  T.raises(function() ((a * b) * 0):sum():backward() end,
           "^Function 'MulBackward0' returned nan values in its 1th output%.", "the input's position")
  T.raises(function() (b * a * 0):sum():backward() end,
           "^Function 'MulBackward0' returned nan values in its 0th output%.", "the other one")
  T.raises(function() A.grad(((a * b) * 0):sum(), { b }) end,
           "^Function 'MulBackward0' returned nan values in its 1th output%.", "autograd.grad too")
  local Nan = A.Function:extend("NanGrad")
  function Nan.forward(_, t) return t * 1 end
  function Nan.backward(_, g) return g * (0 / 0) end
  T.raises(function() Nan.apply(b):sum():backward() end, "returned nan values in its 0th output", "a Function's backward")
  A.set_detect_anomaly(true, false)
  T.is(A.is_anomaly_check_nan_enabled(), false, "check_nan = false")
  T.lives(function() ((a * b) * 0):sum():backward() end, "no check then")
  A.set_detect_anomaly(false)
  T.lives(function() ((a * b) * 0):sum():backward() end, "off again")
  T.raises(function() A.set_detect_anomaly(1) end, "expected mode to be a boolean, got number", "a number for mode")
  T.raises(function() A.detect_anomaly(3) end, "expected a function", "detect_anomaly without a function")
end)

---------------------------------------------------------------- no Lua in a plain backward

T.run("without hooks or Functions a backward runs no Lua", function()
  -- Compiled traces keep the functions and values they were specialised
  -- on alive (a hook's closure, and the tensor it holds), and a freed
  -- node lets go of its Lua state only in the next cycle, so a chain of
  -- finalizers takes a cycle a link: flush the traces and collect until
  -- none is left, a bounded number of times.
  jit.flush()
  local live = lua_live()
  for _ = 1, 32 do
    if live == 0 then break end
    collectgarbage()
    live = lua_live()
  end
  -- every hooked tensor and Function node above is gone: the engine
  -- counts none that could call Lua
  T.is(live, 0, "no Lua nodes or hooked tensors live")
  local m = linear()
  local h = m:register_forward_hook(function() end)
  h:remove()
  local x = x_of()
  m(x):sum():backward()
  T.is(lua_live(), 0, "a module whose hooks were removed records no Lua node")
end)

T.run("register_post_accumulate_grad_hook: after accumulation; an optimizer step in backward", function()
  local w = nn.Parameter(torch.ones(3, f64))
  local seen = {}
  local h = w:register_post_accumulate_grad_hook(function(p) seen[#seen + 1] = p.grad:tolist() end)
  w.grad = torch.full({ 3 }, 10.0, f64)
  ;((w * 2):sum() + (w * 3):sum()):backward()
  T.is(seen, { { 15, 15, 15 } }, "runs once, with .grad holding the old gradient and both of this backward's")
  torch.autograd.grad((w * 4):sum(), w)
  T.is(#seen, 1, "torch.autograd.grad does not run it")
  h:remove()
  ;(w * 2):sum():backward()
  T.is(#seen, 1, "a removed hook does not run")
  T.raises(function() (w * 2):register_post_accumulate_grad_hook(function() end) end, "cannot be registered on non%-leaf",
           "a non-leaf refuses")
  T.raises(function() torch.ones(2):register_post_accumulate_grad_hook(function() end) end, "doesn't require gradient",
           "a tensor that does not require grad refuses")
  -- SGD stepped per parameter inside backward, each gradient dropped at once,
  -- ends where a step after backward ends
  local function model()
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(4, 6, f64), nn.Tanh(), nn.Linear(6, 2, f64))
  end
  local x = torch.randn(5, 4, f64)
  local a, b = model(), model()
  local opt = torch.optim.SGD(a:parameters(), { lr = 0.1 })
  opt:zero_grad()
  a(x):square():sum():backward()
  opt:step()
  local handles, dropped = {}, 0
  for _, p in ipairs(b:parameters()) do
    handles[#handles + 1] = p:register_post_accumulate_grad_hook(function(q)
      torch.no_grad(function() q:sub_(q.grad * 0.1) end)
      q.grad, dropped = nil, dropped + 1
    end)
  end
  b(x):square():sum():backward()
  for _, hh in ipairs(handles) do hh:remove() end
  local pa, pb = a:parameters(), b:parameters()
  local worst = 0
  for i = 1, #pa do worst = math.max(worst, (pa[i] - pb[i]):abs():max():item()) end
  T.ok(worst < 1e-14 and dropped == #pb and pb[1].grad == nil,
       string.format("an SGD step in the hooks is the step after backward (worst %.1e), no gradient kept", worst))
end)

T.run("state-dict hooks and extra state against PyTorch", function()
  local r = R.state_dict_hooks
  local Counter = nn.Module:extend("Counter")
  function Counter:__init()
    self.lin = nn.Linear(2, 2)
    self:register_buffer("scale", torch.ones(2))
    self.steps = 7
  end
  function Counter:forward(x) return self.lin(x) * self.scale end
  function Counter:get_extra_state() return { steps = self.steps, name = "counter" } end
  function Counter:set_extra_state(state) self.steps = state.steps end
  local outer = nn.Sequential(Counter(), nn.Linear(2, 1))
  T.is(outer:state_dict():keys(), r.keys, "keys: the extra state after the module's buffers, before its children")
  local sd = outer:state_dict()
  local old = {}
  for _, k in ipairs(sd:keys()) do old[k == "1.bias" and "1.old_bias" or k] = sd[k] end
  old["0._extra_state"] = { steps = 42, name = "x" }
  local h = outer[1]:register_load_state_dict_pre_hook(function(_, state, prefix)
    if state[prefix .. "old_bias"] ~= nil then
      state[prefix .. "bias"], state[prefix .. "old_bias"] = state[prefix .. "old_bias"], nil
    end
  end)
  outer:load_state_dict(old)
  T.is(outer[0].steps, r.steps_after_load, "set_extra_state got the saved state; the pre hook renamed an old key")
  h:remove()
  local fresh = nn.Sequential(Counter(), nn.Linear(2, 1))
  fresh:register_load_state_dict_post_hook(function(_, inc)
    for i, k in ipairs(inc.missing_keys) do if k == "1.weight" then table.remove(inc.missing_keys, i) end end
  end)
  local partial = {}
  for _, k in ipairs(sd:keys()) do if k ~= "1.weight" then partial[k] = sd[k] end end
  local result = fresh:load_state_dict(partial)
  T.is(result.missing_keys, r.missing_after_hook, "a post hook forgives a missing key before strict checks it")
  T.tensor_close(fresh[1].bias, sd["1.bias"], 0, 0, "and the entries that fit were loaded")
  local strict_fail = nn.Sequential(Counter(), nn.Linear(2, 1))
  T.raises(function() strict_fail:load_state_dict(partial) end, 'Missing key%(s%) in state_dict: "1.weight"',
           "without the hook, strict still names the key")
  local noextra = {}
  for _, k in ipairs(sd:keys()) do if k ~= "0._extra_state" then noextra[k] = sd[k] end end
  T.raises(function() nn.Sequential(Counter(), nn.Linear(2, 1)):load_state_dict(noextra) end,
           'Missing key%(s%) in state_dict: "0._extra_state"', "a module that takes extra state needs it")
  local seen = {}
  local m = nn.Linear(2, 2)
  m:register_state_dict_pre_hook(function(_, prefix) seen[#seen + 1] = "pre " .. prefix end)
  m:register_state_dict_post_hook(function(_, state, prefix) state[prefix .. "note"] = "hi" end)
  local wrapped = nn.Sequential(m)
  local got = wrapped:state_dict()
  T.ok(seen[1] == "pre 0." and got["0.note"] == "hi", "state_dict pre and post hooks see the prefix; post may add")
  T.ok(nn.Linear(2, 2):register_backward_hook(function() end) ~= nil, "register_backward_hook: the full hook")
  local e = nn.Linear(3, 4):to_empty({ device = "cpu" })
  T.ok(nn.is_parameter(e.weight) and T.shape(e.weight)[2] == 3, "to_empty: parameters of the same shapes")
  T.raises(function() nn.Linear(2, 2):register_load_state_dict_post_hook(5) end, "expected a function", "not a function")
end)

T.done_testing()
