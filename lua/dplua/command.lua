-- dplua.command: the frame of a `dplua NAME` command written in Lua
-- (`dplua sweep`, `dplua plot`). An expected failure (a bad command line,
-- a file that cannot be read) is raised with command.fail and becomes one
-- line on stderr and the command's exit status; anything else is reported
-- the same way with status 1.
local M = {}

-- Raises an expected failure: status 2 for the command line (stderr then
-- points at --help), 1 (the default) otherwise.
function M.fail(msg, status) error({ command_error = msg, status = status or 1 }, 0) end

-- The message of an error raised with fail, or nil for any other error.
function M.message(err) return type(err) == "table" and err.command_error or nil end

-- Runs `dplua name ARGS` and returns the exit status: run(list, args),
-- with args the global `arg` of the command (args[1..n] its arguments,
-- args[-1] the program) and list a copy of args[1..n] that a parser may
-- change.
function M.main(name, run, args)
  args = args or {}
  local list = {}
  for i = 1, #args do list[i] = args[i] end
  local ok, status = pcall(run, list, args)
  if ok then return status end
  local msg = M.message(status)
  if not msg then
    io.stderr:write("dplua ", name, ": ", tostring(status), "\n")
    return 1
  end
  io.stderr:write("dplua ", name, ": ", msg, "\n")
  if status.status == 2 then io.stderr:write("Try 'dplua ", name, " --help' for more information.\n") end
  return status.status
end

return M
