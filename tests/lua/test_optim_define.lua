-- test_optim_define.lua: RMSprop, Adagrad and Adadelta (torch.optim.define
-- over their fused C steps), and Adamax, NAdam, RAdam, ASGD and Rprop
-- (over tensor ops), against PyTorch's parameters after three steps
-- with fixed gradients (tests/ref/optim_define.lua, written by
-- scripts/gen_optim_define_ref.py), on the fused path (every gradient
-- present) and the per-parameter one (one missing), in float64, float32
-- and bfloat16; a Lion optimizer defined in this file with tensor ops
-- against its published rule; every optimizer with maximize (the step
-- with the gradient negated, which is left as it was); state dicts;
-- errors, the fused steps' too.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim
local ref = dofile(here .. "/../ref/optim_define.lua")

local Lion = optim.define("Lion", {
  defaults = { lr = 1e-4, betas = { 0.9, 0.99 }, weight_decay = 0 },
  state = { "exp_avg" },
  update = function(g, p, grad, s)
    local b1, b2 = g.betas[1], g.betas[2]
    p:mul_(1 - g.lr * g.weight_decay)
    p:add_((s.exp_avg * b1 + grad * (1 - b1)):sign(), -g.lr)
    s.exp_avg:mul_(b2):add_(grad, 1 - b2)
  end,
})

