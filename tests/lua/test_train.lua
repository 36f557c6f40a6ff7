-- test_train.lua -- the helpers of a mixed-precision training loop, against
-- PyTorch (tests/ref/train.lua, written by scripts/gen_train_reference.py):
-- Adam/AdamW with float32 master weights of bfloat16 parameters (fused,
-- per parameter, state_dict resume), clip_grad_norm_ over flat-bucket and
-- loose gradients, gradient accumulation over micro-batches against the
-- whole batch, and activation checkpointing (float64 finite differences,
-- dropout replayed); bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, optim, F = torch.nn, torch.optim, torch.nn.functional
local models = require("models")
local backward_with = models.backward_with
local ref = dofile(dir .. "/ref/train.lua")

local f64 = { dtype = torch.float64 }

-- the same dtype, shape and values, bit for bit
local function equal(a, b)
  return a.dtype == b.dtype and T.compare_values(T.shape(a), T.shape(b), 0, 0) and a:eq(b):all():item()
end

local function tensor(values, shape, dtype)
  return torch.tensor(values, { dtype = dtype or torch.float64 }):reshape(shape)
end

---------------------------------------------------------------- master weights

local M = ref.master

local function bf16_params()
  local ps = {}
  for i, v in ipairs(M.p0) do ps[i] = nn.Parameter(tensor(v, M.shapes[i], torch.bfloat16)) end
  return ps
end


local function check_step(label, opt, ps, want)
  -- the master copies to float32 rounding, the parameters to one bfloat16 rounding of them
  local sd = opt:state_dict()
  for i, p in ipairs(ps) do
    local w = sd.state[i - 1] and sd.state[i - 1].master_param
    T.ok(w ~= nil and w.dtype == torch.float32, label .. ": master_param " .. i .. " is float32")
    if w ~= nil then
      local ok, why = T.compare_values(w, want.master[i], 2e-6, 1e-7)
      T.ok(ok, label .. ": master " .. i, why)
      T.ok(equal(w:to(torch.bfloat16), p:detach()), label .. ": parameter " .. i .. " is its master rounded")
    end
    local ok, why = T.compare_values(p:float(), want.param[i], 2 ^ -8, 0)
    T.ok(ok, label .. ": bfloat16 parameter " .. i, why)
  end
end

local master_opts = {
  adamw = { optim.AdamW, { lr = 0.05, weight_decay = 0.1 } },
  adamw_amsgrad = { optim.AdamW, { lr = 0.02, betas = { 0.8, 0.95 }, eps = 1e-6, amsgrad = true } },
  adam_wd = { optim.Adam, { lr = 0.03, weight_decay = 0.05 } },
}

for name, case in pairs(master_opts) do
  for _, capturable in ipairs({ false, true }) do
    T.run("master weights " .. name .. (capturable and " capturable" or ""), function()
      local ps = bf16_params()
      local opts = { master_weights = true, capturable = capturable, fused = true, foreach = false }
      for k, v in pairs(case[2]) do opts[k] = v end
      local opt = case[1](ps, opts)
      for k, gs in ipairs(M.grads) do
        opt:zero_grad()
        backward_with(ps, gs)
        opt:step()
        check_step(name .. " step " .. k, opt, ps, M[name][k])
      end
    end)
  end
end

T.run("master weights with a missing gradient (per-parameter steps)", function()
  local ps = bf16_params()
  local opt = optim.AdamW(ps, { lr = 0.05, weight_decay = 0.1, master_weights = true })
  for k, gs in ipairs(M.grads) do
    opt:zero_grad()
    backward_with(ps, gs, k == 3 and 2 or nil)
    opt:step()
    check_step("missing step " .. k, opt, ps, M.adamw_missing[k])
  end
end)

