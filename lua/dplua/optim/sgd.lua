-- dplua.optim.sgd: SGD with momentum, dampening, Nesterov and weight decay,
-- PyTorch's formulas, one fused torch._sgd_step per flat bucket.
--   local opt = torch.optim.SGD(model:parameters(), {lr=0.1, momentum=0.9})
local torch = require("dplua")
local Optimizer = require("dplua.optim.optimizer")
local raise = torch._raise

local SGD = Optimizer.extend("SGD")

local defaults = { lr = 1e-3, momentum = 0, dampening = 0, nesterov = false, weight_decay = 0 }

function SGD.new(params, opts)
  return Optimizer.init(setmetatable({}, SGD), params, opts, defaults)
end

local function want_number(g, k)
  if type(g[k]) ~= "number" then raise(string.format("SGD: expected %s to be a number, got %s", k, type(g[k]))) end
  return g[k]
end

function SGD:_validate(g)
  if want_number(g, "lr") < 0 then raise("SGD: Invalid learning rate: " .. g.lr) end
  if want_number(g, "momentum") < 0 then raise("SGD: Invalid momentum value: " .. g.momentum) end
  want_number(g, "dampening")
  if want_number(g, "weight_decay") < 0 then raise("SGD: Invalid weight_decay value: " .. g.weight_decay) end
  if type(g.nesterov) ~= "boolean" then raise("SGD: expected nesterov to be a boolean") end
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    raise("SGD: Nesterov momentum requires a momentum and zero dampening")
  end
end

-- The momentum buffer; a new one means no parameter has momentum yet.
local function momentum_buffer(b)
  local buf = b.state.momentum_buffer
  if buf == nil then
    buf = Optimizer._state_buffer(b, "momentum_buffer", "SGD")
    b.step, b.steps = 0, nil
  end
  return buf
end

-- Per-parameter updates, for buckets where some gradients are missing.
-- (A function of its own: a closure in _step_bucket would keep LuaJIT from
-- compiling the fused path.)
local function step_each(g, b, buf)
  local narrow = Optimizer._narrow
  Optimizer._each_with_grad(b, function(j, grad, step)
    torch._sgd_step(narrow(b.flat_param, b, j), grad, narrow(buf, b, j), g.lr, g.momentum, g.dampening,
                    g.nesterov, g.weight_decay, step == 0)
  end)
end

function SGD:_step_bucket(g, b, fused)
  local buf = g.momentum ~= 0 and momentum_buffer(b) or nil
  if fused and b.steps == nil then
    torch._sgd_step(b.flat_param, b.flat_grad, buf, g.lr, g.momentum, g.dampening, g.nesterov, g.weight_decay,
                    b.step == 0)
    b.step = b.step + 1
    return
  end
  step_each(g, b, buf)
end

function SGD:_param_state(b, j)
  local buf = b.state.momentum_buffer
  if buf == nil then return nil end
  return { momentum_buffer = Optimizer._narrow(buf, b, j) }
end

function SGD:_load_param_state(b, j, st, fn, id)
  if st.momentum_buffer == nil then return 0 end
  Optimizer._load_buffer(b, j, "momentum_buffer", st.momentum_buffer, fn, id)
  return 1
end

return SGD
