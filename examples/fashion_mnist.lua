-- fashion_mnist.lua: train an MLP on Fashion-MNIST, the PyTorch way.
--
--   dplua examples/fashion_mnist.lua                   # 784-256-128-10, Adam, 8 epochs
--   dplua examples/fashion_mnist.lua --epochs=2 --batch-size=64 --lr=3e-3
--   dplua examples/fashion_mnist.lua --subset=5000 --max-steps=200
--   dplua examples/fashion_mnist.lua --help
--
-- The data is Debian's dataset-fashion-mnist package (gzip IDX files under
-- /usr/share/datasets/fashion-mnist, or --data=DIR). Each epoch prints its
-- mean loss, test accuracy, wall time, and how that time splits between
-- waiting for the DataLoader (data) and the training step (forward,
-- backward, optimizer): loading must not be the bottleneck.
--
-- Run as a script, it reads its options from the command line; called as
-- a chunk with an options table (tests/lua/test_fashion_mnist.lua does),
-- it takes the options from the table, prints through opts.log, and
-- returns a table of results.
local torch = require("dplua")
local ffi = require("ffi")
local nn, optim, data = torch.nn, torch.optim, torch.utils.data

---------------------------------------------------------------- options

local defaults = {
  data = "/usr/share/datasets/fashion-mnist",
  epochs = 8, batch_size = 128, lr = 1e-3, optimizer = "adam", weight_decay = 0, schedule = "cosine",
  subset = 0,            -- train on the first N images (0: all 60000)
  test_subset = 0,       -- evaluate on the first N test images (0: all 10000)
  max_steps = 0,         -- stop after N optimizer steps in all (0: no limit)
  seed = 0, log_every = 0,
  device = "cpu",        -- "cuda" (or "cuda:N") trains on a GPU
}
local numeric = { epochs = true, batch_size = true, lr = true, weight_decay = true, subset = true,
                  test_subset = true, max_steps = true, seed = true, log_every = true }

local usage = [[
usage: dplua examples/fashion_mnist.lua [--OPTION=VALUE ...]
  --epochs=8          passes over the training set
  --batch-size=128    samples per step
  --lr=1e-3           learning rate
  --optimizer=adam    adam, adamw or sgd (sgd uses momentum 0.9)
  --weight-decay=0
  --schedule=cosine   cosine (anneal the lr to 0 over the epochs, per epoch) or none
  --subset=0          train on the first N images only (0: all 60000)
  --test-subset=0     test on the first N images only (0: all 10000)
  --max-steps=0       stop after N steps in all (0: no limit)
  --seed=0            model initialisation and shuffling
  --log-every=0       print the loss every N steps (0: once per epoch)
  --data=DIR          the IDX files (default /usr/share/datasets/fashion-mnist)
  --device=cpu        cpu, cuda or cuda:N]]

local function parse_args(argv)
  local opts = {}
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "-h" or a == "--help" then print(usage); os.exit(0) end
    local key, value = a:match("^%-%-([%w%-_]+)=(.*)$")
    if not key then
      key = a:match("^%-%-([%w%-_]+)$")
      value = argv[i + 1]
      i = i + 1
    end
    if not key or value == nil then error("fashion_mnist: bad argument '" .. a .. "'\n" .. usage, 0) end
    key = key:gsub("%-", "_")
    if defaults[key] == nil then error("fashion_mnist: unknown option --" .. key .. "\n" .. usage, 0) end
    opts[key] = value
    i = i + 1
  end
  return opts
end

local function resolve(given)
  local o = {}
  for k, v in pairs(defaults) do o[k] = v end
  for k, v in pairs(given) do
    if defaults[k] == nil and k ~= "log" then error("fashion_mnist: unknown option " .. tostring(k), 0) end
    if numeric[k] then
      local n = tonumber(v)
      if not n or n < 0 then error(("fashion_mnist: --%s expects a non-negative number, got %s"):format(k, tostring(v)), 0) end
      v = n
    end
    o[k] = v
  end
  o.log = given.log or print
  return o
end

local opts
if type((...)) == "table" then
  opts = resolve(...)
else
  opts = resolve(parse_args({ ... }))
end
local log = opts.log

---------------------------------------------------------------- wall clock