T.run("master weights: state_dict resumes exactly", function()
  local ps = bf16_params()
  local opt = optim.AdamW(ps, { lr = 0.05, weight_decay = 0.1, master_weights = true })
  local saved
  for k, gs in ipairs(M.grads) do
    if k == 4 then
      saved = { params = {} }
      for i, p in ipairs(ps) do saved.params[i] = p:detach():clone() end
      local sd = opt:state_dict()
      saved.state = {}
      for id, st in pairs(sd.state) do
        saved.state[id] = { step = st.step, exp_avg = st.exp_avg:clone(), exp_avg_sq = st.exp_avg_sq:clone(),
                            master_param = st.master_param:clone() }
      end
      saved.param_groups = sd.param_groups
    end
    opt:zero_grad()
    backward_with(ps, gs)
    opt:step()
  end
  -- a new model and optimizer from the state after step 3, then steps 4 to 6
  local qs = {}
  for i, p in ipairs(saved.params) do qs[i] = nn.Parameter(p:clone()) end
  local opt2 = optim.AdamW(qs, { lr = 1, master_weights = true })
  opt2:load_state_dict({ state = saved.state, param_groups = saved.param_groups })
  T.is(opt2.param_groups[1].lr, 0.05, "the group's lr is restored")
  for k = 4, #M.grads do
    opt2:zero_grad()
    backward_with(qs, M.grads[k])
    opt2:step()
  end
  local sd, sd2 = opt:state_dict(), opt2:state_dict()
  for i = 1, #ps do
    T.ok(equal(ps[i]:detach(), qs[i]:detach()), "resumed parameter " .. i .. " is bit-identical")
    T.ok(equal(sd.state[i - 1].master_param, sd2.state[i - 1].master_param), "resumed master " .. i)
    T.ok(equal(sd.state[i - 1].exp_avg_sq, sd2.state[i - 1].exp_avg_sq), "resumed exp_avg_sq " .. i)
  end
end)

T.run("master weights: a state without master copies takes them from the parameters", function()
  local ps = bf16_params()
  local plain = optim.AdamW(ps, { lr = 0.05 })
  backward_with(ps, M.grads[1]); plain:step()
  local sd = plain:state_dict()
  T.ok(sd.state[0].master_param == nil and sd.state[0].exp_avg.dtype == torch.bfloat16,
       "without master_weights: no copy, bfloat16 moments")
  local qs = {}
  for i, p in ipairs(ps) do qs[i] = nn.Parameter(p:detach():clone()) end
  local opt = optim.AdamW(qs, { lr = 0.05, master_weights = true })
  sd.param_groups[1].master_weights = true
  opt:load_state_dict(sd)
  opt:zero_grad(); backward_with(qs, M.grads[2]); opt:step()
  local st = opt:state_dict().state[0]
  T.ok(st.exp_avg.dtype == torch.float32 and st.master_param ~= nil, "float32 moments and a master copy")
  T.ok(equal(st.master_param:to(torch.bfloat16), qs[1]:detach()), "the copy is the parameters' value")
end)

