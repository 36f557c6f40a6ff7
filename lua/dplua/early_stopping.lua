-- dplua.early_stopping: which trials of a sweep stop before their end.
-- The sweep driver (dplua/sweep.lua) feeds every line a trial reports to
-- its scheduler, which answers "stop" when the trial should be pruned.
-- Pure logic, no processes: tests drive it with known learning curves.
--
-- A sweep file names one in `scheduler`: "asha" or "median" with the
-- defaults, or a table { "asha", time_attr = "epoch", ... }.
--
-- "asha": asynchronous successive halving (Li et al., "A System for
-- Massively Parallel Hyperparameter Tuning", 2020), with one bracket as
-- Ray Tune's ASHAScheduler. Rungs sit at time_attr = grace_period *
-- reduction_factor^k (k = 0, 1, ...; up to max_t when given). The first
-- report of a trial at or past a rung records its metric there (only the
-- highest rung that report reaches); the trial stops when that value is
-- worse than the (1 - 1/reduction_factor) quantile (linear interpolation,
-- as numpy's percentile) of the values other trials recorded at that rung
-- before it. The first trial at a rung always goes on.
--
-- "median": the median stopping rule (Golovin et al., "Google Vizier",
-- 2017) in its simplest form: at each report with time_attr >= grace_period,
-- the trial stops when its metric is worse than the median of the other
-- trials' metrics at that time (each one's latest report at or before it,
-- counting only trials that have reached it), once at least
-- min_samples_required other trials have.
local M = {}

local format, floor = string.format, math.floor

local defaults = {
  asha = { time_attr = "epoch", grace_period = 1, reduction_factor = 3 },
  median = { time_attr = "epoch", grace_period = 1, min_samples_required = 3 },
}
local allowed = {
  asha = { time_attr = true, grace_period = true, reduction_factor = true, max_t = true },
  median = { time_attr = true, grace_period = true, min_samples_required = true },
}

-- better(a, b): whether metric value a is strictly better than b.
local function comparator(mode)
  if mode == "max" then return function(a, b) return a > b end end
  return function(a, b) return a < b end
end

-- The q-quantile (0..1) of a list of numbers, interpolated linearly
-- between the sorted values (numpy.percentile's default).
function M.quantile(values, q)
  local v = {}
  for i, x in ipairs(values) do v[i] = x end
  table.sort(v)
  local pos = q * (#v - 1) + 1
  local lo = floor(pos)
  if lo >= #v then return v[#v] end
  return v[lo] + (v[lo + 1] - v[lo]) * (pos - lo)
end

-- The time and metric of one report line, or nil when it lacks either.
local function point(self, line)
  local t, m = line[self.time_attr], line[self.metric]
  if type(t) ~= "number" or type(m) ~= "number" or m ~= m then return nil end
  return t, m
end

---------------------------------------------------------------- ASHA

local Asha = {}
Asha.__index = Asha

-- The index (0-based) of the highest rung that time t reaches (rungs past
-- max_t do not count), or nil.
function Asha:rung_of(t)
  if t < self.grace_period then return nil end
  local k, limit = 0, math.min(t, self.max_t or math.huge)
  while self.grace_period * self.reduction_factor ^ (k + 1) <= limit do k = k + 1 end
  return k
end

function Asha:report(trial, line)
  local t, m = point(self, line)
  if not t then return "continue" end
  local k = self:rung_of(t)
  if k == nil then return "continue" end
  local rung = self.rungs[k]
  if not rung then rung = { values = {}, seen = {} }; self.rungs[k] = rung end
  if rung.seen[trial] then return "continue" end
  local verdict = "continue"
  if #rung.values > 0 then
    local q = 1 - 1 / self.reduction_factor
    -- the quantile of the "better" side: for min, the 1/rf lowest go on
    local cutoff = M.quantile(rung.values, self.mode == "max" and q or 1 - q)
    if self.better(cutoff, m) then verdict = "stop" end
  end
  rung.seen[trial] = true
  rung.values[#rung.values + 1] = m
  return verdict, self.grace_period * self.reduction_factor ^ k
end

---------------------------------------------------------------- median

local Median = {}
Median.__index = Median

-- trial's metric at time t: its latest report at or before t, provided
-- it has reported at t or later; else nil.
local function value_at(curve, t)
  if #curve == 0 or curve[#curve].t < t then return nil end
  local v
  for _, p in ipairs(curve) do
    if p.t <= t then v = p.m else break end
  end
  return v
end

function Median:report(trial, line)
  local t, m = point(self, line)
  if not t then return "continue" end
  local curve = self.curves[trial]
  if not curve then curve = {}; self.curves[trial] = curve; self.order[#self.order + 1] = trial end
  curve[#curve + 1] = { t = t, m = m }
  if t < self.grace_period then return "continue" end
  local others = {}
  for _, id in ipairs(self.order) do
    if id ~= trial then
      local v = value_at(self.curves[id], t)
      if v then others[#others + 1] = v end
    end
  end
  if #others < self.min_samples_required then return "continue" end
  if self.better(M.quantile(others, 0.5), m) then return "stop", t end
  return "continue"
end

---------------------------------------------------------------- construction

-- Checks a sweep file's `scheduler` value; returns it as a table
-- {name=, options...} with the defaults filled in, or raises (through
-- fail(message)) saying what was wrong.
function M.check(spec, fail)
  if spec == nil then return nil end
  local name, opts = spec, {}
  if type(spec) == "table" then
    name = spec[1] or spec.name
    for k, v in pairs(spec) do
      if k ~= 1 and k ~= "name" then opts[k] = v end
    end
  end
  if name ~= "asha" and name ~= "median" then
    fail(format("'scheduler' must be \"asha\" or \"median\" (or a table {\"asha\", time_attr = ..., ...}), got %s",
                type(name) == "string" and ('"' .. name .. '"') or tostring(name)))
  end
  for k in pairs(opts) do
    if not allowed[name][k] then
      local known = {}
      for o in pairs(allowed[name]) do known[#known + 1] = o end
      table.sort(known)
      fail(format("scheduler %s: unknown option '%s' (known: %s)", name, tostring(k), table.concat(known, ", ")))
    end
  end
  local out = { name = name }
  for k, v in pairs(defaults[name]) do out[k] = v end
  for k, v in pairs(opts) do out[k] = v end
  if type(out.time_attr) ~= "string" or out.time_attr == "" then
    fail(format("scheduler %s: time_attr must name a reported field, such as \"epoch\" or \"step\"", name))
  end
  if type(out.grace_period) ~= "number" or out.grace_period <= 0 then
    fail(format("scheduler %s: grace_period must be a number > 0", name))
  end
  if name == "asha" then
    if type(out.reduction_factor) ~= "number" or out.reduction_factor <= 1 then
      fail("scheduler asha: reduction_factor must be a number > 1")
    end
    if out.max_t ~= nil and (type(out.max_t) ~= "number" or out.max_t < out.grace_period) then
      fail("scheduler asha: max_t must be a number >= grace_period")
    end
  else
    local n = out.min_samples_required
    if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
      fail("scheduler median: min_samples_required must be an integer >= 1")
    end
  end
  return out
end

-- A scheduler for a checked spec, ranking by `metric` in `mode` ("min" or
-- "max"). :report(trial_id, report_line) returns "continue", or "stop"
-- and the time at which the trial was judged.
function M.new(spec, metric, mode)
  local self = { metric = metric, mode = mode, better = comparator(mode) }
  for k, v in pairs(spec) do self[k] = v end
  if spec.name == "asha" then
    self.rungs = {}
    return setmetatable(self, Asha)
  end
  self.curves, self.order = {}, {}
  return setmetatable(self, Median)
end

return M
