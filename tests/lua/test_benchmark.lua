--[[
test_benchmark.lua -- torch.utils.benchmark: Timer's timeit, repeat_ and
blocked_autorange run the statement as often as they say, setup once each,
and their Measurement's statistics follow from its raw times (nothing here
asserts how long anything takes); torch.jit's pass-through.

    ./dplua tests/lua/test_benchmark.lua
--]]
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local B = torch.utils.benchmark

T.run("timeit and repeat_: the statement's runs, setup once", function()
  local runs, setups = 0, 0
  local t = B.Timer({ stmt = function() runs = runs + 1 end, setup = function() setups = setups + 1 end, label = "count" })
  local m = t:timeit(7)
  T.is({ runs, setups }, { 7, 1 }, "timeit(7): seven runs, one setup")
  T.is({ #m.times, m.number_per_run }, { 1, 7 }, "one measurement of seven runs")
  T.close(m.times[1], m.raw_times[1] / 7, 1e-12, 0, "times are per run")
  runs = 0
  local r = t:repeat_({ ["repeat"] = 3, number = 4 })
  T.is({ runs, #r.raw_times }, { 12, 3 }, "repeat_ 3 x 4: twelve runs, three measurements")
  T.ok(tostring(r):find("count") and tostring(r):find("Median:") and tostring(r):find("3 measurements, 4 runs"),
       "printed with its label, median and counts")
end)

T.run("blocked_autorange: blocks until min_run_time", function()
  local x = torch.randn(32, 32)
  local m = B.Timer({ stmt = function() x:matmul(x) end }):blocked_autorange({ min_run_time = 0.02 })
  local total = 0
  for _, t in ipairs(m.raw_times) do total = total + t end
  T.ok(total >= 0.02, string.format("the blocks take at least min_run_time (%.3f s)", total))
  local sorted = { unpack(m.times) }
  table.sort(sorted)
  T.ok(m.median >= sorted[1] and m.median <= sorted[#sorted] and m.iqr >= 0, "median within the times, IQR >= 0")
  local sum = 0
  for _, t in ipairs(m.times) do sum = sum + t end
  T.close(m.mean, sum / #m.times, 1e-12, 0, "mean of the times")
end)

T.run("Lua source with globals; bad input", function()
  local g = { n = 0 }
  local t = B.Timer({ stmt = "n = n + step", setup = "step = 2", globals = g })
  t:timeit(5)
  T.is(g.n, 10, "the statement ran in globals: 5 runs adding the setup's step")
  T.is(B.Timer("local y = torch.ones(2):sum()"):timeit(3).number_per_run, 3, "Timer(stmt): a string statement")
  T.raises(function() B.Timer({ stmt = "n = = 1" }) end, "stmt does not compile", "a statement that does not compile")
  T.raises(function() B.Timer({ stmt = 5 }) end, "expected stmt to be a function or Lua source", "a number")
  T.raises(function() B.Timer({ stmt = function() end, bogus = 1 }) end, "unknown option 'bogus'", "an unknown option")
  T.raises(function() B.Timer(function() end):timeit(0) end, "number to be an integer of at least 1", "timeit(0)")
  T.raises(function() B.Timer(function() end):blocked_autorange({ min_run_time = -1 }) end,
           "min_run_time to be a positive number", "a negative min_run_time")
end)

T.run("torch.jit: what it is given, back", function()
  local f = function() return 1 end
  local m = torch.nn.Linear(2, 2)
  T.ok(torch.jit.script(f) == f and torch.jit.trace(m, torch.ones(1, 2)) == m and torch.jit.ignore(f) == f,
       "script, trace and the decorators return their argument")
  T.ok(torch.jit.is_scripting() == false, "is_scripting is false")
  T.raises(function() torch.jit.save(m, "/tmp/m.pt") end, "TorchScript archives are not supported", "jit.save says why")
  T.raises(function() torch.jit.script(nil) end, "expected a module or a function", "jit.script(nil)")
end)

T.done_testing()