ffi.cdef [[
  struct dplua_fm_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk_id, struct dplua_fm_timespec *tp);
]]
local ts = ffi.new("struct dplua_fm_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)   -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

---------------------------------------------------------------- data

local t0 = now()
local function load(name)
  return data.load_idx(opts.data .. "/" .. name)
end
local train_x, train_y = load("train-images-idx3-ubyte.gz"), load("train-labels-idx1-ubyte.gz")
local test_x, test_y = load("t10k-images-idx3-ubyte.gz"), load("t10k-labels-idx1-ubyte.gz")
if opts.subset > 0 then
  train_x, train_y = train_x:narrow(0, 0, math.min(opts.subset, #train_x)), train_y:narrow(0, 0, math.min(opts.subset, #train_y))
end
if opts.test_subset > 0 then
  test_x, test_y = test_x:narrow(0, 0, math.min(opts.test_subset, #test_x)), test_y:narrow(0, 0, math.min(opts.test_subset, #test_y))
end

-- Pixels to [0, 1], then to zero mean and unit variance with the training
-- set's statistics (done once here, not per batch). Labels become int64
-- class indices, as cross_entropy wants.
train_x = train_x:float():div_(255)
test_x = test_x:float():div_(255)
local mean, std = train_x:mean():item(), train_x:std():item()
train_x:sub_(mean):div_(std)
test_x:sub_(mean):div_(std)
train_y, test_y = train_y:long(), test_y:long()
local load_time = now() - t0

torch.manual_seed(opts.seed)
local train_loader = data.DataLoader(data.TensorDataset(train_x, train_y),
                                     { batch_size = opts.batch_size, shuffle = true, seed = opts.seed })
local test_loader = data.DataLoader(data.TensorDataset(test_x, test_y), { batch_size = 1000 })
log(("data: %d train and %d test images of 28x28 (pixel mean %.4f, std %.4f), read and normalised in %.2f s")
    :format(#train_x, #test_x, mean, std, load_time))

---------------------------------------------------------------- model

local device = torch.device(opts.device)
local model = nn.Sequential(
  nn.Flatten(),
  nn.Linear(28 * 28, 256), nn.ReLU(),
  nn.Linear(256, 128), nn.ReLU(),
  nn.Linear(128, 10)):to(device)
local criterion = nn.CrossEntropyLoss()
local optimizer
if opts.optimizer == "adam" then
  optimizer = optim.Adam(model:parameters(), { lr = opts.lr, weight_decay = opts.weight_decay })
elseif opts.optimizer == "adamw" then
  optimizer = optim.AdamW(model:parameters(), { lr = opts.lr, weight_decay = opts.weight_decay })
elseif opts.optimizer == "sgd" then
  optimizer = optim.SGD(model:parameters(), { lr = opts.lr, momentum = 0.9, weight_decay = opts.weight_decay })
else
  error("fashion_mnist: --optimizer must be adam, adamw or sgd, got " .. tostring(opts.optimizer), 0)
end
local scheduler
if opts.schedule == "cosine" then
  scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, { T_max = math.max(opts.epochs, 1) })
elseif opts.schedule ~= "none" then
  error("fashion_mnist: --schedule must be cosine or none, got " .. tostring(opts.schedule), 0)
end
log(("model: 784-256-128-10 MLP on %s, %s lr %g (%s schedule), batch %d, %d epochs%s")
    :format(tostring(device), opts.optimizer, opts.lr, opts.schedule, opts.batch_size, opts.epochs,
            opts.max_steps > 0 and (", at most " .. opts.max_steps .. " steps") or ""))

---------------------------------------------------------------- training

local function evaluate()
  model:eval()
  local correct, total = 0, 0
  torch.no_grad(function()
    for x, y in test_loader:iter() do
      x, y = x:to(device), y:to(device)
      correct = correct + model(x):argmax(1):eq(y):sum():item()
      total = total + y:size(0)
    end
  end)
  model:train()
  return correct / total
end

local result = { epochs = {}, steps = 0, data_time = 0, step_time = 0 }
local steps = 0
local train_start = now()
for epoch = 1, opts.epochs do
  local epoch_start = now()
  local data_time, step_time = 0, 0
  local loss_sum, correct, seen, batches = 0, 0, 0, 0
  local t_ready = now()
  for x, y in train_loader:iter() do
    x, y = x:to(device), y:to(device)
    local t_got = now()
    data_time = data_time + (t_got - t_ready)

    optimizer:zero_grad()
    local logits = model(x)
    local loss = criterion(logits, y)
    loss:backward()
    optimizer:step()

    local l = loss:item()       -- also waits for the step to finish
    loss_sum, batches, seen = loss_sum + l, batches + 1, seen + y:size(0)
    correct = correct + logits:detach():argmax(1):eq(y):sum():item()
    steps = steps + 1
    t_ready = now()
    step_time = step_time + (t_ready - t_got)
    if opts.log_every > 0 and steps % opts.log_every == 0 then
      log(("  step %d  loss %.4f"):format(steps, l))
    end
    if opts.max_steps > 0 and steps >= opts.max_steps then break end
  end
  if scheduler then scheduler:step() end
  local train_time = now() - epoch_start
  local acc = evaluate()
  local e = { epoch = epoch, loss = loss_sum / math.max(batches, 1), train_accuracy = correct / math.max(seen, 1),
              test_accuracy = acc, time = train_time, data_time = data_time, step_time = step_time, steps = batches }
  result.epochs[epoch] = e
  result.data_time, result.step_time = result.data_time + data_time, result.step_time + step_time
  log(("epoch %d  loss %.4f  train acc %.2f%%  test acc %.2f%%  %.2f s (%d steps: data %.3f s = %.1f%%, step %.2f s, %.2f ms/step)")
      :format(epoch, e.loss, 100 * e.train_accuracy, 100 * acc, train_time, batches, data_time,
              100 * data_time / math.max(data_time + step_time, 1e-9), step_time,
              1000 * step_time / math.max(batches, 1)))
  if opts.max_steps > 0 and steps >= opts.max_steps then break end
end

result.steps = steps
result.time = now() - train_start
result.test_accuracy = result.epochs[#result.epochs] and result.epochs[#result.epochs].test_accuracy or evaluate()
log(("done: test accuracy %.2f%% after %d steps in %.1f s; data loading %.2f s vs training steps %.2f s (%.1f%% of the loop)")
    :format(100 * result.test_accuracy, steps, result.time, result.data_time, result.step_time,
            100 * result.data_time / math.max(result.data_time + result.step_time, 1e-9)))
return result