T.run("master weights: model:bfloat16() then AdamW", function()
  torch.manual_seed(3)
  local model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
  model:bfloat16()
  local opt = optim.AdamW(model:parameters(), { lr = 1e-2, master_weights = true, fused = true })
  local x, y = torch.randn(16, 4):bfloat16(), torch.randint(0, 3, { 16 })
  local losses = models.train(model, opt, function(out, t) return F.cross_entropy(out:float(), t) end, x, y, 30)
  local first, last = losses[1], losses[#losses]
  T.ok(last < first, string.format("the loss falls (%.4f -> %.4f)", first, last))
  for i, p in ipairs(model:parameters()) do
    T.ok(p.dtype == torch.bfloat16, "parameter " .. i .. " stays bfloat16")
  end
  local st = opt:state_dict().state[0]
  T.ok(equal(st.master_param:to(torch.bfloat16), model:parameters()[1]:detach()),
       "the first weight is its master copy rounded")
end)

T.run("master_weights on float32 and float64 parameters changes nothing", function()
  for _, dtype in ipairs({ torch.float32, torch.float64 }) do
    local a = { nn.Parameter(tensor(M.p0[1], M.shapes[1], dtype)) }
    local b = { nn.Parameter(tensor(M.p0[1], M.shapes[1], dtype)) }
    local oa = optim.AdamW(a, { lr = 0.05, master_weights = true })
    local ob = optim.AdamW(b, { lr = 0.05 })
    for k = 1, 3 do
      for _, pair in ipairs({ { a, oa }, { b, ob } }) do
        pair[2]:zero_grad()
        local loss = (pair[1][1] * tensor(M.grads[k][1], M.shapes[1], dtype)):sum()
        loss:backward()
        pair[2]:step()
      end
    end
    T.ok(equal(a[1]:detach(), b[1]:detach()), tostring(dtype) .. ": the same steps")
    T.ok(oa:state_dict().state[0].master_param == nil, tostring(dtype) .. ": no master copy")
  end
end)

T.run("master step: a float32 gradient", function()
  -- the primitive takes a float32 gradient beside bfloat16 parameters
  local p = tensor(M.p0[2], M.shapes[2], torch.bfloat16)
  local w = p:float()
  local g = tensor(M.grads[1][2], M.shapes[2], torch.float32)
  local m, v = torch.zeros(5), torch.zeros(5)
  torch._adam_step(p, g, m, v, nil, w, 0.1, 0.9, 0.999, 1e-8, 0, true, 1)
  -- first step of Adam: w - lr * g / (|g| + eps) elementwise
  local want = {}
  for i, x in ipairs(M.p0[2]) do
    local pw = torch.tensor(x):bfloat16():float():item()
    local gi = torch.tensor(M.grads[1][2][i]):float():item()
    want[i] = pw - 0.1 * gi / (math.abs(gi) + 1e-8)
  end
  local ok, why = T.compare_values(w, want, 1e-6, 1e-7)
  T.ok(ok, "the master copy", why)
  T.ok(equal(w:to(torch.bfloat16), p), "the parameters are its rounding")
end)

T.run("master weights: bad input", function()
  local ps = bf16_params()
  T.raises(function() optim.AdamW(ps, { master_weights = 1 }) end, "expected master_weights to be a boolean",
           "master_weights must be a boolean")
  local p = tensor(M.p0[2], M.shapes[2], torch.bfloat16)
  local w, g, m, v = p:float(), torch.zeros(5, { dtype = torch.bfloat16 }), torch.zeros(5), torch.zeros(5)
  T.raises(function() torch._adam_step(p:float(), g:float(), m, v, nil, w, 0.1, 0.9, 0.999, 1e-8, 0, true, 1) end,
           "a float32 master copy goes with bfloat16 parameters, got float32", "float32 parameters with a copy")
  T.raises(function() torch._adam_step(p, g, m, v, nil, w:double(), 0.1, 0.9, 0.999, 1e-8, 0, true, 1) end,
           "does not match the bfloat16 parameters", "a float64 copy")
  T.raises(function() torch._adam_step(p, g, m:bfloat16(), v, nil, w, 0.1, 0.9, 0.999, 1e-8, 0, true, 1) end,
           "the master copy and the moments are float32", "bfloat16 moments with a copy")
  T.raises(function() torch._adam_step(p, g:double(), m, v, nil, w, 0.1, 0.9, 0.999, 1e-8, 0, true, 1) end,
           "the gradient must be bfloat16 or float32, got float64", "a float64 gradient")
  T.raises(function() torch._adam_step(p, g, m, v, nil, torch.zeros(4), 0.1, 0.9, 0.999, 1e-8, 0, true, 1) end,
           "does not match", "a copy of the wrong size")
end)

---------------------------------------------------------------- clip_grad_norm_

local CL = ref.clip
local U = nn.utils

-- Parameters whose gradients are CL.grads: through backward into an
-- optimizer's flat gradient buffer (flat), or set by hand (loose).
local function clip_params(flat)
  local ps = {}
  for i, shape in ipairs(CL.shapes) do ps[i] = nn.Parameter(torch.zeros(shape, f64)) end
  if flat then
    optim.SGD(ps, { lr = 0.1 })
    local loss
    for i, p in ipairs(ps) do
      local term = (p * tensor(CL.grads[i], CL.shapes[i])):sum()
      loss = loss and loss + term or term
    end
    loss:backward()
  else
    for i, p in ipairs(ps) do p.grad = tensor(CL.grads[i], CL.shapes[i]) end
  end
  return ps
end

for _, flat in ipairs({ true, false }) do
  local kind = flat and "flat-bucket" or "loose"
  T.run("clip_grad_norm_ of " .. kind .. " gradients against PyTorch", function()
    T.is(#U._grad_runs((function()
      local gs = {}
      for i, p in ipairs(clip_params(flat)) do gs[i] = p.grad end
      return gs
    end)()), flat and 1 or #CL.shapes, kind .. ": the gradients make " .. (flat and "one run" or "a run each"))
    for _, c in ipairs(CL.cases) do
      local ps = clip_params(flat)
      local label = string.format("%s max_norm %g norm_type %g", kind, c.max_norm, c.norm_type)
      local total = U.clip_grad_norm_(ps, c.max_norm, c.norm_type, { foreach = true })
      T.ok(torch.is_tensor(total) and total:dim() == 0, label .. ": the total is a 0-d tensor")
      T.close(total:item(), c.total, 1e-12, 1e-14, label .. ": the total norm")
      for i, p in ipairs(ps) do
        local ok, why = T.compare_values(p.grad, c.grads[i], 1e-12, 1e-14)
        T.ok(ok, label .. ": gradient " .. i, why)
      end
    end
  end)
