-- CUDA graphs, streams and events, and the errors kernels find (make
-- check-gpu): a training step replayed from a graph equals the same steps
-- run eagerly; what cannot be captured fails clearly at capture time and
-- leaves dplua usable; work on a side stream is ordered by events; a bad
-- class index or index found on the GPU is raised at the next
-- synchronisation, naming the value; gather, scatter_add and the bf16
-- optimizer step agree with the CPU; gradcheck holds on the GPU; bf16
-- autocast losses stay within bf16 tolerance of float32.
local dir = os.getenv("DPLUA_TEST_DIR") or (debug.getinfo(1, "S").source:match("^@(.*)/gpu/") or "tests")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local models = require("models")
local torch = require("dplua")
if not torch.cuda.is_available() then T.skip_all("no CUDA device") end

local nn, optim, F = torch.nn, torch.optim, torch.nn.functional
local dev = "cuda:0"

-- the worst relative difference between two lists of numbers (relative
-- to at least `floor`)
local function worst(a, b, floor)
  local w = 0
  for i = 1, #a do w = math.max(w, math.abs(a[i] - b[i]) / math.max(math.abs(a[i]), floor or 1e-6)) end
  return w
end

local function flat_params(m)
  local out = {}
  for _, p in ipairs(m:parameters()) do
    for _, v in ipairs(p:detach():cpu():double():reshape(-1):tolist()) do out[#out + 1] = v end
  end
  return out
end

---------------------------------------------------------------- the deferred Linear

-- the optimizer settings of the bit test below, by name (SGD's unless
-- `optimizer` names another)
local SGD_SETTINGS = {
  momentum = { momentum = 0.9 },
  plain = {},
  nesterov = { momentum = 0.9, nesterov = true, weight_decay = 0.01 },
  dampening = { momentum = 0.9, dampening = 0.5, weight_decay = 0.001 },
  adam = { optimizer = "Adam" },
  adamw = { optimizer = "AdamW", weight_decay = 0.01 },
  adadelta = { optimizer = "Adadelta", weight_decay = 0.01 },
  rmsprop = { optimizer = "RMSprop", momentum = 0.5, centered = true },
  adagrad = { optimizer = "Adagrad", lr_decay = 0.01, initial_accumulator_value = 0.1 },
}

-- `steps` steps of an optimizer (settings: SGD_SETTINGS') of m on fixed
-- data: the losses as exact hex (%a), one a line.
local function sgd_loss_lines(m, x, y, steps, lr, settings)
  local options = { lr = lr }
  for k, v in pairs(settings) do
    if k ~= "optimizer" then options[k] = v end
  end
  local opt = optim[settings.optimizer or "SGD"](m:parameters(), options)
  local lines = {}
  for _ = 1, steps do
    lines[#lines + 1] = ("%a"):format(models.step(m, opt, F.cross_entropy, x, y):item())
  end
  return lines
end

-- Four optimizer steps (SGD_SETTINGS[sgd]) of the seed's model, `act` between
-- its Linears, in dtype (a name: float32, float64, bfloat16), on fixed
-- data: the losses and the parameters after them as exact hex (%a), one
-- line each. "wide" makes it 20-40-2 (922 parameters: more than a thread
-- each of the block that takes the step after the backward), "head"
-- 20-128-10 at batch 256 (its head too large for one block: the loss's
-- launch takes it over a cluster of blocks), "first" 784-128-10 at batch
-- 256 (the first layer's weight gradient is cuBLASLt's, its bias gradient
-- waits for the optimizer's launch).
local function defer_bits(act, dtype_name, sgd, wide)
  local dtype = torch[dtype_name]
  local inputs, hidden, classes, batch = 10, 10, 2, 32
  if wide == "wide" then inputs, hidden = 20, 40 end
  if wide == "head" then inputs, hidden, classes, batch = 20, 128, 10, 256 end
  if wide == "first" then inputs, hidden, classes, batch = 784, 128, 10, 256 end
  torch.manual_seed(5)
  local x, y = torch.randn(batch, inputs):to(dtype):to(dev), torch.randint(0, classes, { batch }):to(dev)
  local m = nn.Sequential(nn.Linear(inputs, hidden), act == "relu" and nn.ReLU() or nn.GELU(act),
                          nn.Linear(hidden, classes))
  m = m:to(dtype):to(dev)
  local lines = sgd_loss_lines(m, x, y, 4, 0.1, SGD_SETTINGS[sgd])
  for _, v in ipairs(flat_params(m)) do lines[#lines + 1] = ("%a"):format(v) end
  return table.concat(lines, "\n")
end

-- t's elements as exact hex, one a line, into lines
local function hex_lines(lines, t)
  for _, v in ipairs(t:detach():cpu():double():reshape(-1):tolist()) do lines[#lines + 1] = ("%a"):format(v) end
end

-- One forward and backward of a 10-10-2 ReLU model (case "lone": of one
-- Linear(10, 2) whose input wants a gradient, so that its backward waits
-- alone), then an SGD step by torch._sgd_step on tensors of its own:
-- 100 float32 elements, momentum with Nesterov and weight decay, its
-- first step. Case "large" takes 5000 elements, "float64" another dtype,
-- "aliased" the second Linear's weight gradient (which the chain writes)
-- as the parameters. The step's parameters and momentum and every
-- gradient as exact hex, one a line.
local function sgd_after_bits(case)
  torch.manual_seed(8)
  local x, y = torch.randn(32, 10):to(dev), torch.randint(0, 2, { 32 }):to(dev)
  local m = case == "lone" and nn.Linear(10, 2):to(dev) or
            nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 2)):to(dev)
  if case == "lone" then x:requires_grad_() end
  local n = case == "large" and 5000 or case == "aliased" and 20 or 100
  local dtype = case == "float64" and torch.float64 or torch.float32
  -- made before the forward: a copy or a fill launches what waits
  local p, g, buf = torch.randn(n):to(dtype):to(dev), torch.randn(n):to(dtype):to(dev), torch.zeros(n):to(dtype):to(dev)
  F.cross_entropy(m(x), y):backward()
  if case == "aliased" then p = m:parameters()[3].grad end
  torch._sgd_step(p, g, buf, 0.1, 0.9, 0, true, 0.01, true)
  local lines = {}
  hex_lines(lines, p)
  hex_lines(lines, buf)
  for _, q in ipairs(m:parameters()) do hex_lines(lines, q.grad) end
  if case == "lone" then hex_lines(lines, x.grad) end
  return table.concat(lines, "\n")
end

-- what f() returns with every op launched on its own
local function alone(f, ...)
  torch.cuda._set_deferral(false)
  local ok, v = pcall(f, ...)
  torch.cuda._set_deferral(true)
  assert(ok, v)
  return v
end

-- What waits runs where it fits (gpu_linear.c's waiting_work): the Linears
-- inside the loss's launch, an activation in a Linear's epilogue, two
-- backwards chained in one block, and the SGD step after them in that
-- block. Each must give the bits its own launch would: the same steps
-- with the waiting turned off (torch.cuda._set_deferral) end in the same
-- losses and parameters, bit for bit. A step of the ReLU model saves
-- four launches (both Linears in the loss, the chain, the SGD step; the
-- activation is the first Linear's own, nn.Sequential's fusion, not
-- counted), but the first with momentum three (making the momentum
-- buffer launches the chain first); the wide model's hidden layer is too
-- large for the loss's launch (one less). A GELU's backward is an op
-- between the Linears' (no chain, no step in it): two. The head model
-- saves one a step where the GPU has clusters (sm_90 on): the loss's
-- launch takes its head; its backwards are too large to chain. The
-- "first" model saves that, and the optimizer's launch takes its first
-- layer's bias gradient, but not on a first step that makes the
-- optimizer's state (momentum, Adam's moments, Adadelta's and RMSprop's
-- buffers: a kernel launches it; Adagrad makes its sum with the optimizer).
T.run("the deferred Linear changes no bit of a training run", function()
  for _, case in ipairs({ { "relu", "float32", "momentum" }, { "relu", "float64", "momentum" },
                          { "relu", "bfloat16", "momentum" }, { "none", "float32", "momentum" },
                          { "tanh", "float64", "momentum" }, { "relu", "float32", "plain" },
                          { "relu", "float64", "nesterov" }, { "relu", "bfloat16", "dampening" },
                          { "relu", "float32", "nesterov", "wide" }, { "relu", "bfloat16", "momentum", "wide" },
                          { "relu", "float32", "momentum", "head" }, { "relu", "float64", "plain", "head" },
                          { "relu", "bfloat16", "momentum", "head" }, { "relu", "float32", "momentum", "first" },
                          { "relu", "float32", "plain", "first" }, { "relu", "bfloat16", "nesterov", "first" },
                          { "relu", "float64", "adam", "first" }, { "relu", "float32", "adamw", "first" },
                          { "relu", "bfloat16", "adam", "first" }, { "relu", "float32", "adadelta", "first" },
                          { "relu", "bfloat16", "rmsprop", "first" }, { "relu", "float64", "adagrad", "first" } }) do
    local name = table.concat(case, " ")
    local each = alone(defer_bits, case[1], case[2], case[3], case[4])
    local fused_before = torch.cuda._linear_fusions()
    local waited = defer_bits(case[1], case[2], case[3], case[4])
    local relu = case[1] == "relu"
    local saved = 4 * ((relu and 4 or 2) - (case[4] and 1 or 0)) - ((relu and SGD_SETTINGS[case[3]].momentum) and 1 or 0)
    if case[4] == "head" or case[4] == "first" then saved = torch.cuda.get_device_capability() >= 9 and 4 or 0 end
    if case[4] == "first" then
      local settings = SGD_SETTINGS[case[3]]
      local fresh_state = settings.momentum or (settings.optimizer and settings.optimizer ~= "Adagrad")
      saved = saved + 4 - (fresh_state and 1 or 0)
    end
    T.is(torch.cuda._linear_fusions() - fused_before, saved, name .. ": the launches the Linears' waiting saved")
    T.is(waited, each, name .. ": the same losses and parameters as each op alone")
  end
end)

-- The SGD step joins the launch of the backward that waits before it
-- when it can (gpu_linear.c's takes_sgd): after a chain, on its first step with
-- momentum, and after a lone Linear's backward; not when it is too large
-- for the block, of another dtype, or on an output of the chain (its
-- parameters would be read before they are written). Either way the
-- bits are those of each op alone.
T.run("an SGD step joins the backward's launch only where it may", function()
  -- launches saved: both Linears in the loss (one for "lone"), the chain
  -- (none for "lone"), and the step where it joins
  for _, case in ipairs({ { "first", 4 }, { "lone", 2 }, { "large", 3 }, { "float64", 3 }, { "aliased", 3 } }) do
    local each = alone(sgd_after_bits, case[1])
    local fused_before = torch.cuda._linear_fusions()
    local waited = sgd_after_bits(case[1])
    T.is(torch.cuda._linear_fusions() - fused_before, case[2], case[1] .. ": the launches the waiting saved")
    T.is(waited, each, case[1] .. ": the same step and gradients as each op alone")
  end
end)

---------------------------------------------------------------- graphs

-- sizes: inputs, hidden, classes, batch
local function seed_model(dtype, sizes)
  torch.manual_seed(7)
  local m = nn.Sequential(nn.Linear(sizes[1], sizes[2]), nn.ReLU(), nn.Linear(sizes[2], sizes[3])):to(dtype):to(dev)
  return m, optim.SGD(m:parameters(), { lr = 0.05, momentum = 0.9 })
end

-- the seed's model; and 784-128-10 at batch 256, whose first layer's
-- weight gradient is cuBLASLt's and its bias gradient the SGD step's
-- launch's (captured too)
T.run("a training step replayed from a graph equals eager steps", function()
  for _, case in ipairs({ { torch.float64, { 10, 10, 2, 32 } }, { torch.float32, { 10, 10, 2, 32 } },
                          { torch.float32, { 784, 128, 10, 256 } } }) do
    local dtype, sizes = case[1], case[2]
    torch.manual_seed(11)
    local xs, ys = {}, {}
    for i = 1, 6 do
      xs[i] = torch.randn(sizes[4], sizes[1], { dtype = dtype }):to(dev)
      ys[i] = torch.randint(0, sizes[3], { sizes[4] }):to(dev)
    end
    local m1, o1 = seed_model(dtype, sizes)
    local eager = {}
    for i = 1, 6 do eager[i] = models.step(m1, o1, F.cross_entropy, xs[i], ys[i]):item() end
    local m2, o2 = seed_model(dtype, sizes)
    local x, y = xs[1]:clone(), ys[1]:clone()
    -- one eager step first, as in PyTorch: the momentum buffers then exist
    local replayed = { models.step(m2, o2, F.cross_entropy, x, y):item() }
    local loss
    local fused_before = torch.cuda._linear_fusions()
    local g = torch.cuda.graph(function() loss = models.step(m2, o2, F.cross_entropy, x, y) end)
    if sizes[1] == 784 then
      local head = torch.cuda.get_device_capability() >= 9 and 1 or 0
      T.is(torch.cuda._linear_fusions() - fused_before - head, 1,
           "784-128-10: the captured SGD step takes the first layer's bias gradient")
    end
    for i = 2, 6 do
      x:copy_(xs[i])
      y:copy_(ys[i])
      g:replay()
      replayed[i] = loss:item()
    end
    local tol = dtype == torch.float64 and 1e-12 or 1e-5
    local what = ("%d-%d-%d %s"):format(sizes[1], sizes[2], sizes[3], dtype.name)
    T.ok(worst(eager, replayed) < tol, ("%s: the replayed losses equal the eager ones (worst rel %.2e)")
         :format(what, worst(eager, replayed)))
    local w = worst(flat_params(m1), flat_params(m2))
    T.ok(w < tol * 10, ("%s: so do the parameters after 6 steps (worst rel %.2e)"):format(what, w))
    T.is(tostring(torch.cuda.current_stream()), tostring(torch.cuda.default_stream()),
         what .. ": the default stream is current again after the capture")
  end
end)

T.run("capturable Adam replayed from a graph equals eager steps", function()
  torch.manual_seed(12)
  local x, y = torch.randn(32, 10, { dtype = torch.float64 }):to(dev), torch.randint(0, 2, { 32 }):to(dev)
  local function make()
    torch.manual_seed(7)
    local m = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 2)):to(torch.float64):to(dev)
    return m, optim.Adam(m:parameters(), { lr = 0.01, capturable = true })
  end
  local m1, o1 = make()
  local eager = models.train(m1, o1, F.cross_entropy, x, y, 5)
  local m2, o2 = make()
  local replayed, loss = { models.step(m2, o2, F.cross_entropy, x, y):item() }, nil
  local g = torch.cuda.graph(function() loss = models.step(m2, o2, F.cross_entropy, x, y) end)
  for i = 2, 5 do
    g:replay()
    replayed[i] = loss:item()
  end
  T.ok(worst(eager, replayed) < 1e-12, ("losses (worst rel %.2e)"):format(worst(eager, replayed)))
  T.ok(worst(flat_params(m1), flat_params(m2)) < 1e-12, "parameters after 5 steps")
  T.is(o2:state_dict().state[0].step, 5, "the step count advanced with every replay")
end)

T.run("replays reuse the graph's memory", function()
  local m, o = seed_model(torch.float32, { 10, 10, 2, 32 })
  local x, y = torch.randn(32, 10):to(dev), torch.randint(0, 2, { 32 }):to(dev)
  local function step() models.step(m, o, F.cross_entropy, x, y) end
  step()   -- the momentum buffers exist before the capture
  local g = torch.cuda.graph(step)
  g:replay()
  torch.cuda.synchronize()
  collectgarbage()
  local before = torch.cuda.memory_allocated()
  for _ = 1, 50 do g:replay() end
  torch.cuda.synchronize()
  collectgarbage()
  T.is(torch.cuda.memory_allocated(), before, "50 replays allocate nothing")
end)

T.run("what cannot be captured fails at capture time", function()
  local m, o = seed_model(torch.float32, { 10, 10, 2, 32 })
  local x, y = torch.randn(32, 10):to(dev), torch.randint(0, 2, { 32 }):to(dev)
  T.raises(function() torch.cuda.graph(function() return F.cross_entropy(m(x), y):item() end) end,
           "a copy from the GPU to the host", ":item() inside a capture")
  T.raises(function() torch.cuda.graph(function() return torch.randn(3):to(dev) end) end,
           "a copy from the host to the GPU", "moving a CPU tensor inside a capture")
  T.raises(function() torch.cuda.graph(function() return torch.rand(3, { device = dev }) end) end,
           "a random draw", "a random draw on the GPU inside a capture")
  T.raises(function() torch.cuda.graph(function() torch.cuda.synchronize() end) end,
           "synchronize", "torch.cuda.synchronize inside a capture")
  T.raises(function() torch.cuda.graph(function() torch.cuda.graph(function() end) end) end,
           "captures do not nest", "a capture inside a capture")
  local adam = optim.Adam(m:parameters(), { lr = 0.01 })
  local function adam_step() models.step(m, adam, F.cross_entropy, x, y) end
  T.raises(function() torch.cuda.graph(adam_step) end, "run a step eagerly before torch.cuda.graph",
           "optimizer state made inside a capture: run a step first")
  adam_step()
  T.raises(function() torch.cuda.graph(adam_step) end, "capturable = true",
           "a plain Adam's step inside a capture names the way out")
  T.ok(not torch.cuda.is_current_stream_capturing(), "no capture is under way after the failures")
  -- and everything works as before afterwards
  T.is(tostring(torch.cuda.current_stream()), tostring(torch.cuda.default_stream()),
       "the default stream is current again after failed captures")
  local loss = models.step(m, o, F.cross_entropy, x, y)
  T.ok(loss:item() == loss:item(), "an eager step after the failed captures gives a number")
  T.raises(function() torch.cuda.graph(3) end, "expected a function", "a graph of a non-function")
end)

---------------------------------------------------------------- streams and events

T.run("streams and events", function()
  local s = torch.cuda.Stream()
  local a = torch.randn(256, 256):to(dev)
  local b
  local start, stop = torch.cuda.Event({ enable_timing = true }), torch.cuda.Event({ enable_timing = true })
  s:wait_stream(torch.cuda.current_stream())
  torch.cuda.stream(s, function()
    T.ok(torch.cuda.current_stream() == s, "torch.cuda.stream makes the stream current")
    start:record()
    b = a:mm(a):sum()
    stop:record()
  end)
  T.ok(torch.cuda.current_stream() == torch.cuda.default_stream(), "and puts the default stream back")
  torch.cuda.current_stream():wait_stream(s)
  T.close(b:item(), a:cpu():mm(a:cpu()):sum():item(), 1e-4, 1e-2, "work on the side stream, ordered by an event")
  stop:synchronize()
  T.ok(stop:query() and s:query(), "query says done after synchronize")
  local ms = start:elapsed_time(stop)
  T.ok(ms >= 0 and ms < 10000, ("elapsed_time gives milliseconds (%.3f)"):format(ms))
  T.raises(function() torch.cuda.Event():elapsed_time(torch.cuda.Event()) end, "enable_timing",
           "elapsed_time without timing")
  T.raises(function() torch.cuda.set_stream("x") end, "expected a torch.cuda.Stream", "set_stream of a string")
  T.raises(function() torch.cuda.stream(s, function() error("inside") end) end, "inside", "an error inside stream()")
  T.ok(torch.cuda.current_stream() == torch.cuda.default_stream(), "the stream is restored after an error")
end)

T.run("device and memory queries", function()
  local p = torch.cuda.get_device_properties(0)
  T.ok(#p.name > 0 and p.total_memory > 0 and p.major >= 1 and p.multi_processor_count > 0,
       ("get_device_properties: %s, %.1f GiB, %d.%d, %d SMs"):format(p.name, p.total_memory / 2 ^ 30, p.major, p.minor,
                                                                      p.multi_processor_count))
  T.is(torch.cuda.get_device_name(), p.name, "get_device_name")
  local free, total = torch.cuda.mem_get_info()
  T.ok(free > 0 and free <= total and total == p.total_memory, "mem_get_info: free <= total")
  local big = torch.zeros(64, 1024, 1024, { device = dev })   -- 256 MiB
  T.ok(torch.cuda.memory_reserved() >= torch.cuda.memory_allocated(), "memory_reserved >= memory_allocated")
  big = nil
  collectgarbage()
  torch.cuda.empty_cache()
  T.ok(torch.cuda.memory_reserved() < 256 * 2 ^ 20, "empty_cache gives the freed 256 MiB back to the driver")
  T.ok(torch.cuda.max_memory_reserved() >= 256 * 2 ^ 20, "max_memory_reserved remembers them")
  local stats = torch.cuda.memory_stats()
  T.is({ stats["allocated_bytes.all.current"], stats["reserved_bytes.all.peak"] },
       { torch.cuda.memory_allocated(), torch.cuda.max_memory_reserved() }, "memory_stats: PyTorch's keys, the same numbers")
  T.ok(torch.cuda.memory_summary():find("reserved %(pool%)") ~= nil, "memory_summary")
  local inside = torch.cuda.device(0, function() return torch.cuda.current_device() end)
  T.is(inside, 0, "cuda.device(0, fn): fn runs on device 0")
  T.is(torch.cuda.device_of(torch.ones(1, { device = dev }), function() return torch.cuda.current_device() end),
       torch.ones(1, { device = dev }).device.index, "cuda.device_of: the tensor's device")
end)

T.run("set_default_device: the factories and new modules on the GPU", function()
  torch.set_default_device("cuda")
  local ok, err = pcall(function()
    T.is(torch.get_default_device(), torch.device("cuda:0"), "get_default_device")
    for name, t in pairs({ zeros = torch.zeros(2), tensor = torch.tensor({ 1, 2 }), arange = torch.arange(3),
                           randn = torch.randn(2), full = torch.full({ 2 }, 7), eye = torch.eye(2),
                           linear = torch.nn.Linear(2, 3).weight }) do
      T.ok(t.is_cuda, name .. " on the GPU")
    end
    T.ok(not torch.zeros(2, { device = "cpu" }).is_cuda, "an explicit device still wins")
  end)
  torch.set_default_device(nil)
  if not ok then error(err, 0) end
  T.ok(not torch.zeros(2).is_cuda, "nil: the CPU again")
end)

T.run("the small-block cache hands a freed block back on its stream", function()
  local s = torch.cuda.Stream()
  local a = torch.ones(1000, { device = dev })
  local p = a:data_ptr()
  a = nil
  collectgarbage()   -- freed on the default stream
  -- (another stream may get the same address from CUDA's pool, which reuses
  -- a block whose free has completed: that is not the cache)
  local b
  torch.cuda.stream(s, function() b = torch.zeros(1000, { device = dev }) end)
  local c = torch.zeros(1000, { device = dev })
  T.ok(c:data_ptr() == p, "the same stream gets the freed block back")
  T.is(c:sum():item(), 0, "and it holds what was written, not the old ones")
  torch.cuda.stream(s, function()
    b = nil
    collectgarbage()   -- freed on s, into the cache
  end)
  s = nil
  collectgarbage()   -- s destroyed: its cached block goes back to the pool first
  local s2 = torch.cuda.Stream()
  local d
  torch.cuda.stream(s2, function() d = torch.full({ 1000 }, 2, { device = dev }) end)
  torch.cuda.current_stream():wait_stream(s2)
  T.is(d:sum():item(), 2000, "a new stream after one destroyed with a cached block")
  torch.cuda.empty_cache()
  local e = torch.ones(1000, { device = dev })
  T.is(e:sum():item(), 1000, "allocation works after empty_cache gave the cached blocks back")
end)

---------------------------------------------------------------- errors found by kernels

T.run("a bad class index is raised at the next synchronisation", function()
  local logits = torch.randn(4, 3):to(dev)
  local target = torch.tensor({ 0, 5, 1, 2 }, { dtype = torch.int64 }):to(dev)
  local loss
  T.lives(function() loss = F.cross_entropy(logits, target) end, "the call itself does not wait for the GPU")
  T.raises(function() return loss:item() end, "target 5 is out of bounds", "loss:item() raises it, naming the target")
  local ok = pcall(function() return F.cross_entropy(logits, target:clamp(0, 2)):item() end)
  T.ok(ok, "the error is raised once: the next good step works")
  -- the same from a head that the loss's launch takes over a cluster of
  -- blocks (the MLP's 256 x 128 -> 10), the bad row in its last block
  local hx, hw = torch.randn(256, 128):to(dev), torch.randn(10, 128):to(dev)
  local ht = torch.randint(0, 10, { 256 })
  ht[250] = 12
  T.raises(function() return F.cross_entropy(F.linear(hx, hw), ht:to(dev)):item() end, "target 12 is out of bounds",
           "a head inside the loss's launch: the row's target named")
  T.ok(pcall(function() return F.cross_entropy(F.linear(hx, hw), ht:clamp(0, 9):to(dev)):item() end),
       "and the next good loss works")
  T.raises(function()
    local r = torch.randn(5, 2):to(dev):index_select(0, torch.tensor({ 1, 7 }, { dtype = torch.int64 }):to(dev))
    torch.cuda.synchronize()
    return r
  end, "index 7 is out of bounds", "index_select")
  T.raises(function()
    return torch.randn(3, 4):to(dev):gather(1, torch.tensor({ { 0, 4 } }, { dtype = torch.int64 }):to(dev)):sum():item()
  end, "index 4 is out of bounds", "gather")
end)

---------------------------------------------------------------- gather, scatter_add, bf16 steps

T.run("gather and its backward on the device equal the CPU", function()
  torch.manual_seed(5)
  local a = torch.randn(5, 6, { dtype = torch.float64 })
  local idx = torch.randint(0, 6, { 5, 4 })
  local function run(device)
    local x = a:detach():clone():to(device):requires_grad_()
    local y = x:gather(1, idx:to(device))
    local sq = (y * y):sum()
    sq:backward()
    return y:cpu(), x.grad:cpu()
  end
  local yc, gc = run("cpu")
  local yg, gg = run(dev)
  T.tensor_close(yg, yc, 1e-14, 1e-14, "gather values")
  T.tensor_close(gg, gc, 1e-12, 1e-12, "gather backward (scatter_add) values")
  local ints = torch.randint(0, 9, { 4, 5 })
  local rows = torch.tensor({ { 3, 0, 1 }, { 2, 2, 0 } }, { dtype = torch.int64 })
  T.is(table.concat(ints:to(dev):gather(0, rows:to(dev)):cpu():reshape(-1):tolist(), ","),
       table.concat(ints:gather(0, rows):reshape(-1):tolist(), ","), "gather of int64 values")
end)

T.run("bf16 SGD and Adam steps equal the CPU's", function()
  for _, make in ipairs({ function(ps) return optim.SGD(ps, { lr = 0.1, momentum = 0.9 }) end,
                          function(ps) return optim.Adam(ps, { lr = 0.01 }) end }) do
    local res = {}
    for _, device in ipairs({ "cpu", dev }) do
      torch.manual_seed(2)
      local m = nn.Linear(8, 4):to(torch.bfloat16):to(device)
      local o = make(m:parameters())
      local x = torch.randn(16, 8):bfloat16():to(device)
      for _ = 1, 3 do
        o:zero_grad()
        m(x):float():pow(2):mean():backward()
        o:step()
      end
      res[device] = flat_params(m)
    end
    local w = worst(res.cpu, res[dev], 0.1)
    T.ok(w < 3e-2, ("bf16 parameters after 3 steps, within a few bf16 roundings (worst %.2e)"):format(w))
  end
end)

T.run("random draws on the GPU are the CPU's numbers", function()
  for _, dt in ipairs({ torch.float32, torch.float64, torch.bfloat16 }) do
    torch.manual_seed(9)
    local c = torch.rand(1000, { dtype = dt })
    torch.manual_seed(9)
    local g = torch.rand(1000, { dtype = dt, device = dev })
    T.ok(g:cpu():eq(c):all():item(), "rand " .. dt.name .. ": bit-equal")
  end
  torch.manual_seed(10)
  local c = torch.randn(1000, { dtype = torch.float64 })
  local ci = torch.randint(-5, 7, { 500 })
  local after_c = torch.rand(4)
  torch.manual_seed(10)
  local g = torch.randn(1000, { dtype = torch.float64, device = dev })
  local gi = torch.randint(-5, 7, { 500 }, { device = dev })
  local after_g = torch.rand(4)
  T.tensor_close(g:cpu(), c, 1e-13, 1e-13, "randn float64: equal up to the last bits of log and cos")
  T.ok(gi:cpu():eq(ci):all():item(), "randint: equal")
  T.ok(after_g:eq(after_c):all():item(), "a GPU draw advances the stream as a CPU draw does")
end)

T.run("gradcheck on the GPU", function()
  torch.manual_seed(4)
  local x = torch.randn(4, 5, { dtype = torch.float64 }):to(dev):requires_grad_()
  local w = torch.randn(3, 5, { dtype = torch.float64 }):to(dev):requires_grad_()
  local t = torch.tensor({ 0, 2, 1, 2 }, { dtype = torch.int64 }):to(dev)
  T.ok(torch.autograd.gradcheck(function(a, b)
    return F.cross_entropy(torch.relu(F.linear(a, b)) + a:sum(1, true):tanh(), t)
  end, { x, w }), "linear, relu, tanh, sum, cross-entropy")
  T.ok(torch.autograd.gradcheck(function(a) return a:gather(1, torch.tensor({ { 0, 4 }, { 1, 1 }, { 3, 2 }, { 0, 0 } }, { dtype = torch.int64 }):to(dev)):exp() end, { x }),
       "gather")
end)

T.run("bf16 autocast on the GPU", function()
  torch.manual_seed(6)
  local m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)):to(dev)
  local x, y = torch.randn(32, 64):to(dev), torch.randint(0, 10, { 32 }):to(dev)
  local full = F.cross_entropy(m(x), y)
  local out
  local mixed = torch.autocast("cuda", { dtype = torch.bfloat16 }, function()
    out = m(x)
    return F.cross_entropy(out, y)
  end)
  T.ok(out.dtype == torch.bfloat16 and mixed.dtype == torch.float32, "bf16 activations, a float32 loss")
  T.close(mixed:item(), full:item(), 2e-2, 0, "the autocast loss is within bf16 tolerance of float32")
  mixed:backward()
  T.ok(m[0].weight.grad.dtype == torch.float32, "gradients reach the float32 weights in float32")
end)

T.done_testing()
