-- sweep_trial_fashion_mnist.lua: one trial of examples/sweep_fashion_mnist.lua.
--
--   dplua sweep examples/sweep_fashion_mnist.lua        # runs this once per configuration
--   dplua examples/sweep_trial_fashion_mnist.lua        # one short run with the defaults below
--
-- It trains examples/fashion_mnist.lua (called as a chunk with an options
-- table) in a short mode: a subset of the images, few epochs. The sweep's
-- values arrive through torch.hparams and override the defaults; any
-- fashion_mnist option may be swept (lr, batch_size, epochs, optimizer,
-- weight_decay, ...). It reports each epoch's loss and accuracies as it
-- goes, and the final test accuracy, through torch.report.
local torch = require("dplua")

local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."

local hp = torch.hparams{
  lr = 1e-3, batch_size = 128, optimizer = "adam", weight_decay = 0, schedule = "cosine",
  epochs = 2, subset = 20000, test_subset = 5000, max_steps = 0, seed = 0,
  data = "/usr/share/datasets/fashion-mnist",
}

-- fashion_mnist prints through opts.log; each epoch line is reported too
local function log(line)
  print(line)
  io.stdout:flush()
  local epoch, loss, train_acc, test_acc =
    line:match("^epoch (%d+)%s+loss ([%d.]+)%s+train acc ([%d.]+)%%%s+test acc ([%d.]+)%%")
  if epoch then
    local function fraction(percent) return tonumber(("%.6g"):format(tonumber(percent) / 100)) end
    torch.report{ epoch = tonumber(epoch), loss = tonumber(loss),
                  train_accuracy = fraction(train_acc), test_accuracy = fraction(test_acc) }
  end
end

local train = assert(loadfile(here .. "/fashion_mnist.lua"))
local opts = { log = log }
for k, v in pairs(hp) do opts[k] = v end
local result = train(opts)

local last = result.epochs[#result.epochs] or {}
torch.report{ test_accuracy = result.test_accuracy, loss = last.loss, steps = result.steps, train_time = result.time }
