-- dplua.optim.adadelta: Adadelta with PyTorch's formulas, one fused
-- torch._adadelta_step per flat bucket (optim/define.lua keeps the state
-- buffers and the state dict).
--   local opt = torch.optim.Adadelta(model:parameters())   -- lr 1.0, rho 0.9
local torch = require("dplua")
local define = require("dplua.optim.define")
local raise = torch._raise

return define("Adadelta", {
  defaults = { lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0 },
  state = { "square_avg", "acc_delta" },
  validate = function(g)
    for _, k in ipairs({ "rho", "eps", "weight_decay" }) do
      if type(g[k]) ~= "number" then raise(string.format("Adadelta: expected %s to be a number, got %s", k, type(g[k]))) end
    end
    if g.rho < 0 or g.rho > 1 then raise("Adadelta: Invalid rho value: " .. g.rho) end
    if g.eps < 0 then raise("Adadelta: Invalid epsilon value: " .. g.eps) end
    if g.weight_decay < 0 then raise("Adadelta: Invalid weight_decay value: " .. g.weight_decay) end
  end,
  update = function(g, p, grad, s)
    torch._adadelta_step(p, grad, s.square_avg, s.acc_delta, g.lr, g.rho, g.eps, g.weight_decay)
  end,
})