local cases = {
  adamax = function(ps) return optim.Adamax(ps, { lr = 0.1 }) end,
  adamax_all = function(ps) return optim.Adamax(ps, { lr = 0.05, betas = { 0.8, 0.9 }, eps = 1e-3, weight_decay = 0.1 }) end,
  nadam = function(ps) return optim.NAdam(ps, { lr = 0.1 }) end,
  nadam_all = function(ps)
    return optim.NAdam(ps, { lr = 0.05, betas = { 0.8, 0.9 }, eps = 1e-3, weight_decay = 0.1, momentum_decay = 0.01 })
  end,
  radam = function(ps) return optim.RAdam(ps, { lr = 0.1 }) end,
  radam_all = function(ps) return optim.RAdam(ps, { lr = 0.05, betas = { 0.8, 0.9 }, eps = 1e-3, weight_decay = 0.1 }) end,
  asgd = function(ps) return optim.ASGD(ps, { lr = 0.1 }) end,
  asgd_all = function(ps)
    return optim.ASGD(ps, { lr = 0.05, lambd = 0.1, alpha = 0.5, t0 = 1, weight_decay = 0.1 })
  end,
  rprop = function(ps) return optim.Rprop(ps, { lr = 0.1 }) end,
  rprop_all = function(ps) return optim.Rprop(ps, { lr = 0.05, etas = { 0.3, 1.5 }, step_sizes = { 0.02, 0.08 } }) end,
  nadam_missing = { function(ps) return optim.NAdam(ps, { lr = 0.1, weight_decay = 0.1 }) end, { 2, 1 } },
  rprop_missing = { function(ps) return optim.Rprop(ps, { lr = 0.1 }) end, { 1, 2 } },
  rmsprop = function(ps) return optim.RMSprop(ps, { lr = 0.01 }) end,
  rmsprop_momentum_wd = function(ps)
    return optim.RMSprop(ps, { lr = 0.02, alpha = 0.9, eps = 1e-6, weight_decay = 0.1, momentum = 0.8 })
  end,
  rmsprop_centered = function(ps) return optim.RMSprop(ps, { lr = 0.01, centered = true }) end,
  rmsprop_centered_momentum = function(ps) return optim.RMSprop(ps, { lr = 0.01, momentum = 0.5, centered = true }) end,
  rmsprop_all = function(ps)
    return optim.RMSprop(ps, { lr = 0.02, alpha = 0.9, eps = 1e-6, weight_decay = 0.1, momentum = 0.8,
                               centered = true })
  end,
  adagrad = function(ps) return optim.Adagrad(ps, { lr = 0.1 }) end,
  adagrad_all = function(ps)
    return optim.Adagrad(ps, { lr = 0.1, lr_decay = 0.05, weight_decay = 0.2, initial_accumulator_value = 0.5, eps = 1e-6 })
  end,
  adadelta = function(ps) return optim.Adadelta(ps) end,
  adadelta_all = function(ps) return optim.Adadelta(ps, { lr = 0.5, rho = 0.8, eps = 1e-4, weight_decay = 0.1 }) end,
  lion = function(ps) return Lion(ps, { lr = 0.01, betas = { 0.9, 0.99 }, weight_decay = 0.1 }) end,
  sgd_maximize = function(ps) return optim.SGD(ps, { lr = 0.1, momentum = 0.9, weight_decay = 0.05, maximize = true }) end,
  adam_maximize = function(ps)
    return optim.Adam(ps, { lr = 0.1, weight_decay = 0.05, amsgrad = true, maximize = true })
  end,
  adamw_maximize = function(ps) return optim.AdamW(ps, { lr = 0.1, maximize = true }) end,
  rmsprop_maximize = function(ps)
    return optim.RMSprop(ps, { lr = 0.01, momentum = 0.5, centered = true, maximize = true })
  end,
  adagrad_maximize = function(ps) return optim.Adagrad(ps, { lr = 0.1, weight_decay = 0.2, maximize = true }) end,
  adadelta_maximize = function(ps) return optim.Adadelta(ps, { lr = 0.5, weight_decay = 0.05, maximize = true }) end,
  adamax_maximize = function(ps) return optim.Adamax(ps, { lr = 0.1, maximize = true }) end,
  asgd_maximize = function(ps) return optim.ASGD(ps, { lr = 0.1, weight_decay = 0.05, maximize = true }) end,
  rprop_maximize = function(ps) return optim.Rprop(ps, { lr = 0.1, maximize = true }) end,
  adam_maximize_missing = { function(ps) return optim.Adam(ps, { lr = 0.1, maximize = true }) end, { 2, 1 } },
  adagrad_maximize_missing = { function(ps) return optim.Adagrad(ps, { lr = 0.1, maximize = true }) end, { 1, 2 } },
  rmsprop_missing = { function(ps) return optim.RMSprop(ps, { lr = 0.01, momentum = 0.9 }) end, { 2, 1 } },
  adagrad_missing = { function(ps)
    return optim.Adagrad(ps, { lr = 0.1, lr_decay = 0.1, initial_accumulator_value = 0.1 })
  end, { 1, 2 } },
  adadelta_missing = { function(ps)
    return optim.Adadelta(ps, { lr = 0.5, rho = 0.8, weight_decay = 0.1 })
  end, { 2, 2 } },
}

-- three steps with the reference's gradients (none for `missing` = {step,
-- param}), in dtype (float64 if nil); the parameters after each
local function run(make, missing, dtype)
  dtype = dtype or torch.float64
  local ps = {}
  for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p, { dtype = torch.float64 }):to(dtype)) end
  local opt = make(ps)
  local out = {}
  for k, gs in ipairs(ref.grads) do
    for i, p in ipairs(ps) do
      if missing and missing[1] == k and missing[2] == i then p.grad = nil
      else p.grad = torch.tensor(gs[i], { dtype = torch.float64 }):to(dtype) end
    end
    opt:step()
    local now = {}
    for i, p in ipairs(ps) do now[i] = p:double():tolist() end
    out[k] = now
  end
  return out, opt, ps
end

-- a case's maker and missing gradient
local function case_of(name)
  local c = cases[name]
  if type(c) == "table" then return c[1], c[2] end
  return c, nil
end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local make, missing = case_of(name)
    local got = run(make, missing)
    local ok, why = T.compare_values(got, ref[name], 1e-12, 1e-14)
    T.ok(ok, name .. ": the parameters after each of three steps", why)
  end)
