-- dplua.optim.adagrad: Adagrad with PyTorch's formulas (lr_decay, weight
-- decay, initial_accumulator_value), one fused torch._adagrad_step per flat
-- bucket (optim/define.lua keeps the state buffers and the state dict).
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
    torch._adagrad_step(p, grad, s.sum, g.lr, g.lr_decay, g.weight_decay, g.eps, step)
  end,
})
