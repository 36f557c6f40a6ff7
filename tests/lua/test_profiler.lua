-- test_profiler.lua: torch.profiler. The schedule's actions and the table's
-- columns against PyTorch's (tests/ref/profiler.lua, written by
-- scripts/gen_profiler_ref.py); which calls become events and how they
-- nest (self time = whole time - children's), backward nodes, module
-- calls and optimizer steps, steps handed to on_trace_ready, the Chrome
-- trace, the functions put back after a profile, and bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local json = require("dplua.json")
local P = torch.profiler
local nn = torch.nn
local ref = dofile(here .. "/../ref/profiler.lua")

-- the events named name
local function named(prof, name)
  local list = {}
  for _, e in ipairs(prof:events()) do if e.name == name then list[#list + 1] = e end end
  return list
end
local function row(avgs, key)
  for _, r in ipairs(avgs) do if r.key == key then return r end end
end

for _, name in ipairs(T.sorted_keys(ref.schedules)) do
  local c = ref.schedules[name]
  T.run("schedule " .. name .. " acts as PyTorch's", function()
    local fn = P.schedule(c.options)
    local got = {}
    for step = 0, #c.actions - 1 do got[#got + 1] = fn(step) end
    T.is(got, c.actions, "the actions of steps 0-" .. (#c.actions - 1))
  end)
end

T.run("events nest: ops inside record_function ranges, self time without the children", function()
  local x = torch.ones(4, 5)
  local prof, a, b = P.profile(function()
    return P.record_function("outer", function()
      local y = P.record_function("inner", function() return x:add(1) end)
      return y * 2, "second"
    end)
  end)
  T.is(b, "second", "profile returns fn's results after the profile")
  T.is(a:sum():item(), 80, "and they are right")
  local outer, inner, add, mul = named(prof, "outer")[1], named(prof, "inner")[1], named(prof, "add")[1], named(prof, "mul")[1]
  T.ok(outer and inner and add and mul, "the two ranges, the method and the operator are events")
  T.is({ outer.depth, inner.depth, add.depth, mul.depth }, { 1, 2, 3, 2 }, "depths")
  T.ok(outer.start_us <= inner.start_us and inner.start_us <= add.start_us, "in the order they started")
  T.ok(inner.cpu_time_total >= add.cpu_time_total and outer.cpu_time_total >= inner.cpu_time_total + mul.cpu_time_total,
       "a range lasts at least as long as what it called")
  T.ok(math.abs(inner.self_cpu_time_total - (inner.cpu_time_total - add.cpu_time_total)) < 1e-6,
       "self time is the whole time less the children's")
  T.ok(add.self_cpu_time_total == add.cpu_time_total and add.cpu_time_total > 0, "a leaf's self time is its time")
  local avg = prof:key_averages()
  T.is(row(avg, "add").count, 1, "key_averages: one row per name, with its count")
  local total = 0
  for _, r in ipairs(avg) do total = total + r.self_cpu_time_total end
  T.ok(math.abs(total - outer.cpu_time_total) < 1e-6, "the self times add up to the outermost range's time")
end)

T.run("a training step: module calls, backward nodes, the optimizer, the table", function()
  torch.manual_seed(0)
  local model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
  local opt = torch.optim.SGD(model:parameters(), { lr = 0.1 })
  local x, y = torch.randn(4, 6), torch.randint(0, 3, { 4 })
  local function step()
    opt:zero_grad()
    local loss = nn.functional.cross_entropy(model(x), y)
    loss:backward()
    opt:step()
  end
  local prof = P.profile({ record_shapes = true }, function() for _ = 1, 3 do step() end end)
  local avg = prof:key_averages()
  T.is(row(avg, "nn.Module: Sequential").count, 3, "module calls")
  T.is(row(avg, "nn.Module: Tanh").count, 3, "each module")
  T.is(row(avg, "Optimizer.step#SGD.step").count, 3, "optimizer steps, as PyTorch names them")
  T.is(row(avg, "Optimizer.zero_grad#SGD.zero_grad").count, 3, "and zero_grad")
  T.is(row(avg, "TanhBackward0").count, 3, "backward nodes, by their grad_fn names")
  local bw, node = named(prof, "backward")[1], named(prof, "TanhBackward0")[1]
  T.ok(node.depth == bw.depth + 1 and node.start_us >= bw.start_us
       and node.start_us + node.cpu_time_total <= bw.start_us + bw.cpu_time_total + 1e-3, "inside the backward's event")
  T.is(named(prof, "nn.Module: Linear")[1].input_shapes, "[[4, 6]]", "record_shapes: the tensors' shapes")
  local linears = {}
  for _, r in ipairs(prof:key_averages(true)) do
    if r.key == "nn.Module: Linear" then linears[#linears + 1] = r.input_shapes .. " x" .. r.count end
  end
  table.sort(linears)
  T.is(linears, { "[[4, 5]] x3", "[[4, 6]] x3" }, "grouped by input shapes: the two Linears' calls apart")
  local tbl = prof:key_averages():table({ sort_by = "self_cpu_time_total", row_limit = 4 })
  local lines = {}
  for l in tbl:gmatch("[^\n]+") do lines[#lines + 1] = l end
  local header = {}
  for c in (lines[2] .. "  "):gmatch("%s*(.-)  ") do if c ~= "" then header[#header + 1] = c end end
  T.is(header, ref.columns, "the table's columns are PyTorch's")
  T.is(#lines, 3 + 4 + 2, "row_limit rows between the rules, then the total")
  T.ok(lines[#lines]:find("^Self CPU time total: [%d.]+[mu]?s$") ~= nil, "the total line", lines[#lines])
  local self1 = lines[4]:match("%s([%d.]+[mu]?s)%s")
  T.ok(self1 ~= nil, "rows print times with units", lines[4])
  T.raises(function() prof:key_averages():table({ sort_by = "nope" }) end, "unknown sort_by 'nope'", "a bad sort_by")
end)

T.run("after a profile every function is itself again, also after an error", function()
  local add, cat, linear, mul = torch._methods.add, torch.cat, nn.functional.linear, torch._operators.mul
  local step = torch.optim.Optimizer.step
  P.profile(function() torch.ones(2):add(1) end)
  T.ok(torch._methods.add == add and torch.cat == cat and nn.functional.linear == linear
       and torch._operators.mul == mul and torch.optim.Optimizer.step == step, "restored")
  T.raises(function() P.profile(function() torch.ones(2):add(torch.ones(3)) end) end, "add", "an error goes on")
  T.ok(torch._methods.add == add, "restored after the error")
  local again = P.profile(function() torch.ones(2):mul(3) end)
  T.is(#named(again, "mul"), 1, "and the next profile records")
end)

T.run("start, step and stop with a schedule: the recorded steps reach on_trace_ready", function()
  local traces = {}
  local prof = P.profile({ schedule = P.schedule({ wait = 1, warmup = 1, active = 2 }),
                           on_trace_ready = function(p) traces[#traces + 1] = p:events() end })
  prof:start()
  for s = 0, 7 do
    P.record_function("work" .. s, function() torch.ones(3):add(s) end)
    prof:step()
  end
  prof:stop()
  T.is(#traces, 2, "one trace per cycle of wait, warmup and two active steps")
  local function names(events, prefix)
    local out = {}
    for _, e in ipairs(events) do if e.name:find(prefix) then out[#out + 1] = e.name end end
    return out
  end
  T.is(names(traces[1], "^work"), { "work2", "work3" }, "the active steps only (the warm-up's are dropped)")
  T.is(names(traces[1], "^ProfilerStep"), { "ProfilerStep#2", "ProfilerStep#3" }, "each inside its step's event")
  T.is(names(traces[2], "^work"), { "work6", "work7" }, "the second cycle")
  T.ok(torch._methods.add ~= nil and P.record_function("plain", function() return 5 end) == 5,
       "outside a profile record_function just runs")
end)

T.run("the Chrome trace and TensorBoard's files", function()
  local dir = T.temp_dir("profiler")
  local prof = P.profile(function() P.record_function("r", function() return torch.ones(2) * 3 end) end)
  prof:export_chrome_trace(dir .. "/t.json")
  local trace = json.decode(T.read_file(dir .. "/t.json"))
  local by = {}
  for _, e in ipairs(trace.traceEvents) do by[e.name] = e end
  T.ok(by.r and by.mul and by.r.ph == "X" and by.mul.ts >= by.r.ts and by.mul.dur <= by.r.dur,
       "complete events with start and duration in µs, nested in time")
  local handler = P.tensorboard_trace_handler(dir .. "/tb", "worker0")
  P.profile({ on_trace_ready = handler }, function() torch.ones(2):add(1) end)
  local listing = io.popen("ls " .. T.sh_quote(dir .. "/tb")):read("*a")
  T.ok(listing:find("^worker0%.%d+%.pt%.trace%.json\n$") ~= nil, "tensorboard_trace_handler writes <worker>.<ms>.pt.trace.json", listing)
end)

T.run("bad input", function()
  T.raises(function() P.profile({ activities = { "TPU" } }, function() end) end, "unknown activity TPU", "activity")
  T.raises(function() P.profile({ record_shape = true }, function() end) end, "unknown option 'record_shape'", "option")
  T.raises(function() P.profile(function() P.profile(function() end) end) end, "do not nest", "nested profiles")
  T.lives(function() P.profile(function() end) end, "a profile after the failed nesting")
  T.raises(function() P.schedule({ wait = 1, warmup = 0, active = 0 }) end, "active must be at least 1", "active 0")
  T.raises(function() P.schedule({ wait = -1, active = 1 }) end, "wait must be an integer >= 0", "negative wait")
  T.raises(function() P.record_function(3, function() end) end, "expected a name string", "record_function's name")
  if not torch.cuda.is_available() then
    T.raises(function() P.profile({ activities = { P.ProfilerActivity.CUDA } }, function() end) end,
             "ProfilerActivity.CUDA needs a CUDA device", "CUDA without a device")
  end
  local p = P.profile({})
  T.raises(function() p:step() end, "step%(%) before start%(%)", "step before start")
end)

T.done_testing()
