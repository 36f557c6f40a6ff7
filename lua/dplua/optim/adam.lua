-- dplua.optim.adam: Adam and AdamW (decoupled weight decay), with amsgrad,
-- PyTorch's formulas, one fused torch._adam_step per flat bucket.
--   local opt = torch.optim.AdamW(model:parameters(), {lr=1e-3, weight_decay=0.01})
--
-- master_weights = true (not a PyTorch option): a bfloat16 bucket keeps a
-- float32 master copy of its parameters (state "master_param") and float32
-- moments; the step updates the copy and writes it rounded into the
-- bfloat16 parameters, in the same launch. Buckets of other dtypes are
-- their own master already and step as without it.
local torch = require("dplua")
local Optimizer = require("dplua.optim.optimizer")
local raise = torch._raise

local function adam_class(name, decoupled, weight_decay)
  local cls = Optimizer.extend(name)
  local defaults = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = weight_decay, amsgrad = false,
                     capturable = false, master_weights = false }

  function cls.new(params, opts)
    return Optimizer.init(setmetatable({}, cls), params, opts, defaults)
  end

  function cls:_validate(g)
    for _, k in ipairs({ "lr", "eps", "weight_decay" }) do
      if type(g[k]) ~= "number" then raise(string.format("%s: expected %s to be a number, got %s", name, k, type(g[k]))) end
    end
    if g.lr < 0 then raise(name .. ": Invalid learning rate: " .. g.lr) end
    if g.eps < 0 then raise(name .. ": Invalid epsilon value: " .. g.eps) end
    if g.weight_decay < 0 then raise(name .. ": Invalid weight_decay value: " .. g.weight_decay) end
    local betas = g.betas
    if type(betas) ~= "table" or type(betas[1]) ~= "number" or type(betas[2]) ~= "number" then
      raise(name .. ": expected betas to be a pair of numbers {beta1, beta2}")
    end
    for i = 1, 2 do
      if betas[i] < 0 or betas[i] >= 1 then
        raise(string.format("%s: Invalid beta parameter at index %d: %s", name, i - 1, tostring(betas[i])))
      end
    end
    if type(g.amsgrad) ~= "boolean" then raise(name .. ": expected amsgrad to be a boolean") end
    if type(g.capturable) ~= "boolean" then raise(name .. ": expected capturable to be a boolean") end
    if type(g.master_weights) ~= "boolean" then
      raise(name .. ": expected master_weights to be a boolean, got " .. type(g.master_weights))
    end
  end

  -- Whether bucket b of group g steps a float32 master copy.
  local function uses_master(g, b) return g.master_weights and b.flat_param.dtype == torch.bfloat16 end

  -- The dtype of b's moments: float32 with a master copy, else the
  -- parameters'. A group whose master_weights changed (by hand or by
  -- load_state_dict) has its moments converted, and loses or gains its copy.
  local function state_layout(b, master)
    local want = master and torch.float32 or b.flat_param.dtype
    if b.state_dtype == want then return want end
    for k, t in pairs(b.state) do
      if k ~= "master_param" and t.dtype ~= want then b.state[k] = t:to(want) end
    end
    if not master then b.state.master_param, b.master_stale = nil, nil end
    b.state_dtype = want
    return want
  end

  -- The master copy, made from the parameters on first use; parameters
  -- whose saved state had no copy (b.master_stale) take theirs again.
  local function master_of(b)
    local w = b.state.master_param
    if w == nil then
      Optimizer._no_new_state_in_capture(name, "master_param")
      w = b.flat_param:to(torch.float32)
      b.state.master_param, b.master_stale = w, nil
    elseif b.master_stale then
      for j in pairs(b.master_stale) do Optimizer._narrow(w, b, j):copy_(Optimizer._narrow(b.flat_param, b, j)) end
      b.master_stale = nil
    end
    return w
  end

  function cls:_step_bucket(g, b, fused)
    local master = uses_master(g, b)
    local dtype = state_layout(b, master)
    local w = master and master_of(b) or nil
    local m = Optimizer._state_buffer(b, "exp_avg", name, dtype)
    local v = Optimizer._state_buffer(b, "exp_avg_sq", name, dtype)
    local vmax = g.amsgrad and Optimizer._state_buffer(b, "max_exp_avg_sq", name, dtype) or nil
    local beta1, beta2 = g.betas[1], g.betas[2]
    if fused and b.steps == nil then
      b.step = b.step + 1
      if g.capturable then
        -- the count lives beside the parameters (a graph replay advances it)
        if b.step_t == nil then
          Optimizer._no_new_state_in_capture(name, "step count")
          b.step_t = torch.full({}, b.step - 1, { dtype = torch.float64, device = b.flat_param.device })
        end
        torch._adam_step_t(b.flat_param, b.flat_grad, m, v, vmax, w, g.lr, beta1, beta2, g.eps, g.weight_decay,
                           decoupled, b.step_t)
      else
        torch._adam_step(b.flat_param, b.flat_grad, m, v, vmax, w, g.lr, beta1, beta2, g.eps, g.weight_decay,
                         decoupled, b.step)
      end
      return
    end
    Optimizer._sync_step(b)
    local narrow = Optimizer._narrow
    Optimizer._each_with_grad(b, function(j, grad, step)
      torch._adam_step(narrow(b.flat_param, b, j), grad, narrow(m, b, j), narrow(v, b, j), narrow(vmax, b, j),
                       narrow(w, b, j), g.lr, beta1, beta2, g.eps, g.weight_decay, decoupled, step + 1)
    end)
    Optimizer._store_step(b)
  end

  function cls:_param_state(b, j, step)
    local narrow = Optimizer._narrow
    local st = { step = step, exp_avg = narrow(b.state.exp_avg, b, j), exp_avg_sq = narrow(b.state.exp_avg_sq, b, j) }
    if b.state.max_exp_avg_sq ~= nil then st.max_exp_avg_sq = narrow(b.state.max_exp_avg_sq, b, j) end
    if b.state.master_param ~= nil and not (b.master_stale and b.master_stale[j]) then
      st.master_param = narrow(b.state.master_param, b, j)
    end
    return st
  end

  -- A saved master copy is loaded when this group uses one; a parameter
  -- saved without one takes a copy of its (bfloat16) value at the next step.
  function cls:_load_param_state(b, j, st, fn, id, g)
    local step = Optimizer._step_number(st.step, fn, id)
    local master = uses_master(g, b)
    local dtype = state_layout(b, master)
    for _, k in ipairs({ "exp_avg", "exp_avg_sq", "max_exp_avg_sq" }) do
      if st[k] ~= nil then Optimizer._load_buffer(b, j, k, st[k], fn, id, dtype)
      elseif k ~= "max_exp_avg_sq" and step > 0 then
        raise(string.format("%s: state[%d] has a step but no %s", fn, id, k))
      end
    end
    if master then
      if st.master_param ~= nil then
        if b.state.master_param == nil then
          Optimizer._no_new_state_in_capture(name, "master_param")
          b.state.master_param = b.flat_param:to(torch.float32)
        end
        Optimizer._load_buffer(b, j, "master_param", st.master_param, fn, id, torch.float32)
        if b.master_stale then b.master_stale[j] = nil end
      elseif b.state.master_param ~= nil then
        b.master_stale = b.master_stale or {}
        b.master_stale[j] = true
      end
    end
    return step
  end

  return cls
end

return {
  Adam = adam_class("Adam", false, 0),
  AdamW = adam_class("AdamW", true, 1e-2),
}
