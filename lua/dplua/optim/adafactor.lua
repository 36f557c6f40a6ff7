-- dplua.optim.adafactor: Adafactor (Shazeer and Stern 2018) with PyTorch
-- 2.5's formulas and options (torch.optim.Adafactor), the optimizer of
-- T5 and of models whose Adam state would not fit:
--
--   local opt = torch.optim.Adafactor(model:parameters(), { lr = 1e-2 })
--
-- A parameter of two or more dims keeps its second moment factored over
-- its last two: a row mean (..., m, 1) and a column mean (..., 1, n), so
-- its state is m + n numbers a matrix instead of m n; a vector keeps the
-- whole second moment. Step t of parameter p:
--   beta2_t = 1 - t^beta2_decay; rho = min(lr, 1 / sqrt(t));
--   alpha = max(eps2, RMS(p)) rho, then p *= 1 - lr weight_decay;
--   row_var, col_var (or variance) move towards the means of g^2 by
--   1 - beta2_t; v = row_var col_var / max(mean(row_var), eps1);
--   u = g / sqrt(max(v, eps1^2)); p -= alpha u / max(1, RMS(u) / d).
-- eps = {eps1, eps2}, eps1 nil for the machine epsilon of p's dtype.
--
-- The update is not elementwise (the factors span rows and columns, the
-- scale the whole parameter), so the step runs per parameter on its own
-- shape, and the state lies in tensors of its own rather than in the
-- flat buffers of optimizer.lua. Each step reads RMS(p) and RMS(u) on the
-- host, as PyTorch's does.
local torch = require("dplua")
local Optimizer = require("dplua.optim.optimizer")
local raise = torch._raise

local Adafactor = Optimizer.extend("Adafactor")
-- ZeroRedundancyOptimizer shards by element, which would cut the factors
Adafactor._not_elementwise = true

local defaults = { lr = 1e-2, beta2_decay = -0.8, eps = { nil, 1e-3 }, d = 1.0, weight_decay = 0.0 }

-- Adafactor(params [, {lr=1e-2, beta2_decay=-0.8, eps={nil, 1e-3}, d=1,
-- weight_decay=0, maximize=false}]); maximize as every optimizer's
-- (optimizer.lua negates the gradients around the step)
function Adafactor.new(params, opts)
  -- options other optimizers accept and ignore that PyTorch's Adafactor does not have
  for _, k in ipairs({ "capturable", "fused", "differentiable" }) do
    if type(opts) == "table" and opts[k] ~= nil then raise("Adafactor: unknown option '" .. k .. "'") end
  end
  return Optimizer.init(setmetatable({}, Adafactor), params, opts, defaults)
end

local function number(g, k)
  if type(g[k]) ~= "number" then raise(string.format("Adafactor: expected %s to be a number, got %s", k, type(g[k]))) end
  return g[k]
end

-- PyTorch's checks and messages
function Adafactor:_validate(g)
  if number(g, "lr") < 0 then raise("Adafactor: Learning rate should be >= 0 but is: " .. g.lr) end
  if number(g, "beta2_decay") > 0 then raise("Adafactor: beta2_decay should be <= 0 but is: " .. g.beta2_decay) end
  local eps = g.eps
  if type(eps) ~= "table" or (eps[1] ~= nil and type(eps[1]) ~= "number") or type(eps[2]) ~= "number" then
    raise("Adafactor: expected eps to be a pair {eps1, eps2} of numbers, eps1 may be nil")
  end
  if eps[1] ~= nil and eps[1] < 0 then raise("Adafactor: epsilon1 should be >= 0 but is: " .. eps[1]) end
  if eps[2] < 0 then raise("Adafactor: epsilon2 should be >= 0 but is: " .. eps[2]) end
  if number(g, "d") < 1 then raise("Adafactor: Clipping threshold d should be >= 1 but is: " .. g.d) end
  if number(g, "weight_decay") < 0 then raise("Adafactor: weight_decay should be >= 0 but is: " .. g.weight_decay) end
end

-- the state of the bucket's parameter j, made as zeros on its first step
local function factors(b, j, p)
  b.factors = b.factors or {}
  local f = b.factors[j]
  if f == nil then
    Optimizer._no_new_state_in_capture("Adafactor", "state")
    if p:dim() > 1 then
      local rows, cols = p:size(), p:size()
      rows[#rows], cols[#cols - 1] = 1, 1
      f = { row_var = torch.zeros(rows, { dtype = p.dtype, device = p.device }),
            col_var = torch.zeros(cols, { dtype = p.dtype, device = p.device }) }
    else
      f = { variance = torch.zeros_like(p) }
    end
    b.factors[j] = f
  end
  return f
end

local function rms(t) return t:norm(2):item() / math.sqrt(t:numel()) end

-- one step (t, counted from 1) of parameter p with gradient grad (p's shape)
local function update(g, p, grad, f, t)
  local eps1, eps2 = g.eps[1] or torch.finfo(p.dtype).eps, g.eps[2]
  local weight = t ^ g.beta2_decay          -- 1 - beta2_t
  local rho = math.min(g.lr, 1 / math.sqrt(t))
  local alpha = math.max(eps2, rms(p)) * rho
  if g.weight_decay ~= 0 then p:mul_(1 - g.lr * g.weight_decay) end
  local var
  if f.variance == nil then
    local sq = grad * grad
    f.row_var:lerp_(sq:mean(-1, true), weight)
    f.col_var:lerp_(sq:mean(-2, true), weight)
    var = f.row_var:matmul(f.col_var):div_(f.row_var:mean(-2, true):clamp_min_(eps1))
  else
    f.variance:lerp_(grad * grad, weight)
    var = f.variance:clone()
  end
  local u = var:clamp_min_(eps1 * eps1):rsqrt_():mul_(grad)
  p:add_(u, -alpha / math.max(1, rms(u) / g.d))
end

local function step_each(g, b)
  Optimizer._each_with_grad(b, function(j, grad, step)
    local p = b.params[j]
    if step == 0 and b.factors then b.factors[j] = nil end   -- (a state dict without this parameter's was loaded)
    update(g, p, grad:view(p:size()), factors(b, j, p), step + 1)
  end)
end

-- always per parameter: the fused flag of optimizer.lua does not apply
function Adafactor:_step_bucket(g, b)
  torch.no_grad(step_each, g, b)
end

local state_names = { "row_var", "col_var", "variance" }

-- state_dict's entry: step and the state tensors in their own shapes
function Adafactor:_param_state(b, j, step)
  local f = b.factors and b.factors[j]
  if step == 0 or f == nil then return nil end
  local st = { step = step }
  for _, k in ipairs(state_names) do st[k] = f[k] end
  return st
end

function Adafactor:_load_param_state(b, j, st, fn, id)
  local step = Optimizer._step_number(st.step, fn, id)
  if step == 0 then
    if b.factors then b.factors[j] = nil end
    return 0
  end
  local p = b.params[j]
  local f = factors(b, j, p)
  for _, k in ipairs(state_names) do
    local want, v = f[k], st[k]
    if want ~= nil then
      if not torch.is_tensor(v) then
        raise(string.format("%s: state[%d] has a step but no %s tensor (a parameter of %d dims keeps %s)", fn, id, k,
                            p:dim(), p:dim() > 1 and "row_var and col_var" or "variance"))
      end
      if tostring(v.shape) ~= tostring(want.shape) then
        raise(string.format("%s: state[%d].%s has shape %s, expected %s for a parameter of shape %s", fn, id, k,
                            tostring(v.shape), tostring(want.shape), tostring(p.shape)))
      end
      want:copy_(v)
    end
  end
  return step
end

return Adafactor
