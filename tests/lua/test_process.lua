-- test_process.lua: the C API for processes, clocks and the machine
-- (dp_process_spawn/wait/kill, dp_signal_name, dp_clock_*, dp_sleep,
-- dp_make_dirs, dp_cpu_count, dp_is_terminal, dp_cuda_devices,
-- dp_env_facts), called through the FFI as the sweep driver and the
-- progress bar call them: what they do, and a clear error for bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local ffi = require("ffi")
local torch = require("dplua")
local C = torch.C

local function last_error() return ffi.string(C.dp_last_error()) end

-- A NULL-terminated const char *[] (the strings live as long as the list).
local function strings(list)
  local arr = ffi.new("const char *[?]", #list + 1)
  for i, s in ipairs(list) do arr[i - 1] = s end
  return arr
end

local tmp = os.tmpname()
os.remove(tmp)
assert(C.dp_make_dirs(tmp) == 0, last_error())
local pid = ffi.new("int[1]")
local exited, code, signo = ffi.new("int[1]"), ffi.new("int[1]"), ffi.new("int[1]")

-- Waits for pid[0] without a limit; returns exited, code, signo.
local function wait_for(p)
  T.is(tonumber(C.dp_process_wait(p, -1, exited, code, signo)), C.DP_OK, "waiting for pid " .. p)
  return exited[0], code[0], signo[0]
end

---------------------------------------------------------------- spawn

T.run("a child of this program: argv, environment, output, exit status", function()
  local log = tmp .. "/child.log"
  local argv = strings({ "dplua", "-e", "io.write(os.getenv('DPLUA_TEST_VALUE'), ' ', tostring(os.getenv('PATH'))) "
                                        .. "io.stdout:flush() io.stderr:write(' err') os.exit(3)" })
  local env = strings({ "DPLUA_TEST_VALUE=hello", "PATH" })
  T.is(tonumber(C.dp_process_spawn(pid, nil, argv, env, log, log)), C.DP_OK, "spawn returns DP_OK")
  local e, c, s = wait_for(pid[0])
  T.is({ e, c, s }, { 1, 3, 0 }, "the child exited with status 3")
  local f = assert(io.open(log, "r"))
  local text = f:read("*a")
  f:close()
  T.is(text, "hello nil err", "env set a variable and removed PATH; stdout and stderr went to one file")
  T.is(tonumber(C.dp_process_wait(pid[0], 0, exited, code, signo)), C.DP_ERR_STATE,
       "a reaped child cannot be waited for again")
  T.ok(last_error():find("not a child of this process", 1, true), "and the error says why", last_error())
end)

T.run("a program found in PATH, waited for, signalled", function()
  T.is(tonumber(C.dp_process_spawn(pid, "sleep", strings({ "sleep", "30" }), nil, nil, nil)), C.DP_OK, "spawn sleep 30")
  T.is(tonumber(C.dp_process_wait(pid[0], 0, exited, code, signo)), C.DP_OK, "a look at a running child")
  T.is(exited[0], 0, "it runs")
  T.is(tonumber(C.dp_process_kill(pid[0], 15)), C.DP_OK, "SIGTERM sent")
  local e, c, s = wait_for(pid[0])
  T.is({ e, c, s }, { 1, -1, 15 }, "ended by signal 15")
  T.is(ffi.string(C.dp_signal_name(s)), "SIGTERM", "named SIGTERM")
end)

T.run("spawn: bad arguments are clear errors", function()
  local st = C.dp_process_spawn(pid, tmp .. "/no-such-program", strings({ "x" }), nil, nil, nil)
  T.is(tonumber(st), C.DP_ERR_IO, "a missing program is an error of the spawn")
  T.ok(last_error():find("cannot run " .. tmp .. "/no-such-program: No such file", 1, true),
       "which names the program and the reason", last_error())
  T.is(tonumber(C.dp_process_spawn(pid, "dplua-no-such-command", strings({ "x" }), nil, nil, nil)), C.DP_ERR_IO,
       "so is a name that PATH does not have")
  T.is(tonumber(C.dp_process_spawn(pid, nil, nil, nil, nil, nil)), C.DP_ERR_ARG, "argv NULL")
  T.ok(last_error():find("argv", 1, true), "the error names argv", last_error())
  T.is(tonumber(C.dp_process_spawn(pid, nil, strings({}), nil, nil, nil)), C.DP_ERR_ARG, "an empty argv")
  T.is(tonumber(C.dp_process_spawn(nil, nil, strings({ "x" }), nil, nil, nil)), C.DP_ERR_ARG, "no pid pointer")
  T.is(tonumber(C.dp_process_spawn(pid, "", strings({ "x" }), nil, nil, nil)), C.DP_ERR_ARG, "an empty program")
  T.is(tonumber(C.dp_process_spawn(pid, nil, strings({ "x" }), strings({ "=value" }), nil, nil)), C.DP_ERR_ARG,
       "an environment entry without a name")
  T.ok(last_error():find('env[0] is "=value"', 1, true), "the error shows the entry", last_error())
  local st2 = C.dp_process_spawn(pid, nil, strings({ "x" }), nil, tmp .. "/no/such/dir/log", nil)
  T.is(tonumber(st2), C.DP_ERR_IO, "an output file that cannot be opened")
  T.ok(last_error():find("cannot open " .. tmp .. "/no/such/dir/log", 1, true), "is named", last_error())
end)

T.run("wait and kill: bad arguments are clear errors", function()
  T.is(tonumber(C.dp_process_wait(0, 0, exited, code, signo)), C.DP_ERR_ARG, "wait: pid 0")
  T.is(tonumber(C.dp_process_wait(1, 0, nil, code, signo)), C.DP_ERR_ARG, "wait: a NULL pointer")
  T.is(tonumber(C.dp_process_wait(1, 0, exited, code, signo)), C.DP_ERR_STATE, "wait: a process that is not a child")
  T.is(tonumber(C.dp_process_kill(0, 15)), C.DP_ERR_ARG, "kill: pid 0 (a process group) is refused")
  T.is(tonumber(C.dp_process_kill(-1, 15)), C.DP_ERR_ARG, "kill: pid -1 (every process) is refused")
  T.ok(last_error():find("expected a process id > 0, got -1", 1, true), "and says so", last_error())
  T.is(tonumber(C.dp_process_kill(1, 1000)), C.DP_ERR_ARG, "kill: a signal number out of range")
end)

T.run("signal names", function()
  T.is(ffi.string(C.dp_signal_name(9)), "SIGKILL", "9")
  T.is(ffi.string(C.dp_signal_name(2)), "SIGINT", "2")
  T.is(ffi.string(C.dp_signal_name(0)), "signal 0", "0 is no signal")
end)

---------------------------------------------------------------- clocks and the machine

T.run("clocks and sleep", function()
  local t0 = C.dp_clock_monotonic()
  T.is(tonumber(C.dp_sleep(0.02)), 0, "a sleep that no signal ends returns 0")
  T.ok(C.dp_clock_monotonic() - t0 >= 0.02, "the monotonic clock moved at least as long as the sleep")
  T.is(tonumber(C.dp_sleep(-1)), 0, "a negative sleep returns at once")
  T.ok(math.abs(C.dp_clock_wall() - os.time()) < 5, "the wall clock counts seconds since 1970, as os.time")
end)

T.run("make_dirs", function()
  local deep = tmp .. "/a/b/c/"
  T.is(tonumber(C.dp_make_dirs(deep)), C.DP_OK, "a nested path")
  T.is(tonumber(C.dp_make_dirs(deep)), C.DP_OK, "again: existing directories are fine")
  local f = assert(io.open(tmp .. "/file", "w"))
  f:close()
  T.is(tonumber(C.dp_make_dirs(tmp .. "/file/sub")), C.DP_ERR_IO, "a file in the way")
  T.ok(last_error():find("cannot create the directory " .. tmp .. "/file: a file of that name is in the way", 1, true),
       "is named", last_error())
  T.is(tonumber(C.dp_make_dirs("")), C.DP_ERR_ARG, "an empty path")
  T.is(tonumber(C.dp_make_dirs(nil)), C.DP_ERR_ARG, "NULL")
end)

T.run("the machine", function()
  T.ok(C.dp_cpu_count() >= 1, "at least one CPU")
  T.is(tonumber(C.dp_is_terminal(-1)), 0, "no terminal behind a bad descriptor")
  local n = ffi.new("int[1]")
  local st = C.dp_cuda_devices(n)
  if st == C.DP_OK then
    T.ok(n[0] > 0, "GPUs are counted")
  else
    T.ok(n[0] == 0 and last_error():find("^no GPU is visible %("), "no GPU: the count is 0 and the error says why",
         last_error())
  end
  T.is(tonumber(C.dp_cuda_devices(nil)), C.DP_ERR_ARG, "cuda_devices: a NULL count")
end)

T.run("env facts", function()
  local facts = {}
  local cb = ffi.cast("dp_fact_fn", function(key, value)
    facts[ffi.string(key)] = ffi.string(value)
  end)
  C.dp_env_facts(cb, nil)
  cb:free()
  T.ok(facts["OpenBLAS"] and facts["OpenBLAS threads"]:match("^%d+$"), "OpenBLAS and its threads")
  T.ok(facts["Gloo"] and facts["CUDA"], "Gloo and CUDA, built or not")
  C.dp_env_facts(nil, nil)   -- no callback: nothing to do, no crash
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done_testing()
