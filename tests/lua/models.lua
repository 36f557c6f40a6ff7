--[[
models.lua -- what the tests that train share: the seed model and a step.

    local models = require("models")   -- after putting tests/lua on package.path
    local model = models.SimpleNN()    -- the seed model of examples/seed.lua
    local loss = models.step(model, opt, loss_fn, x, y)   -- one training step
    local losses = models.train(model, opt, loss_fn, x, y, steps)
    models.backward_with(ps, grads)    -- fixed gradients through backward
--]]
local torch = require("dplua")
local nn = torch.nn

local M = {}

-- The seed model (PyTorch's tutorial SimpleNN, as examples/seed.lua
-- writes it): Linear(10, 10), ReLU, Linear(10, 2), named fc1 and fc2.
M.SimpleNN = nn.Module:extend("SimpleNN")
function M.SimpleNN:__init()
  self.fc1 = nn.Linear(10, 10)
  self.fc2 = nn.Linear(10, 2)
end
function M.SimpleNN:forward(x) return self.fc2(torch.relu(self.fc1(x))) end

-- One step of an ordinary loop; returns the loss tensor (of the graph
-- just run backward).
function M.step(model, opt, loss_fn, x, y)
  opt:zero_grad()
  local loss = loss_fn(model(x), y)
  loss:backward()
  opt:step()
  return loss
end

-- `steps` steps on one batch; the losses as numbers.
function M.train(model, opt, loss_fn, x, y, steps)
  local losses = {}
  for i = 1, steps do losses[i] = M.step(model, opt, loss_fn, x, y):item() end
  return losses
end

-- Gradients through backward (so that they land in an optimizer's flat
-- slots): loss = sum_i (p_i * g_i), g_i the values gs[i] in p_i's dtype
-- and shape, skipping the parameter `skip`.
function M.backward_with(ps, gs, skip)
  local loss
  for i, p in ipairs(ps) do
    if i ~= skip then
      local term = (p * torch.tensor(gs[i], { dtype = p.dtype }):reshape(p.shape)):sum()
      loss = loss and loss + term or term
    end
  end
  loss:backward()
end

return M
