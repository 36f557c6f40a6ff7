-- dplua.optim.more: Adamax, NAdam, RAdam, ASGD and Rprop with PyTorch 2's
-- formulas, each an update of tensor ops over a whole flat bucket
-- (optim/define.lua keeps the buckets, the state buffers and the state
-- dict). What PyTorch keeps per parameter as a scalar that depends only on
-- the step and the options (NAdam's mu_product, ASGD's eta and mu) is
-- computed from them here, not kept.
--   local opt = torch.optim.NAdam(model:parameters(), {lr=2e-3})
local torch = require("dplua")
local define = require("dplua.optim.define")
local raise = torch._raise

local M = {}

local function number(name, g, k, min)
  if type(g[k]) ~= "number" then raise(string.format("%s: expected %s to be a number, got %s", name, k, type(g[k]))) end
  if min and g[k] < min then raise(string.format("%s: Invalid %s value: %s", name, k, tostring(g[k]))) end
end

local function betas(name, g)
  local b = g.betas
  if type(b) ~= "table" or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
    raise(name .. ": expected betas to be a pair of numbers")
  end
  for i = 1, 2 do
    if b[i] < 0 or b[i] >= 1 then raise(string.format("%s: Invalid beta parameter at index %d: %s", name, i - 1, b[i])) end
  end
end

-- grad plus weight_decay * p (PyTorch's L2 penalty), a new tensor
local function decayed(grad, p, wd)
  if wd == 0 then return grad end
  return grad + p * wd
end

M.Adamax = define("Adamax", {
  defaults = { lr = 2e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0 },
  state = { "exp_avg", "exp_inf" },
  validate = function(g)
    betas("Adamax", g)
    number("Adamax", g, "eps", 0)
    number("Adamax", g, "weight_decay", 0)
  end,
  update = function(g, p, grad, s, step)
    local b1, b2 = g.betas[1], g.betas[2]
    grad = decayed(grad, p, g.weight_decay)
    s.exp_avg:mul_(b1):add_(grad, 1 - b1)
    s.exp_inf:copy_(torch.maximum(s.exp_inf * b2, grad:abs() + g.eps))
    p:addcdiv_(s.exp_avg, s.exp_inf, { value = -g.lr / (1 - b1 ^ step) })
  end,
})

-- NAdam's momentum schedule: mu_t = beta1 (1 - 0.5 * 0.96^(t psi)) and
-- the product of mu_1 .. mu_t, kept per group for the last step asked.
local mu_products = setmetatable({}, { __mode = "k" })
local function nadam_mu(g, t) return g.betas[1] * (1 - 0.5 * 0.96 ^ (t * g.momentum_decay)) end
local function mu_product(g, step)
  local c = mu_products[g]
  if not c or c.step > step or c.b1 ~= g.betas[1] or c.psi ~= g.momentum_decay then
    c = { step = 0, value = 1, b1 = g.betas[1], psi = g.momentum_decay }
    mu_products[g] = c
  end
  while c.step < step do
    c.step = c.step + 1
    c.value = c.value * nadam_mu(g, c.step)
  end
  return c.value
end

M.NAdam = define("NAdam", {
  defaults = { lr = 2e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0, momentum_decay = 4e-3,
               decoupled_weight_decay = false },
  state = { "exp_avg", "exp_avg_sq" },
  validate = function(g)
    betas("NAdam", g)
    number("NAdam", g, "eps", 0)
    number("NAdam", g, "weight_decay", 0)
    number("NAdam", g, "momentum_decay", 0)
  end,
  update = function(g, p, grad, s, step)
    local b1, b2 = g.betas[1], g.betas[2]
    if g.decoupled_weight_decay then p:mul_(1 - g.lr * g.weight_decay)
    else grad = decayed(grad, p, g.weight_decay) end
    local mu, mu_next = nadam_mu(g, step), nadam_mu(g, step + 1)
    local prod = mu_product(g, step)
    s.exp_avg:mul_(b1):add_(grad, 1 - b1)
    s.exp_avg_sq:mul_(b2):addcmul_(grad, grad, { value = 1 - b2 })
    local denom = (s.exp_avg_sq / (1 - b2 ^ step)):sqrt() + g.eps
    p:addcdiv_(grad, denom, { value = -g.lr * (1 - mu) / (1 - prod) })
    p:addcdiv_(s.exp_avg, denom, { value = -g.lr * mu_next / (1 - prod * mu_next) })
  end,
})

M.RAdam = define("RAdam", {
  defaults = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0, decoupled_weight_decay = false },
  state = { "exp_avg", "exp_avg_sq" },
  validate = function(g)
    betas("RAdam", g)
    number("RAdam", g, "eps", 0)
    number("RAdam", g, "weight_decay", 0)
  end,
  update = function(g, p, grad, s, step)
    local b1, b2 = g.betas[1], g.betas[2]
    if g.decoupled_weight_decay then p:mul_(1 - g.lr * g.weight_decay)
    else grad = decayed(grad, p, g.weight_decay) end
    s.exp_avg:mul_(b1):add_(grad, 1 - b1)
    s.exp_avg_sq:mul_(b2):addcmul_(grad, grad, { value = 1 - b2 })
    local bc1, bc2 = 1 - b1 ^ step, 1 - b2 ^ step
    local rho_inf = 2 / (1 - b2) - 1
    local rho_t = rho_inf - 2 * step * b2 ^ step / bc2
    if rho_t > 5 then
      -- the variance's rectification, then the adaptive step
      local rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
      p:sub_(s.exp_avg / bc1 * (g.lr * rect * math.sqrt(bc2)) / (s.exp_avg_sq:sqrt() + g.eps))
    else
      p:sub_(s.exp_avg * (g.lr / bc1))
    end
  end,
})

