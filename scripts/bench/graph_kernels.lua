-- What each kernel of the replayed seed step costs inside a CUDA graph:
-- a graph of 1 and of 9 launches of one op (each reading what the one
-- before wrote), replayed; (t9 - t1) / 8 is a launch's share of a
-- replayed step, beside an in-place add of one element (the floor). The
-- ops are the seed step's kernels: fc1 with its ReLU (a one-block
-- product), the loss with fc2 inside it, the SGD step; then the model's
-- forward and loss (2 kernels; the loss also writes its gradient, as the
-- parameters need one), that and the backward (3: the chained backwards'
-- share is the difference), and the whole step (4).
-- usage: dplua scripts/bench/graph_kernels.lua
local torch = require("dplua")
local F = torch.nn.functional
local clock = torch.utils.progress.clock
if not torch.cuda.is_available() then print("no_gpu"); os.exit(0) end
local d = "cuda"
torch.manual_seed(0)

local function replay_us(k, op)
  for _ = 1, 3 do for _ = 1, k do op() end end
  torch.cuda.synchronize()
  local g = torch.cuda.graph(function() for _ = 1, k do op() end end)
  for _ = 1, 100 do g:replay() end
  torch.cuda.synchronize()
  local best = math.huge
  for _ = 1, 5 do
    local n, t = 2000, clock()
    for _ = 1, n do g:replay() end
    torch.cuda.synchronize()
    best = math.min(best, (clock() - t) / n * 1e6)
  end
  return best
end

local x, one, loss = torch.zeros(1, { device = d }), torch.ones(1, { device = d }), nil
local h = torch.rand(32, 10, { device = d })
local w1, b1 = torch.rand(10, 10, { device = d }) - 0.5, torch.rand(10, { device = d }) - 0.5
local w2, b2 = torch.rand(2, 10, { device = d }) - 0.5, torch.rand(2, { device = d }) - 0.5
local y = torch.randint(0, 2, { 32 }):to(d)
local models = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or ".") .. "/models.lua")
local model, xs = models.SimpleNN():cuda(), torch.rand(32, 10):cuda()
local crit, opt = torch.nn.CrossEntropyLoss(), torch.optim.SGD(model:parameters(), { lr = 0.01 })
crit(model(xs), y):backward()   -- gradients for the SGD step alone
local ops = {
  { "add_ (1 element)", function() x:add_(one) end },
  { "fc1+ReLU (one block)", function() h = F.relu(F.linear(h, w1, b1)) end },
  { "loss with fc2 in it", function() loss = F.cross_entropy(F.linear(h, w2, b2), y) end },
  { "SGD step (4 parameters)", function() opt:step() end },
  { "the model's forward and loss", function() loss = crit(model(xs), y) end },
  { "forward, loss and backward", function() opt:zero_grad(); crit(model(xs), y):backward() end },
  { "the whole seed step", function() opt:zero_grad(); crit(model(xs), y):backward(); opt:step() end },
}
print(("%-28s %10s %10s %12s"):format("op", "1 us", "9 us", "per launch"))
for _, o in ipairs(ops) do
  local t1, t9 = replay_us(1, o[2]), replay_us(9, o[2])
  print(("%-28s %10.2f %10.2f %12.2f"):format(o[1], t1, t9, (t9 - t1) / 8))
end
-- the same graphs captured and replayed on a stream of our own, not the
-- legacy default stream that the ops above used
local s = torch.cuda.Stream()
torch.cuda.stream(s, function()
  for _, o in ipairs({ ops[1], ops[#ops] }) do
    local t1, t9 = replay_us(1, o[2]), replay_us(9, o[2])
    print(("%-28s %10.2f %10.2f %12.2f"):format(o[1] .. ", own stream", t1, t9, (t9 - t1) / 8))
  end
end)
