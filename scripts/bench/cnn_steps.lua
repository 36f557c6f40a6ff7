-- dplua's side of scripts/bench/cnn_steps: pytorch/examples' MNIST CNN
-- on the CPU, one thread: ms per training step (batch 64, Adam) and per
-- call of its two convolutions, forward and forward + backward. Times are
-- the process's CPU time (os.clock), the best of a few repeats, printed as
-- "name ms" lines; cnn_steps.py measures PyTorch the same way.
local torch = require("dplua")
local F = torch.nn.functional
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local models = dofile(here .. "/models.lua")
torch.set_num_threads(1)

local ms = dofile(here .. "/timing.lua").cpu_ms

local function row(name, f, n) print(string.format("%s %.3f", name, ms(f, n))); collectgarbage() end

torch.manual_seed(0)
local model = models.MnistCNN()
local x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, { 64 })
local crit, opt = torch.nn.CrossEntropyLoss(), torch.optim.Adam(model:parameters(), { lr = 1e-3 })
row("step", function() opt:zero_grad(); crit(model(x), y):backward(); opt:step() end, 5)

-- the layers' own shapes: conv1 1->32 on (64, 1, 28, 28), conv2 32->64 on (64, 32, 26, 26)
local function conv_rows(name, C, O, H, input_grad)
  local xi = torch.randn(64, C, H, H, { requires_grad = input_grad })
  local w = torch.randn(O, C, 3, 3, { requires_grad = true })
  local b = torch.randn(O, { requires_grad = true })
  local g = torch.randn(64, O, H - 2, H - 2)
  local n = C == 1 and 20 or 3
  row(name .. "_fwd", function() return F.conv2d(xi, w, b) end, n)
  row(name .. "_fwdbwd", function() F.conv2d(xi, w, b):backward(g); w.grad = nil; b.grad = nil; xi.grad = nil end, n)
end
conv_rows("conv1", 1, 32, 28, false)
conv_rows("conv2", 32, 64, 26, true)
