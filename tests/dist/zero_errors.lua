-- Run under the launcher: dplua --nproc_per_node=2 tests/dist/zero_errors.lua
-- Bad input to the sharded optimizer, ZeRO-2 and Join gives a Lua error
-- naming what was wrong; prints TAP.
local torch = require("dplua")
local nn, optim, dist = torch.nn, torch.optim, torch.distributed

dist.init_process_group("gloo")
local Z = dist.optim.ZeroRedundancyOptimizer
local n = 0
local tests = {}
local function expect(what, pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  tests[#tests + 1] = { ok = not ok and tostring(err):find(pattern, 1, true) ~= nil, what = what, err = tostring(err) }
end
local function model() torch.manual_seed(1); return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)) end

local m = model()
expect("no optimizer_class", "optimizer_class", Z, m:parameters(), { lr = 0.1 })
expect("no options table", "optimizer_class", Z, m:parameters())
expect("an optimizer instance as optimizer_class", "the class, not an instance", Z, m:parameters(),
       { optimizer_class = optim.SGD(model():parameters(), { lr = 0.1 }) })
expect("a string as optimizer_class", "optimizer_class", Z, m:parameters(), { optimizer_class = "AdamW" })
expect("an option the optimizer does not know", "unknown option 'bogus'", Z, m:parameters(),
       { optimizer_class = optim.SGD, lr = 0.1, bogus = 1 })
expect("a single tensor as params", "single Tensor", Z, m:parameters()[1], { optimizer_class = optim.SGD })
local mixed = { torch.zeros({ 4 }, { requires_grad = true }), torch.zeros({ 4 }, { dtype = torch.float64, requires_grad = true }) }
expect("parameters of two dtypes", "one dtype and device", Z, mixed, { optimizer_class = optim.SGD })

local ddp = nn.parallel.DistributedDataParallel(model())
local some = { ddp:parameters()[1], ddp:parameters()[2] }
expect("part of a DDP's flat buffer", "not all of it", Z, some, { optimizer_class = optim.SGD, lr = 0.1 })
expect("an unknown sharding strategy", "sharding_strategy", nn.parallel.DistributedDataParallel, model(),
       { sharding_strategy = "FULL_SHARD" })

local ddp2 = nn.parallel.DistributedDataParallel(model(), { sharding_strategy = "SHARD_GRAD_OP" })
expect("SHARD_GRAD_OP without ZeroRedundancyOptimizer", "ZeroRedundancyOptimizer", ddp2, torch.randn(2, 6))
local zopt = Z(ddp2:parameters(), { optimizer_class = optim.Adam })
expect("a second ZeroRedundancyOptimizer over one gradient shard", "already has", Z, ddp2:parameters(),
       { optimizer_class = optim.Adam })
expect("state_dict before consolidate_state_dict", "consolidate_state_dict", zopt.state_dict, zopt)
expect("a sharded state dict that is not one", "sharded_state_dict()", zopt.load_sharded_state_dict, zopt, {})
expect("Join of something that is not a joinable", "expected a DistributedDataParallel", dist.algorithms.Join,
       { optim.SGD(model():parameters(), { lr = 1 }) }, function() end)
expect("Join without a function", "training loop as a function", dist.algorithms.Join, { ddp2 })

print("1.." .. #tests)
for i, t in ipairs(tests) do
  print(string.format("%s %d - %s%s", t.ok and "ok" or "not ok", i, t.what, t.ok and "" or (": got " .. t.err)))
end
dist.destroy_process_group()
