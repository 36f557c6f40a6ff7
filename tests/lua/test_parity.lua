-- test_parity.lua -- autograd, nn and optim against PyTorch, step by step.
--
-- The references are written by scripts/gen_parity.py (PyTorch 1.13, CPU,
-- float32); this file only reads them:
--
--   ref/parity_seed.lua  the seed model (SimpleNN: Linear(10,10), relu,
--                        Linear(10,2); CrossEntropyLoss; batch 32): initial
--                        weights and the batch are stored; every run starts
--                        from them and trains on that batch:
--                          sgd           SGD(lr=0.01), 100 steps
--                          sgd_nesterov  SGD(lr=0.01, momentum=0.9, nesterov,
--                                        weight_decay=0.01), 5 steps
--                          adam_amsgrad  Adam(lr=0.01, amsgrad), 5 steps
--                        checked: the loss of every step, every final parameter.
--   ref/parity_mlp.lua   784-256-128-10 ReLU MLP (nn.Sequential), AdamW(lr=1e-3,
--                        weight_decay=0.01), clip_grad_norm_(max_norm=1.0),
--                        SequentialLR(LinearLR(start_factor=0.1, total_iters=10),
--                        CosineAnnealingLR(T_max=90), milestones={10}), 100 steps,
--                        a new batch each step. Weights and data are not stored:
--                        both sides compute them from the formula below.
--                        checked: the loss, the total gradient norm and the lr of
--                        every step; digests of the final parameters.
--   ref/parity_cnn.lua   Conv2d(2,4,3,padding=1), relu, MaxPool2d(2),
--                        Conv2d(4,6,3,stride=2,padding=1), relu, Flatten,
--                        Linear(36,16), relu, Dropout(0.5) (eval mode),
--                        Linear(16,5); CrossEntropyLoss on a 3x2x8x10 input:
--                        checked: logits, loss, every parameter's gradient and
--                        the input's gradient.
--
-- The MLP formula (integer arithmetic, exact in doubles on both sides):
--   h(a, b, c) = (7919*a + 104729*b + 1299709*c + 31*a*b + 13*a*a + 17*b*b) % 65521
--   layer l = 1, 2, 3 (Sequential indices 0, 2, 4), s_l = 1 / sqrt(in_features):
--     weight_l[i][j] = float32((2*h(i, j, l) / 65521 - 1) * s_l)     (0-based i, j)
--     bias_l[i]      = float32((2*h(i, 0, 10 + l) / 65521 - 1) * s_l)
--   step t = 1..100:  x[n][k] = float32(h(n, k, 1000 + t) / 65521)   (32 x 784)
--                     y[n]    = h(n, 5, 2000 + t) % 10
-- A digest is sum, abs_sum, sq_sum (float64 sums), max_abs and the entries at
-- flat indices (k*7919 + 17) % numel, k = 0..23, plus the last; the final one
-- adds d_abs_sum and d_sq_sum, the sums of |final - init| and (final - init)^2.
--
-- Tolerance (float32; the issue asks for 1e-5 relative):
--   tensor entries  |got - expected| <= 1e-5 * max(|expected|, 0.1 * M), M the
--                   largest |expected| in that tensor: an entry far smaller than
--                   its tensor carries the tensor's rounding error (a gradient
--                   summed with cancellation, an Adam step whose denominator is
--                   near eps), so it is compared at a tenth of the tensor's size;
--   scalars         losses, gradient norms, digest abs_sum/sq_sum/max_abs:
--                   |got - expected| <= 1e-5 * |expected|; a digest's sum:
--                   <= 1e-5 * abs_sum (sums cancel); d_abs_sum and d_sq_sum
--                   (the update, ~10x smaller than the weights): 1e-4 relative;
--   lrs             1e-10 relative (double arithmetic on both sides);
--   the MLP's initial weights and batch must equal the reference exactly
--   (samples bit-equal, float64 sums to 1e-12).
-- gen_parity.py reruns every case in float64 and reports what fraction of this
-- tolerance float32 rounding alone uses (at most ~0.16 for what is checked);
-- VERBOSE=1 ./dplua tests/lua/test_parity.lua prints what dplua uses.
-- DPLUA_TEST_DEVICE=cuda runs the same models on a GPU (scripts/device-check
-- does), against the same references and tolerances.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim

