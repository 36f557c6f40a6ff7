-- test_cnn_bn.lua -- a small CNN with BatchNorm (Conv2d, BatchNorm2d,
-- ReLU, MaxPool2d, Conv2d, BatchNorm2d, ReLU, AdaptiveAvgPool2d, Linear)
-- trained 20 steps with SGD and momentum from PyTorch's initial weights on
-- the same batches: every step's loss and the running statistics after
-- the last against PyTorch's (tests/ref/cnn_bn.lua, written by
-- scripts/gen_cnn_bn_ref.py), in float64 and float32.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, F = torch.nn, torch.nn.functional
local ref = dofile(dir .. "/ref/cnn_bn.lua")
local cfg = ref.config

local Net = nn.Module:extend("Net")
function Net:__init(dtype)
  local o = { dtype = dtype }
  self.conv1 = nn.Conv2d(1, 4, 3, { padding = 1, dtype = dtype })
  self.bn1 = nn.BatchNorm2d(4, o)
  self.conv2 = nn.Conv2d(4, 8, 3, o)
  self.bn2 = nn.BatchNorm2d(8, o)
  self.fc = nn.Linear(8, cfg.classes, o)
end
function Net:forward(x)
  x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
  x = F.relu(self.bn2(self.conv2(x)))
  return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
end

-- the generator's formula, in double, cast to dtype
local function batch(step, dtype)
  local N, S = cfg.n, cfg.side
  local x = torch.empty({ N, 1, S, S }, { dtype = torch.float64 })
  local y = torch.empty({ N }, { dtype = torch.int64 })
  for n = 0, N - 1 do
    for i = 0, S - 1 do
      for j = 0, S - 1 do
        x[n][0][i][j] = math.sin(0.37 * (step + 1) + 0.11 * n + 0.53 * i - 0.29 * j) + 0.1 * ((n * 7 + i * 3 + j) % 5)
      end
    end
    y[n] = (step + n) % cfg.classes
  end
  return x:to(dtype), y
end

local function close_list(got, want, tol, what)
  local worst = 0
  for i = 1, #want do worst = math.max(worst, math.abs(got[i] - want[i])) end
  T.ok(#got == #want and worst <= tol, what, string.format("worst difference %.3g over %.3g", worst, tol))
end

for _, c in ipairs({ { torch.float64, ref.float64, 1e-10 }, { torch.float32, ref.float32, 1e-4 } }) do
  local dtype, want, tol = c[1], c[2], c[3]
  T.run("CNN with BatchNorm, 20 steps in " .. tostring(dtype), function()
    local model = Net(dtype)
    local sd = model:state_dict()
    for k, v in pairs(ref.weights) do sd[k] = T.ref_tensor(torch, v, torch.float32):to(dtype) end
    model:load_state_dict(sd)
    local opt = torch.optim.SGD(model:parameters(), { lr = cfg.lr, momentum = cfg.momentum })
    local losses = {}
    for step = 0, cfg.steps - 1 do
      local x, y = batch(step, dtype)
      opt:zero_grad()
      local loss = F.cross_entropy(model(x), y)
      loss:backward()
      opt:step()
      losses[#losses + 1] = loss:item()
    end
    for i = 1, #want.losses do
      T.ok(math.abs(losses[i] - want.losses[i]) <= tol,
           string.format("step %d: loss %.12g (PyTorch %.12g)", i, losses[i], want.losses[i]))
    end
    close_list(model.bn1.running_mean:tolist(), want.bn1_running_mean, tol, "bn1's running mean after 20 steps")
    close_list(model.bn2.running_var:tolist(), want.bn2_running_var, tol, "bn2's running variance after 20 steps")
  end)
end

T.done_testing()
