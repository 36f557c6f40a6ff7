-- test_autograd_memory.lua -- memory stays flat over long training loops
-- that never call collectgarbage().
--
-- 1. The seed model (Linear(10,10), relu, Linear(10,2); CrossEntropyLoss;
--    SGD lr=0.01; batch 32) trains for 10,000 steps of an ordinary loop.
-- 2. Wide activations: Linear(16,64), ReLU, Linear(64,2) on a batch of 4096,
--    120 steps. The seed loop allocates only ~2.8 KB of tensors a step
--    (~27 MiB over 10,000 steps), less than the point where tensor memory
--    pressure must force a collection, so the peak check bites here: each
--    step allocates several MiB (the 4096x64 activations alone are 1 MiB
--    each; ~2 MiB of them stay referenced until collected), ~0.5 GiB in all,
--    while the Lua heap grows only ~1 KiB a step, so Lua's own GC alone would
--    let hundreds of MiB of garbage pile up.
--
-- For each loop, after step FIRST and after the last step, at the same point
-- of the loop body, the test measures after a full collection (the
-- measurement collects, the loop does not), so that it counts what is still
-- referenced, not garbage awaiting the GC:
--   - torch.memory_allocated(), the CPU bytes held by live tensors: equal at
--     both points (nothing, saved tensors, graph nodes, grads, piles up);
--   - the Lua heap (collectgarbage("count")): it may move a little (interned
--     strings, JIT traces) but not grow with the steps: at most 256 KiB more.
-- And over each loop the allocator's peak (torch.C.dp_max_memory_allocated(-1),
-- the CPU's, which only grows, so loop 2 is measured as a new maximum) stays
-- below 64 MiB (the amount of new tensor bytes after which the bindings
-- collect) + 2 x the bytes a step holds at its fullest (measured after the
-- forward of step FIRST, after a full collection): garbage may wait for a
-- collection, but not pile up without bound.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
local dir = os.getenv("DPLUA_TEST_DIR") or (here .. "/..")
package.path = dir .. "/lua/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local nn, optim = torch.nn, torch.optim

local MiB = 1024 * 1024

local SimpleNN = require("models").SimpleNN

-- Live memory: tensor bytes and Lua heap KiB after a full collection (two
-- passes, so that what finalizers released is collected too).
local function live()
  collectgarbage("collect")
  collectgarbage("collect")
  return torch.memory_allocated(), collectgarbage("count")
end

local function peak_bytes() return tonumber(torch.C.dp_max_memory_allocated(-1)) end

-- An ordinary training loop; measures at step `first` and at the last step.
local function train(model, x, y, steps, first)
  local crit = nn.CrossEntropyLoss()
  local opt = optim.SGD(model:parameters(), {lr = 0.01})
  local m = {bytes = {}, heap = {}}
  local t0 = os.clock()
  for step = 1, steps do
    opt:zero_grad()
    local output = model(x)
    local loss = crit(output, y)
    if step == first then m.fullest = live() end
    loss:backward()
    opt:step()
    if step == 1 then m.first_loss = loss:item() end
    if step == first or step == steps then
      m.last_loss = loss:item()
      m.bytes[step], m.heap[step] = live()
    end
  end
  m.secs = os.clock() - t0
  m.peak = peak_bytes()
  return m
end

local function check(label, m, first, steps, peak_before)
  T.ok(m.last_loss < m.first_loss, label .. ": the model trains (loss falls)",
       ("loss %s at step 1, %s at step %d"):format(T.fmt(m.first_loss), T.fmt(m.last_loss), steps))
  T.ok(m.bytes[first] > 0, label .. ": memory_allocated() counts the live tensors",
       ("memory_allocated() = %s"):format(tostring(m.bytes[first])))
  T.is(m.bytes[steps], m.bytes[first],
       ("%s: tensor bytes in use after step %d equal those after step %d"):format(label, steps, first))
  T.ok(m.heap[steps] - m.heap[first] <= 256,
       ("%s: the Lua heap does not grow with the steps (<= 256 KiB from step %d to %d)"):format(label, first, steps),
       ("Lua heap %.1f KiB after step %d, %.1f KiB after step %d"):format(m.heap[first], first, m.heap[steps], steps))
  local bound = 64 * MiB + 2 * m.fullest
  T.ok(m.peak <= bound or m.peak == peak_before,
       label .. ": peak tensor bytes stay below 64 MiB + 2 x a step's fullest",
       ("peak %d bytes (%.1f MiB), bound %d (a step holds %d at its fullest)"):format(m.peak, m.peak / MiB, bound, m.fullest))
  T.diag(("%s: %d steps in %.2f s CPU; live %d bytes, %d at a step's fullest; peak %.2f MiB; Lua heap %.0f -> %.0f KiB")
         :format(label, steps, m.secs, m.bytes[first], m.fullest, m.peak / MiB, m.heap[first], m.heap[steps]))
end

T.run("seed model, 10,000 steps", function()
  torch.manual_seed(0)
  local x = torch.rand(32, 10)
  local y = torch.randint(0, 2, {32})
  local m = train(SimpleNN(), x, y, 10000, 100)
  check("seed", m, 100, 10000, -1)
end)

T.run("wide activations, 120 steps", function()
  torch.manual_seed(0)
  local model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
  local x = torch.rand(4096, 16)
  local y = x:select(1, 0):gt(0.5):long()     -- learnable: is the first feature > 0.5
  local before = peak_bytes()
  local m = train(model, x, y, 120, 20)
  -- dp_max_memory_allocated never resets: a peak that loop 2 did not raise
  -- is loop 1's, already checked
  check("wide", m, 20, 120, before)
end)

-- A graph never given to backward() is freed when its output is: a chain
-- of 200,000 adds (y = y + 1, each node's saved input holding the node
-- before it, the shape of a loop's `total = total + loss`) is freed by one
-- loop, not by a recursion as deep as the chain, which overflowed the C
-- stack (a segfault) past about 15,000.
T.run("a chain of 200,000 nodes freed without backward", function()
  local base = live()
  local x = torch.zeros(1, { requires_grad = true })
  local y = x
  for _ = 1, 200000 do y = y + 1 end
  T.is(y:item(), 200000, "the chain computed")
  local held = live()
  T.ok(held > base + 200000 * 4, "the chain holds its outputs", ("%d bytes more"):format(held - base))
  y = nil
  local left = live()
  T.ok(left < base + 64, "all of it freed but x", ("%d bytes more than before"):format(left - base))
end)

T.done_testing()
