-- dplua.optim.adam: Adam and AdamW (decoupled weight decay), with amsgrad,
-- PyTorch's formulas, one fused torch._adam_step per flat bucket.
--   local opt = torch.optim.AdamW(model:parameters(), {lr=1e-3, weight_decay=0.01})
local torch = require("dplua")
local Optimizer = require("dplua.optim.optimizer")
local raise = torch._raise

local function adam_class(name, decoupled, weight_decay)
  local cls = Optimizer.extend(name)
  local defaults = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = weight_decay, amsgrad = false,
                     capturable = false }

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
  end

  function cls:_step_bucket(g, b, fused)
    local m = Optimizer._state_buffer(b, "exp_avg", name)
    local v = Optimizer._state_buffer(b, "exp_avg_sq", name)
    local vmax = g.amsgrad and Optimizer._state_buffer(b, "max_exp_avg_sq", name) or nil
    local beta1, beta2 = g.betas[1], g.betas[2]
    if fused and b.steps == nil then
      b.step = b.step + 1
      if g.capturable then
        -- the count lives beside the parameters (a graph replay advances it)
        if b.step_t == nil then
          Optimizer._no_new_state_in_capture(name, "step count")
          b.step_t = torch.full({}, b.step - 1, { dtype = torch.float64, device = b.flat_param.device })
        end
        torch._adam_step_t(b.flat_param, b.flat_grad, m, v, vmax, g.lr, beta1, beta2, g.eps, g.weight_decay,
                           decoupled, b.step_t)
      else
        torch._adam_step(b.flat_param, b.flat_grad, m, v, vmax, g.lr, beta1, beta2, g.eps, g.weight_decay,
                         decoupled, b.step)
      end
      return
    end
    Optimizer._sync_step(b)
    local narrow = Optimizer._narrow
    Optimizer._each_with_grad(b, function(j, grad, step)
      torch._adam_step(narrow(b.flat_param, b, j), grad, narrow(m, b, j), narrow(v, b, j), narrow(vmax, b, j),
                       g.lr, beta1, beta2, g.eps, g.weight_decay, decoupled, step + 1)
    end)
    Optimizer._store_step(b)
  end

  function cls:_param_state(b, j, step)
    local narrow = Optimizer._narrow
    local st = { step = step, exp_avg = narrow(b.state.exp_avg, b, j), exp_avg_sq = narrow(b.state.exp_avg_sq, b, j) }
    if b.state.max_exp_avg_sq ~= nil then st.max_exp_avg_sq = narrow(b.state.max_exp_avg_sq, b, j) end
    return st
  end

  function cls:_load_param_state(b, j, st, fn, id)
    local step = Optimizer._step_number(st.step, fn, id)
    for _, k in ipairs({ "exp_avg", "exp_avg_sq", "max_exp_avg_sq" }) do
      if st[k] ~= nil then Optimizer._load_buffer(b, j, k, st[k], fn, id)
      elseif k ~= "max_exp_avg_sq" and step > 0 then
        raise(string.format("%s: state[%d] has a step but no %s", fn, id, k))
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
