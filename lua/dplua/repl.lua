-- The REPL's helpers: completion, ?help and the echo of values. Loaded once
-- by host.c when the REPL starts; returns { complete, help, show }. Reads
-- the library through package.loaded, so it never loads it by itself.
local G, loaded, searchpath = _G, package.loaded, package.searchpath
local type, next, rawget, pcall, select, tostring = type, next, rawget, pcall, select, tostring
local getmetatable, getinfo, getupvalue = debug.getmetatable, debug.getinfo, debug.getupvalue
local getlocal = debug.getlocal
local ipairs, string, loadstring, insert = ipairs, string, loadstring, table.insert
local sort, concat, format, write = table.sort, table.concat, string.format, io.write
local open, setfenv = io.open, setfenv

local keywords = { 'and', 'break', 'do', 'else', 'elseif', 'end', 'false', 'for',
  'function', 'goto', 'if', 'in', 'local', 'nil', 'not', 'or', 'repeat', 'return',
  'then', 'true', 'until', 'while' }
-- Tensor fields that are not methods (the getters of dplua/tensor.lua).
local tensor_fields = { 'shape', 'dtype', 'device', 'ndim', 'is_cuda', 'T', 'grad',
  'requires_grad', 'is_leaf', 'grad_fn', 'data' }

local UNKNOWN = {}  -- a name whose value completion does not know
-- The library, once loaded, with its operations that load on first use
-- (the compositions) loaded too, so that completion lists them.
local function lib()
  local t = loaded.dplua
  local load_ops = t and rawget(t, '_load_ops')
  if load_ops then pcall(load_ops) end
  return t
end

-- M.scope: where names are looked up: _G, or after `dplua -i script.lua`
-- a table of the script's locals whose misses read _G (set by host.c).
-- M.only: while a line of the distributed REPL runs on some ranks only
-- (`:on 0,2 ...`), the ranks it runs on ("0,2"); dplua.distributed's
-- collectives refuse to run then.
local M = {}
local function scope() return M.scope or G end

local function is_tensor(x)
  local t = type(x) == 'cdata' and lib()
  if not t or type(t.is_tensor) ~= 'function' then return false end
  local ok, yes = pcall(t.is_tensor, x)
  return ok and yes == true
end

local function is_module(x)
  local mt = type(x) == 'table' and getmetatable(x)
  return type(mt) == 'table' and rawget(mt, '__is_module') == true
end

local function is_class(x)
  return type(x) == 'table' and (rawget(x, '__instance_mt') ~= nil)
end

-- Tensor methods: the library keeps them in torch.Tensor.
local function tensor_methods()
  local t = lib()
  local m = t and rawget(t, 'Tensor')
  return type(m) == 'table' and m or {}
end

---------------------------------------------------------------- safe indexing

-- obj[key] without running code that could fail or change anything: raw
-- reads through __index tables; the only __index functions called (under
-- pcall) are the lazy loaders of _G and torch and the field lookup of
-- nn.Module instances, which only read.
local function index(obj, key)
  local ty = type(obj)
  if ty == 'string' then return string[key] end
  if ty == 'cdata' then
    if not is_tensor(obj) then return nil end
    local m = rawget(tensor_methods(), key)
    if m ~= nil then return m end
    for _, f in ipairs(tensor_fields) do
      if f == key then
        local ok, v = pcall(function() return obj[key] end)
        return ok and v or nil
      end
    end
    return nil
  end
  if ty ~= 'table' then return nil end
  for _ = 1, 32 do  -- a bound on __index chains, which may loop
    local v = rawget(obj, key)
    if v ~= nil then return v end
    local mt = getmetatable(obj)
    if type(mt) ~= 'table' then return nil end
    local idx = rawget(mt, '__index')
    if type(idx) == 'function' then
      if obj == G or obj == lib() or rawget(mt, '__is_module') == true then
        local ok, r = pcall(idx, obj, key)
        return ok and r or nil
      end
      return nil
    end
    if type(idx) ~= 'table' then return nil end
    obj = idx
  end
  return nil
end

-- The value of a dotted path ('torch.nn.Linear'), or nil.
local function resolve(path)
  local obj
  if path:find('^%.') or path:find('%.%.') or path:find('%.$') then return nil end
  for name in path:gmatch('[^.]+') do
    if not name:match('^[%a_][%w_]*$') then return nil end
    if obj == nil then obj = index(scope(), name) else obj = index(obj, name) end
    if obj == nil then return nil end
  end
  return obj
