-- dplua.optim.rmsprop: RMSprop with PyTorch's formulas (momentum, centered,
-- weight decay), as tensor ops on the flat buckets (optim/define.lua).
--   local opt = torch.optim.RMSprop(model:parameters(), {lr=1e-3, alpha=0.9})
local torch = require("dplua")
local define = require("dplua.optim.define")
local raise = torch._raise

local function nonnegative(g, k)
  if type(g[k]) ~= "number" then raise(string.format("RMSprop: expected %s to be a number, got %s", k, type(g[k]))) end
  if g[k] < 0 then raise(string.format("RMSprop: Invalid %s value: %s", k == "alpha" and "alpha" or k, g[k])) end
end

return define("RMSprop", {
  defaults = { lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0, centered = false },
  state = { "square_avg", "momentum_buffer", "grad_avg" },
  validate = function(g)
    for _, k in ipairs({ "alpha", "eps", "weight_decay", "momentum" }) do nonnegative(g, k) end
    if type(g.centered) ~= "boolean" then raise("RMSprop: expected centered to be a boolean") end
  end,
  update = function(g, p, grad, s)
    if g.weight_decay ~= 0 then grad = grad + p * g.weight_decay end
    s.square_avg:mul_(g.alpha):add_(grad * grad, 1 - g.alpha)
    local avg
    if g.centered then
      s.grad_avg:mul_(g.alpha):add_(grad, 1 - g.alpha)
      avg = (s.square_avg - s.grad_avg * s.grad_avg):sqrt()
    else
      avg = s.square_avg:sqrt()
    end
    avg:add_(g.eps)
    if g.momentum > 0 then
      s.momentum_buffer:mul_(g.momentum):add_(grad / avg)
      p:add_(s.momentum_buffer, -g.lr)
    else
      p:add_(grad / avg, -g.lr)
    end
  end,
})
