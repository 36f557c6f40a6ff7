-- options.lua: the command line of train.lua and sample.lua. A script
-- lists its options as {name, default, what}; a number default makes a
-- number option, a boolean default a flag (--resume, or --resume=false),
-- a string default a string. parse(args) takes --name=value or
-- --name value, prints the list for --help and exits, and exits with
-- status 2 and a message naming the option for anything it cannot take.
local M = {}

function M.fail(script, msg)
  io.stderr:write(script, ": ", msg, "\n")
  os.exit(2)
end

function M.usage(script, options)
  io.write("usage: dplua examples/gpt2/", script, " [--name=value ...]\n\n")
  for _, o in ipairs(options) do
    io.write(string.format("  --%-14s %s (default %s)\n", o[1], o[3], tostring(o[2])))
  end
end

function M.parse(script, options, args)
  local opt, kind = {}, {}
  for _, o in ipairs(options) do opt[o[1]], kind[o[1]] = o[2], type(o[2]) end
  local i = 1
  while args[i] ~= nil do
    local a = args[i]
    if a == "-h" or a == "--help" then M.usage(script, options); os.exit(0) end
    local name, value = a:match("^%-%-([%w_]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w_]+)$") end
    if not name then M.fail(script, "unexpected argument '" .. a .. "' (options are --name=value; see --help)") end
    if kind[name] == nil then M.fail(script, "unknown option --" .. name .. " (see --help)") end
    if value == nil then
      if kind[name] == "boolean" then value = "true"
      else
        i = i + 1
        value = args[i]
        if value == nil then M.fail(script, "option --" .. name .. " needs a value") end
      end
    end
    if kind[name] == "number" then
      opt[name] = tonumber(value)
      if opt[name] == nil then M.fail(script, "option --" .. name .. " expects a number, got '" .. value .. "'") end
    elseif kind[name] == "boolean" then
      if value ~= "true" and value ~= "false" then
        M.fail(script, "option --" .. name .. " is true or false, got '" .. value .. "'")
      end
      opt[name] = value == "true"
    else
      opt[name] = value
    end
    i = i + 1
  end
  return opt
end

-- Each of names must be a positive integer.
function M.positive_ints(script, opt, names)
  for _, k in ipairs(names) do
    if opt[k] < 1 or opt[k] % 1 ~= 0 then M.fail(script, "--" .. k .. " must be a positive integer, got " .. opt[k]) end
  end
end

return M