end

T.run("clip_grad_norm_: a gap in the flat buffer and a gradient outside it", function()
  local ps = clip_params(true)
  local c = CL.cases[1]
  -- the second parameter has no gradient: its neighbours are two runs; a
  -- loose fourth gradient is a third
  ps[2].grad = nil
  local extra = nn.Parameter(torch.zeros(3, f64))
  extra.grad = tensor(CL.grads[2], CL.shapes[2])
  local list = { ps[1], ps[2], ps[3], extra }
  T.is(#U._grad_runs({ ps[1].grad, ps[3].grad, extra.grad }), 3, "three runs")
  U.clip_grad_norm_(list, c.max_norm)
  -- the same gradients as all three of PyTorch's case (the set is the same, reordered)
  for _, pair in ipairs({ { ps[1], 1 }, { extra, 2 }, { ps[3], 3 } }) do
    local ok, why = T.compare_values(pair[1].grad, c.grads[pair[2]], 1e-12, 1e-14)
    T.ok(ok, "gradient " .. pair[2], why)
  end
end)

T.run("clip_grad_norm_: bfloat16 flat-bucket gradients, model:bfloat16()", function()
  local ps = {}
  for i, shape in ipairs(CL.shapes) do ps[i] = nn.Parameter(torch.zeros(shape, { dtype = torch.bfloat16 })) end
  optim.AdamW(ps, { master_weights = true })
  local loss
  for i, p in ipairs(ps) do
    local term = (p * tensor(CL.grads[i], CL.shapes[i], torch.bfloat16)):sum()
    loss = loss and loss + term or term
  end
  loss:backward()
  local c = CL.cases[1]
  local total = U.clip_grad_norm_(ps, c.max_norm)
  T.close(total:float():item(), c.total, 2e-2, 0, "the total norm to bfloat16 precision")
  for i, p in ipairs(ps) do
    local ok, why = T.compare_values(p.grad:float(), c.grads[i], 2e-2, 1e-3)
    T.ok(ok, "gradient " .. i, why)
  end
end)

T.run("clip_grad_norm_: bad input", function()
  local ps = clip_params(false)
  T.raises(function() U.clip_grad_norm_(ps, "1") end, "expected max_norm to be a number", "max_norm a string")
  T.raises(function() U.clip_grad_norm_(ps, 1, { foreach = 1 }) end, "expected foreach to be a boolean",
           "foreach a number")
  T.raises(function() U.clip_grad_norm_({ ps[1], 3 }, 1) end, "expected a tensor at position 2", "a number in the list")
  ps[1].grad:fill_(0 / 0)
  T.raises(function() U.clip_grad_norm_(ps, 1, { error_if_nonfinite = true }) end, "is non%-finite",
           "error_if_nonfinite")
end)

---------------------------------------------------------------- gradient accumulation

local A = ref.accumulate

local function accum_model()
  local m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)):double()
  torch.no_grad(function()
    m[0].weight:copy_(tensor(A.w1, { 6, 4 })); m[0].bias:copy_(tensor(A.b1, { 6 }))
    m[2].weight:copy_(tensor(A.w2, { 2, 6 })); m[2].bias:copy_(tensor(A.b2, { 2 }))
  end)
  return m
end

for _, ckpt in ipairs({ false, true }) do
  T.run("gradient accumulation over 4 micro-batches equals the whole batch" .. (ckpt and ", checkpointed" or ""),
        function()
    local m = accum_model()
    local opt = optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
    local x, y = tensor(A.x, { 8, 4 }), tensor(A.y, { 8, 2 })
    local k = 4
    opt:zero_grad()
    local total = 0
    for i = 0, k - 1 do
      local xb, yb = x:narrow(0, 2 * i, 2), y:narrow(0, 2 * i, 2)
      local out = ckpt and torch.utils.checkpoint.checkpoint(m, xb) or m(xb)
      local loss = F.mse_loss(out, yb) / k
      loss:backward()
      total = total + loss:item()
    end
    T.close(total, A.loss, 1e-12, 1e-14, "the micro-batch losses add up to the batch's")
    for i, p in ipairs(m:parameters()) do
      local ok, why = T.compare_values(p.grad, A.grads[i], 1e-12, 1e-14)
      T.ok(ok, "gradient " .. i, why)
    end
    opt:step()
    for i, p in ipairs(m:parameters()) do
      local ok, why = T.compare_values(p, A.after_sgd[i], 1e-12, 1e-14)
      T.ok(ok, "parameter " .. i .. " after the step", why)
    end
  end)
