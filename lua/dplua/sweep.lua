-- dplua.sweep: `dplua sweep SWEEP.lua`, the hyperparameter sweep driver.
--
-- SWEEP.lua returns a table (docs/SWEEPS.md has the whole story):
--
--   return {
--     script = "train.lua",                 -- relative to SWEEP.lua's folder
--     space = { lr = {1e-3, 3e-3}, batch_size = {64, 128} },
--     metric = "test_accuracy", mode = "max",
--     parallel = 2,
--   }
--
-- Every configuration of the space is a trial, run as its own process: the
-- same dplua program on the script, with its hyperparameters in
-- $DPLUA_HPARAMS (torch.hparams reads them), $DPLUA_REPORT_FILE for
-- torch.report, $DPLUA_TRIAL_ID, one GPU in $CUDA_VISIBLE_DEVICES when there
-- are GPUs, and stdout and stderr in a log file of its own. Up to `parallel`
-- trials run at once. Processes are started and reaped through the C API
-- (dp_process_spawn, dp_process_wait) in a polling loop (no threads, no
-- signal handlers). A trial that fails (exit status, signal, timeout) is
-- recorded, not fatal. Each finished trial appends one JSON line to the
-- results file; a rerun skips configurations that have a record there
-- already. At the end the driver prints every trial sorted by the metric,
-- and the best one. With a TensorBoard folder, the driver copies what each
-- trial reports into a TensorBoard run of its own as it comes, and the
-- trial's hyperparameters and last metrics when it ends. With a
-- `scheduler` (dplua/early_stopping.lua), the driver reads each trial's
-- reports as they come and stops the trials it prunes (SIGTERM); they are
-- recorded as "pruned" with their last metrics. With nproc_per_node = N
-- each trial is a launch of N ranks (`dplua --nproc_per_node=N`) on N GPUs
-- of its own.
local ffi = require("ffi")
local bit = require("bit")
local command = require("dplua.command")
local json = require("dplua.json")
local early_stopping = require("dplua.early_stopping")
local C = require("dplua").C

local M = {}

local format, concat = string.format, table.concat

---------------------------------------------------------------- processes

local SIGKILL, SIGTERM, SIGINT = 9, 15, 2
local KILL_GRACE = 5      -- seconds between SIGTERM and SIGKILL on a timeout
local POLL_S = 0.05       -- how often the driver looks at its children
local TB_POLL_S = 1       -- how often it copies new report lines to TensorBoard

local function last_error() return ffi.string(C.dp_last_error()) end

-- The dplua program to run trials with: $DPLUA_EXE, else this one (nil);
-- and the name it goes by in argv[0].
local function find_exe(args)
  local e = os.getenv("DPLUA_EXE")
  if e and e ~= "" then return e, e end
  return nil, args and args[-1] or "dplua"
end