end

---------------------------------------------------------------- completion

-- Add the identifier keys of table t and of its __index tables to names.
local function add_table(names, t)
  for _ = 1, 32 do
    if type(t) ~= 'table' then return end
    for k, v in next, t do
      if type(k) == 'string' and k:match('^[%a_][%w_]*$') and names[k] == nil then names[k] = v end
    end
    local mt = getmetatable(t)
    t = type(mt) == 'table' and rawget(mt, '__index') or nil
  end
end

-- torch's submodules load on first use: their names are the keys of the
-- `submodules` table that torch's __index function closes over.
local function add_lazy(names, t)
  local mt = getmetatable(t)
  local f = type(mt) == 'table' and rawget(mt, '__index')
  if type(f) ~= 'function' then return end
  for i = 1, 64 do
    local name, v = getupvalue(f, i)
    if name == nil then return end
    if name == 'submodules' and type(v) == 'table' then
      for k in next, v do if names[k] == nil then names[k] = UNKNOWN end end
    end
  end
end

local function add_module(names, m)
  local attrs = rawget(m, '_attrs')
  add_table(names, type(attrs) == 'table' and attrs or nil)
  for _, od in ipairs({ '_parameters', '_buffers', '_modules' }) do
    local o = rawget(m, od)
    local keys, map = type(o) == 'table' and rawget(o, 'keys'), type(o) == 'table' and rawget(o, 'map')
    if type(keys) == 'table' and type(map) == 'table' then
      for _, k in ipairs(keys) do
        if type(k) == 'string' and k:match('^[%a_][%w_]*$') and names[k] == nil then
          names[k] = rawget(map, k) or UNKNOWN
        end
      end
    end
  end
  add_table(names, m)
  add_table(names, rawget(getmetatable(m), '__class'))
end

-- The names that may follow `obj.` (or `obj:` with methods set).
local function members(obj)
  local names = {}
  if type(obj) == 'string' then add_table(names, string)
  elseif is_tensor(obj) then
    add_table(names, tensor_methods())
    for _, f in ipairs(tensor_fields) do names[f] = false end
  elseif is_module(obj) then add_module(names, obj)
  elseif type(obj) == 'table' then
    add_table(names, obj)
    if obj == lib() then add_lazy(names, obj) end
  end
  return names
end

local function callable(v)
  if type(v) == 'function' then return true end
  if type(v) ~= 'table' then return false end
  local mt = getmetatable(v)
  return type(mt) == 'table' and rawget(mt, '__call') ~= nil
end