end

---------------------------------------------------------------- checkpoint

local cp = torch.utils.checkpoint

-- The gradients of every parameter of m and of x after loss_of(x) backward.
local function grads_after(m, x, loss_of)
  m:zero_grad()
  x.grad = nil
  loss_of(x):backward()
  local gs = { x.grad:clone() }
  for _, p in ipairs(m:parameters()) do gs[#gs + 1] = p.grad:clone() end
  return gs
end

local function same_grads(label, a, b)
  T.is(#a, #b, label .. ": as many gradients")
  for i = 1, #a do T.ok(equal(a[i], b[i]), label .. ": gradient " .. i .. " bit for bit") end
end

T.run("checkpoint: an MLP's gradients are the ones without it (float64)", function()
  torch.manual_seed(1)
  local m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)):double()
  local x = torch.randn(5, 4, f64):requires_grad_()
  local plain = grads_after(m, x, function(v) return (m(v) ^ 2):sum() end)
  local ck = grads_after(m, x, function(v)
    local y = cp.checkpoint(m, v)
    T.is(y.grad_fn.name, "CheckpointFunctionBackward", "the node's name")
    return (y ^ 2):sum()
  end)
  same_grads("MLP", plain, ck)
  T.is(tonumber(torch.C.dp_lua_nodes_live()), 0, "no checkpoint node left after the backward")
  -- finite differences through the checkpointed function
  local w = m[0].weight
  T.ok(torch.autograd.gradcheck(function(v) return cp.checkpoint(m, v):tanh() end, { x:detach():requires_grad_() }),
       "gradcheck of x")
  local xs = x:detach()
  local lin = nn.Linear(4, 3):double()
  local wd = lin.weight:detach():clone():requires_grad_()
  T.ok(torch.autograd.gradcheck(function(W) return cp.checkpoint(function(v, W2) return F.linear(v, W2):sin() end,
                                                                 xs, W) end, { wd }),
       "gradcheck of a weight passed as an argument")
  T.ok(w ~= nil, "the model is intact")
end)

T.run("checkpoint: a block with dropout draws the same mask again", function()
  local block = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 6)):double()
  block:train()
  local x = torch.randn(4, 6, f64):requires_grad_()
  torch.manual_seed(7)
  local plain = grads_after(block, x, function(v) return (block(v) + v):sum() end)
  local after_plain = torch.rand(3, f64)
  torch.manual_seed(7)
  local ck = grads_after(block, x, function(v) return (cp.checkpoint(block, v) + v):sum() end)
  local after_ck = torch.rand(3, f64)
  same_grads("dropout", plain, ck)
  T.ok(equal(after_plain, after_ck), "the backward leaves the random state where the forward left it")
  -- without preserve_rng_state the recomputation draws a new mask
  torch.manual_seed(7)
  local other = grads_after(block, x, function(v)
    return (cp.checkpoint(block, v, { preserve_rng_state = false, use_reentrant = false }) + v):sum()
  end)
  T.ok(not equal(plain[2], other[2]), "preserve_rng_state = false: another mask")
end)

T.run("checkpoint_sequential equals the plain model", function()
  torch.manual_seed(2)
  local m = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 5), nn.Dropout(0.3), nn.Tanh(), nn.Linear(5, 2))
  m:double():train()
  local x = torch.randn(4, 3, f64):requires_grad_()
  for _, segments in ipairs({ 1, 2, 3, 6 }) do
    torch.manual_seed(9)
    local plain = grads_after(m, x, function(v) return m(v):sum() end)
    torch.manual_seed(9)
    local ck = grads_after(m, x, function(v) return cp.checkpoint_sequential(m, segments, v):sum() end)
    same_grads(segments .. " segments", plain, ck)
  end
  local fns = { function(v) return v * 2 end, function(v) return v:sin() end, function(v) return v:exp() end }
  local y = torch.randn(3, f64):requires_grad_()
  cp.checkpoint_sequential(fns, 2, y):sum():backward()
  local ok, why = T.compare_values(y.grad, (y:detach() * 2):sin():exp() * (y:detach() * 2):cos() * 2, 1e-12, 1e-14)
  T.ok(ok, "a list of functions", why)
