-- test_func.lua: torch.func (functional_call, grad, grad_and_value, vmap,
-- vjp, jacrev) against functorch's results (tests/ref/func.lua, written by
-- scripts/gen_func_ref.py) in float64; that the module is left as it was;
-- bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local func = torch.func
local ref = dofile(here .. "/../ref/func.lua")
local f64 = { dtype = torch.float64 }

-- the generator's model, inputs and loss
local model = nn.Sequential(nn.Linear(3, 4, f64), nn.Tanh(), nn.Linear(4, 2, f64))
torch.no_grad(function()
  for k, pair in ipairs(model:named_parameters()) do
    pair[2]:copy_(T.filled(torch, T.shape(pair[2]), function(j) return 0.5 * math.sin(1 + 0.7 * j + (k - 1)) end))
  end
end)
local params = {}
for name, p in model:named_parameters() do params[name] = p:detach() end
local x = T.filled(torch, { 5, 3 }, function(j) return math.cos(0.3 * j) end)
local y = T.filled(torch, { 5, 2 }, function(j) return math.sin(0.4 * j) end)
local function loss(ps, xb, yb) return F.mse_loss(func.functional_call(model, ps, xb), yb) end
local function flat(t) return t:reshape(-1):tolist() end
local function key(name) return "p" .. name:gsub("%.", "_") end

T.run("functional_call", function()
  local scaled = {}
  for n, p in pairs(params) do scaled[n] = p * 1.5 end
  local before = model[0].weight:clone()
  T.values_close(flat(func.functional_call(model, scaled, x)), ref.functional_call.y, 1e-12, 1e-12,
                 "the output with the given parameters")
  T.tensor_close(model[0].weight, before, 0, 0, "the module's own parameters are back")
  T.ok(nn.is_parameter(model[0].weight), "as Parameters")
  T.raises(function() func.functional_call(model, { ["0.kernel"] = x }, x) end, "no parameter or buffer '0.kernel'",
           "an unknown name")
  T.raises(function() func.functional_call(model, { ["0.weight"] = torch.ones(2, 2, f64) }, x) end, "",
           "a tensor of the wrong shape fails inside the call")
  T.tensor_close(model[0].weight, before, 0, 0, "and the module is restored after the error")
  T.values_close(flat(nn.utils.stateless.functional_call(model, scaled, x)), ref.functional_call.y, 1e-12, 1e-12,
                 "nn.utils.stateless.functional_call, its older name")
end)

T.run("grad and grad_and_value", function()
  local g = func.grad(loss)(params, x, y)
  for name in pairs(params) do T.values_close(flat(g[name]), ref.grad[key(name)], 1e-12, 1e-12, "d loss / d " .. name) end
  local g2, value = func.grad_and_value(loss)(params, x, y)
  T.close(value:item(), ref.grad.loss, 1e-12, 0, "grad_and_value: the value")
  T.tensor_close(g2["2.bias"], g["2.bias"], 0, 0, "and the same gradient")
  T.ok(model[0].weight.grad == nil, "no .grad touched")
  local gx = func.grad(loss, { argnums = 1 })(params, x, y)
  T.is(T.shape(gx), { 5, 3 }, "argnums = 1: the gradient of the input")
  local gs = func.grad(loss, { argnums = { 1, 2 } })(params, x, y)
  T.is(#gs, 2, "argnums as a list: one gradient each")
  local ga, aux = func.grad(function(a) return (a * a):sum(), "aux" end, { has_aux = true })(x)
  T.tensor_close(ga, x * 2, 0, 0, "a plain tensor argument")
  T.is(aux, "aux", "has_aux returns the second result")
  T.raises(function() func.grad(function(a) return a * 2 end)(x) end, "expected func to return a tensor of one element",
           "a non-scalar output")
  T.raises(function() func.grad(loss, { argnums = 3 })(params, x, y) end, "argnums 3 is out of range", "argnums too large")
end)

T.run("vmap: per-sample gradients", function()
  local per = func.vmap(func.grad(loss), { nil, 0, 0 })(params, x, y)
  for name in pairs(params) do
    T.values_close(flat(per[name]), ref.per_sample[key(name)], 1e-12, 1e-12, "per-sample d loss / d " .. name)
  end
  local s, d = func.vmap(function(a) return a:sum(), a * 2 end)(x)
  T.tensor_close(s, x:sum(1), 1e-15, 1e-15, "several results, each stacked")
  T.tensor_close(d, x * 2, 0, 0, "along out_dims 0")
  local t = func.vmap(function(a) return a end, 1, 1)(x)
  T.tensor_close(t, x, 0, 0, "in_dims 1 and out_dims 1")
  T.raises(function() func.vmap(function(a, b) return a + b end)(x, torch.ones(4, f64)) end,
           "the same size in the mapped dimension", "mapped sizes that differ")
  T.raises(function() func.vmap(function(a) return a end, { nil })(x) end, "at least one argument must be mapped",
           "nothing mapped")
end)

T.run("vjp and jacrev", function()
  local out, vjp_fn = func.vjp(function(a) return a:sin() * a end, x)
  T.tensor_close(out, x:sin() * x, 0, 0, "vjp: the output")
  local g = vjp_fn(torch.arange(0, 15, f64):cos():reshape(5, 3))
  T.values_close(flat(g), ref.vjp.g, 1e-12, 1e-12, "vjp: the vector-Jacobian product")
  local W = params["0.weight"]
  local J = func.jacrev(function(a) return W:mv(a):tanh() end)(torch.tensor({ 0.2, -0.4, 0.6 }, f64))
  T.values_close(flat(J), ref.jacrev.J, 1e-12, 1e-12, "jacrev")
  local Jf = func.jacfwd(function(a) return W:mv(a):tanh() end)(torch.tensor({ 0.2, -0.4, 0.6 }, f64))
  T.values_close(flat(Jf), ref.jacrev.J, 1e-12, 1e-12, "jacfwd: the same Jacobian")
  T.is(torch.vmap, func.vmap, "torch.vmap is torch.func.vmap")
end)

T.run("stack_module_state: a model ensemble in one vmap", function()
  local models = {}
  for i = 1, 3 do
    torch.manual_seed(i)
    models[i] = nn.Sequential(nn.Linear(4, 8, f64), nn.ReLU(), nn.Linear(8, 2, f64))
  end
  local params, buffers = func.stack_module_state(models)
  T.is(params["0.weight"]:size(), { 3, 8, 4 }, "each name's tensors stacked")
  T.ok(params["0.weight"].requires_grad and params["0.weight"].grad_fn == nil, "as new leaves that require grad")
  local x = torch.randn(5, 4, f64)
  local out = func.vmap(function(p, b, xx) return func.functional_call(models[1], { p, b }, xx) end, { 0, 0, nil })(
    params, buffers, x)
  T.tensor_close(out, torch.stack({ models[1](x), models[2](x), models[3](x) }), 0, 0, "every model's output")
  out:sum():backward()
  models[2](x):sum():backward()
  T.tensor_close(params["2.weight"].grad[1], models[2][2].weight.grad, 1e-14, 1e-14, "and its gradients")
  T.raises(function() func.stack_module_state({ models[1], nn.Linear(4, 8) }) end, "are not models%[1%]'s",
           "models of another structure")
end)

T.done_testing()