end

T.run("maximize leaves the gradients as they were, on the fused path and per parameter", function()
  for _, missing in ipairs({ false, true }) do
    local ps = {}
    for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p, { dtype = torch.float64 })) end
    local opt = optim.Adam(ps, { lr = 0.1, maximize = true })
    ps[1].grad = torch.tensor(ref.grads[1][1], { dtype = torch.float64 })
    if not missing then ps[2].grad = torch.tensor(ref.grads[1][2], { dtype = torch.float64 }) end
    opt:step()
    T.is(ps[1].grad:tolist(), ref.grads[1][1], (missing and "per parameter" or "fused") .. ": p.grad unchanged")
    T.ok(ps[1][0]:item() > ref.p0[1][1], (missing and "per parameter" or "fused") .. ": the step ascends")
  end
  -- a gradient shared by two parameters, and an expanded one, ascend once each
  local a, b, c = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4))
  local shared = torch.ones(4)
  a.grad, b.grad, c.grad = shared, shared, torch.ones(1):expand(4)
  optim.SGD({ a, b, c }, { lr = 1, maximize = true }):step()
  T.is({ a[0]:item(), b[0]:item(), c[0]:item() }, { 1, 1, 1 }, "a shared and an expanded gradient: one ascent each")
  T.is(shared:tolist(), { 1, 1, 1, 1 }, "the shared gradient as it was")
  T.raises(function() optim.SGD({ nn.Parameter(torch.ones(1)) }, { lr = 0.1, maximize = "yes" }) end,
           "expected maximize to be a boolean, got string", "maximize a string")
end)

T.run("RAdam's rectified steps and NAdam's momentum schedule over ten steps", function()
  for _, c in ipairs({ { "radam_ten_steps", function(ps) return optim.RAdam(ps, { lr = 0.1 }) end },
                       { "nadam_ten_steps", function(ps) return optim.NAdam(ps, { lr = 0.1 }) end } }) do
    local ps = {}
    for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p, { dtype = torch.float64 })) end
    local opt = c[2](ps)
    for k = 0, 9 do
      for i, p in ipairs(ps) do p.grad = torch.tensor(ref.grads[k % 3 + 1][i], { dtype = torch.float64 }) end
      opt:step()
    end
    local got = {}
    for i, p in ipairs(ps) do got[i] = p:detach():tolist() end
    local ok, why = T.compare_values(got, ref.long[c[1]], 1e-12, 1e-14)
    T.ok(ok, c[1] .. ": the parameters after ten steps", why)
  end
end)

