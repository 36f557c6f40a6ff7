-- The models the Lua benches share (scripts/bench/*.lua load this file with
-- dofile): the seed's SimpleNN (10-10-2) and the 784-256-128-10 MLP, the
-- same as models.py builds for the PyTorch side, and the step the benches
-- time on them: cross-entropy, SGD with lr 0.01.
local torch = require("dplua")
local nn = torch.nn

local SimpleNN = nn.Module:extend("SimpleNN")
function SimpleNN:__init() self.fc1 = nn.Linear(10, 10); self.fc2 = nn.Linear(10, 2) end
function SimpleNN:forward(x) return self.fc2(torch.relu(self.fc1(x))) end

local function mlp()
  return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
end

-- One training step of model on (x, y), as a function.
local function sgd_step(model, x, y)
  local crit, opt = nn.CrossEntropyLoss(), torch.optim.SGD(model:parameters(), { lr = 0.01 })
  return function() opt:zero_grad(); crit(model(x), y):backward(); opt:step() end
end

return { SimpleNN = SimpleNN, mlp = mlp, sgd_step = sgd_step }