-- A NULL-terminated char*[] of strings; the strings are kept alive in keep.
local function cstrings(list, keep)
  local arr = ffi.new("const char *[?]", #list + 1)
  for i, s in ipairs(list) do
    keep[#keep + 1] = s
    arr[i - 1] = s
  end
  keep[#keep + 1] = arr
  return arr
end

-- `set` (NAME -> value, or false to remove) as NAME=VALUE and NAME entries.
local function env_entries(set)
  local names, out = {}, {}
  for name in pairs(set) do names[#names + 1] = name end
  table.sort(names)
  for i, k in ipairs(names) do out[i] = set[k] and (k .. "=" .. tostring(set[k])) or k end
  return out
end

-- Starts exe (nil: this program) with argv, this process's environment
-- with `set` over it, stdin from /dev/null and stdout and stderr appended
-- to log. Returns the pid, or nil and why.
local pid_box = ffi.new("int[1]")
local function spawn(exe, argv, set, log)
  local keep = {}
  if C.dp_process_spawn(pid_box, exe, cstrings(argv, keep), cstrings(env_entries(set), keep), log, log) ~= 0 then
    return nil, last_error()
  end
  return pid_box[0]
end

-- Whether the child ended: nil while it runs, else a table {exit_code=}
-- or {signal=, signo=}, or {error=} when it cannot be waited for.
local exited, code, signo = ffi.new("int[1]"), ffi.new("int[1]"), ffi.new("int[1]")
local function reap(pid)
  if C.dp_process_wait(pid, 0, exited, code, signo) ~= 0 then return { error = last_error() } end
  if exited[0] == 0 then return nil end
  if code[0] >= 0 then return { exit_code = code[0] } end
  return { signal = ffi.string(C.dp_signal_name(signo[0])), signo = signo[0] }
end

local function kill(pid, sig) C.dp_process_kill(pid, sig) end

local wall_time = require("dplua.report").wall_time
local tpe = require("dplua.tpe")

---------------------------------------------------------------- the sweep table

local fields = {
  script = "the training script (relative to the sweep file's folder)",
  args = "arguments for the script: a list of strings with {name} for hparams, or a function(hparams)",
  space = "the search space: name = {values...} (grid), or distributions with method = \"random\" or \"tpe\"",
  method = "\"grid\" (default), \"random\" or \"tpe\" (each configuration chosen from the results so far)",
  samples = "how many configurations method = \"random\" draws (\"tpe\": how many trials in all)",
  seed = "the seed of method = \"random\" or \"tpe\" (default 0)",
  tpe = "method = \"tpe\"'s options: {startup = 10, gamma = 0.25, candidates = 24}",
  metric = "the reported metric that ranks trials",
  mode = "\"min\" (default) or \"max\": whether lower or higher is better",
  parallel = "how many trials run at once (default: the number of GPUs, or 1)",
  timeout = "seconds a trial may run before it is stopped (default: no limit)",
  results = "the results JSONL file (default: SWEEP.results.jsonl beside the sweep file)",
  logs = "the folder of per-trial logs (default: SWEEP.logs beside the sweep file)",
  env = "extra environment variables for every trial: {NAME = value}",
  name = "a name printed in the header",
  tensorboard = "a folder for TensorBoard event files: one run per trial, named by its hyperparameters",
  scheduler = "early stopping: \"asha\" or \"median\", or {\"asha\", time_attr=, grace_period=, reduction_factor=, max_t=}",
  nproc_per_node = "ranks per trial (default 1): each trial is a launch of that many processes, on as many GPUs",
}

-- Expected failures (a wrong sweep file, a bad option) carry their exit
-- status: 2 for the command line, 1 otherwise.
local sweep_error = command.fail
local function usage_error(msg) sweep_error(msg, 2) end

local function is_distribution(v)
  return type(v) == "table" and v[1] == nil and (v.uniform or v.log_uniform or v.int) ~= nil
end

local sorted_keys = json.sorted_keys

local function check_space(s)
  if type(s.space) ~= "table" or next(s.space) == nil then
    sweep_error("'space' must be a non-empty table of name = {values...}")
  end
  for _, k in ipairs(sorted_keys(s.space)) do
    local v = s.space[k]
    if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then
      sweep_error(format("space: %s is not a valid hyperparameter name (letters, digits, _)", tostring(k)))
    end
    if is_distribution(v) then
      if s.method == "grid" then
        sweep_error(format("space.%s is a distribution; it needs method = \"random\" (or \"tpe\") and samples = N", k))
      end
      local name, range = next(v)
      if next(v, name) ~= nil or type(range) ~= "table" or type(range[1]) ~= "number"
         or type(range[2]) ~= "number" or range[1] > range[2] then
        sweep_error(format("space.%s: a distribution is {uniform = {lo, hi}}, {log_uniform = {lo, hi}} or {int = {lo, hi}}", k))
      end
      if name == "log_uniform" and range[1] <= 0 then
        sweep_error(format("space.%s: log_uniform needs lo > 0", k))
      end
    elseif type(v) == "table" and #v == 0 then
      sweep_error(format("space.%s is an empty list of values", k))
    elseif type(v) == "function" or type(v) == "userdata" then
      sweep_error(format("space.%s is a %s; give a list of values", k, type(v)))
    end
  end
end

-- Checks the table a sweep file returned and fills in the defaults.
-- dir is the sweep file's folder; base its path without ".lua".
function M.check(s, dir, base)
  if type(s) ~= "table" then sweep_error("the sweep file must return a table, got " .. type(s)) end
  for k in pairs(s) do
    if not fields[k] then
      local names = sorted_keys(fields)
      sweep_error(format("unknown field '%s' in the sweep table (known: %s)", tostring(k), concat(names, ", ")))
    end
  end
  if type(s.script) ~= "string" or s.script == "" then sweep_error("'script' must name the training script") end
  s.method = s.method or "grid"
  if s.method ~= "grid" and s.method ~= "random" and s.method ~= "tpe" then
    sweep_error("'method' must be \"grid\", \"random\" or \"tpe\"")
  end
  if s.method ~= "grid" and (type(s.samples) ~= "number" or s.samples < 1 or s.samples % 1 ~= 0) then
    sweep_error(format("method = \"%s\" needs samples = N (how many configurations to %s)", s.method,
                       s.method == "tpe" and "try" or "draw"))
  end
  if s.tpe ~= nil then
    if s.method ~= "tpe" or type(s.tpe) ~= "table" then sweep_error("'tpe' is a table of options for method = \"tpe\"") end
    for k, v in pairs(s.tpe) do
      local good = (k == "startup" and type(v) == "number" and v >= 1 and v % 1 == 0)
                   or (k == "gamma" and type(v) == "number" and v > 0 and v < 1)
                   or (k == "candidates" and type(v) == "number" and v >= 1 and v % 1 == 0)
      if not good then
        sweep_error(format("tpe.%s: expected startup (an integer >= 1), gamma (in (0, 1)) or candidates (an integer >= 1)",
                           tostring(k)))
      end
    end
  end
  check_space(s)
  if type(s.metric) ~= "string" or s.metric == "" then sweep_error("'metric' must name a reported metric") end
  s.mode = s.mode or "min"
  if s.mode ~= "min" and s.mode ~= "max" then sweep_error("'mode' must be \"min\" or \"max\"") end
  if s.parallel ~= nil and (type(s.parallel) ~= "number" or s.parallel < 1) then
    sweep_error("'parallel' must be a number >= 1")
  end
  if s.timeout ~= nil and (type(s.timeout) ~= "number" or s.timeout <= 0) then
    sweep_error("'timeout' must be a number of seconds > 0")
  end
  if s.args ~= nil and type(s.args) ~= "table" and type(s.args) ~= "function" then
    sweep_error("'args' must be a list of strings or a function(hparams)")
  end
  if type(s.args) == "table" then
    for i, a in ipairs(s.args) do
      if type(a) ~= "string" and type(a) ~= "number" then sweep_error(format("args[%d] must be a string", i)) end
      for name in tostring(a):gmatch("{([%w_]+)}") do
        if s.space[name] == nil then
          sweep_error(format("args[%d] refers to {%s}, which is not in the space", i, name))
        end
      end
    end
  end
  if s.env ~= nil and type(s.env) ~= "table" then sweep_error("'env' must be a table of NAME = value") end
  s.scheduler = early_stopping.check(s.scheduler, sweep_error)
  s.nproc_per_node = s.nproc_per_node or 1
  if type(s.nproc_per_node) ~= "number" or s.nproc_per_node < 1 or s.nproc_per_node % 1 ~= 0 then
    sweep_error("'nproc_per_node' must be an integer >= 1 (ranks per trial)")
  end
  local function rel(p) return p:sub(1, 1) == "/" and p or (dir == "." and p or dir .. "/" .. p) end
  s.script_path = rel(s.script)
  s.results = s.results and rel(s.results) or base .. ".results.jsonl"
  s.logs = s.logs and rel(s.logs) or base .. ".logs"
  if s.tensorboard ~= nil then
    if type(s.tensorboard) ~= "string" or s.tensorboard == "" then sweep_error("'tensorboard' must name a folder") end
    s.tensorboard = rel(s.tensorboard)
  end
  return s
end

-- Loads and checks a sweep file.
function M.load(path)
  local chunk, err = loadfile(path)
  if not chunk then sweep_error(err) end
  local ok, s = pcall(chunk)
  if not ok then sweep_error(path .. ": " .. tostring(s)) end
  local dir = path:match("^(.*)/[^/]*$") or "."
  local base = path:gsub("%.lua$", "")
  return M.check(s, dir, base)
end

---------------------------------------------------------------- configurations

-- xorshift32: the same draws on every machine and LuaJIT build.
local function rng(seed)
  local s = bit.bxor(bit.tobit(seed), 0x2545F491)
  if s == 0 then s = 1 end
  local function next_u()
    s = bit.bxor(s, bit.lshift(s, 13))
    s = bit.bxor(s, bit.rshift(s, 17))
    s = bit.bxor(s, bit.lshift(s, 5))
    return (s % 4294967296) / 4294967296
  end
  for _ = 1, 8 do next_u() end
  return next_u
end

local function draw(v, u)
  if is_distribution(v) then
    local name, r = next(v)
    local lo, hi = r[1], r[2]
    if name == "uniform" then return lo + (hi - lo) * u() end
    if name == "log_uniform" then return math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * u()) end
    return lo + math.floor((hi - lo + 1) * u())
  end
  if type(v) == "table" then return v[math.floor(#v * u()) + 1] end
  return v
end

-- The list of configurations, in trial order: the grid with the first name
-- (sorted) varying slowest, or `samples` random draws. Duplicates are
-- dropped.
function M.configurations(s)
  local names = sorted_keys(s.space)
  local list = {}
  if s.method == "tpe" then return {} end   -- chosen as results come in (M.tpe_trial)
  if s.method == "grid" then
    local function walk(i, cur)
      if i > #names then
        local c = {}
        for k, v in pairs(cur) do c[k] = v end
        list[#list + 1] = c
        return
      end
      local v = s.space[names[i]]
      local values = (type(v) == "table" and #v > 0) and v or { v }
      for _, x in ipairs(values) do
        cur[names[i]] = x
        walk(i + 1, cur)
      end
      cur[names[i]] = nil
    end
    walk(1, {})
  else
    local u = rng(s.seed or 0)
    for _ = 1, s.samples do
      local c = {}
      for _, k in ipairs(names) do c[k] = draw(s.space[k], u) end
      list[#list + 1] = c
    end
  end
  local seen, out = {}, {}
  for _, c in ipairs(list) do
    local key = json.encode(c)
    if not seen[key] then
      seen[key] = true
      out[#out + 1] = { id = #out + 1, hparams = c, key = key }
    end
  end
  return out
end

-- method = "tpe": the trials of an earlier run of the sweep, from its
-- records, in trial order, with their numbers (a trial interrupted before
-- its record leaves a gap, which stays one: a number names a trial's logs)
function M.tpe_past(records)
  local list = {}
  for key, r in pairs(records) do list[#list + 1] = { id = tonumber(r.trial) or 0, hparams = r.hparams, key = key } end
  table.sort(list, function(a, b) return a.id < b.id end)
  return list
end

-- method = "tpe": the next trial, from what the finished trials reported
-- (the first `startup` drawn at random), or nil when the space has no
-- configuration left that has not been tried. Appended to configs.
function M.tpe_trial(s, configs, records)
  local names = sorted_keys(s.space)
  local o = s.tpe or {}
  local id = 1
  for _, t in ipairs(configs) do id = math.max(id, t.id + 1) end
  local u = rng((s.seed or 0) * 7919 + id)
  local history = {}
  for _, t in ipairs(configs) do
    local r = records[t.key]
    if r then
      local m = r.status == "ok" and type(r.metrics) == "table" and r.metrics[s.metric] or nil
      if type(m) == "number" and s.mode == "max" then m = -m end
      history[#history + 1] = { hparams = t.hparams, value = type(m) == "number" and m or nil }
    end
  end
  local seen = {}
  for _, t in ipairs(configs) do seen[t.key] = true end
  for attempt = 1, 20 do
    local c
    if #configs < (o.startup or 10) or attempt > 10 then c = tpe.random(s.space, names, u)
    else c = tpe.suggest(s.space, names, history, u, o) end
    local key = json.encode(c)
    if not seen[key] then
      local t = { id = id, hparams = c, key = key }
      configs[#configs + 1] = t
      return t
    end
  end
  return nil
end

local function show_value(v)
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 1e15 then return format("%d", v) end
    return format("%.4g", v)
  end
  if type(v) == "table" then return json.encode(v) end
  return tostring(v)
end

local function show_config(c, sep)
  local parts = {}
  for _, k in ipairs(sorted_keys(c)) do parts[#parts + 1] = k .. "=" .. show_value(c[k]) end
  return concat(parts, sep or " ")
end
M.show_config = show_config

-- The script's argument list for one configuration.
local function trial_args(s, hp)
  if type(s.args) == "function" then return s.args(hp) end
  local out = {}
  for i, a in ipairs(s.args or {}) do
    out[i] = tostring(a):gsub("{([%w_]+)}", function(name)
      local v = hp[name]
      if type(v) == "number" then return json.number(v) end
      if type(v) == "table" then return json.encode(v) end
      return tostring(v)
    end)
  end
  return out
end

---------------------------------------------------------------- results

local record_order = { "trial", "status", "hparams", "metrics", "pruned_at", "exit_code", "signal", "error",
                       "time", "started", "gpu", "log" }

-- The latest record of each configuration in the results file, by key.
local function read_results(path)
  local by_key = {}
  local f = io.open(path, "r")
  if not f then return by_key end
  f:close()
  local records, bad = json.read_lines(path)
  for _, b in ipairs(bad or {}) do io.stderr:write("dplua sweep: skipping a damaged line: ", b, "\n") end
  for _, r in ipairs(records or {}) do
    if type(r) == "table" and type(r.hparams) == "table" and type(r.status) == "string" then
      by_key[json.encode(r.hparams)] = r
    end
  end
  return by_key
end

local function append_record(path, r)
  local f, err = io.open(path, "a")
  if not f then error("cannot append to the results file: " .. tostring(err), 0) end
  f:write(json.encode(r, { order = record_order }), "\n")
  f:close()
end

-- The latest value of every metric a trial reported (wall_time aside).
local function read_metrics(path)
  local metrics, n = {}, 0
  local lines = json.read_lines(path)
  for _, line in ipairs(lines or {}) do
    if type(line) == "table" then
      n = n + 1
      for k, v in pairs(line) do
        if k ~= "wall_time" then metrics[k] = v end
      end
    end
  end
  return metrics, n
end

-- The line of a crashed trial's log that says why: the last "dplua: "
-- error line, else the last non-empty line.
local function log_reason(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local last, err
  for line in f:lines() do
    if line:find("%S") and not line:find("^#") then last = line end
    if line:find("^dplua: ") then err = line end
  end
  f:close()
  local r = err or last
  if r and #r > 300 then r = r:sub(1, 297) .. "..." end
  return r
end

---------------------------------------------------------------- TensorBoard

-- Fields of a report line that are not metrics: the step (or epoch) is
-- the x of the others, wall_time their time.
local not_scalars = { step = true, epoch = true, time = true, wall_time = true }

-- The TensorBoard run of each configuration, by key: its hyperparameters
-- as name=value joined by ",", with characters other than letters, digits
-- and ._-=,+ as "_"; the trial number is added where two configurations
-- read alike (values are shown to 4 significant digits).
local function run_name(t) return (show_config(t.hparams, ","):gsub("[^%w%._%-=,%+]", "_")) end
function M.run_names(configs)
  local names, seen = {}, {}
  for _, t in ipairs(configs) do
    local name = run_name(t)
    seen[name] = (seen[name] or 0) + 1
    names[t.key] = name
  end
  for _, t in ipairs(configs) do
    if seen[names[t.key]] > 1 then names[t.key] = names[t.key] .. ",trial=" .. t.id end
  end
  return names
end

local function tb_open(ctx, t)
  ctx.run_names[t.key] = ctx.run_names[t.key] or run_name(t) .. ",trial=" .. t.id   -- (a trial tpe chose)
  local SummaryWriter = require("dplua.utils.tensorboard").SummaryWriter
  return { writer = SummaryWriter(ctx.tensorboard .. "/" .. ctx.run_names[t.key]), lines = 0 }
end

-- One report line as TensorBoard scalars: each numeric metric at the
-- line's step (else its epoch, else its number, from 0) and wall time.
local function tb_add(tb, r)
  local step = r.step
  if type(step) ~= "number" or step % 1 ~= 0 then step = r.epoch end
  if type(step) ~= "number" or step % 1 ~= 0 then step = tb.lines end
  local wall = type(r.wall_time) == "number" and r.wall_time or nil
  for _, k in ipairs(sorted_keys(r)) do
    local v = r[k]
    if type(v) == "number" and not not_scalars[k] then tb.writer:add_scalar(k, v, step, wall) end
  end
  tb.lines, tb.last_step = tb.lines + 1, step
end

---------------------------------------------------------------- following a trial

-- The report lines (decoded) that a trial completed since the last look;
-- run.offset is how far its report file was read.
local function new_report_lines(run)
  local f = io.open(run.report, "r")
  if not f then return {} end
  f:seek("set", run.offset or 0)
  local text = f:read("*a")
  f:close()
  local done = text:match(".*()\n")
  if not done then return {} end
  run.offset = (run.offset or 0) + done
  local out = {}
  for line in text:sub(1, done):gmatch("[^\n]+") do
    local r = json.decode(line)
    if type(r) == "table" then out[#out + 1] = r end
  end
  return out
end

local function say(...)
  io.stdout:write(...)
  io.stdout:write("\n")
  io.stdout:flush()
end

local function now() return wall_time() end

-- Reads what the trial reported since the last look: into its TensorBoard
-- run, and through the scheduler, which may prune it (SIGTERM now, SIGKILL
-- after the grace time if it lingers).
local function follow(ctx, run)
  for _, r in ipairs(new_report_lines(run)) do
    if run.tb then tb_add(run.tb, r) end
    if ctx.scheduler and not run.pruned_at then
      local verdict, at = ctx.scheduler:report(run.trial.id, r)
      if verdict == "stop" and run.pid then
        run.pruned_at, run.kill_at = at, now() + KILL_GRACE
        kill(run.pid, SIGTERM)
        say(format("trial %d pruned at %s = %s by %s", run.trial.id, ctx.scheduler.time_attr,
                   show_value(at), ctx.scheduler.name))
      end
    end
  end
  if run.tb and now() - (run.tb.flushed or 0) >= TB_POLL_S then
    run.tb.flushed = now()
    run.tb.writer:flush()
  end
end

-- A resumed sweep's scheduler learns what the finished trials reported
-- (their report files in the logs folder), its verdicts ignored.
local function replay_finished(ctx, configs)
  if not ctx.scheduler then return end
  for _, t in ipairs(configs) do
    local r = ctx.records[t.key]
    if r and (r.status == "ok" or r.status == "pruned") and type(r.log) == "string" then
      local run = { report = (r.log:gsub("%.log$", ".report.jsonl")) }
      for _, line in ipairs(new_report_lines(run)) do ctx.scheduler:report(t.id, line) end
    end
  end
end

-- The last lines, then the hparams plugin's summaries in the trial's own
-- run (the hyperparameters; the last value of each numeric metric, at the
-- last step), so that TensorBoard's HPARAMS tab lists the trial.
local function tb_close(ctx, run, r)
  follow(ctx, run)
  local hparams, metrics = {}, {}
  for k, v in pairs(run.trial.hparams) do
    hparams[k] = (type(v) == "number" or type(v) == "string" or type(v) == "boolean") and v or json.encode(v)
  end
  for k, v in pairs(r.metrics or {}) do
    if type(v) == "number" and not not_scalars[k] then metrics[k] = v end
  end
  run.tb.writer:add_hparams(hparams, metrics, nil, ".", run.tb.last_step)
  run.tb.writer:close()
end

---------------------------------------------------------------- running

local function gpu_list()
  local ok, torch = pcall(require, "dplua")
  local n = 0
  if ok and type(torch) == "table" and torch.cuda and torch.cuda.device_count then
    local ok2, c = pcall(torch.cuda.device_count)
    if ok2 and type(c) == "number" then n = c end
  end
  if n == 0 then return {} end
  -- honour a CUDA_VISIBLE_DEVICES that the driver itself runs under
  local visible = {}
  for d in (os.getenv("CUDA_VISIBLE_DEVICES") or ""):gmatch("[^,%s]+") do visible[#visible + 1] = d end
  local gpus = {}
  for i = 1, n do gpus[i] = visible[i] or tostring(i - 1) end
  return gpus
end

-- Starts one trial in slot `slot`. Returns the running-trial table.
local function start_trial(ctx, t, slot)
  local s = ctx.sweep
  local width = #tostring(ctx.total_trials)
  local tag = format("trial-%0" .. math.max(width, 3) .. "d", t.id)
  local log = ctx.logs .. "/" .. tag .. ".log"
  local report = ctx.logs .. "/" .. tag .. ".report.jsonl"
  os.remove(report)
  local argv = { ctx.exe_name, s.script_path }
  if s.nproc_per_node > 1 then table.insert(argv, 2, "--nproc_per_node=" .. s.nproc_per_node) end
  for _, a in ipairs(t.args) do argv[#argv + 1] = a end
  for _, a in ipairs(ctx.extra_args) do argv[#argv + 1] = a end
  local set = { DPLUA_HPARAMS = t.key, DPLUA_TRIAL_ID = tostring(t.id), DPLUA_REPORT_FILE = report }
  local gpu
  if #ctx.gpus > 0 then
    -- slot k's trial gets GPUs (k-1)*n+1 .. k*n: disjoint while
    -- parallel * n <= the GPUs (checked before the sweep starts)
    local n, list = s.nproc_per_node, {}
    for i = 1, n do list[i] = ctx.gpus[((slot - 1) * n + i - 1) % #ctx.gpus + 1] end
    gpu = concat(list, ",")
    set.CUDA_VISIBLE_DEVICES = gpu
  else
    for _, v in ipairs({ "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS" }) do
      if os.getenv(v) == nil and not (s.env and s.env[v]) then set[v] = tostring(ctx.threads) end
    end
  end
  for k, v in pairs(s.env or {}) do set[k] = tostring(v) end
  local f = io.open(log, "w")
  if f then
    f:write("# dplua sweep: trial ", t.id, ": ", show_config(t.hparams), "\n")
    f:write("# DPLUA_HPARAMS=", t.key, gpu and ("  CUDA_VISIBLE_DEVICES=" .. gpu) or "", "\n")
    f:write("# ", concat(argv, " "), "\n")
    f:close()
  end
  local run = { trial = t, slot = slot, log = log, report = report, gpu = gpu, started = now() }
  if ctx.tensorboard then run.tb = tb_open(ctx, t) end
  run.pid, run.spawn_error = spawn(ctx.exe, argv, set, log)
  if run.pid then
    say(format("trial %d started: %s%s", t.id, show_config(t.hparams),
               gpu and ((gpu:find(",") and " on GPUs " or " on GPU ") .. gpu) or ""))
  end
  return run
end

-- Builds the record of a trial that ended with `how` (from reap).
local function finish_trial(ctx, run, how)
  local t = run.trial
  if ctx.scheduler or run.tb then
    run.pid = nil   -- reaped: the last lines are read, and nothing is killed
    follow(ctx, run)
  end
  local function ms(x) return math.floor(x * 1000 + 0.5) / 1000 end
  local r = { trial = t.id, hparams = t.hparams, started = ms(run.started), log = run.log,
              time = ms(now() - run.started), gpu = run.gpu and (tonumber(run.gpu) or run.gpu) or nil }
  local metrics = read_metrics(run.report)
  r.metrics = next(metrics) and metrics or nil
  if run.spawn_error then
    r.status, r.error, r.time = "crashed", run.spawn_error, 0
  elseif run.pruned_at then
    r.status, r.pruned_at = "pruned", run.pruned_at
    r.exit_code, r.signal = how.exit_code, how.signal
  elseif run.timed_out then
    r.status = "timeout"
    r.error = format("stopped after the %g s timeout", ctx.timeout)
    r.exit_code, r.signal = how.exit_code, how.signal
  elseif how.exit_code == 0 then
    r.status = "ok"
    r.exit_code = 0
  else
    r.status = "crashed"
    r.exit_code, r.signal = how.exit_code, how.signal
    r.error = how.error or log_reason(run.log)
  end
  append_record(ctx.results, r)
  if r.status == "pruned" then
    local f = io.open(run.log, "a")
    if f then
      f:write(format("# dplua sweep: pruned at %s = %s\n", ctx.scheduler.time_attr, show_value(r.pruned_at)))
      f:close()
    end
  end
  if run.tb then tb_close(ctx, run, r) end
  ctx.done = ctx.done + 1
  local m = r.metrics and r.metrics[ctx.sweep.metric]
  local what
  if r.status == "ok" then
    what = m ~= nil and format("%s = %s", ctx.sweep.metric, show_value(m))
           or format("no '%s' reported", ctx.sweep.metric)
  elseif r.status == "timeout" then
    what = r.error
  elseif r.status == "pruned" then
    what = format("at %s = %s, %s", ctx.scheduler.time_attr, show_value(r.pruned_at),
                  m ~= nil and format("%s = %s", ctx.sweep.metric, show_value(m)) or "no metric")
  else
    what = (r.signal and ("killed by " .. r.signal)) or (r.exit_code and ("exit status " .. r.exit_code)) or ""
    if r.error then what = what .. ": " .. r.error end
  end
  say(format("[%d/%d] trial %d %s in %.1f s: %s  (log: %s)", ctx.done, ctx.to_run, t.id, r.status, r.time, what, run.log))
  ctx.records[t.key] = r
end

-- Stops every running trial: SIGTERM, then SIGKILL after the grace time.
local function stop_all(ctx)
  for _, run in pairs(ctx.slots) do
    if run.pid then kill(run.pid, SIGTERM) end
  end
  local deadline = now() + KILL_GRACE
  while next(ctx.slots) do
    for slot, run in pairs(ctx.slots) do
      if not run.pid or reap(run.pid) then ctx.slots[slot] = nil end
    end
    if now() > deadline then
      for _, run in pairs(ctx.slots) do kill(run.pid, SIGKILL) end
      deadline = math.huge
    end
    C.dp_sleep(POLL_S)
  end
end

-- The loop: keep `parallel` trials running, reap those that end, stop
-- those past their timeout.
local function run_queue(ctx, queue)
  local qi, left = 1, true
  -- the queue's trials, then (method = "tpe") those ctx.generate chooses
  local function take()
    if qi <= #queue then
      qi = qi + 1
      return queue[qi - 1]
    end
    local t = ctx.generate and ctx.generate() or nil
    left = t ~= nil
    return t
  end
  ctx.running = 0
  while left or ctx.running > 0 do
    for slot = 1, ctx.parallel do
      local t = not ctx.slots[slot] and left and take() or nil
      if t then
        local run = start_trial(ctx, t, slot)
        if run.pid then
          ctx.slots[slot] = run
          ctx.running = ctx.running + 1
        else
          finish_trial(ctx, run, {})
        end
      end
    end
    C.dp_sleep(POLL_S)
    for slot = 1, ctx.parallel do
      local run = ctx.slots[slot]
      if run then
        local how = reap(run.pid)
        if how and how.signo == SIGINT then
          -- Ctrl-C reached the trial (it shares our process group): no
          -- record, so that the next start runs it again
          ctx.slots[slot] = nil
          ctx.running = ctx.running - 1
          say(format("trial %d interrupted (SIGINT); not recorded", run.trial.id))
          if run.tb then run.tb.writer:close() end
        elseif how then
          ctx.slots[slot] = nil
          ctx.running = ctx.running - 1
          finish_trial(ctx, run, how)
        elseif ctx.scheduler or (run.tb and now() - (run.polled or 0) >= TB_POLL_S) then
          -- every poll for the scheduler's verdicts; TensorBoard alone can wait
          run.polled = now()
          follow(ctx, run)
        end
        if not how then
          local t = now()
          if ctx.timeout and not run.timed_out and not run.pruned_at and t - run.started > ctx.timeout then
            run.timed_out, run.kill_at = true, t + KILL_GRACE
            kill(run.pid, SIGTERM)
          elseif run.kill_at and t > run.kill_at then
            kill(run.pid, SIGKILL)
            run.kill_at = nil
          end
        end
      end
    end
  end
end
-- Interpreted, so that the host's Ctrl-C hook can stop it (compiled
-- traces do not run hooks).
jit.off(run_queue)

---------------------------------------------------------------- the table

-- Rows for every configuration with a record, best first: trials with the
-- metric sorted by it, then the others by trial number.
function M.ranked(s, configs, records)
  local rows = {}
  for _, t in ipairs(configs) do
    local r = records[t.key]
    if r then
      local m = type(r.metrics) == "table" and r.metrics[s.metric]
      rows[#rows + 1] = { trial = t.id, hparams = t.hparams, record = r,
                          value = (r.status == "ok" and type(m) == "number" and m == m) and m or nil }
    end
  end
  table.sort(rows, function(a, b)
    if a.value and b.value then
      if a.value ~= b.value then
        if s.mode == "max" then return a.value > b.value end
        return a.value < b.value
      end
      return a.trial < b.trial
    end
    if a.value or b.value then return a.value ~= nil end
    return a.trial < b.trial
  end)
  return rows
end

local function print_table(s, rows)
  local names = sorted_keys(s.space)
  local header = { "rank", "trial" }
  for _, k in ipairs(names) do header[#header + 1] = k end
  header[#header + 1] = s.metric
  header[#header + 1] = "status"
  header[#header + 1] = "time"
  local cells = { header }
  for i, row in ipairs(rows) do
    local r = row.record
    local line = { row.value and tostring(i) or "-", tostring(row.trial) }
    for _, k in ipairs(names) do line[#line + 1] = show_value(row.hparams[k]) end
    local m = type(r.metrics) == "table" and r.metrics[s.metric]
    line[#line + 1] = m ~= nil and show_value(m) or "-"
    local status = r.status
    if r.status == "pruned" then status = "pruned at " .. show_value(r.pruned_at)
    elseif r.signal then status = status .. " (" .. r.signal .. ")"
    elseif r.status ~= "ok" and r.exit_code then status = status .. " (exit " .. r.exit_code .. ")" end
    line[#line + 1] = status
    line[#line + 1] = type(r.time) == "number" and format("%.1fs", r.time) or "-"
    cells[#cells + 1] = line
  end
  local widths = {}
  for _, line in ipairs(cells) do
    for j, c in ipairs(line) do widths[j] = math.max(widths[j] or 0, #c) end
  end
  for i, line in ipairs(cells) do
    local out = {}
    for j, c in ipairs(line) do
      -- numbers right-aligned, words left-aligned
      if j <= #line - 2 and i > 1 then out[j] = format("%" .. widths[j] .. "s", c)
      else out[j] = format("%-" .. widths[j] .. "s", c) end
    end
    say((concat(out, "  "):gsub("%s+$", "")))
    if i == 1 then
      local rule = {}
      for j = 1, #line do rule[j] = string.rep("-", widths[j]) end
      say(concat(rule, "  "))
    end
  end
end

local function print_summary(s, configs, records)
  local rows = M.ranked(s, configs, records)
  say("")
  local pruned = 0
  for _, row in ipairs(rows) do if row.record.status == "pruned" then pruned = pruned + 1 end end
  say(format("%d of %d trials finished%s; sorted by %s (%s is better):", #rows, #configs,
             pruned > 0 and format(" (%d pruned)", pruned) or "", s.metric, s.mode == "max" and "higher" or "lower"))
  say("")
  if #rows > 0 then print_table(s, rows) end
  say("")
  local best = rows[1]
  if best and best.value then
    say(format("best: trial %d, %s = %s", best.trial, s.metric, show_value(best.value)))
    say("  " .. show_config(best.hparams))
    say("  DPLUA_HPARAMS='" .. json.encode(best.hparams) .. "'")
    return best
  end
  say(format("best: none (no trial finished with a numeric '%s')", s.metric))
  return nil
end

---------------------------------------------------------------- main

local usage = [[
usage: dplua sweep SWEEP.lua [options] [-- script args...]

Runs a training script once per configuration of the search space that
SWEEP.lua returns (a grid, random draws, or with method = "tpe" each chosen
from the results so far), `parallel` trials at a time, each its own process;
appends one JSON line per finished trial to the results file and prints the
trials sorted by the metric. A rerun skips configurations already in the
results.

options:
  --parallel N      trials at once (default: the sweep's, else one per GPU, else 1)
  --timeout S       stop a trial after S seconds
  --results FILE    the results JSONL (default: SWEEP.results.jsonl)
  --tensorboard DIR TensorBoard event files, one run per trial (default: the sweep's)
  --retry-failed    run crashed and timed-out configurations again
  --dry-run         list the configurations and what a run would do; run nothing
  -h, --help        this help

Arguments after -- go to every trial's script, after the sweep's own args.
See docs/SWEEPS.md for the sweep table, torch.hparams and torch.report.]]

local function parse_command_line(args)
  local o = { extra_args = {} }
  local i = 1
  local function value(name)
    i = i + 1
    local v = args[i]
    if v == nil then usage_error("option " .. name .. " needs a value") end
    return v
  end
  while args[i] ~= nil do
    local a = args[i]
    local name, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
    if name then
      a = name
      table.insert(args, i + 1, inline)
    end
    if a == "-h" or a == "--help" then o.help = true
    elseif a == "--parallel" then o.parallel = tonumber(value(a))
      if not o.parallel or o.parallel < 1 then usage_error("--parallel expects a number >= 1") end
    elseif a == "--timeout" then o.timeout = tonumber(value(a))
      if not o.timeout or o.timeout <= 0 then usage_error("--timeout expects seconds > 0") end
    elseif a == "--results" then o.results = value(a)
    elseif a == "--tensorboard" then o.tensorboard = value(a)
    elseif a == "--retry-failed" then o.retry_failed = true
    elseif a == "--dry-run" then o.dry_run = true
    elseif a == "--" then
      for j = i + 1, #args do o.extra_args[#o.extra_args + 1] = args[j] end
      break
    elseif a:sub(1, 1) == "-" and a ~= "-" then usage_error("unknown option " .. a)
    elseif o.file == nil then o.file = a
    else usage_error("unexpected argument " .. a .. " (script arguments go after --)") end
    i = i + 1
  end
  return o
end

-- The configurations still to run (all but those with a record; with
-- A trial's script arguments (t.args), checked
function M.prepare(s, t)
  local ok, a = pcall(trial_args, s, t.hparams)
  if not ok then sweep_error(format("args for trial %d (%s): %s", t.id, show_config(t.hparams), tostring(a))) end
  if type(a) ~= "table" then sweep_error("the sweep's args(hparams) must return a list of strings") end
  t.args = {}
  for i, x in ipairs(a) do t.args[i] = tostring(x) end
  return t
end

-- --retry-failed, all but the successful ones), each with its script
-- arguments, checked before anything runs. Returns the queue and how many
-- were skipped.
local function plan(s, o, configs, records)
  local f = io.open(s.script_path, "r")
  if not f then sweep_error("cannot open the training script " .. s.script_path) end
  f:close()
  local queue, skipped = {}, 0
  for _, t in ipairs(configs) do
    local r = records[t.key]
    if r and (r.status == "ok" or r.status == "pruned" or not o.retry_failed) then
      skipped = skipped + 1
    else
      M.prepare(s, t)
      queue[#queue + 1] = t
    end
  end
  return queue, skipped
end

local function print_header(s, o, n, skipped, queued, parallel, gpus)
  say(format("sweep %s: %d configuration%s (%s over %s), %s %s", s.name or o.file, n, n == 1 and "" or "s",
             s.method, concat(sorted_keys(s.space), ", "), s.metric,
             s.mode == "max" and "(higher is better)" or "(lower is better)"))
  say(format("  %d finished earlier, %d to run, %d at a time%s", skipped, queued, parallel,
             #gpus > 0 and format(" on %d GPU%s", #gpus, #gpus > 1 and "s" or "") or " (CPU)"))
  if s.scheduler then
    local opts = {}
    for _, k in ipairs(sorted_keys(s.scheduler)) do
      if k ~= "name" then opts[#opts + 1] = k .. "=" .. show_value(s.scheduler[k]) end
    end
    say(format("  early stopping: %s (%s)", s.scheduler.name, concat(opts, ", ")))
  end
  say(format("  results: %s   logs: %s/%s", s.results, s.logs,
             s.tensorboard and ("   tensorboard: " .. s.tensorboard .. "/") or ""))
end

-- Runs the queue; on Ctrl-C stops the trials, prints what finished and
-- returns 130.
local function run_trials(ctx, queue, configs)
  local s = ctx.sweep
  for _, dir in ipairs({ s.logs, s.results:match("^(.*)/[^/]*$"), s.tensorboard }) do
    if C.dp_make_dirs(dir) ~= 0 then sweep_error(last_error()) end
  end
  say("")
  local fine, why = pcall(run_queue, ctx, queue)
  if fine then return nil end
  stop_all(ctx)
  why = tostring(command.message(why) or why):gsub("^[^\n:]-:%d+: ", "")
  if why ~= "interrupted!" then sweep_error(why .. " (running trials were stopped)") end
  say("")
  say("dplua sweep: interrupted; unfinished trials have no record and run on the next start")
  print_summary(s, configs, ctx.records)
  return 130
end

local function run_sweep(list, args)
  local o = parse_command_line(list)
  if o.help then say(usage); return 0 end
  if not o.file then io.stderr:write(usage, "\n"); return 2 end
  local s = M.load(o.file)
  if o.results then s.results = o.results end
  if o.tensorboard then s.tensorboard = o.tensorboard end
  local configs = M.configurations(s)
  local records = read_results(s.results)
  local tpe_sweep = s.method == "tpe"
  if tpe_sweep then configs = M.tpe_past(records) end
  local gpus = gpu_list()
  local parallel = math.floor(o.parallel or s.parallel or math.max(math.floor(#gpus / s.nproc_per_node), 1))
  if #gpus > 0 and s.nproc_per_node > 1 and parallel * s.nproc_per_node > #gpus then
    sweep_error(format("%d trials at once of %d rank%s each need %d GPUs; this machine has %d (lower parallel)",
                       parallel, s.nproc_per_node, s.nproc_per_node > 1 and "s" or "", parallel * s.nproc_per_node, #gpus))
  end
  local queue, skipped = plan(s, o, configs, records)
  local chosen_later = tpe_sweep and math.max(0, s.samples - #configs) or 0
  print_header(s, o, tpe_sweep and math.max(s.samples, #configs) or #configs, skipped, #queue + chosen_later, parallel, gpus)
  if o.dry_run then
    for _, t in ipairs(configs) do
      local r = records[t.key]
      say(format("  trial %d: %s%s", t.id, show_config(t.hparams), r and ("  [" .. r.status .. "]") or ""))
    end
    if chosen_later > 0 then
      say(format("  then %d trial%s chosen by tpe from the results as they come", chosen_later, chosen_later == 1 and "" or "s"))
    end
    return 0
  end
  local exe, exe_name = find_exe(args)
  local ctx = {
    sweep = s, exe = exe, exe_name = exe_name, gpus = gpus, parallel = parallel, results = s.results,
    logs = s.logs, timeout = o.timeout or s.timeout, extra_args = o.extra_args,
    threads = math.max(1, math.floor(C.dp_cpu_count() / (parallel * s.nproc_per_node))), records = records,
    scheduler = s.scheduler and early_stopping.new(s.scheduler, s.metric, s.mode),
    tensorboard = s.tensorboard, run_names = M.run_names(configs),
    slots = {}, done = 0, running = 0, to_run = #queue + chosen_later,
    total_trials = tpe_sweep and math.max(s.samples, #configs) or #configs,
  }
  if tpe_sweep then
    ctx.generate = function()
      if #configs >= s.samples then return nil end
      local t = M.tpe_trial(s, configs, ctx.records)
      if t == nil then
        say("dplua sweep: every configuration of the space has been tried")
        return nil
      end
      return M.prepare(s, t)
    end
  end
  replay_finished(ctx, configs)
  if #queue > 0 or chosen_later > 0 then
    local status = run_trials(ctx, queue, configs)
    if status then return status end
  end
  return print_summary(s, configs, ctx.records) and 0 or 1
end

-- `dplua sweep ARGS`: args[1..n] are the command's arguments (arg[-1], when
-- present, the program). Returns the exit status: 0 when at least one
-- trial succeeded, 1 when none did or the sweep file is wrong, 2 for a bad
-- command line, 130 when interrupted.
function M.main(args) return command.main("sweep", run_sweep, args) end

return M
