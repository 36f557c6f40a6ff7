-- The models the Lua benches share (scripts/bench/*.lua load this file with
-- dofile): the seed's SimpleNN (10-10-2), the 784-256-128-10 MLP and
-- pytorch/examples' MNIST CNN, the same as models.py builds for the PyTorch
-- side, and the step the benches time on them: cross-entropy, SGD (lr
-- 0.01 unless given).
local torch = require("dplua")
local nn = torch.nn

local SimpleNN = nn.Module:extend("SimpleNN")
function SimpleNN:__init() self.fc1 = nn.Linear(10, 10); self.fc2 = nn.Linear(10, 2) end
function SimpleNN:forward(x) return self.fc2(torch.relu(self.fc1(x))) end

local function mlp()
  return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
end

-- pytorch/examples mnist/main.py's Net: two 3x3 convolutions, a max pool,
-- dropout, two Linears; input (batch, 1, 28, 28).
local MnistCNN = nn.Module:extend("MnistCNN")
function MnistCNN:__init()
  self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
  self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
  self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)
end
function MnistCNN:forward(x)
  x = torch.relu(self.conv1(x))
  x = torch.relu(self.conv2(x))
  x = self.dropout1(nn.functional.max_pool2d(x, 2))
  x = torch.flatten(x, 1)
  x = self.dropout2(torch.relu(self.fc1(x)))
  return self.fc2(x)
end

-- One training step of model on (x, y), as a function.
local function sgd_step(model, x, y, lr)
  local crit, opt = nn.CrossEntropyLoss(), torch.optim.SGD(model:parameters(), { lr = lr or 0.01 })
  return function() opt:zero_grad(); crit(model(x), y):backward(); opt:step() end
end

return { SimpleNN = SimpleNN, mlp = mlp, MnistCNN = MnistCNN, sgd_step = sgd_step }
