-- dplua.optim.adadelta: Adadelta with PyTorch's formulas, as tensor ops on
-- the flat buckets (optim/define.lua).
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
    if g.weight_decay ~= 0 then grad = grad + p * g.weight_decay end
    s.square_avg:mul_(g.rho):add_(grad * grad, 1 - g.rho)
    local delta = (s.acc_delta + g.eps):sqrt():div_((s.square_avg + g.eps):sqrt()):mul_(grad)
    s.acc_delta:mul_(g.rho):add_(delta * delta, 1 - g.rho)
    p:add_(delta, -g.lr)
  end,
})
