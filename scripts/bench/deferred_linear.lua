-- dplua's side of scripts/bench/deferred_linear: the eager seed (10-10-2,
-- batch 32) and MLP (784-256-128-10, batch 256) steps with SGD on the GPU,
-- the median of 9 blocks of 2000 steps after 3000 of warm-up, and the
-- fusions of the deferred Linear a step (torch.cuda._linear_fusions).
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim
local clock = torch.utils.progress.clock
if not torch.cuda.is_available() then print("no_gpu"); os.exit(0) end
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")

local function measure(which)
  torch.manual_seed(0)
  local model, x, y
  if which == "seed" then
    model, x, y = models.SimpleNN():cuda(), torch.rand(32, 10):cuda(), torch.randint(0, 2, { 32 }):cuda()
  else
    model, x, y = models.mlp():cuda(), torch.rand(256, 784):cuda(), torch.randint(0, 10, { 256 }):cuda()
  end
  local crit = nn.CrossEntropyLoss()
  local opt = optim.SGD(model:parameters(), { lr = 0.01 })
  local function step() opt:zero_grad(); crit(model(x), y):backward(); opt:step() end
  for _ = 1, 3000 do step() end
  local fusions = torch.cuda._linear_fusions()
  local times = {}
  for b = 1, 9 do
    torch.cuda.synchronize()
    local t0 = clock()
    for _ = 1, 2000 do step() end
    torch.cuda.synchronize()
    times[b] = (clock() - t0) / 2000 * 1e6
  end
  table.sort(times)
  return times[5], (torch.cuda._linear_fusions() - fusions) / (9 * 2000)
end

local seed_us, seed_fusions = measure("seed")
local mlp_us, mlp_fusions = measure("mlp")
print(string.format("DPLUA_DEFER_LINEAR=%s  seed %.1f us/step (%.2f fusions a step)  MLP %.1f us/step (%.2f)",
                    os.getenv("DPLUA_DEFER_LINEAR") or "1", seed_us, seed_fusions, mlp_us, mlp_fusions))