T.run("LBFGS against PyTorch: the parameters and evaluations after each step(closure)", function()
  local X = torch.tensor({ { 0.5, -1.0, 2.0 }, { 1.5, 0.25, -0.5 }, { -1.0, 1.0, 1.0 }, { 0.0, 2.0, -1.5 } },
                         { dtype = torch.float64 })
  local Y = torch.tensor({ { 1.0, 0.0 }, { -0.5, 2.0 }, { 0.25, 0.75 }, { 2.0, -1.0 } }, { dtype = torch.float64 })
  local problems = {
    rosen = { function(ps)
      local a, b = ps[1][0], ps[1][1]
      return (1 - a) ^ 2 + (b - a * a) ^ 2 * 100
    end, { { -1.5, 2.0 } } },
    lsq = { function(ps) return ((X:mm(ps[1]:t()) + ps[2] - Y) ^ 2):sum() end,
            { { { 0.1, 0.2, 0.3 }, { -0.1, 0.0, 0.5 } }, { 0.0, 0.1 } } },
  }
  local options = { default = {}, short_history = { max_iter = 4, history_size = 2, lr = 0.5 },
                    strong_wolfe = { max_iter = 5, line_search_fn = "strong_wolfe" } }
  for pname, pr in pairs(problems) do
    for oname, opts in pairs(options) do
      local name = pname .. "_" .. oname
      local ps = {}
      for i, p in ipairs(pr[2]) do ps[i] = torch.tensor(p, { dtype = torch.float64 }):requires_grad_() end
      local opt = optim.LBFGS(ps, opts)
      local function closure()
        opt:zero_grad()
        local loss = pr[1](ps)
        loss:backward()
        return loss
      end
      for k = 1, 4 do
        opt:step(closure)
        local got = {}
        for i, p in ipairs(ps) do got[i] = p:detach():reshape(-1):tolist() end
        local want = ref.lbfgs[name][k]
        -- Rosenbrock's valley amplifies a last-bit difference of a dot
        -- product (the two first differ by 1 ulp at iteration 4) to 1e-4
        -- by iteration 80: the later steps of its 20-iteration run within 1e-3
        local tol = (name == "rosen_default" and k > 2) and 1e-3 or 1e-9
        local ok, why = T.compare_values(got, want[1], tol, 1e-12)
        T.ok(ok, name .. ": the parameters after step " .. k, why)
        T.is(opt.state.func_evals, want[2], name .. ": the evaluations after step " .. k)
      end
    end
  end
  T.raises(function() optim.LBFGS({ torch.zeros(1):requires_grad_() }, { line_search_fn = "backtracking" }) end,
           'only "strong_wolfe" is supported', "an unknown line search")
  T.raises(function() optim.LBFGS({ torch.zeros(1):requires_grad_() }):step() end, "expected a closure", "no closure")
  T.raises(function() optim.LBFGS({ { params = {} }, { params = {} } }) end, "doesn't support per%-parameter options",
           "two groups")
end)

T.run("RMSprop's state dict holds what PyTorch's does for its options", function()
  -- PyTorch 1.13 keeps momentum_buffer only with momentum, grad_avg only
  -- when centered: its state dicts load here, and ours there
  for _, c in ipairs({ { {}, { "square_avg", "step" } },
                       { { momentum = 0.9 }, { "momentum_buffer", "square_avg", "step" } },
                       { { centered = true }, { "grad_avg", "square_avg", "step" } },
                       { { momentum = 0.5, centered = true }, { "grad_avg", "momentum_buffer", "square_avg", "step" } } }) do
    local opts = { lr = 0.01 }
    for k, v in pairs(c[1]) do opts[k] = v end
    local g1 = torch.tensor({ 0.3, 0.1, -0.2 }, { dtype = torch.float64 })
    local g2 = torch.tensor({ -0.1, 0.4, 0.2 }, { dtype = torch.float64 })
    local function fresh() return nn.Parameter(torch.tensor({ 1.0, -2.0, 0.5 }, { dtype = torch.float64 })) end
    local pa = fresh()   -- two steps in one optimizer
    local oa = optim.RMSprop({ pa }, opts)
    pa.grad = g1; oa:step()
    pa.grad = g2; oa:step()
    local pb = fresh()   -- one step, its state dict into a new optimizer, the second step there
    local ob = optim.RMSprop({ pb }, opts)
    pb.grad = g1; ob:step()
    local sd = ob:state_dict()
    local label = string.format("RMSprop momentum %s centered %s", tostring(opts.momentum or 0),
                                tostring(opts.centered or false))
    T.is(T.sorted_keys(sd.state[0]), c[2], label .. ": the state's entries")
    local ob2 = optim.RMSprop({ pb }, opts)
    ob2:load_state_dict(sd)
    pb.grad = g2; ob2:step()
    T.tensor_close(pb:detach(), pa:detach():tolist(), 0, 0, label .. ": a step from the loaded state is the same step")
  end
end)

