-- dplua.utils.progress: a progress bar for training loops.
--
--   local ProgressBar = require("dplua.utils.progress").ProgressBar
--   local bar = ProgressBar(total_steps, {desc = "train"})
--   for step = 1, total_steps do
--     ...
--     bar:update(step, {loss = loss})     -- a number or a one-element tensor
--   end
--   bar:close()
--
-- On a terminal it is one line, redrawn in place (at most ten times a
-- second, and at the last step):
--
--   train  120/1000 [###.........................]  12% | 35.2 it/s | ETA 0:25 | loss 0.4321
--
-- When stdout is not a terminal (a log file, a pipe, a sweep trial) it
-- prints a plain line every `every` steps and at the last step, and
-- flushes it, so that logs show progress while the run goes on:
--
--   train step 120/1000 (12%)  35.2 steps/s  ETA 25s  loss 0.4321
--
-- Under torch.distributed only rank 0 prints. Options: every (steps
-- between plain lines; default a twentieth of total, or 100 without a
-- total), desc (a label), width (of the bar, 30), out (a file, default
-- io.stdout), tty (force terminal mode on or off), clock (a function
-- returning seconds, for tests), start (the step counting starts from, 0).
local report = require("dplua.report")
local C = require("dplua").C

local M = {}

-- Seconds on the monotonic clock.
function M.clock() return C.dp_clock_monotonic() end

-- Whether stdout is a terminal.
function M.stdout_is_tty() return C.dp_is_terminal(1) == 1 end

local format = string.format

-- 25 -> "25s", 95 -> "1:35", 3725 -> "1:02:05" (plain lines: "25s" style
-- under a minute, as in the terminal).
local function duration(s)
  if s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s < 60 then return format("%ds", s) end
  local h, m = math.floor(s / 3600), math.floor(s / 60) % 60
  if h > 0 then return format("%d:%02d:%02d", h, m, s % 60) end
  return format("%d:%02d", m, s % 60)
end
M.duration = duration

local function number(v)
  if type(v) ~= "number" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 1e9 then return format("%d", v) end
  return format("%.4g", v)
end

-- "loss 0.4321 | lr 0.001": loss first, the rest sorted.
local function metrics_text(info, sep)
  if not info then return "" end
  local keys = {}
  for k in pairs(info) do if k ~= "loss" then keys[#keys + 1] = k end end
  table.sort(keys)
  if info.loss ~= nil then table.insert(keys, 1, "loss") end
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. " " .. number(info[k]) end
  return table.concat(parts, sep)
end

local ProgressBar = {}
ProgressBar.__index = ProgressBar

function M.ProgressBar(total, opts)
  opts = opts or {}
  if total ~= nil and (type(total) ~= "number" or total < 0) then
    error("ProgressBar: total must be a number of steps >= 0 (or nil when unknown), got " .. tostring(total), 2)
  end
  if total == 0 then total = nil end
  local out = opts.out or io.stdout
  local tty = opts.tty
  if tty == nil then tty = out == io.stdout and M.stdout_is_tty() end
  local every = opts.every or (total and math.max(1, math.floor(total / 20))) or 100
  if type(every) ~= "number" or every < 1 then
    error("ProgressBar: every must be a number of steps >= 1, got " .. tostring(opts.every), 2)
  end
  local clock = opts.clock or M.clock
  local self = setmetatable({
    total = total, out = out, tty = tty, every = math.floor(every), clock = clock,
    desc = opts.desc, width = opts.width or 30, start = opts.start or 0,
    t0 = clock(), last_draw = -math.huge, step = opts.start or 0, closed = false, drawn = false,
  }, ProgressBar)
  return self
end

-- Steps per second since the bar was made, and the seconds left.
function ProgressBar:rate(now)
  local dt = now - self.t0
  local done = self.step - self.start
  local rate = (dt > 0 and done > 0) and done / dt or nil
  local eta = (rate and self.total) and math.max(self.total - self.step, 0) / rate or nil
  return rate, eta
end

function ProgressBar:tty_line(now)
  local rate, eta = self:rate(now)
  local parts = {}
  local head = self.desc and (self.desc .. " ") or ""
  if self.total then
    local w = #tostring(self.total)
    local frac = math.min(self.step / self.total, 1)
    local fill = math.floor(frac * self.width + 0.5)
    head = head .. format("%" .. w .. "d/%d [%s%s] %3d%%", self.step, self.total, string.rep("#", fill),
                          string.rep(".", self.width - fill), math.floor(frac * 100))
  else
    head = head .. format("%d", self.step)
  end
  parts[1] = head
  parts[#parts + 1] = rate and format("%.1f it/s", rate) or "- it/s"
  if self.total then parts[#parts + 1] = "ETA " .. (eta and duration(eta) or "?") end
  local m = metrics_text(self.info, " | ")
  if m ~= "" then parts[#parts + 1] = m end
  return table.concat(parts, " | ")
end

function ProgressBar:plain_line(now)
  local rate, eta = self:rate(now)
  local s = (self.desc and (self.desc .. " ") or "") .. "step " .. self.step
  if self.total then
    s = s .. format("/%d (%d%%)", self.total, math.floor(math.min(self.step / self.total, 1) * 100))
  end
  s = s .. (rate and format("  %.1f steps/s", rate) or "")
  if self.total and eta then s = s .. "  ETA " .. duration(eta) end
  local m = metrics_text(self.info, "  ")
  if m ~= "" then s = s .. "  " .. m end
  return s
end

-- Records that `step` steps are done (info: the latest metrics to show)
-- and redraws or prints when it is time to.
function ProgressBar:update(step, info)
  if type(step) ~= "number" then error("ProgressBar:update: step must be a number, got " .. type(step), 2) end
  self.step = step
  if info then
    local plain = {}
    for k, v in pairs(info) do plain[k] = report.plain_value(v, k, "ProgressBar:update") end
    self.info = plain
  end
  local last = self.total and step >= self.total
  if self.tty then
    local now = self.clock()
    if last or now - self.last_draw >= 0.1 then
      self.last_draw = now
      if report.is_rank0() then
        self.out:write("\r", self:tty_line(now), "\27[K")
        self.out:flush()
        self.drawn = true
      end
    end
  elseif (step % self.every == 0 or last) and step ~= self.printed then
    self.printed = step
    if report.is_rank0() then
      self.out:write(self:plain_line(self.clock()), "\n")
      self.out:flush()
    end
  end
  if last then self:close() end
end

-- Ends the bar: on a terminal, draws it once more and moves to the next
-- line. Safe to call twice.
function ProgressBar:close()
  if self.closed then return end
  self.closed = true
  if self.tty and report.is_rank0() then
    self.out:write("\r", self:tty_line(self.clock()), "\27[K\n")
    self.out:flush()
  end
end

M.ProgressBar_class = ProgressBar

return M