-- complete('torch.nn.Li') -> { 'torch.nn.Linear' }: the whole words that
-- the text may become, sorted. Names that start with '_' are offered only
-- once the text has the '_'.
local function complete(text)
  local head, sep, part = text:match('^(.-)([.:])([%w_]*)$')
  local names
  if head == nil then
    if not text:match('^[%a_]?[%w_]*$') then return {} end
    head, sep, part = '', '', text
    names = members(scope())
    if rawget(G, 'torch') == nil and getmetatable(G) ~= nil then names.torch = UNKNOWN end
    for _, k in ipairs(keywords) do names[k] = UNKNOWN end
  else
    if head:find(':', 1, true) then return {} end
    local obj = resolve(head)
    if obj == nil then return {} end
    names = members(obj)
  end
  local out, private = {}, part:sub(1, 1) == '_'
  for k, v in next, names do
    if k:sub(1, #part) == part and (private or k:sub(1, 1) ~= '_')
       and (sep ~= ':' or v == UNKNOWN or callable(v)) then
      out[#out + 1] = head .. sep .. k
    end
  end
  sort(out)
  return out
end

---------------------------------------------------------------- help

local function read_lines(path)
  local f = open(path, 'r')
  if not f then return nil end
  local lines = {}
  for l in f:lines() do lines[#lines + 1] = l end
  f:close()
  return lines
end

-- The comment block that ends just above line n, without its '--'; a
-- section rule ('-------- name') ends it.
local function comment_above(lines, n)
  local block = {}
  for i = n - 1, 1, -1 do
    local l = lines[i]
    local text = l and l:match('^%s*%-%-(.*)$')
    if text == nil or text:match('^%-%-%-%-') then break end
    insert(block, 1, (text:gsub('^ ', '')))
  end
  return #block > 0 and block or nil
end

-- The comment at the top of a file (after a #! line).
local function file_comment(lines)
  local block, i = {}, 1
  if lines[1] and lines[1]:match('^#') then i = 2 end
  while lines[i] do
    local text = lines[i]:match('^%-%-(.*)$')
    if text == nil or text:match('^%-%-%-%-') then break end
    block[#block + 1] = text:gsub('^ ', '')
    i = i + 1
  end
  return #block > 0 and block or nil
end

local function escape(s) return (s:gsub('%p', '%%%0')) end

-- The line that defines `name` in a file: `function a.b.name(`,
-- `a.name = `, `local function name(`, or a registration like
-- `sized("name", ...)`; for a class, `Module:extend("name")`.
local function find_definition(lines, name, class)
  local e, q = escape(name), '["\']'   -- q: either quote
  local pats = { '^%s*function%s+' .. e .. '%s*%(', '^%s*function%s+[%w_.:]*[.:]' .. e .. '%s*%(',
                 '^%s*local%s+function%s+' .. e .. '%s*%(', '[%w_]%.' .. e .. '%s*=[^=]',
                 '^%s*' .. e .. '%s*=[^=]', '^[%w_.]+%(%s*' .. q .. e .. q }
  if class then pats = { ':extend%(%s*' .. q .. e .. q } end
  for _, p in ipairs(pats) do
    for i, l in ipairs(lines) do
      if l:match(p) then return i end
    end
  end
  return nil
end

local function source_of(f)
  local info = getinfo(f, 'S')
  if not info or info.what == 'C' then return nil end
  local path = info.source:match('^@(.*)$')
  return path, info.linedefined, info.source
end

local function params(f)
  local names = {}
  for i = 1, 64 do
    local n = getlocal(f, i)
    if n == nil or n:sub(1, 1) == '(' then break end
    names[#names + 1] = n
  end
  local info = getinfo(f, 'u')
  if info and info.isvararg then names[#names + 1] = '...' end
  return concat(names, ', ')
end

local function say(fmt, ...) write(format(fmt, ...), "\n") end

local function print_block(block)
  for _, l in ipairs(block) do write('  ', l, "\n") end
end

local function short(path)
  return (path:gsub('^.*/lua/', 'lua/'))
end

-- Docs of a Lua function: the comment above its definition (found by the
-- name it was asked for, else by the line LuaJIT recorded).
local function help_function(what, f, name)
  local path, line, source = source_of(f)
  if path == nil then
    if source == '=stdin' then say('%s(%s)  -- function, defined at the REPL', what, params(f))
    elseif source then say('%s(%s)  -- function, defined in a string chunk', what, params(f))
    else say('%s: a built-in function (no Lua source)', what) end
    return false
  end
  local lines = read_lines(path) or {}
  -- The line LuaJIT recorded, unless the name is not on it: a function
  -- made by a helper (torch.zeros by `sized`) is found by its name.
  local def = line
  if name and not (lines[line] or ''):find('%f[%w_]' .. escape(name) .. '%f[^%w_]') then
    def = find_definition(lines, name) or line
  end
  local block = comment_above(lines, def)
  say('%s(%s)  -- function, %s:%d', what, params(f), short(path), def)
  if block then print_block(block); return true end
  return false
end

local function field_names(t, max)
  local names = {}
  add_table(names, t)
  local list = {}
  for k in next, names do if k:sub(1, 1) ~= '_' then list[#list + 1] = k end end
  sort(list)
  local n = #list
  if n > max then
    for i = n, max + 1, -1 do list[i] = nil end
    list[#list + 1] = '...'
  end
  return concat(list, ', '), n
end

local function help_class(what, cls, instance)
  local name = rawget(cls, '__name') or what
  local super = rawget(cls, '__super')
  local parent = super and ', a subclass of ' .. tostring(rawget(super, '__name')) or ''
  if instance then say('%s: an instance of class %s%s', what, name, parent)
  else say('%s: class %s%s', what, name, parent) end
  local init = rawget(cls, '__init') or rawget(cls, 'forward')
  local found = false
  if type(init) == 'function' then
    local path, line = source_of(init)
    local lines = path and read_lines(path)
    if lines then
      local def = find_definition(lines, name, true)
      local block = def and comment_above(lines, def) or comment_above(lines, line)
      if block == nil then def, block = 1, file_comment(lines) end
      if block then
        say('  defined in %s:%d', short(path), def or line)
        print_block(block)
        found = true
      end
      if rawget(cls, '__init') then say('  %s(%s)', name, params(init):gsub('^self,? ?', '')) end
    end
  end
  local methods = {}
  for k, v in next, cls do
    if type(k) == 'string' and type(v) == 'function' and k:sub(1, 1) ~= '_' then methods[#methods + 1] = k end
  end
  sort(methods)
  if #methods > 0 then say('  methods: %s', concat(methods, ', ')) end
  return found
end

local function module_name_of(t)
  for name, m in next, loaded do
    if m == t and type(name) == 'string' then return name end
  end
  return nil
end

local function help_table(what, t)
  local list, n = field_names(t, 24)
  local modname = module_name_of(t)
  local found = false
  if modname then
    local path = searchpath(modname, package.path)
    local lines = path and read_lines(path)
    local block = lines and file_comment(lines)
    say('%s: module %s%s', what, modname, path and ' (' .. short(path) .. ')' or '')
    if block then print_block(block); found = true end
  else
    local mt = getmetatable(t)
    local ok, str = false, nil
    if type(mt) == 'table' and rawget(mt, '__tostring') then ok, str = pcall(tostring, t) end
    local len = #t > 0 and format(' of length %d', #t) or ''
    if ok then say('%s: %s (a table%s)', what, tostring(str), len)
    else say('%s: a table%s with %d named fields', what, len, n) end
  end
  if n > 0 then say('  fields: %s', list) end
  return found
end

local function tensor_summary(x)
  local ok, s = pcall(function()
    local shape = {}
    for i, d in ipairs(x.shape) do shape[i] = tostring(d) end
    local rg = x.requires_grad and ' requires_grad=true' or ''
    return format('shape=[%s] dtype=%s device=%s%s', concat(shape, ', '), tostring(x.dtype), tostring(x.device), rg)
  end)
  return ok and s or 'a tensor'
end

-- ?expr: what expr is, and the library's own documentation of it.
local function help(expr)
  expr = expr:match('^%s*(.-)%s*$')
  if expr == '' then
    write("?name prints what name is and its documentation (?torch.nn.Linear, ?x:sum).\n",
          "Tab completes names and fields; Ctrl-C interrupts; Ctrl-D exits.\n")
    return
  end
  local path = expr:gsub(':', '.')
  local value = resolve(path)
  if value == nil then  -- not a plain name: evaluate it
    local f = loadstring('return ' .. expr, '=?')
    if f then
      setfenv(f, scope())
      local ok, v = pcall(f)
      if ok then value = v end
    end
  end
  local name = path:match('([%a_][%w_]*)$')
  local found = true
  if value == nil then
    say('%s: nil (no such name)', expr)
    return
  elseif type(value) == 'function' then found = help_function(expr, value, name)
  elseif is_class(value) then found = help_class(expr, value)
  elseif is_module(value) then
    found = help_class(expr, rawget(getmetatable(value), '__class'), true)
  elseif is_tensor(value) then say('%s: a tensor, %s', expr, tensor_summary(value))
  elseif type(value) == 'table' then found = help_table(expr, value)
  elseif type(value) == 'string' then say('%s: a string of %d bytes', expr, #value)
  else say('%s: %s %s', expr, type(value), tostring(value)) end
  if not found and (type(value) == 'function' or is_class(value) or is_module(value)) then
    say('  no documentation for %s', expr)
  end
end

---------------------------------------------------------------- the echo

-- The values of an expression line: through the global print, as a script
-- would show them; a tensor also gets a line with its shape, dtype and
-- device. Several values share a line unless one of them is a tensor.
local function show(...)
  local n = select('#', ...)
  local print = G.print
  local any = false
  for i = 1, n do if is_tensor((select(i, ...))) then any = true end end
  if not any then return print(...) end
  for i = 1, n do
    local v = select(i, ...)
    print(v)
    if is_tensor(v) then write('-- ', tensor_summary(v), "\n") end
  end
end

M.complete, M.help, M.show = complete, help, show
return M
