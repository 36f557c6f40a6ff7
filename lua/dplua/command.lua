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

-- Walks a command line into a table o: "--name=value" reads as "--name
-- value"; -h/--help sets o.help; -o FILE, --output FILE and -oFILE set
-- o.output; an argument not starting with "-" is appended to o.files.
-- Any other option goes to option(o, a, value), where value() takes the
-- option's value (the next argument); it returns false for an option it
-- does not know, which is a command-line failure.
function M.parse_options(args, option)
  local o = { files = {} }
  local i = 1
  local function value()
    local name = args[i]
    i = i + 1
    if args[i] == nil then M.fail("option " .. name .. " needs a value", 2) end
    return args[i]
  end
  while args[i] ~= nil do
    local a = args[i]
    local name, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
    if name then a = name; args[i] = name; table.insert(args, i + 1, inline) end
    if a == "-h" or a == "--help" then o.help = true
    elseif a == "-o" or a == "--output" then o.output = value()
    elseif a:match("^%-o.") then o.output = a:sub(3)
    elseif a:sub(1, 1) ~= "-" or #a == 1 then o.files[#o.files + 1] = a
    elseif not option(o, a, value) then M.fail("unknown option " .. a, 2) end
    i = i + 1
  end
  return o
end

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
