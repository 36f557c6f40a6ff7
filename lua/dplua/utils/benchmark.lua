-- dplua.utils.benchmark: torch.utils.benchmark's Timer and Measurement,
-- for timing a statement the way PyTorch users do:
--
--   local Timer = torch.utils.benchmark.Timer
--   local t = Timer({ stmt = function() y = x:matmul(w) end, label = "matmul" })
--   print(t:blocked_autorange({ min_run_time = 0.5 }))   -- median, IQR, runs
--
-- stmt and setup are functions, or Lua source run with `globals` as its
-- environment (PyTorch's strings of Python become strings of Lua). With a
-- GPU the device is synchronised before and after each timed block, so a
-- block's time includes its kernels.
local torch = require("dplua")
local raise = torch._raise
local clock = torch.C.dp_clock_monotonic

local M = {}

---------------------------------------------------------------- Measurement

local Measurement = {}
Measurement.__index = Measurement
M.Measurement = Measurement

-- The k-th of the sorted times at fraction q, interpolated as NumPy's percentile.
local function quantile(sorted, q)
  local pos = (#sorted - 1) * q + 1
  local lo = math.floor(pos)
  local hi = math.min(lo + 1, #sorted)
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo)
end

-- A Measurement of number_per_run statements a run (raw_times: each
-- run's seconds; times: per statement), with its labels.
local function measurement(number_per_run, raw_times, opts)
  local times = {}
  for i, t in ipairs(raw_times) do times[i] = t / number_per_run end
  local sorted = { unpack(times) }
  table.sort(sorted)
  local sum = 0
  for _, t in ipairs(times) do sum = sum + t end
  local m = setmetatable({ number_per_run = number_per_run, raw_times = raw_times, times = times,
                           mean = sum / #times, median = quantile(sorted, 0.5),
                           iqr = quantile(sorted, 0.75) - quantile(sorted, 0.25) }, Measurement)
  for _, k in ipairs({ "label", "sub_label", "description" }) do m[k] = opts and opts[k] end
  return m
end

-- A time in the unit that suits it, as PyTorch prints them
local function human(seconds)
  if seconds >= 1 then return string.format("%.2f s", seconds) end
  if seconds >= 1e-3 then return string.format("%.2f ms", seconds * 1e3) end
  if seconds >= 1e-6 then return string.format("%.2f us", seconds * 1e6) end
  return string.format("%.2f ns", seconds * 1e9)
end

Measurement.__tostring = function(m)
  local head = {}
  for _, k in ipairs({ "label", "sub_label", "description" }) do if m[k] then head[#head + 1] = m[k] end end
  local lines = { table.concat(head, ": ") }
  if #m.times > 1 then
    lines[#lines + 1] = string.format("  Median: %s", human(m.median))
    lines[#lines + 1] = string.format("  IQR:    %s (%s to %s)", human(m.iqr), human(m.median - m.iqr / 2),
                                      human(m.median + m.iqr / 2))
  else
    lines[#lines + 1] = string.format("  %s", human(m.mean))
  end
  lines[#lines + 1] = string.format("  %d measurement%s, %d run%s per measurement", #m.times,
                                    #m.times == 1 and "" or "s", m.number_per_run, m.number_per_run == 1 and "" or "s")
  if head[1] == nil then table.remove(lines, 1) end
  return table.concat(lines, "\n")
end

---------------------------------------------------------------- Timer

local Timer = {}
Timer.__index = Timer

local function runnable(v, what, env)
  if v == nil then return function() end end
  if type(v) == "function" then return v end
  if type(v) == "string" then
    local f, err = loadstring(v, "=" .. what)
    if not f then raise("benchmark.Timer: " .. what .. " does not compile: " .. tostring(err)) end
    return setfenv(f, env)
  end
  raise(string.format("benchmark.Timer: expected %s to be a function or Lua source, got %s", what, type(v)))
end

-- Timer({stmt =, setup =, globals =, label =, sub_label =, description =}),
-- or Timer(stmt [, setup]).
function M.Timer(opts, setup)
  if type(opts) ~= "table" then opts = { stmt = opts, setup = setup } end
  local known = { stmt = true, setup = true, globals = true, label = true, sub_label = true, description = true,
                  num_threads = true }
  for k in pairs(opts) do
    if not known[k] then raise("benchmark.Timer: unknown option '" .. tostring(k) .. "'") end
  end
  if opts.globals ~= nil and type(opts.globals) ~= "table" then raise("benchmark.Timer: expected globals to be a table") end
  local env = setmetatable(opts.globals or {}, { __index = _G })
  env.torch = env.torch or torch
  return setmetatable({ stmt = runnable(opts.stmt, "stmt", env), setup = runnable(opts.setup, "setup", env),
                        labels = { label = opts.label, sub_label = opts.sub_label, description = opts.description } },
                      Timer)
end

local function synchronize()
  if torch.cuda.is_available() then torch.cuda.synchronize() end
end

-- seconds for number runs of stmt
local function block(self, number)
  local stmt = self.stmt
  synchronize()
  local t0 = clock()
  for _ = 1, number do stmt() end
  synchronize()
  return clock() - t0
end

local function count(v, what, default, min)
  v = v == nil and default or v
  if type(v) ~= "number" or v % 1 ~= 0 or v < min then
    raise(string.format("benchmark.Timer: expected %s to be an integer of at least %d, got %s", what, min, tostring(v)))
  end
  return v
end

-- timeit([number = 1000000]): one measurement of number runs (after setup)
function Timer:timeit(number)
  if type(number) == "table" then number = number.number end
  number = count(number, "number", 1000000, 1)
  self.setup()
  return measurement(number, { block(self, number) }, self.labels)
end

-- repeat_(repeat [, number]): repeat measurements of number runs each
function Timer:repeat_(rep, number)
  if type(rep) == "table" then rep, number = rep["repeat"], rep.number end
  rep, number = count(rep, "repeat", 5, 1), count(number, "number", 1000000, 1)
  self.setup()
  local raw = {}
  for i = 1, rep do raw[i] = block(self, number) end
  return measurement(number, raw, self.labels)
end

-- blocked_autorange([{min_run_time = 0.2}]): runs per block grown until a
-- block takes at least a hundredth of min_run_time (and 1 ms), then blocks
-- until min_run_time has passed: one time per block
function Timer:blocked_autorange(opts)
  local min_run_time = type(opts) == "table" and opts.min_run_time or opts or 0.2
  if type(min_run_time) ~= "number" or not (min_run_time > 0) then
    raise("benchmark.Timer: expected min_run_time to be a positive number of seconds, got " .. tostring(min_run_time))
  end
  self.setup()
  local number, target = 1, math.max(min_run_time / 100, 1e-3)
  while true do
    local t = block(self, number)
    if t >= target or number >= 2 ^ 30 then break end
    number = number * (t > 0 and math.min(10, math.max(2, math.ceil(target / t))) or 10)
  end
  local raw, total = {}, 0
  repeat
    local t = block(self, number)
    raw[#raw + 1] = t
    total = total + t
  until total >= min_run_time
  return measurement(number, raw, self.labels)
end
return M