T.run("state dicts resume exactly", function()
  for _, name in ipairs({ "rmsprop_centered_momentum", "adagrad_all", "adadelta_all", "lion" }) do
    -- two steps, save, a fresh optimizer loads it and takes the third
    local ps = {}
    for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p, { dtype = torch.float64 })) end
    local opt = cases[name](ps)
    for k = 1, 2 do
      for i, p in ipairs(ps) do p.grad = torch.tensor(ref.grads[k][i], { dtype = torch.float64 }) end
      opt:step()
    end
    local sd = opt:state_dict()
    T.is(sd.state[0].step, 2, name .. ": the state dict holds the step")
    local opt2 = cases[name](ps)
    opt2:load_state_dict(sd)
    for i, p in ipairs(ps) do p.grad = torch.tensor(ref.grads[3][i], { dtype = torch.float64 }) end
    opt2:step()
    local now = {}
    for i, p in ipairs(ps) do now[i] = p:tolist() end
    local ok, why = T.compare_values(now, ref[name][3], 1e-12, 1e-14)
    T.ok(ok, name .. ": the third step from a loaded state", why)
  end
end)

T.run("float32 parameters on the fused path", function()
  local ps = {}
  for i, p in ipairs(ref.p0) do ps[i] = nn.Parameter(torch.tensor(p)) end
  local opt = optim.RMSprop(ps, { lr = 0.01, centered = true })
  for k, gs in ipairs(ref.grads) do
    for i, p in ipairs(ps) do p.grad = torch.tensor(gs[i]) end
    opt:step()
  end
  local now = {}
  for i, p in ipairs(ps) do now[i] = p:tolist() end
  local ok, why = T.compare_values(now, ref.rmsprop_centered[3], 1e-5, 1e-6)
  T.ok(ok, "float32 within float32 rounding", why)
end)

T.run("float32 parameters, every case", function()
  for _, name in ipairs(T.sorted_keys(cases)) do
    if name ~= "lion" then
      local make, missing = case_of(name)
      local got, _, ps = run(make, missing, torch.float32)
      T.ok(ps[1].dtype == torch.float32, name .. ": float32 parameters stay float32")
      local ok, why = T.compare_values(got, ref[name], 1e-5, 1e-6)
      T.ok(ok, name .. ": float32 within float32 rounding of PyTorch's float64", why)
    end
  end
end)

-- ref.bf16: PyTorch's float32 steps of the bfloat16 values, every stored
-- value rounded to bfloat16; within a bfloat16 rounding (2^-8) of them
T.run("bfloat16 parameters: float32 steps rounded once", function()
  for _, name in ipairs(T.sorted_keys(ref.bf16)) do
    local got, opt, ps = run(case_of(name), nil, torch.bfloat16)
    T.ok(ps[1].dtype == torch.bfloat16, name .. ": bfloat16 parameters stay bfloat16")
    local sd = opt:state_dict()
    for k, t in pairs(sd.state[0]) do
      if torch.is_tensor(t) then T.ok(t.dtype == torch.bfloat16, name .. ": bfloat16 state " .. k) end
    end
    local ok, why = T.compare_values(got, ref.bf16[name], 2 ^ -8, 1e-3)
    T.ok(ok, name .. ": the parameters after each of three steps", why)
  end
end)

