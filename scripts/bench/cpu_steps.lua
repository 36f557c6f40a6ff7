-- dplua's side of scripts/bench/cpu_steps: µs per training step of the
-- seed model (10-10-2, batch 32, SGD) and of the 784-256-128-10 MLP
-- (batch 256, SGD), printed as "name us_per_step" lines.
local torch = require("dplua")

local clock = torch.utils.progress.clock   -- seconds, monotonic
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")

local function bench(name, model, batch, in_features, classes, steps)
  torch.manual_seed(0)
  local x = torch.rand(batch, in_features)
  local y = torch.randint(0, classes, { batch })
  local step = models.sgd_step(model, x, y)
  for _ = 1, math.max(10, math.floor(steps / 10)) do step() end
  local best = math.huge
  for _ = 1, 5 do
    local t0 = clock()
    for _ = 1, steps do step() end
    best = math.min(best, (clock() - t0) / steps)
  end
  print(string.format("%s %.2f", name, best * 1e6))
end

local SimpleNN = models.SimpleNN

local which = arg[1] or "all"
if which == "all" or which == "seed" then bench("seed", SimpleNN(), 32, 10, 2, 20000) end
if which == "all" or which == "mlp" then
  local mlp = models.mlp()
  bench("mlp", mlp, 256, 784, 10, 200)
end