local RTOL, SCALE, D_RTOL, LR_RTOL = 1e-5, 0.1, 1e-4, 1e-10
local DEVICE = os.getenv("DPLUA_TEST_DEVICE") or "cpu"

local function ref(name) return dofile(T.test_dir() .. "/ref/parity_" .. name .. ".lua") end

local fmt = T.fmt

-- VERBOSE=1: each check also prints the largest fraction of its tolerance used.
local VERBOSE = (os.getenv("VERBOSE") or "") ~= "" and os.getenv("VERBOSE") ~= "0"
local used = 0
local function note(ratio) if ratio == ratio and ratio > used then used = ratio end end
local function report(ok)
  if VERBOSE then T.diag(("largest fraction of the tolerance used: %.3g"):format(used)) end
  used = 0
  return ok
end

---------------------------------------------------------------- comparisons

-- Tensor entries (flat lists) under the rule above; returns ok, diagnostic.
local function entries_close(got, exp)
  if #got ~= #exp then return false, ("got %d values, expected %d"):format(#got, #exp) end
  local M = 0
  for i = 1, #exp do M = math.max(M, math.abs(exp[i])) end
  local floor = SCALE * M
  local nbad, worst, wi = 0, 0, nil
  for i = 1, #exp do
    local g, e = got[i], exp[i]
    local ratio = math.abs(g - e) / (RTOL * math.max(math.abs(e), floor))
    if ratio ~= ratio then ratio = (g == e) and 0 or math.huge end   -- 0/0 when all are 0; NaN
    note(ratio)
    if not (math.abs(g - e) <= RTOL * math.max(math.abs(e), floor)) then
      nbad = nbad + 1
      if ratio >= worst then worst, wi = ratio, i end
    end
  end
  if nbad == 0 then return true end
  return false, ("%d of %d entries differ; worst at flat index %d: got %s, expected %s (%.3g x the tolerance 1e-5 * max(|e|, %s))")
      :format(nbad, #exp, wi - 1, fmt(got[wi]), fmt(exp[wi]), worst, fmt(floor))
end

local function flat(t) return t:detach():cpu():contiguous():reshape(-1):tolist() end

local function shape_of(t)
  local s = {}
  for i = 1, t:dim() do s[i] = t:size(i - 1) end
  return s
end

-- A tensor against {shape=, values=} (values flat).
local function tensor_ok(t, spec, name)
  if not T.is_tensor(t) then return T.ok(false, name, "expected a tensor, got " .. type(t)) end
  local shape = shape_of(t)
  if #shape ~= #spec.shape or table.concat(shape, ",") ~= table.concat(spec.shape, ",") then
    return T.ok(false, name, ("shape {%s}, expected {%s}"):format(table.concat(shape, ","), table.concat(spec.shape, ",")))
  end
  local ok, why = entries_close(flat(t), spec.values)
  return report(T.ok(ok, name, why))
end

local function rel_ok(g, e, rtol, scale)
  scale = scale or math.abs(e)
  if type(g) ~= "number" then return false end
  local d = math.abs(g - e)
  note(d == 0 and 0 or d / (rtol * scale))
  return d <= rtol * scale
end

-- Per-step scalars (losses, norms, lrs): one test; the diagnostic names the
-- first step that differs and how many do.
local function series_ok(got, exp, rtol, name)
  local first, nbad = nil, 0
  for i = 1, #exp do
    if not rel_ok(got[i], exp[i], rtol) then
      nbad = nbad + 1
      first = first or i
    end
  end
  if #got ~= #exp then
    return T.ok(false, name, ("got %d values, expected %d"):format(#got, #exp))
  end
  return report(T.ok(nbad == 0, name, nbad > 0 and ("%d of %d steps differ; first at step %d: got %s, expected %s (rtol %g)")
      :format(nbad, #exp, first, fmt(got[first]), fmt(exp[first]), rtol) or nil))
end

local function number(x)
  if type(x) == "number" then return x end
  return x:item()
end

local function tensor_from(spec, dtype)
  return torch.tensor(spec.values, dtype and {dtype = dtype} or nil):reshape(spec.shape)
end

local function state_dict_from(list)
  local sd = {}
  for _, e in ipairs(list) do sd[e.name] = tensor_from(e) end
  return sd
end

---------------------------------------------------------------- the seed model

local models = require("models")

local SEED_OPTIMIZERS = {
  sgd = function(p) return optim.SGD(p, {lr = 0.01}) end,
  sgd_nesterov = function(p) return optim.SGD(p, {lr = 0.01, momentum = 0.9, nesterov = true, weight_decay = 0.01}) end,
  adam_amsgrad = function(p) return optim.Adam(p, {lr = 0.01, amsgrad = true}) end,
}

T.run("seed model", function()
  local R = ref("seed")
  local x = tensor_from(R.x):to(DEVICE)
  local y = torch.tensor(R.y, {dtype = torch.int64}):to(DEVICE)
  for _, name in ipairs({"sgd", "sgd_nesterov", "adam_amsgrad"}) do
    local run = R.runs[name]
    T.run("seed " .. name, function()
      local model = models.SimpleNN()
      model:load_state_dict(state_dict_from(R.init))
      model:to(DEVICE)
      local opt = SEED_OPTIMIZERS[name](model:parameters())
      local losses = models.train(model, opt, nn.CrossEntropyLoss(), x, y, run.steps)
      series_ok(losses, run.losses, RTOL, ("seed %s: loss at each of %d steps"):format(name, run.steps))
      local sd = model:state_dict()
      for _, e in ipairs(run.final) do
        tensor_ok(sd[e.name], e, ("seed %s: final %s"):format(name, e.name))
      end
    end)
  end
end)

---------------------------------------------------------------- the MLP

local P = 65521
local function h(a, b, c)
  return (7919 * a + 104729 * b + 1299709 * c + 31 * a * b + 13 * a * a + 17 * b * b) % P
end

local SIZES = {784, 256, 128, 10}

local function mlp_init()
  local list = {}
  for l = 1, 3 do
    local fin, fout = SIZES[l], SIZES[l + 1]
    local s = 1 / math.sqrt(fin)
    local w, b = {}, {}
    for i = 0, fout - 1 do
      for j = 0, fin - 1 do w[i * fin + j + 1] = (2 * h(i, j, l) / P - 1) * s end
      b[i + 1] = (2 * h(i, 0, 10 + l) / P - 1) * s
    end
    list[#list + 1] = {name = (2 * (l - 1)) .. ".weight", t = torch.tensor(w):reshape(fout, fin)}
    list[#list + 1] = {name = (2 * (l - 1)) .. ".bias", t = torch.tensor(b)}
  end
  return list
end

local function mlp_batch(t)
  local x, y = {}, {}
  for n = 0, 31 do
    for k = 0, 783 do x[n * 784 + k + 1] = h(n, k, 1000 + t) / P end
    y[n + 1] = h(n, 5, 2000 + t) % 10
  end
  return torch.tensor(x):reshape(32, 784), torch.tensor(y, {dtype = torch.int64})
end

-- The digest of a float32 tensor (delta: with d_abs_sum, d_sq_sum against init).
local function digest(t, idx_from, init)
  local d64 = t:detach():cpu():double()
  local d = {
    sum = d64:sum():item(), abs_sum = d64:abs():sum():item(), sq_sum = (d64 * d64):sum():item(),
    max_abs = d64:abs():max():item(),
  }
  if init then
    local dd = d64 - init:detach():cpu():double()
    d.d_abs_sum = dd:abs():sum():item()
    d.d_sq_sum = (dd * dd):sum():item()
  end
  local fl = t:detach():contiguous():reshape(-1)
  d.samples = {}
  for i, s in ipairs(idx_from) do d.samples[i] = fl[s[1]]:item() end
  return d
end

-- Compares a computed digest with the reference one. exact: the samples must be
-- bit-equal and the sums agree to 1e-12 (inputs); else the tolerance rule.
local function digest_ok(t, e, name, exact, init)
  local shape = shape_of(t)
  if table.concat(shape, ",") ~= table.concat(e.shape, ",") then
    return T.ok(false, name, ("shape {%s}, expected {%s}"):format(table.concat(shape, ","), table.concat(e.shape, ",")))
  end
  local d = digest(t, e.samples, init)
  local why = {}
  local function chk(key, rtol, scale)
    if e[key] == nil then return end
    if not rel_ok(d[key], e[key], rtol, scale) then
      why[#why + 1] = ("%s: got %s, expected %s (rtol %g%s)"):format(key, fmt(d[key]), fmt(e[key]), rtol,
                                                                     scale and (" of " .. fmt(scale)) or "")
    end
  end
  local r = exact and 1e-12 or RTOL
  chk("sum", r, e.abs_sum)
  chk("abs_sum", r); chk("sq_sum", r); chk("max_abs", r)
  chk("d_abs_sum", D_RTOL); chk("d_sq_sum", D_RTOL)
  local got_s, exp_s = {}, {}
  for i, s in ipairs(e.samples) do got_s[i], exp_s[i] = d.samples[i], s[2] end
  if exact then
    for i = 1, #exp_s do
      if got_s[i] ~= exp_s[i] then
        why[#why + 1] = ("sample at flat index %d: got %s, expected %s"):format(e.samples[i][1], fmt(got_s[i]), fmt(exp_s[i]))
        break
      end
    end
  else
    -- entries: the rule's M is the tensor's max_abs from the reference
    local floor = SCALE * e.max_abs
    for i = 1, #exp_s do
      local g, x = got_s[i], exp_s[i]
      note(math.abs(g - x) / (RTOL * math.max(math.abs(x), floor)))
      if not (math.abs(g - x) <= RTOL * math.max(math.abs(x), floor)) then
        why[#why + 1] = ("sample at flat index %d: got %s, expected %s (tolerance 1e-5 * max(|e|, %s))")
            :format(e.samples[i][1], fmt(g), fmt(x), fmt(floor))
      end
    end
  end
  return report(T.ok(#why == 0, name, #why > 0 and table.concat(why, "\n") or nil))
end

local Seq = nn.Sequential

T.run("mlp", function()
  local R = ref("mlp")
  local init = mlp_init()
  local init_map = {}
  for i, p in ipairs(init) do
    init_map[p.name] = p.t
    digest_ok(p.t, R.init[i], "mlp: the formula gives PyTorch's initial " .. p.name, true)
  end
  do
    local x1, y1 = mlp_batch(1)
    digest_ok(x1, R.batch1.x, "mlp: the formula gives PyTorch's batch 1 (x)", true)
    T.is(y1:tolist(), R.batch1.y, "mlp: the formula gives PyTorch's batch 1 (y)")
  end

  local model = Seq(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
  local sd = {}
  for _, p in ipairs(init) do sd[p.name] = p.t end
  model:load_state_dict(sd)
  model:to(DEVICE)
  local opt = optim.AdamW(model:parameters(), {lr = 1e-3, weight_decay = 0.01})
  local LR = optim.lr_scheduler
  local warm = LR.LinearLR(opt, {start_factor = 0.1, total_iters = 10})
  local cos = LR.CosineAnnealingLR(opt, {T_max = R.steps - 10})
  local sched = LR.SequentialLR(opt, {schedulers = {warm, cos}, milestones = {10}})
  local crit = nn.CrossEntropyLoss()
  local losses, norms, lrs = {}, {}, {}
  for t = 1, R.steps do
    local x, y = mlp_batch(t)
    x, y = x:to(DEVICE), y:to(DEVICE)
    opt:zero_grad()
    local loss = crit(model(x), y)
    loss:backward()
    norms[t] = number(nn.utils.clip_grad_norm_(model:parameters(), 1.0))
    lrs[t] = opt.param_groups[1].lr
    opt:step()
    sched:step()
    losses[t] = loss:item()
  end
  series_ok(lrs, R.lrs, LR_RTOL, "mlp: lr at each of 100 steps (warm-up, then cosine)")
  series_ok(losses, R.losses, RTOL, "mlp: loss at each of 100 steps")
  series_ok(norms, R.grad_norms, RTOL, "mlp: clip_grad_norm_'s total norm at each of 100 steps")
  local final = model:state_dict()
  for _, e in ipairs(R.final) do
    local t = final[e.name]
    if t == nil then
      T.ok(false, "mlp: final " .. e.name, "no such entry in model:state_dict()")
    else
      digest_ok(t, e, "mlp: final " .. e.name .. " (digest)", false, init_map[e.name])
    end
  end
end)

---------------------------------------------------------------- the CNN

local SmallCNN = nn.Module:extend("SmallCNN")
function SmallCNN:__init()
  self.conv1 = nn.Conv2d(2, 4, 3, {padding = 1})
  self.pool = nn.MaxPool2d(2)
  self.conv2 = nn.Conv2d(4, 6, 3, {stride = 2, padding = 1})
  self.flatten = nn.Flatten()
  self.fc1 = nn.Linear(36, 16)
  self.drop = nn.Dropout(0.5)
  self.fc2 = nn.Linear(16, 5)
end
function SmallCNN:forward(x)
  x = self.pool(torch.relu(self.conv1(x)))   -- 3x4x8x10 -> 3x4x4x5
  x = torch.relu(self.conv2(x))              -- -> 3x6x2x3
  x = self.flatten(x)                        -- -> 3x36
  x = self.drop(torch.relu(self.fc1(x)))
  return self.fc2(x)
end

T.run("cnn", function()
  local R = ref("cnn")
  local model = SmallCNN()
  model:load_state_dict(state_dict_from(R.init))
  model:to(DEVICE)
  model:eval()
  T.ok(model.drop.training == false, "cnn: eval() puts the Dropout in eval mode")
  local x = tensor_from(R.x):to(DEVICE):requires_grad_(true)
  local y = torch.tensor(R.y, {dtype = torch.int64}):to(DEVICE)
  local out = model(x)
  local loss = nn.CrossEntropyLoss()(out, y)
  loss:backward()
  tensor_ok(out, R.logits, "cnn: logits")
  report(T.ok(rel_ok(loss:item(), R.loss, RTOL), "cnn: loss",
              ("got %s, expected %s"):format(fmt(loss:item()), fmt(R.loss))))
  local names, exp_names = {}, {}
  for name in model:named_parameters() do names[#names + 1] = name end
  for i, e in ipairs(R.grads) do exp_names[i] = e.name end
  T.is(names, exp_names, "cnn: named_parameters() order is PyTorch's")
  local params = {}
  for name, p in model:named_parameters() do params[name] = p end
  for _, e in ipairs(R.grads) do
    local p = params[e.name]
    if p == nil or p.grad == nil then
      T.ok(false, "cnn: gradient of " .. e.name, p == nil and "no such parameter" or "grad is nil")
    else
      tensor_ok(p.grad, e, "cnn: gradient of " .. e.name)
    end
  end
  if x.grad == nil then T.ok(false, "cnn: gradient of the input", "x.grad is nil")
  else tensor_ok(x.grad, R.x_grad, "cnn: gradient of the input") end
  -- eval-mode Dropout is the identity: a second forward gives the same logits
  local again = torch.no_grad(function() return model(x) end)
  T.ok(again:sub(out:detach()):abs():max():item() == 0, "cnn: eval mode is deterministic (Dropout off)")
end)

T.done_testing()