-- ASGD: eta_t = lr / (1 + lambd lr (t - 1))^alpha and mu_t = 1 / max(1,
-- t - 1 - t0), the values PyTorch's step t reads (it writes them at the
-- end of step t - 1).
M.ASGD = define("ASGD", {
  defaults = { lr = 1e-2, lambd = 1e-4, alpha = 0.75, t0 = 1e6, weight_decay = 0 },
  state = { "ax" },
  validate = function(g)
    for _, k in ipairs({ "lambd", "alpha", "t0", "weight_decay" }) do number("ASGD", g, k) end
    if g.weight_decay < 0 then raise("ASGD: Invalid weight_decay value: " .. g.weight_decay) end
  end,
  update = function(g, p, grad, s, step)
    local eta = g.lr / (1 + g.lambd * g.lr * (step - 1)) ^ g.alpha
    local mu = 1 / math.max(1, step - 1 - g.t0)
    grad = decayed(grad, p, g.weight_decay)
    p:mul_(1 - g.lambd * eta)
    p:add_(grad, -eta)
    if mu ~= 1 then s.ax:add_((p - s.ax) * mu) else s.ax:copy_(p) end
  end,
})

M.Rprop = define("Rprop", {
  defaults = { lr = 1e-2, etas = { 0.5, 1.2 }, step_sizes = { 1e-6, 50 } },
  state = { "prev", "step_size" },
  init_state = function(g, k) if k == "step_size" then return g.lr end end,
  validate = function(g)
    local e, z = g.etas, g.step_sizes
    if type(e) ~= "table" or not (type(e[1]) == "number" and type(e[2]) == "number" and 0 < e[1] and e[1] < 1
                                  and 1 < e[2]) then
      raise("Rprop: Invalid eta values: expected 0 < etaminus < 1 < etaplus")
    end
    if type(z) ~= "table" or type(z[1]) ~= "number" or type(z[2]) ~= "number" then
      raise("Rprop: expected step_sizes to be a pair of numbers")
    end
  end,
  update = function(g, p, grad, s)
    local etaminus, etaplus = g.etas[1], g.etas[2]
    local sign = (grad * s.prev):sign()
    local factor = torch.ones_like(grad):masked_fill(sign:gt(0), etaplus):masked_fill(sign:lt(0), etaminus)
    s.step_size:mul_(factor):clamp_(g.step_sizes[1], g.step_sizes[2])
    local g2 = grad:masked_fill(sign:lt(0), 0)   -- a sign change: no step, and no memory of it
    p:addcmul_(g2:sign(), s.step_size, { value = -1 })
    s.prev:copy_(g2)
  end,
})

return M