-- The C steps under the optimizers check their buffers as adam_step does.
T.run("the fused steps: bad input", function()
  local p, g, a, b = torch.zeros(4), torch.zeros(4), torch.zeros(4), torch.zeros(4)
  local strided = torch.zeros(4, 2):select(1, 0)
  local function adadelta(pp, gg, aa, bb)
    return function() torch._adadelta_step(pp, gg, aa, bb, 1.0, 0.9, 1e-6, 0) end
  end
  T.raises(adadelta(nil, nil, a, b), "adadelta_step: expected parameter and gradient tensors", "no parameters")
  T.raises(adadelta(p, g, a, nil), "adadelta_step: expected square_avg and acc_delta buffers",
           "a missing state buffer")
  T.raises(adadelta(p, g, torch.zeros(5), b), "adadelta_step: buffer %[5%] %(float32%) does not match the "
           .. "parameters %[4%] %(float32%)", "a state buffer of another size")
  T.raises(adadelta(p, g:double(), a, b), "buffer %[4%] %(float64%) does not match the parameters %[4%] %(float32%)",
           "a gradient of another dtype")
  T.raises(adadelta(p, g, a, b:bfloat16()), "does not match the parameters", "a state buffer of another dtype")
  T.raises(adadelta(p, g, strided, b), "adadelta_step: buffers must be contiguous", "a strided state buffer")
  T.raises(adadelta(strided, g, a, b), "adadelta_step: parameters must be contiguous", "strided parameters")
  local i = torch.zeros(4, { dtype = torch.int64 })
  T.raises(adadelta(i, i, i, i), "adadelta_step: fused updates take float32, float64 or bfloat16 parameters, got "
           .. "int64", "integer parameters")
  T.raises(function() torch._rmsprop_step(p, g, nil, a, b, 0.01, 0.99, 1e-8, 0, 0, false) end,
           "rmsprop_step: expected a square_avg buffer", "RMSprop without square_avg")
  T.raises(function() torch._rmsprop_step(p, g, a, nil, b, 0.01, 0.99, 1e-8, 0, 0, true) end,
           "rmsprop_step: centered needs a grad_avg buffer", "centered RMSprop without grad_avg")
  T.raises(function() torch._rmsprop_step(p, g, a, b, nil, 0.01, 0.99, 1e-8, 0, 0.9, false) end,
           "rmsprop_step: momentum 0.9 needs a momentum buffer", "RMSprop momentum without its buffer")
  T.raises(function() torch._rmsprop_step(p, g, a, torch.zeros(3), nil, 0.01, 0.99, 1e-8, 0, 0, true) end,
           "rmsprop_step: buffer %[3%] %(float32%) does not match", "a grad_avg of another size")
  T.raises(function() torch._adagrad_step(p, g, nil, 0.01, 0, 0, 1e-10, 1) end,
           "adagrad_step: expected a sum buffer", "Adagrad without sum")
  T.raises(function() torch._adagrad_step(p, g, a, 0.01, 0, 0, 1e-10, 0) end,
           "adagrad_step: step must be at least 1, got 0", "Adagrad's step 0")
  T.raises(function() torch._adagrad_step(p, g:bfloat16(), a, 0.01, 0, 0, 1e-10, 1) end,
           "adagrad_step: buffer %[4%] %(bfloat16%) does not match", "Adagrad's gradient of another dtype")
  T.raises(function() torch._adadelta_step(p, 1, a, b, 1.0, 0.9, 1e-6, 0) end, "expected a tensor or nil, got number",
           "a number for a tensor")
  -- unused buffers are not read: RMSprop without momentum nor centering
  torch._rmsprop_step(p, g, a, nil, nil, 0.01, 0.99, 1e-8, 0, 0, false)
  T.ok(true, "RMSprop takes no grad_avg or momentum buffer where it needs none")
end)

T.run("argument errors", function()
  local p = { nn.Parameter(torch.zeros(2)) }
  T.raises(function() optim.RMSprop(p, { lr = -1 }) end, "RMSprop: Invalid learning rate: %-1", "a negative lr")
  T.raises(function() optim.RMSprop(p, { alpha = -0.5 }) end, "Invalid alpha value", "a negative alpha")
  T.raises(function() optim.RMSprop(p, { centered = 1 }) end, "centered to be a boolean", "centered not a boolean")
  T.raises(function() optim.Adagrad(p, { lr_decay = -1 }) end, "Invalid lr_decay value", "a negative lr_decay")
  T.raises(function() optim.Adadelta(p, { rho = 1.5 }) end, "Invalid rho value: 1.5", "rho above 1")
  T.raises(function() optim.Adadelta(p, { betas = 1 }) end, "unknown option 'betas'", "an option it does not have")
  T.raises(function() optim.define("X", {}) end, "expected {defaults = ", "define without update")
end)

T.done_testing()
