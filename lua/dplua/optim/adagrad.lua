-- dplua.optim.adagrad: Adagrad with PyTorch's formulas (lr_decay, weight
-- decay, initial_accumulator_value), as tensor ops on the flat buckets
-- (optim/define.lua).
--   local opt = torch.optim.Adagrad(model:parameters(), {lr=1e-2})
local torch = require("dplua")
local define = require("dplua.optim.define")
local raise = torch._raise

return define("Adagrad", {
  defaults = { lr = 1e-2, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0, eps = 1e-10 },
  state = { "sum" },
  init_state = function(g) return g.initial_accumulator_value end,
  validate = function(g)
    for _, k in ipairs({ "lr_decay", "weight_decay", "initial_accumulator_value", "eps" }) do
      if type(g[k]) ~= "number" then raise(string.format("Adagrad: expected %s to be a number, got %s", k, type(g[k]))) end
      if g[k] < 0 then raise(string.format("Adagrad: Invalid %s value: %s", k, g[k])) end
    end
  end,
  update = function(g, p, grad, s, step)
    if g.weight_decay ~= 0 then grad = grad + p * g.weight_decay end
    local clr = g.lr / (1 + (step - 1) * g.lr_decay)
    s.sum:add_(grad * grad)
    p:add_(grad / s.sum:sqrt():add_(g.eps), -clr)
  end,
})
