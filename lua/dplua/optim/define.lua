-- dplua.optim.define: an optimizer from an update rule, on the same flat
-- buckets as the built-in ones (see optimizer.lua). RMSprop, Adagrad and
-- Adadelta are defined this way, their update one fused C step
-- (torch._rmsprop_step, ...); a user's own writes it with tensor ops:
--
--   local Lion = torch.optim.define("Lion", {
--     defaults = { lr = 1e-4, betas = { 0.9, 0.99 }, weight_decay = 0 },
--     state = { "exp_avg" },
--     update = function(g, p, grad, s)
--       local b1, b2 = g.betas[1], g.betas[2]
--       p:mul_(1 - g.lr * g.weight_decay)
--       p:add_((s.exp_avg * b1 + grad * (1 - b1)):sign(), -g.lr)
--       s.exp_avg:mul_(b2):add_(grad, 1 - b2)
--     end,
--   })
--   local opt = Lion(model:parameters(), { lr = 3e-5 })
--
-- update(group, param, grad, state, step) runs without autograd on 1-D
-- tensors: the whole flat bucket when every parameter of the bucket has a
-- gradient (with tensor ops, a few launches per bucket, whatever the
-- number of parameters), else each parameter's slice of it. state holds
-- one tensor per name of `state`, of param's size, zeros at first (or
-- init_state(group, name) filled); step counts from 1. It updates param
-- and the state in place. used(group, name), when given, says whether the
-- group's options keep that state (RMSprop keeps momentum_buffer only
-- with momentum): one not kept is nil in `state`, made on the first step
-- that needs it. validate(group) checks a param group's options and
-- raises. state_dict() and load_state_dict() carry the state in
-- PyTorch's layout, with `step` (what the options keep, as PyTorch's).
local torch = require("dplua")
local Optimizer = require("dplua.optim.optimizer")
local raise = torch._raise

return function(name, spec)
  if type(name) ~= "string" then raise("optim.define: expected a name, got " .. type(name)) end
  if type(spec) ~= "table" or type(spec.defaults) ~= "table" or type(spec.update) ~= "function" then
    raise("optim.define: expected {defaults = {...}, state = {names...}, update = function(group, p, grad, state, step)}")
  end
  local state_names = spec.state or {}
  local update, init_state = spec.update, spec.init_state
  local used = spec.used or function() return true end
  local cls = Optimizer.extend(name)

  -- the bucket's state buffers by name, made on first use; those the
  -- group's options do not keep stay nil
  local function buffers(g, b)
    local s = {}
    for _, k in ipairs(state_names) do
      local t = b.state[k]
      if t == nil and used(g, k) then
        t = Optimizer._state_buffer(b, k, name)
        local v = init_state and init_state(g, k)
        if v ~= nil and v ~= 0 then t:fill_(v) end
      end
      s[k] = t
    end
    return s
  end

  function cls.new(params, opts)
    local self = Optimizer.init(setmetatable({}, cls), params, opts, spec.defaults)
    -- a state that does not start at zero is made now, as PyTorch's
    -- Adagrad does, so that a loaded state dict only overwrites its slices
    if init_state then
      for gi, g in ipairs(self.param_groups) do
        for _, b in ipairs(self._buckets[gi]) do buffers(g, b) end
      end
    end
    return self
  end

  function cls:_validate(g)
    if type(g.lr) ~= "number" then raise(string.format("%s: expected lr to be a number, got %s", name, type(g.lr))) end
    if g.lr < 0 then raise(name .. ": Invalid learning rate: " .. g.lr) end
    if spec.validate then spec.validate(g) end
  end

  local function slices(s, b, j)
    local out = {}
    for k, t in pairs(s) do out[k] = Optimizer._narrow(t, b, j) end
    return out
  end

  -- Per-parameter updates, for buckets where some gradients are missing.
  -- (A function of its own: a closure in _step_bucket would keep LuaJIT
  -- from compiling the fused path.)
  local function step_each(g, b, s)
    Optimizer._each_with_grad(b, function(j, grad, step)
      update(g, Optimizer._narrow(b.flat_param, b, j), grad, slices(s, b, j), step + 1)
    end)
  end

  function cls:_step_bucket(g, b, fused)
    local s = buffers(g, b)
    if fused and b.steps == nil then
      b.step = b.step + 1
      torch.no_grad(update, g, b.flat_param, b.flat_grad, s, b.step)
      return
    end
    torch.no_grad(step_each, g, b, s)
  end

  function cls:_param_state(b, j, step)
    if step == 0 then return nil end
    local st = slices(b.state, b, j)
    st.step = step
    return st
  end

  function cls:_load_param_state(b, j, st, fn, id, g)
    local step = Optimizer._step_number(st.step, fn, id)
    for _, k in ipairs(state_names) do
      if st[k] ~= nil then Optimizer._load_buffer(b, j, k, st[k], fn, id)
      elseif step > 0 and used(g, k) then raise(string.format("%s: state[%d] has a step but no %s", fn, id, k)) end
    end
    return step
  end

  return cls
end
