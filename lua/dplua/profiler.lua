-- torch.profiler: where a program's host time goes, op by op, as PyTorch's.
--
--   local prof = torch.profiler.profile({ record_shapes = true }, function()
--     torch.profiler.record_function("step", function() train_step() end)
--   end)
--   print(prof:key_averages():table({ sort_by = "self_cpu_time_total", row_limit = 10 }))
--   prof:export_chrome_trace("trace.json")     -- chrome://tracing, Perfetto
--
-- While a profile records, every Tensor method, torch.* and
-- nn.functional function, arithmetic operator, module call ("nn.Module:
-- Linear"), optimizer step ("Optimizer.step#Adam.step") and, inside a
-- backward, every node's backward function ("MulBackward0") is an event
-- with its start, its whole time and its self time (without the events it
-- called). The functions are wrapped while a profile records and restored
-- after: outside one they cost nothing. Times are the host's (dp_clock);
-- on a GPU an op's time is its launch, and ProfilerActivity.CUDA adds the
-- kernels' own times from torch.cuda.profile_kernels as a second table.
local ffi = require("ffi")
local torch = require("dplua")
local json = require("dplua.json")
local C = torch.C
local raise, is_tensor = torch._raise, torch.is_tensor

local M = {}
M.ProfilerActivity = { CPU = "CPU", CUDA = "CUDA" }
M.ProfilerAction = { NONE = "NONE", WARMUP = "WARMUP", RECORD = "RECORD", RECORD_AND_SAVE = "RECORD_AND_SAVE" }
local A = M.ProfilerAction

local clock = C.dp_clock_monotonic

---------------------------------------------------------------- recording

-- The profile being recorded (nil outside one), the depth of the event
-- open now, and per depth the time of the finished children of the event
-- open at the depth above.
local rec, depth, child = nil, 0, { [1] = 0 }
local shapes_of   -- set while record_shapes

local names_buf = ffi.new("const char *[256]")
local starts_buf, secs_buf = ffi.new("double[256]"), ffi.new("double[256]")

-- Adds the backward nodes timed since the last call as events at depth d,
-- and returns their total time.
local function take_backward_nodes(p, d)
  local total = 0
  while true do
    local n = C.dp_backward_times(names_buf, starts_buf, secs_buf, 256)
    for k = 0, n - 1 do
      local i = p.n + 1
      p.n = i
      p.name[i], p.depth[i], p.starts[i] = ffi.string(names_buf[k]), d, starts_buf[k]
      p.dur[i], p.self[i] = secs_buf[k], secs_buf[k]
      total = total + secs_buf[k]
    end
    if n < 256 then return total end
  end
end

local function open(name, ...)
  local p = rec
  local i = p.n + 1
  p.n = i
  depth = depth + 1
  child[depth + 1] = 0
  p.name[i], p.depth[i] = name, depth
  if shapes_of then p.shapes[i] = shapes_of(...) end
  p.starts[i] = clock()
  return i, depth
end

-- Closes event i, opened at depth d, and passes fn's results on. After an
-- error inside, the next close further out puts the depth right again.
local function close(i, d, ...)
  local p = rec
  if p then
    local now = clock()
    local nodes = take_backward_nodes(p, d + 1)
    local dur = now - p.starts[i]
    p.dur[i] = dur
    p.self[i] = dur - child[d + 1] - nodes
    child[d] = (child[d] or 0) + dur
  end
  depth = d - 1
  return ...
end

local function wrapper(name, fn)
  return function(...)
    if not rec then return fn(...) end
    local i, d = open(name, ...)
    return close(i, d, fn(...))
  end
end

local size = torch._methods.size   -- as it is before wrapping
local function input_shapes(...)
  local parts = {}
  for k = 1, select("#", ...) do
    local v = select(k, ...)
    parts[k] = is_tensor(v) and "[" .. table.concat(size(v), ", ") .. "]" or "[]"
  end
  return "[" .. table.concat(parts, ", ") .. "]"
end

---------------------------------------------------------------- what is wrapped

-- Context managers and functions that run the caller's code, which would
-- only nest the program in an event of their own.
-- So are the questions about a tensor that launch nothing (PyTorch
-- records none of them either).
local not_ops = {
  no_grad = true, enable_grad = true, inference_mode = true, set_grad_enabled = true, autocast = true,
  is_tensor = true, is_grad_enabled = true, get_default_dtype = true, compile = true,
  size = true, dim = true, ndimension = true, numel = true, nelement = true, stride = true, element_size = true,
  is_floating_point = true, is_complex = true, is_contiguous = true, is_signed = true, get_device = true,
  data_ptr = true, storage_offset = true, type = true, is_pinned = true, is_inference = true,
}

local installed   -- list of { table, key, original }

local function wrap_functions(tbl, prefix)
  local keys = {}
  for k, v in pairs(tbl) do
    if type(k) == "string" and type(v) == "function" and k:sub(1, 1) ~= "_" and not not_ops[k] then keys[#keys + 1] = k end
  end
  for _, k in ipairs(keys) do
    installed[#installed + 1] = { tbl, k, tbl[k] }
    tbl[k] = wrapper(prefix .. k, tbl[k])
  end
end

-- an optimizer's step and zero_grad as PyTorch names them, by the class of
-- the optimizer they run on
local function wrap_optimizer_method(cls, method)
  local fn = rawget(cls, method)
  if type(fn) ~= "function" then return end
  installed[#installed + 1] = { cls, method, fn }
  cls[method] = function(self, ...)
    if not rec then return fn(self, ...) end
    local i, d = open("Optimizer." .. method .. "#" .. tostring(self.__name) .. "." .. method, ...)
    return close(i, d, fn(self, ...))
  end
end

local function install()
  torch._load_ops()
  installed = {}
  wrap_functions(torch._methods, "")
  wrap_functions(torch, "")
  wrap_functions(torch.nn.functional, "")
  wrap_functions(torch._operators, "")
  local Optimizer = torch.optim.Optimizer
  for _, method in ipairs({ "step", "zero_grad" }) do
    wrap_optimizer_method(Optimizer, method)
    for _, cls in pairs(torch.optim) do
      if type(cls) == "table" and cls ~= Optimizer and rawget(cls, method) then wrap_optimizer_method(cls, method) end
    end
  end
  torch.nn.Module._observe_calls(function(call, m, ...)
    if not rec then return call(m, ...) end
    local i, d = open("nn.Module: " .. m:_get_name(), ...)
    return close(i, d, call(m, ...))
  end)
  C.dp_set_backward_timing(1)
end

local function uninstall()
  for k = #installed, 1, -1 do
    local e = installed[k]
    e[1][e[2]] = e[3]
  end
  installed = nil
  torch.nn.Module._observe_calls(nil)
  C.dp_set_backward_timing(0)
end

---------------------------------------------------------------- events and their averages

local function format_time(us)
  if us >= 1e6 then return string.format("%.3fs", us / 1e6) end
  if us >= 1e3 then return string.format("%.3fms", us / 1e3) end
  return string.format("%.3fus", us)
end

local Averages = {}
Averages.__index = Averages

-- table({sort_by = "cpu_time_total", row_limit = 100}): PyTorch's table of
-- the averages, largest first by sort_by (any field of a row)
function Averages:table(opts)
  opts = opts or {}
  local sort_by, limit = opts.sort_by or "cpu_time_total", opts.row_limit or 100
  local rows = {}
  for k, r in ipairs(self) do rows[k] = r end
  if #rows > 0 and rows[1][sort_by] == nil then
    raise("key_averages:table: unknown sort_by '" .. tostring(sort_by) .. "' (self_cpu_time_total, cpu_time_total, "
          .. "cpu_time, count)")
  end
  table.sort(rows, function(a, b)
    if a[sort_by] ~= b[sort_by] then return a[sort_by] > b[sort_by] end
    return a.key < b.key
  end)
  if limit >= 0 and #rows > limit then for k = #rows, limit + 1, -1 do rows[k] = nil end end
  local self_total = 0
  for _, r in ipairs(self) do self_total = self_total + r.self_cpu_time_total end
  local shapes = self.group_by_input_shape
  local width = 4
  for _, r in ipairs(rows) do width = math.max(width, math.min(#r.key, 55)) end
  local cols = { "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls" }
  if shapes then cols[#cols + 1] = "Input Shapes" end
  local function line(cells)
    local out = { string.format("%" .. width .. "s", cells[1]) }
    for k = 2, #cells do out[k] = string.format(k == 8 and "%-s" or "%12s", cells[k]) end
    return table.concat(out, "  ") .. "  "
  end
  local rule_cells = { string.rep("-", width) }
  for k = 1, #cols do rule_cells[k + 1] = string.rep("-", k == 7 and 30 or 12) end
  local rule = line(rule_cells)
  local head = { "Name" }
  for k, c in ipairs(cols) do head[k + 1] = c end
  local out = { rule, line(head), rule }
  local function pct(x) return string.format("%.2f%%", self_total > 0 and 100 * x / self_total or 0) end
  for _, r in ipairs(rows) do
    local name = #r.key > 55 and r.key:sub(1, 52) .. "..." or r.key
    local cells = { name, pct(r.self_cpu_time_total), format_time(r.self_cpu_time_total), pct(r.cpu_time_total),
                    format_time(r.cpu_time_total), format_time(r.cpu_time), tostring(r.count) }
    if shapes then cells[8] = r.input_shapes or "" end
    out[#out + 1] = line(cells)
  end
  out[#out + 1] = rule
  out[#out + 1] = "Self CPU time total: " .. format_time(self_total)
  return table.concat(out, "\n")
end
Averages.__tostring = function(self) return self:table() end

local Profile = {}
Profile.__index = Profile

-- events(): the recorded events in the order they started, each {name =,
-- start_us = (from the profile's start), cpu_time_total =, self_cpu_time_total
-- = (µs), depth = (1 outermost), input_shapes = (with record_shapes)}
function Profile:events()
  local order = {}
  for i = 1, self.n do if self.dur[i] then order[#order + 1] = i end end
  table.sort(order, function(a, b)
    if self.starts[a] ~= self.starts[b] then return self.starts[a] < self.starts[b] end
    return self.depth[a] < self.depth[b]
  end)
  local list = {}
  for k, i in ipairs(order) do
    list[k] = { name = self.name[i], start_us = 1e6 * (self.starts[i] - self.t0), cpu_time_total = 1e6 * self.dur[i],
                self_cpu_time_total = 1e6 * self.self[i], depth = self.depth[i], input_shapes = self.shapes[i] }
  end
  return list
end

-- key_averages([group_by_input_shape]): one row per name (and per input
-- shapes), {key =, count =, cpu_time_total =, self_cpu_time_total =,
-- cpu_time = (the mean), input_shapes =}, in µs; :table() prints them
function Profile:key_averages(group_by_input_shape)
  local by, rows = {}, setmetatable({ group_by_input_shape = group_by_input_shape or nil }, Averages)
  for i = 1, self.n do
    if self.dur[i] then
      local shapes = group_by_input_shape and self.shapes[i] or nil
      local key = shapes and self.name[i] .. "\0" .. shapes or self.name[i]
      local r = by[key]
      if not r then
        r = { key = self.name[i], count = 0, cpu_time_total = 0, self_cpu_time_total = 0, input_shapes = shapes }
        by[key] = r
        rows[#rows + 1] = r
      end
      r.count = r.count + 1
      r.cpu_time_total = r.cpu_time_total + 1e6 * self.dur[i]
      r.self_cpu_time_total = r.self_cpu_time_total + 1e6 * self.self[i]
    end
  end
  for _, r in ipairs(rows) do r.cpu_time = r.cpu_time_total / r.count end
  return rows
end

-- export_chrome_trace(path): the events as the Trace Event Format's
-- complete events (chrome://tracing, Perfetto, TensorBoard's profiler)
function Profile:export_chrome_trace(path)
  if type(path) ~= "string" then raise("export_chrome_trace: expected a file path, got " .. type(path)) end
  local pid = torch._pid
  local events = {}
  for k, e in ipairs(self:events()) do
    events[k] = { ph = "X", cat = e.name:find("Backward%d*$") and "backward" or "cpu_op", name = e.name, pid = pid,
                  tid = 0, ts = self.t0_wall_us + e.start_us, dur = e.cpu_time_total,
                  args = e.input_shapes and { ["Input Dims"] = e.input_shapes } or nil }
  end
  local f, err = io.open(path, "w")
  if not f then raise("export_chrome_trace: cannot write " .. path .. ": " .. tostring(err)) end
  f:write(json.encode({ traceEvents = json.array(events), displayTimeUnit = "ms" }))
  f:close()
end

-- kernels(): with ProfilerActivity.CUDA, the GPU kernels' profile of the
-- recorded steps (torch.cuda.profile_kernels'), else nil
function Profile:kernels() return self.kernel_profile end

Profile.__tostring = function(self)
  local s = self:key_averages():table()
  if self.kernel_profile then s = s .. "\n\n" .. self.kernel_profile:table(30) end
  return s
end

---------------------------------------------------------------- the profiler's life

local function reset_events(p)
  p.n, p.name, p.starts, p.dur, p.self, p.depth, p.shapes = 0, {}, {}, {}, {}, {}, {}
  p.t0 = clock()
  p.t0_wall_us = 1e6 * C.dp_clock_wall()
end

local function start_recording(p)
  if rec then raise("profiler: a profile is already recording (profiles do not nest)") end
  reset_events(p)
  install()
  rec, depth, child = p, 0, { [1] = 0 }
  shapes_of = p.record_shapes and input_shapes or nil
  if p.cuda then
    local ok, err = pcall(torch.cuda._profile_start, "profiler.profile")
    if not ok then
      rec = nil
      uninstall()
      error(err, 0)
    end
  end
end

local function stop_recording(p)
  rec, shapes_of = nil, nil
  uninstall()
  if p.cuda then p.kernel_profile = torch.cuda._profile_stop() end
end

-- The step marker: an event "ProfilerStep#N" around each step recorded
local function open_step(p)
  if p.step_event then return end
  p.step_event = { open("ProfilerStep#" .. p.step_num) }
end
local function close_step(p)
  if not p.step_event then return end
  close(p.step_event[1], p.step_event[2])
  p.step_event = nil
end

local function recording(action) return action == A.WARMUP or action == A.RECORD or action == A.RECORD_AND_SAVE end

function Profile:start()
  if self.started then raise("profiler: start() called twice") end
  self.started = true
  self.step_num = 0
  self.action = self.schedule(0)
  if recording(self.action) then
    start_recording(self)
    if self.schedule_given then open_step(self) end
  end
  return self
end

local function finish_cycle(self)
  close_step(self)
  stop_recording(self)
  if self.on_trace_ready then self.on_trace_ready(self) end
end

-- step(): the end of a training step; with a schedule it moves the
-- profiler on (warm-up, record, hand the trace to on_trace_ready)
function Profile:step()
  if not self.started then raise("profiler: step() before start()") end
  local prev = self.action
  self.step_num = self.step_num + 1
  local action = self.schedule(self.step_num)
  self.action = action
  if prev == A.RECORD_AND_SAVE or (recording(prev) and not recording(action)) then
    if prev == A.WARMUP then
      close_step(self)
      stop_recording(self)
    else
      finish_cycle(self)
    end
    if recording(action) then start_recording(self) end
  elseif prev == A.WARMUP and action ~= A.WARMUP then
    -- the warm-up's events are dropped
    close_step(self)
    reset_events(self)
    depth, child = 0, { [1] = 0 }
  elseif not recording(prev) and recording(action) then
    start_recording(self)
  else
    close_step(self)
  end
  if recording(action) then open_step(self) end
end

function Profile:stop()
  if not self.started then raise("profiler: stop() before start()") end
  self.started = false
  if self.action == A.RECORD or self.action == A.RECORD_AND_SAVE then
    finish_cycle(self)
  elseif self.action == A.WARMUP then
    close_step(self)
    stop_recording(self)
    reset_events(self)
  end
end

local function check_opts(opts)
  for k in pairs(opts) do
    if not ({ activities = true, schedule = true, on_trace_ready = true, record_shapes = true, profile_memory = true,
              with_stack = true, with_flops = true, with_modules = true })[k] then
      raise("profiler.profile: unknown option '" .. tostring(k) .. "' (activities, schedule, on_trace_ready, "
            .. "record_shapes)")
    end
  end
end

-- profile([opts] [, fn, ...]): opts {activities = {ProfilerActivity.CPU,
-- ProfilerActivity.CUDA}, schedule = profiler.schedule{...}, on_trace_ready
-- = function(prof), record_shapes = false}. With fn, runs fn(...) while
-- recording and returns the profile, then fn's results; without, returns
-- the profile to start(), step() and stop() by hand.
function M.profile(opts, fn, ...)
  if type(opts) == "function" then return M.profile({}, opts, fn, ...) end
  opts = opts or {}
  if type(opts) ~= "table" then raise("profiler.profile: expected an options table, got " .. type(opts)) end
  check_opts(opts)
  local cuda = false
  for _, a in ipairs(opts.activities or {}) do
    if a == M.ProfilerActivity.CUDA then cuda = true
    elseif a ~= M.ProfilerActivity.CPU then raise("profiler.profile: unknown activity " .. tostring(a)) end
  end
  if cuda and not torch.cuda.is_available() then
    raise("profiler.profile: ProfilerActivity.CUDA needs a CUDA device, and none is available")
  end
  if opts.schedule ~= nil and type(opts.schedule) ~= "function" then
    raise("profiler.profile: expected schedule to be a function of the step number (profiler.schedule{...})")
  end
  if opts.on_trace_ready ~= nil and type(opts.on_trace_ready) ~= "function" then
    raise("profiler.profile: expected on_trace_ready to be a function of the profile")
  end
  local p = setmetatable({ cuda = cuda, record_shapes = opts.record_shapes and true or false,
                           schedule = opts.schedule or function() return A.RECORD end,
                           schedule_given = opts.schedule ~= nil, on_trace_ready = opts.on_trace_ready }, Profile)
  reset_events(p)
  if fn == nil then return p end
  if type(fn) ~= "function" then raise("profiler.profile: expected a function to profile, got " .. type(fn)) end
  p:start()
  return p, torch._finally(function() if p.started then p:stop() end end, nil, pcall(fn, ...))
end

-- record_function(name, fn, ...): fn(...) as one event named name (inside
-- a profile; outside one fn simply runs); returns fn's results
function M.record_function(name, fn, ...)
  if type(name) ~= "string" then raise("record_function: expected a name string, got " .. type(name)) end
  if type(fn) ~= "function" then raise("record_function: expected a function to run, got " .. type(fn)) end
  if not rec then return fn(...) end
  local i, d = open(name)
  return close(i, d, fn(...))
end

-- schedule{wait =, warmup =, active =, ["repeat"] = 0, skip_first = 0}:
-- PyTorch's: after skip_first steps, cycles of wait steps not recorded,
-- warmup steps recorded and dropped, active steps recorded (the last one
-- hands the trace to on_trace_ready), repeat cycles (0: forever)
function M.schedule(opts)
  if type(opts) ~= "table" then raise("profiler.schedule: expected {wait =, warmup =, active =}, got " .. type(opts)) end
  local wait, warmup, active = opts.wait or 0, opts.warmup or 0, opts.active or 0
  local rep, skip = opts["repeat"] or 0, opts.skip_first or 0
  for name, v in pairs({ wait = wait, warmup = warmup, active = active, ["repeat"] = rep, skip_first = skip }) do
    if type(v) ~= "number" or v < 0 or v % 1 ~= 0 then
      raise(string.format("profiler.schedule: %s must be an integer >= 0, got %s", name, tostring(v)))
    end
  end
  if active < 1 then raise("profiler.schedule: active must be at least 1") end
  local cycle = wait + warmup + active
  return function(step)
    if step < skip then return A.NONE end
    step = step - skip
    if rep > 0 and step / cycle >= rep then return A.NONE end
    local at = step % cycle
    if at < wait then return A.NONE end
    if at < wait + warmup then return A.WARMUP end
    return at < cycle - 1 and A.RECORD or A.RECORD_AND_SAVE
  end
end

-- tensorboard_trace_handler(dir [, worker_name]): an on_trace_ready that
-- writes each trace to dir/<worker>.<ms>.pt.trace.json, which TensorBoard's
-- profiler plugin reads; worker defaults to <host>_<pid>
function M.tensorboard_trace_handler(dir, worker_name)
  if type(dir) ~= "string" then raise("tensorboard_trace_handler: expected a directory, got " .. type(dir)) end
  if worker_name == nil then
    worker_name = torch._host_name .. "_" .. torch._pid
  end
  return function(prof)
    os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'")
    prof:export_chrome_trace(string.format("%s/%s.%d.pt.trace.json", dir, worker_name,
                                           math.floor(1000 * C.dp_clock_wall())))
  end
end

return M
