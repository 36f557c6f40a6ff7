-- The CUDA side of a mixed-precision training step (make check-gpu)
-- against the CPU's (itself checked against PyTorch by
-- tests/lua/test_train.lua): Adam/AdamW over bfloat16 parameters with a
-- float32 master copy (the fused kernel with bfloat16 and float32
-- gradients, amsgrad, capturable, and through the optimizer with the first
-- layer's bias gradient in the step's launch); Adadelta, RMSprop and
-- Adagrad's fused kernels with every option set of
-- tests/lua/test_optim_define.lua in float32, bfloat16 and float64, alone
-- and through the optimizers with a missing gradient (the CPU side checked
-- against PyTorch there); clip_grad_norm_ over a flat gradient buffer, and
-- torch.utils.checkpoint with dropout.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local models = require("models")
local torch = require("dplua")
local nn, optim, F = torch.nn, torch.optim, torch.nn.functional
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local dev = "cuda:0"
local bf16, f32 = torch.bfloat16, torch.float32

-- bit for bit, dtypes too; else a diagnostic with the largest difference
local function same_bits(got, want, name)
  got = got:cpu()
  local ok = got.dtype == want.dtype and got:numel() == want:numel() and got:eq(want):all():item()
  T.ok(ok, name, not ok and string.format("%s vs %s, max difference %g", tostring(got.dtype), tostring(want.dtype),
                                          (got:double() - want:double()):abs():max():item()) or nil)
end

-- The same training steps on the CPU and on the GPU from the same
-- parameters (of `shapes`, drawn as dtype from seed) and gradients made
-- exact (loss = sum(p * g) in float32): make_opt(params) builds the
-- optimizer; skip(k, i) says parameter i gets no gradient at step k.
-- Returns each device's parameters and state dict, by device name.
local function steps_on_both(shapes, dtype, seed, steps, make_opt, skip)
  torch.manual_seed(seed)
  local init, grads = {}, {}
  for i, s in ipairs(shapes) do init[i] = torch.randn(s):to(dtype) end
  for k = 1, steps do
    grads[k] = {}
    for i, s in ipairs(shapes) do grads[k][i] = torch.randn(s):to(dtype) end
  end
  local result = {}
  for _, d in ipairs({ "cpu", dev }) do
    local ps = {}
    for i, t in ipairs(init) do ps[i] = nn.Parameter(t:to(d)) end
    local opt = make_opt(ps)
    for k = 1, steps do
      opt:zero_grad()
      local loss
      for i, p in ipairs(ps) do
        if not (skip and skip(k, i)) then
          local term = (p:float() * grads[k][i]:to(d):float()):sum()
          loss = loss and loss + term or term
        end
      end
      loss:backward()
      opt:step()
    end
    result[d] = { ps = ps, sd = opt:state_dict() }
  end
  return result
end

-- The fused step on the CPU and on the GPU from the same buffers, 4 steps.
local n = 100003   -- not a multiple of a block
for _, case in ipairs({
  { name = "AdamW", decoupled = true, wd = 0.1, amsgrad = false, grad = bf16 },
  { name = "AdamW amsgrad", decoupled = true, wd = 0.01, amsgrad = true, grad = bf16 },
  { name = "Adam", decoupled = false, wd = 0.05, amsgrad = false, grad = bf16 },
  { name = "AdamW, float32 gradient", decoupled = true, wd = 0.1, amsgrad = false, grad = f32 },
}) do
  for _, capturable in ipairs({ false, true }) do
    T.run(string.format("master step %s%s: CUDA equals the CPU", case.name, capturable and " (capturable)" or ""),
          function()
      torch.manual_seed(1)
      local w = torch.randn(n)                  -- the master copy, not what p rounds from
      local p = (w + torch.randn(n) * 1e-3):to(bf16)
      local bufs = {}
      for _, d in ipairs({ "cpu", dev }) do
        bufs[d] = { p = p:to(d), w = w:to(d), m = torch.zeros(n, { device = d }), v = torch.zeros(n, { device = d }),
                    vmax = case.amsgrad and torch.zeros(n, { device = d }) or nil,
                    step = torch.zeros({}, { dtype = torch.float64, device = d }) }
      end
      for step = 1, 4 do
        local g = torch.randn(n):to(case.grad)
        for _, d in ipairs({ "cpu", dev }) do
          local b = bufs[d]
          if capturable then
            torch._adam_step_t(b.p, g:to(d), b.m, b.v, b.vmax, b.w, 0.01, 0.9, 0.999, 1e-8, case.wd, case.decoupled,
                               b.step)
          else
            torch._adam_step(b.p, g:to(d), b.m, b.v, b.vmax, b.w, 0.01, 0.9, 0.999, 1e-8, case.wd, case.decoupled,
                             step)
          end
        end
      end
      local c, g = bufs.cpu, bufs[dev]
      same_bits(g.w, c.w, "the master copy")
      same_bits(g.p, c.p, "the bfloat16 parameters")
      same_bits(g.m, c.m, "exp_avg")
      same_bits(g.v, c.v, "exp_avg_sq")
      if case.amsgrad then same_bits(g.vmax, c.vmax, "max_exp_avg_sq") end
      same_bits(g.p, g.w:to(bf16):cpu(), "the parameters are the copy rounded")
    end)
  end