end)

T.run("checkpoint: residuals, nesting, no argument requiring grad, retain_graph, no_grad", function()
  torch.manual_seed(4)
  local b1 = nn.Sequential(nn.Linear(4, 4), nn.GELU()):double()
  local b2 = nn.Sequential(nn.Linear(4, 4), nn.Tanh()):double()
  local model = nn.Sequential(b1, b2)
  local x = torch.randn(3, 4, f64):requires_grad_()
  local function forward(v, ck)
    local run = ck and cp.checkpoint or function(f, a) return f(a) end
    local h = v + run(b1, v)
    local o = h + run(function(a) return run(b2, a) * 2 end, h)   -- a checkpoint inside a checkpoint
    return (o ^ 2):sum()
  end
  same_grads("residual and nested", grads_after(model, x, function(v) return forward(v, false) end),
             grads_after(model, x, function(v) return forward(v, true) end))
  -- an input that does not require grad: the parameters still get theirs
  local xc = x:detach()
  model:zero_grad()
  cp.checkpoint(b1, xc):sum():backward()
  local w = b1[0].weight.grad:clone()
  model:zero_grad()
  b1(xc):sum():backward()
  T.ok(equal(w, b1[0].weight.grad), "parameters of fn get gradients when no argument requires grad")
  -- retain_graph: a second backward recomputes again and accumulates
  model:zero_grad()
  local y = cp.checkpoint(b1, xc):sum()
  y:backward({ retain_graph = true })
  y:backward()
  local ok, why = T.compare_values(b1[0].weight.grad, w * 2, 1e-12, 1e-14)
  T.ok(ok, "retain_graph: twice the gradient", why)
  -- under no_grad it is fn
  local z = torch.no_grad(function() return cp.checkpoint(b1, x) end)
  T.ok(not z.requires_grad and z.grad_fn == nil, "under no_grad: no node")
  y = nil
  collectgarbage(); collectgarbage()
  cp.checkpoint(b1, x)   -- (a call drops the entries of freed nodes)
  collectgarbage(); collectgarbage()
  T.is(tonumber(torch.C.dp_lua_nodes_live()), 0, "freed graphs leave no checkpoint node")
end)

T.run("checkpoint: bad input", function()
  local lin = nn.Linear(2, 2):double()
  local x = torch.randn(3, 2, f64):requires_grad_()
  T.raises(function() cp.checkpoint(42, x) end, "expected a function or a module to run, got number", "fn a number")
  T.raises(function() cp.checkpoint(function(v) return { v } end, x) end, "fn must return one tensor, got table",
           "fn returns a table")
  T.raises(function() cp.checkpoint(lin, x, { preserve_rng_state = 1 }) end,
           "expected preserve_rng_state to be a boolean", "preserve_rng_state a number")
  T.raises(function() cp.checkpoint_sequential(nn.Sequential(lin), 0, x) end,
           "expected segments to be a positive integer", "zero segments")
  T.raises(function() cp.checkpoint_sequential(nn.Sequential(lin), 2, x) end, "2 segments for 1 functions",
           "more segments than functions")
  T.raises(function() cp.checkpoint_sequential(x, 1, x) end, "expected an nn.Sequential or a list of functions",
           "a tensor for functions")
  local y = cp.checkpoint(lin, x):sum()
  y:backward()
  T.raises(function() y:backward() end, "backward through the graph a second time", "a second backward")
  -- fn fails when recomputed: the backward raises its message, and the next one works
  local calls = 0
  local flaky = function(v)
    calls = calls + 1
    if calls == 2 then error("recomputation failed on purpose") end
    return lin(v)
  end
  y = cp.checkpoint(flaky, x):sum()
  T.raises(function() y:backward() end, "recomputation failed on purpose", "an error in the recomputation")
  x.grad = nil
  cp.checkpoint(lin, x):sum():backward()
  T.ok(x.grad ~= nil, "a later backward works")
end)

T.done_testing()
