-- dplua.optim.rmsprop: RMSprop with PyTorch's formulas (momentum, centered,
-- weight decay), one fused torch._rmsprop_step per flat bucket
-- (optim/define.lua keeps the state buffers and the state dict).
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
  -- as PyTorch's: a momentum buffer with momentum, grad_avg when centered
  used = function(g, k)
    if k == "momentum_buffer" then return g.momentum > 0 end
    return k ~= "grad_avg" or g.centered
  end,
  validate = function(g)
    for _, k in ipairs({ "alpha", "eps", "weight_decay", "momentum" }) do nonnegative(g, k) end
    if type(g.centered) ~= "boolean" then raise("RMSprop: expected centered to be a boolean") end
  end,
  update = function(g, p, grad, s)
    torch._rmsprop_step(p, grad, s.square_avg, s.grad_avg, s.momentum_buffer, g.lr, g.alpha, g.eps, g.weight_decay,
                        g.momentum, g.centered)
  end,
})