end

-- Through the optimizer, gradients made exact (loss = sum(p * g)) so that
-- both devices step from the same bits.
T.run("AdamW master_weights over a model's bfloat16 parameters: CUDA equals the CPU", function()
  local shapes = { { 64, 33 }, { 64 }, { 10, 64 }, { 10 } }
  local result = steps_on_both(shapes, bf16, 2, 5, function(ps)
    return optim.AdamW(ps, { lr = 0.02, weight_decay = 0.1, master_weights = true })
  end)
  for i = 1, #shapes do
    same_bits(result[dev].ps[i]:detach(), result.cpu.ps[i]:detach(), "parameter " .. i)
    same_bits(result[dev].sd.state[i - 1].master_param, result.cpu.sd.state[i - 1].master_param, "master " .. i)
  end
end)

T.run("AdamW master_weights on a bfloat16 MLP: the first layer's bias gradient in the step's launch", function()
  torch.manual_seed(4)
  local m = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)):to(bf16):to(dev)
  local opt = optim.AdamW(m:parameters(), { lr = 1e-3, master_weights = true })
  local x, y = torch.randn(256, 784):to(bf16):to(dev), torch.randint(0, 10, { 256 }):to(dev)
  local losses = models.train(m, opt, function(out, t) return F.cross_entropy(out:float(), t) end, x, y, 20)
  local first, last = losses[1], losses[#losses]
  T.ok(last < first, string.format("the loss falls (%.4f -> %.4f)", first, last))
  local sd = opt:state_dict()
  for i, p in ipairs(m:parameters()) do
    same_bits(p:detach(), sd.state[i - 1].master_param:to(bf16):cpu(), "parameter " .. i .. " is its master rounded")
  end
end)

-- Adadelta, RMSprop and Adagrad: the option sets of tests/lua/test_optim_define.lua
local rules = {
  { "Adadelta", { lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0 } },
  { "Adadelta", { lr = 0.5, rho = 0.8, eps = 1e-4, weight_decay = 0.1 } },
  { "RMSprop", { lr = 0.01, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0, centered = false } },
  { "RMSprop", { lr = 0.02, alpha = 0.9, eps = 1e-6, weight_decay = 0.1, momentum = 0.8, centered = false } },
  { "RMSprop", { lr = 0.01, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0, centered = true } },
  { "RMSprop", { lr = 0.01, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0.5, centered = true } },
  { "RMSprop", { lr = 0.02, alpha = 0.9, eps = 1e-6, weight_decay = 0.1, momentum = 0.8, centered = true } },
  { "Adagrad", { lr = 0.1, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0, eps = 1e-10 } },
  { "Adagrad", { lr = 0.1, lr_decay = 0.05, weight_decay = 0.2, initial_accumulator_value = 0.5, eps = 1e-6 } },
}

