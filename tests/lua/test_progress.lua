-- test_progress.lua: dplua.utils.progress (ProgressBar, plain lines when
-- stdout is not a terminal, the redrawn line when it is) and
-- dplua.utils.metrics (MetricsLogger's JSONL), with a fake clock.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local progress = require("dplua.utils.progress")
local metrics = require("dplua.utils.metrics")
local json = require("dplua.json")

-- An output stream that keeps what is written.
local function sink()
  local s = { text = {} }
  function s:write(...) for _, x in ipairs({ ... }) do self.text[#self.text + 1] = tostring(x) end end
  function s:flush() self.flushed = (self.flushed or 0) + 1 end
  function s:lines()
    local out = {}
    for line in (table.concat(self.text)):gmatch("([^\n]*)\n") do out[#out + 1] = line end
    return out
  end
  return s
end

-- A clock that the test moves by hand.
local function fake_clock()
  local c = { t = 100 }
  return c, function() return c.t end
end

T.run("plain lines every N steps", function()
  local out = sink()
  local c, clock = fake_clock()
  local bar = progress.ProgressBar(100, { every = 25, out = out, tty = false, clock = clock })
  for step = 1, 100 do
    c.t = c.t + 0.5     -- 2 steps per second
    bar:update(step, { loss = 1 / step, lr = 0.001 })
  end
  local lines = out:lines()
  T.is(#lines, 4, "one line every 25 steps")
  T.is(lines[1], "step 25/100 (25%)  2.0 steps/s  ETA 38s  loss 0.04  lr 0.001", "the line at step 25")
  T.is(lines[3], "step 75/100 (75%)  2.0 steps/s  ETA 13s  loss 0.01333  lr 0.001", "the line at step 75")
  T.is(lines[4], "step 100/100 (100%)  2.0 steps/s  ETA 0s  loss 0.01  lr 0.001", "the last line")
  T.ok((out.flushed or 0) >= 4, "each plain line is flushed")
  T.ok(not table.concat(out.text):find("\r"), "no carriage returns off a terminal")
end)

T.run("the last step prints even off the period; defaults", function()
  local out = sink()
  local c, clock = fake_clock()
  local bar = progress.ProgressBar(10, { every = 4, out = out, tty = false, clock = clock, desc = "epoch 1" })
  for step = 1, 10 do c.t = c.t + 0.1; bar:update(step) end
  local lines = out:lines()
  T.is(#lines, 3, "steps 4, 8 and 10")
  T.ok(lines[3]:find("^epoch 1 step 10/10 %(100%%%)  10%.0 steps/s") ~= nil, "desc and rate", tostring(lines[3]))
  local b2 = progress.ProgressBar(1000, { out = sink(), tty = false })
  T.is(b2.every, 50, "every defaults to a twentieth of the total")
  local b3 = progress.ProgressBar(nil, { out = sink(), tty = false })
  T.is(b3.every, 100, "without a total, every 100 steps")
end)

T.run("no total, tensor metrics, ETA of hours", function()
  local out = sink()
  local c, clock = fake_clock()
  local bar = progress.ProgressBar(nil, { every = 2, out = out, tty = false, clock = clock })
  c.t = c.t + 1
  bar:update(2, { loss = torch.tensor(0.25) })
  T.is(out:lines()[1], "step 2  2.0 steps/s  loss 0.25", "a line without a total; a tensor loss is shown as its number")
  T.is(progress.duration(3725), "1:02:05", "hours")
  T.is(progress.duration(95), "1:35", "minutes")
  T.raises(function() bar:update(4, { loss = torch.ones(3) }) end, "tensor of 3 elements", "a tensor of several elements is refused")
end)

T.run("terminal mode redraws one line", function()
  local out = sink()
  local c, clock = fake_clock()
  local bar = progress.ProgressBar(4, { out = out, tty = true, clock = clock, width = 8 })
  for step = 1, 4 do c.t = c.t + 1; bar:update(step, { loss = 2 / step }) end
  bar:close()
  local text = table.concat(out.text)
  local _, newlines = text:gsub("\n", "")
  T.is(newlines, 1, "one newline, at the end")
  T.ok(text:find("\r1/4 %[##%.%.%.%.%.%.%]  25%% | 1%.0 it/s | ETA 3s | loss 2\27%[K") ~= nil,
       "the first draw", (text:sub(1, 80):gsub("\27", "ESC")))
  T.ok(text:find("\r4/4 %[########%] 100%% | 1%.0 it/s | ETA 0s | loss 0%.5\27%[K\n$") ~= nil,
       "the last draw ends the line", (text:gsub("\27", "ESC")))
  bar:close()
  T.is(#table.concat(out.text), #text, "close twice writes nothing more")
end)

T.run("terminal mode redraws at most ten times a second", function()
  local out = sink()
  local c, clock = fake_clock()
  local bar = progress.ProgressBar(1000, { out = out, tty = true, clock = clock })
  for step = 1, 1000 do c.t = c.t + 0.001; bar:update(step) end
  local _, draws = table.concat(out.text):gsub("\r", "")
  T.ok(draws >= 10 and draws <= 13, "about ten draws in one second of steps (got " .. draws .. ")")
end)

T.run("only rank 0 prints", function()
  local saved = package.loaded["dplua.distributed"]
  package.loaded["dplua.distributed"] = { is_initialized = function() return true end,
                                          get_rank = function() return 1 end }
  local out = sink()
  local bar = progress.ProgressBar(2, { every = 1, out = out, tty = false })
  bar:update(1); bar:update(2)
  package.loaded["dplua.distributed"] = { is_initialized = function() return true end,
                                          get_rank = function() return 0 end }
  local out0 = sink()
  local bar0 = progress.ProgressBar(2, { every = 1, out = out0, tty = false })
  bar0:update(1); bar0:update(2)
  package.loaded["dplua.distributed"] = saved
  T.is(#out.text, 0, "rank 1 prints nothing")
  T.is(#out0:lines(), 2, "rank 0 prints")
end)

---------------------------------------------------------------- MetricsLogger

local tmp = os.tmpname()

T.run("MetricsLogger writes JSON lines", function()
  local wall_before = os.time()
  local c, clock = fake_clock()
  local log = metrics.MetricsLogger(tmp, { clock = clock })
  for step = 1, 3 do
    c.t = c.t + 0.5
    log:log{ step = step, loss = 1 / step, lr = 0.1 * step, acc = torch.tensor(0.5 + step / 10), note = "x" }
  end
  -- readable while the logger is still open: every line is flushed
  local lines, bad = json.read_lines(tmp)
  T.is(#lines, 3, "three lines, readable before close")
  T.is(#bad, 0, "all of them JSON")
  log:close()
  log:close()
  local wall_after = os.time()
  local l2 = lines[2]
  T.is(l2.step, 2, "step")
  T.close(l2.time, 1.0, 0, 1e-9, "time: seconds since the logger was made")
  -- os.time() counts whole seconds, wall_time their fractions too
  T.ok(type(l2.wall_time) == "number" and l2.wall_time >= wall_before and l2.wall_time < wall_after + 1,
       "wall_time: seconds since 1970, taken when the line was written", tostring(l2.wall_time))
  T.is(l2.loss, 0.5, "loss")
  T.close(l2.lr, 0.2, 1e-12, 0, "lr")
  T.close(l2.acc, 0.7, 1e-6, 0, "a tensor metric is written as its number")
  T.is(l2.note, "x", "a string metric")
  local f = io.open(tmp)
  local first = f:read("*l")
  f:close()
  T.ok(first:find('^{"step":1,"time":0.5,"wall_time":[%d.]+,"loss":1,"lr":0.1,"acc":0.6') ~= nil,
       "step, time, wall_time, loss and lr come first", first)
  T.raises(function() log:log{ loss = 1 } end, "closed", "logging after close is an error")
  T.raises(function() metrics.MetricsLogger(tmp, { clock = clock }):log{ loss = {} } end,
           "metric 'loss' is a table", "a table value is refused")
end)

T.run("MetricsLogger append and truncate", function()
  local log = metrics.MetricsLogger(tmp, { append = true })
  log:log{ step = 9 }
  log:close()
  local lines = json.read_lines(tmp)
  T.is(#lines, 1, "the previous test's logger truncated the file; append keeps it")
  local log2 = metrics.MetricsLogger(tmp, { append = true })
  log2:log{ step = 10 }
  log2:close()
  T.is(#json.read_lines(tmp), 2, "append adds")
  T.raises(function() metrics.MetricsLogger("/nonexistent-dir/x.jsonl") end, "cannot open", "an unwritable path is an error")
end)

os.remove(tmp)
T.done_testing()
