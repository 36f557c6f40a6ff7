-- dplua.utils.metrics: a metrics logger that writes JSON lines.
--
--   local MetricsLogger = require("dplua.utils.metrics").MetricsLogger
--   local log = MetricsLogger("run/metrics.jsonl")
--   log:log{step = step, loss = loss, lr = scheduler:get_last_lr()[1], acc = acc}
--   log:close()
--
-- Each call writes one line, flushed at once, so that a crash loses nothing
-- and `dplua plot run/metrics.jsonl -o loss.svg` can draw a run that is
-- still going:
--
--   {"step":100,"time":12.48,"wall_time":1718000000.123,"loss":0.4321,"lr":0.001,"acc":0.85}
--
-- `time` is the seconds since the logger was made, `wall_time` the seconds
-- since 1970; the caller's fields follow (step, loss and lr first, the rest
-- sorted). Values are numbers, strings, booleans or one-element tensors.
-- Under torch.distributed only rank 0 writes (the file is not even
-- created on other ranks). Options: append (keep what the file holds;
-- default false, start it afresh), clock (a function returning seconds,
-- for tests).
local json = require("dplua.json")
local report = require("dplua.report")

local M = {}

local MetricsLogger = {}
MetricsLogger.__index = MetricsLogger

local order = { "step", "time", "wall_time", "epoch", "loss", "lr" }

function M.MetricsLogger(path, opts)
  opts = opts or {}
  if type(path) ~= "string" or path == "" then
    error("MetricsLogger: expected a file path, got " .. tostring(path), 2)
  end
  local clock = opts.clock or require("dplua.utils.progress").clock
  local self = setmetatable({ path = path, clock = clock, t0 = clock(), lines = 0 }, MetricsLogger)
  if report.is_rank0() then
    local f, err = io.open(path, opts.append and "a" or "w")
    if not f then error("MetricsLogger: cannot open " .. tostring(err), 2) end
    self.file = f
  end
  return self
end

-- Writes one line: time, wall_time and the given metrics.
function MetricsLogger:log(metrics)
  local line = report.plain_metrics(metrics, "MetricsLogger:log", "log:log{step = 1, loss = 0.5}")
  if self.closed then error("MetricsLogger:log: the logger of " .. self.path .. " is closed", 2) end
  if line.time == nil then line.time = math.floor((self.clock() - self.t0) * 1e6 + 0.5) / 1e6 end
  if line.wall_time == nil then line.wall_time = report.wall_time() end
  self.lines = self.lines + 1
  if self.file then
    self.file:write(json.encode(line, { order = order }), "\n")
    self.file:flush()
  end
end

-- Closes the file. Safe to call twice.
function MetricsLogger:close()
  if self.closed then return end
  self.closed = true
  if self.file then self.file:close() end
  self.file = nil
end

return M