local function rule_name(rule)
  local o, parts = rule[2], {}
  for _, k in ipairs(T.sorted_keys(o)) do parts[#parts + 1] = k .. "=" .. tostring(o[k]) end
  return rule[1] .. " " .. table.concat(parts, " ")
end

-- One fused step of rule over the buffers b = { p = , s = {state...} }.
local function rule_step(rule, b, g, step)
  local name, o = rule[1], rule[2]
  if name == "Adadelta" then
    torch._adadelta_step(b.p, g, b.s[1], b.s[2], o.lr, o.rho, o.eps, o.weight_decay)
  elseif name == "RMSprop" then
    torch._rmsprop_step(b.p, g, b.s[1], b.s[2], b.s[3], o.lr, o.alpha, o.eps, o.weight_decay, o.momentum, o.centered)
  else
    torch._adagrad_step(b.p, g, b.s[1], o.lr, o.lr_decay, o.weight_decay, o.eps, step)
  end
end

-- The fused step on the CPU and on the GPU from the same buffers, 4 steps.
for _, rule in ipairs(rules) do
  for _, dtype in ipairs({ f32, bf16, torch.float64 }) do
    T.run(string.format("%s, %s: CUDA equals the CPU", rule_name(rule), dtype.name), function()
      torch.manual_seed(3)
      local p = torch.randn(n):to(dtype)
      local init = rule[2].initial_accumulator_value or 0
      local bufs = {}
      for _, d in ipairs({ "cpu", dev }) do
        local s = {}
        for k = 1, 3 do s[k] = torch.full({ n }, init, { dtype = dtype, device = d }) end
        bufs[d] = { p = p:to(d), s = s }
      end
      for step = 1, 4 do
        local g = torch.randn(n):to(dtype)
        for _, d in ipairs({ "cpu", dev }) do rule_step(rule, bufs[d], g:to(d), step) end
      end
      local c, g = bufs.cpu, bufs[dev]
      same_bits(g.p, c.p, "the parameters")
      for k = 1, 3 do same_bits(g.s[k], c.s[k], "state buffer " .. k) end
    end)
  end
end

-- Through the optimizers, gradients made exact (loss = sum(p * g)) so that
-- both devices step from the same bits; one parameter has no gradient at
-- the second step (the per-parameter path, the kernel on its slices).
for _, rule in ipairs(rules) do
  T.run(rule_name(rule) .. " through the optimizer, one gradient missing: CUDA equals the CPU", function()
    local shapes = { { 64, 33 }, { 64 }, { 10, 64 }, { 10 } }
    local result = steps_on_both(shapes, f32, 6, 4, function(ps) return optim[rule[1]](ps, rule[2]) end,
                                 function(k, i) return k == 2 and i == 3 end)
    for i = 1, #shapes do
      same_bits(result[dev].ps[i]:detach(), result.cpu.ps[i]:detach(), "parameter " .. i)
      for _, k in ipairs(T.sorted_keys(result.cpu.sd.state[i - 1])) do
        local v = result.cpu.sd.state[i - 1][k]
        if torch.is_tensor(v) then same_bits(result[dev].sd.state[i - 1][k], v, "parameter " .. i .. "'s " .. k)
        else T.is(result[dev].sd.state[i - 1][k], v, "parameter " .. i .. "'s " .. k) end
      end
    end
  end)
end

T.run("the fused steps: buffers on two devices", function()
  local p, g, s = torch.zeros(4, { device = dev }), torch.zeros(4, { device = dev }), torch.zeros(4)
  T.raises(function() torch._adadelta_step(p, g, s, s:to(dev), 1.0, 0.9, 1e-6, 0) end,
           "adadelta_step: a buffer is on cpu, the parameters on cuda:0", "a CPU state buffer")
  T.raises(function() torch._rmsprop_step(p, g:cpu(), s:to(dev), nil, nil, 0.01, 0.99, 1e-8, 0, 0, false) end,
           "rmsprop_step: a buffer is on cpu, the parameters on cuda:0", "a CPU gradient")
  T.raises(function() torch._adagrad_step(p:cpu(), g, s, 0.1, 0, 0, 1e-10, 1) end,
           "adagrad_step: a buffer is on cuda:0, the parameters on cpu", "CUDA gradient, CPU parameters")
end)

T.run("clip_grad_norm_ over a CUDA flat gradient buffer equals the CPU's", function()
  torch.manual_seed(5)
  local shapes = { { 300, 7 }, { 7 }, { 5, 300 } }
  local gs = {}
  for i, s in ipairs(shapes) do gs[i] = torch.randn(s, { dtype = torch.float64 }) end
  local out = {}
  for _, d in ipairs({ "cpu", dev }) do
    local ps = {}
    for i, s in ipairs(shapes) do ps[i] = nn.Parameter(torch.zeros(s, { dtype = torch.float64, device = d })) end
    optim.SGD(ps, { lr = 0.1 })
    local loss
    for i, p in ipairs(ps) do
      local term = (p * gs[i]:to(d)):sum()
      loss = loss and loss + term or term
    end
    loss:backward()
    local grads = {}
    for i, p in ipairs(ps) do grads[i] = p.grad end
    T.is(#nn.utils._grad_runs(grads), 1, d .. ": one run")
    out[d] = { total = nn.utils.clip_grad_norm_(ps, 1.0), ps = ps }
  end
  T.ok(out[dev].total.device.type == "cuda", "the total stays on the device")
  T.close(out[dev].total:item(), out.cpu.total:item(), 1e-12, 0, "the total norm")
  for i = 1, #shapes do
    local diff = (out[dev].ps[i].grad:cpu() - out.cpu.ps[i].grad):abs():max():item()
    T.ok(diff < 1e-14, "clipped gradient " .. i .. " (diff " .. diff .. ")")
  end
end)

T.run("checkpoint with dropout on CUDA: the gradients without it", function()
  local block = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.2), nn.Linear(256, 64))
  block:double():to(dev):train()
  local x = torch.randn(32, 64, { dtype = torch.float64 }):to(dev):requires_grad_()
  local function grads(ck)
    block:zero_grad()
    x.grad = nil
    torch.manual_seed(11)
    local h = ck and torch.utils.checkpoint.checkpoint(block, x) or block(x)
    local loss = ((h + x) ^ 2):sum()
    loss:backward()
    local out = { x.grad:cpu() }
    for _, p in ipairs(block:parameters()) do out[#out + 1] = p.grad:cpu() end
    return out
  end
  local plain, ck = grads(false), grads(true)
  for i = 1, #plain do
    local diff = (plain[i] - ck[i]):abs():max():item()
    T.ok(diff <= 1e-12 * math.max(plain[i]:abs():max():item(), 1), "gradient " .. i .. " (diff " .. diff .. ")")
  end
end)

T.done_testing()
