-- dplua.nn.module: nn.Module, the base class of every layer, and nn.Parameter.
--
-- A module class is made with extend; calling the class makes an instance,
-- calling an instance runs forward:
--
--   local SimpleNN = torch.nn.Module:extend("SimpleNN")
--   function SimpleNN:__init(hidden)         -- no super() call needed: the
--     self.fc1 = torch.nn.Linear(10, hidden) -- bookkeeping is set up before
--     self.fc2 = torch.nn.Linear(hidden, 2)  -- __init runs
--   end
--   function SimpleNN:forward(x) return self.fc2(self.fc1(x):relu()) end
--   local model = SimpleNN(10)
--   local y = model(torch.randn(4, 10))
--
-- A subclass of a subclass calls its parent's __init explicitly when it
-- wants it: `function Big:__init(...) SimpleNN.__init(self, ...) ... end`.
--
-- As in PyTorch, assigning a Module to a field registers a child, assigning
-- an nn.Parameter registers a parameter, register_buffer registers a buffer,
-- and registration order is kept: it is the order of named_parameters(),
-- state_dict() and printing. Tensors are C objects that cannot carry Lua
-- fields, so the bookkeeping lives in the module's own tables and a weak
-- set remembers which tensors are Parameters.
--
-- Lists come back as plain 1-based Lua tables (parameters(), buffers(),
-- children(), modules()); the named_* methods return a list of {name, value}
-- pairs that can also be iterated directly:
--   for name, p in model:named_parameters() do ... end
local torch = require("dplua")
local raise = torch._raise
local is_tensor = torch.is_tensor

local M = {}

---------------------------------------------------------------- Parameter

local parameters_set = setmetatable({}, { __mode = "k" })

local function is_parameter(x) return is_tensor(x) and parameters_set[x] == true end
M.is_parameter = is_parameter

-- Parameter(t [, requires_grad=true]): a leaf sharing t's storage, remembered
-- as a parameter so that assigning it to a module field registers it.
function M.Parameter(t, requires_grad)
  if t == nil then t = torch.empty(0) end
  if not is_tensor(t) then raise("Parameter: expected a tensor, got " .. type(t)) end
  local p = t:detach()
  if requires_grad ~= false then p:requires_grad_(true) end
  parameters_set[p] = true
  return p
end

-- Buffer(t [, persistent = true]): assigned to a module's attribute,
-- registers t as a buffer (PyTorch 2.5's nn.Buffer); reading the
-- attribute gives t.
local buffer_mt = {}
function M.Buffer(t, persistent)
  if type(persistent) == "table" then persistent = persistent.persistent end
  if not is_tensor(t) then raise("Buffer: expected a tensor, got " .. type(t)) end
  if persistent ~= nil and type(persistent) ~= "boolean" then
    raise("Buffer: expected persistent to be a boolean, got " .. type(persistent))
  end
  return setmetatable({ tensor = t, persistent = persistent ~= false }, buffer_mt)
end

---------------------------------------------------------------- ordered maps

-- Keys in insertion order; a key may map to nil (PyTorch's None entries).
local function od_new() return { keys = {}, map = {}, has = {} } end

local function od_set(od, k, v)
  if not od.has[k] then
    od.has[k] = true
    od.keys[#od.keys + 1] = k
  end
  od.map[k] = v
end

local function od_del(od, k)
  if not od.has[k] then return end
  od.has[k], od.map[k] = nil, nil
  for i, key in ipairs(od.keys) do
    if key == k then table.remove(od.keys, i); break end
  end
end

-- A list of {name, value} pairs that a generic for can call directly.
-- The loop state is the previous name, so the position comes from a name
-- index rather than from state kept in the list: a loop left with break
-- does not disturb the next one.
local pairs_mt = {
  __call = function(list, _, prev)
    local i = prev == nil and 1 or list._index[prev] + 1
    local e = list[i]
    if e == nil then return nil end
    return e[1], e[2]
  end,
}
local function pair_list(list)
  local index = {}
  for i, e in ipairs(list) do index[e[1]] = i end
  rawset(list, "_index", index)
  return setmetatable(list, pairs_mt)
end

---------------------------------------------------------------- classes

local Module = {}
M.Module = Module
Module.__name = "Module"

local function is_module(x)
  local mt = type(x) == "table" and getmetatable(x)
  return mt and rawget(mt, "__is_module") == true or false
end
M.is_module = is_module
Module.is_module = is_module

-- A module call: forward, or forward with its hooks (M._call_with_hooks)
local function call(self, ...)
  if rawget(self, "_hooks") == nil then return self:forward(...) end
  return M._call_with_hooks(self, ...)
end

-- torch.profiler (and the FLOP counter) observe every module call while
-- they record: observer(call, module, ...) makes the call; nil stops
-- observing; the previous observer is returned.
local call_observer
function Module._observe_calls(observer)
  local previous = call_observer
  call_observer = observer
  return previous
end

local function new_instance_mt(cls)
  local mt = { __is_module = true, __class = cls }
  mt.__index = function(self, k)
    local v = self._attrs[k]
    if v ~= nil then return v end
    v = self._parameters.map[k]
    if v ~= nil then return v end
    v = self._buffers.map[k]
    if v ~= nil then return v end
    v = self._modules.map[k]
    if v ~= nil then return v end
    if type(k) == "number" then
      local get = cls.__getitem
      if get then return get(self, k) end
    end
    -- a tensor of nn.utils.parametrize: computed from its originals
    local par = rawget(self, "_parametrized")
    if par ~= nil and par[k] then return self._modules.map.parametrizations._modules.map[k]:_evaluate() end
    return cls[k]
  end
  mt.__newindex = function(self, k, v) return Module.__setattr(self, k, v) end
  -- ipairs(container): its modules (nn.ParameterList: its parameters) in
  -- order, numbered from 1 (dplua makes ipairs honour __ipairs, see
  -- dplua/init.lua); a module that is no list says so rather than looping
  -- over nothing
  mt.__ipairs = function(self)
    if not cls.__iterable then
      raise(cls.__name .. " is not iterable: ipairs takes an nn.Sequential or nn.ModuleList "
            .. "(for a module's children, ipairs(m:children()))")
    end
    local od = cls.__iterable == "parameters" and self._parameters or self._modules
    local keys, map = od.keys, od.map
    return function(_, i)
      i = i + 1
      if keys[i] ~= nil then return i, map[keys[i]] end
    end, self, 0
  end
  mt.__call = function(self, ...)
    if call_observer then return call_observer(call, self, ...) end
    return call(self, ...)
  end
  mt.__tostring = function(self) return self:__repr() end
  return mt
end

local function construct(cls, ...)
  local self = setmetatable({
    _parameters = od_new(), _buffers = od_new(), _modules = od_new(),
    _non_persistent = {}, _attrs = {}, training = true,
  }, cls.__instance_mt)
  local init = cls.__init
  if init then init(self, ...) end
  return self
end

local class_mt = {
  __index = nil,   -- set per class: the parent
  __call = construct,
  __tostring = function(cls) return "<class " .. cls.__name .. ">" end,
}

-- Module:extend(name): a new module class; Class(...) makes an instance and
-- runs Class.__init(self, ...).
function Module.extend(parent, name)
  if type(parent) ~= "table" or rawget(parent, "__instance_mt") == nil and parent ~= Module then
    raise("extend: call it as Module:extend(\"Name\") (with a colon)")
  end
  if type(name) ~= "string" or name == "" then
    raise("extend: expected a class name string, e.g. Module:extend(\"SimpleNN\"), got " .. type(name))
  end
  local cls = setmetatable({}, { __index = parent, __call = construct, __tostring = class_mt.__tostring })
  rawset(cls, "__name", name)
  rawset(cls, "__super", parent)
  rawset(cls, "__instance_mt", new_instance_mt(cls))
  return cls
end
rawset(Module, "__instance_mt", new_instance_mt(Module))
setmetatable(Module, { __call = construct, __tostring = class_mt.__tostring })

function Module.__init() end

function Module:forward()
  raise(string.format('Module [%s] is missing the required "forward" function', self:_get_name()))
end

function Module:_get_name() return getmetatable(self).__class.__name end

-- isinstance(x, cls), also as m:isinstance(cls): whether x is a module of
-- class cls or of a class extended from it (PyTorch's isinstance(m,
-- nn.Linear)); isinstance(m, nn.Module) is true for every module.
local function isinstance(x, cls)
  if not is_module(x) then return false end
  if type(cls) ~= "table" or rawget(cls, "__instance_mt") == nil then
    raise("isinstance: expected a module class (nn.Linear, a class made with Module:extend), got " .. type(cls))
  end
  local c = getmetatable(x).__class
  while c ~= nil do
    if c == cls then return true end
    c = rawget(c, "__super")
  end
  return cls == Module
end
M.isinstance = isinstance
Module.isinstance = isinstance

---------------------------------------------------------------- registration

local function check_name(name, fn)
  if type(name) ~= "string" then raise(fn .. ": expected the name to be a string, got " .. type(name)) end
  if name == "" then raise(fn .. ': the name can\'t be empty string ""') end
  if name:find(".", 1, true) then raise(fn .. ': the name can\'t contain ".", got "' .. name .. '"') end
end

local function remove_from(self, k, ...)
  for _, which in ipairs({ ... }) do
    if which == "attrs" then self._attrs[k] = nil else od_del(self[which], k) end
  end
end

-- Module.__setattr: PyTorch's rules for `self.k = v`.
function Module:__setattr(k, v)
  local par = rawget(self, "_parametrized")
  if par ~= nil and par[k] then return self._modules.map.parametrizations._modules.map[k]:_assign(v) end
  if is_parameter(v) then
    remove_from(self, k, "attrs", "_buffers", "_modules")
    return self:register_parameter(k, v)
  end
  if getmetatable(v) == buffer_mt then
    remove_from(self, k, "attrs", "_parameters", "_modules")
    return self:register_buffer(k, v.tensor, v.persistent)
  end
  if self._parameters.has[k] then
    if v ~= nil then
      raise(string.format("cannot assign '%s' as parameter '%s' (nn.Parameter or nil expected)",
                          is_tensor(v) and "Tensor" or type(v), tostring(k)))
    end
    return od_set(self._parameters, k, nil)
  end
  if is_module(v) then
    remove_from(self, k, "attrs", "_buffers", "_parameters")
    return od_set(self._modules, k, v)
  end
  if self._modules.has[k] then
    if v ~= nil then
      raise(string.format("cannot assign '%s' as child module '%s' (nn.Module or nil expected)", type(v), tostring(k)))
    end
    return od_set(self._modules, k, nil)
  end
  if self._buffers.has[k] then
    if v ~= nil and not is_tensor(v) then
      raise(string.format("cannot assign '%s' as buffer '%s' (Tensor or nil expected)", type(v), tostring(k)))
    end
    return od_set(self._buffers, k, v)
  end
  self._attrs[k] = v
end

function Module:register_parameter(name, param)
  check_name(name, "register_parameter")
  if self._attrs[name] ~= nil or (self._modules.has[name] or self._buffers.has[name]) then
    raise(string.format("register_parameter: attribute '%s' already exists", name))
  end
  if param ~= nil and not is_parameter(param) then
    raise(string.format("register_parameter: cannot assign a plain %s object to parameter '%s' "
                        .. "(nn.Parameter or nil required)", is_tensor(param) and "Tensor" or type(param), name))
  end
  od_set(self._parameters, name, param)
end

-- _remove_parameter(name), _remove_buffer, _remove_module: drop a
-- registered entry entirely (as Python's `del module._parameters[name]`),
-- so that the name can hold a computed tensor (nn.utils.weight_norm's
-- weight, a parametrized one).
function Module:_remove_parameter(name) od_del(self._parameters, name) end
function Module:_remove_buffer(name) od_del(self._buffers, name); self._non_persistent[name] = nil end
function Module:_remove_module(name) od_del(self._modules, name) end

function Module:register_buffer(name, tensor, persistent)
  check_name(name, "register_buffer")
  if self._attrs[name] ~= nil or self._parameters.has[name] or self._modules.has[name] then
    raise(string.format("register_buffer: attribute '%s' already exists", name))
  end
  if tensor ~= nil and not is_tensor(tensor) then
    raise(string.format("register_buffer: cannot assign '%s' object to buffer '%s' (Tensor or nil required)",
                        type(tensor), name))
  end
  od_set(self._buffers, name, tensor)
  self._non_persistent[name] = persistent == false or nil
end

function Module:add_module(name, module)
  if type(name) ~= "string" then raise("add_module: expected the name to be a string, got " .. type(name)) end
  if name == "" then raise('add_module: module name can\'t be empty string ""') end
  if name:find(".", 1, true) then raise('add_module: module name can\'t contain ".", got: ' .. name) end
  if module ~= nil and not is_module(module) then
    raise("add_module: " .. type(module) .. " is not a Module subclass")
  end
  if self._attrs[name] ~= nil or self._parameters.has[name] or self._buffers.has[name] then
    raise(string.format("add_module: attribute '%s' already exists", name))
  end
  od_set(self._modules, name, module)
end
Module.register_module = Module.add_module

---------------------------------------------------------------- traversal

-- named_modules: pre-order, each module once (shared modules are listed at
-- their first place), like PyTorch.
function Module:named_modules(prefix, memo, out)
  out, memo, prefix = out or {}, memo or {}, prefix or ""
  if memo[self] then return pair_list(out) end
  memo[self] = true
  out[#out + 1] = { prefix, self }
  for _, name in ipairs(self._modules.keys) do
    local m = self._modules.map[name]
    if m ~= nil then m:named_modules(prefix == "" and name or (prefix .. "." .. name), memo, out) end
  end
  return pair_list(out)
end

-- The values of a list of {name, value} pairs, in order.
local function values(named)
  local list = {}
  for _, e in ipairs(named) do list[#list + 1] = e[2] end
  return list
end

function Module:modules() return values(self:named_modules()) end

function Module:named_children()
  local out, memo = {}, {}
  for _, name in ipairs(self._modules.keys) do
    local m = self._modules.map[name]
    if m ~= nil and not memo[m] then memo[m] = true; out[#out + 1] = { name, m } end
  end
  return pair_list(out)
end

function Module:children() return values(self:named_children()) end

-- Members (parameters or buffers) of every module, each tensor once.
local function named_members(self, which, prefix, recurse)
  local out, memo = {}, {}
  local mods = recurse == false and { { prefix or "", self } } or self:named_modules(prefix)
  for _, e in ipairs(mods) do
    local mprefix, m = e[1], e[2]
    local od = m[which]
    for _, k in ipairs(od.keys) do
      local v = od.map[k]
      if v ~= nil and not memo[v] then
        memo[v] = true
        out[#out + 1] = { mprefix == "" and k or (mprefix .. "." .. k), v }
      end
    end
  end
  return pair_list(out)
end

-- named_parameters([prefix] [, recurse]) or named_parameters({prefix=, recurse=})
local function members_args(a, b)
  if type(a) == "table" then return a.prefix, a.recurse end
  return a, b
end

-- parameters([recurse]) or parameters({recurse=})
local function members(self, which, recurse)
  if type(recurse) == "table" then recurse = recurse.recurse end
  return values(named_members(self, which, "", recurse))
end

function Module:named_parameters(a, b) return named_members(self, "_parameters", members_args(a, b)) end
function Module:parameters(recurse) return members(self, "_parameters", recurse) end
function Module:named_buffers(a, b) return named_members(self, "_buffers", members_args(a, b)) end
function Module:buffers(recurse) return members(self, "_buffers", recurse) end

-- num_parameters({trainable=false}): the number of parameter elements
-- (each shared parameter counted once).
function Module:num_parameters(opts)
  local only_trainable = type(opts) == "table" and opts.trainable or opts == true
  local n = 0
  for _, p in ipairs(self:parameters()) do
    if not only_trainable or p.requires_grad then n = n + p:numel() end
  end
  return n
end

function Module:get_submodule(target)
  if target == "" or target == nil then return self end
  local m = self
  for item in tostring(target):gmatch("[^.]+") do
    local child = m._modules.map[item]
    if not is_module(child) then
      raise(string.format("get_submodule: %s has no attribute `%s`", m:_get_name(), item))
    end
    m = child
  end
  return m
end

-- set_submodule(target, module): the submodule at the dotted path replaced
-- (its parent must exist; the last name may be new)
function Module:set_submodule(target, module)
  if type(target) ~= "string" or target == "" then
    raise("set_submodule: expected a non-empty dotted path, got " .. tostring(target))
  end
  if not is_module(module) then raise("set_submodule: `module` is not an nn.Module, got " .. type(module)) end
  local parent_path, name = target:match("^(.*)%.([^.]+)$")
  if not parent_path then parent_path, name = "", target end
  self:get_submodule(parent_path):add_module(name, module)
end

-- compile(...): as torch.compile, the module runs as it is (dplua has no
-- graph compiler: its kernels are compiled ahead of time)
function Module:compile() end

-- get_parameter(target), get_buffer(target): by dotted path ("0.weight")
local function get_entry(self, target, kind, fn)
  local mod_path, name = tostring(target):match("^(.*)%.([^.]+)$")
  if not mod_path then mod_path, name = "", target end
  local m = self:get_submodule(mod_path)
  local v = m["_" .. kind .. "s"].map[name]
  if v == nil then raise(string.format("%s: %s has no %s `%s`", fn, m:_get_name(), kind, name)) end
  return v
end
function Module:get_parameter(target) return get_entry(self, target, "parameter", "get_parameter") end
function Module:get_buffer(target) return get_entry(self, target, "buffer", "get_buffer") end

---------------------------------------------------------------- modes and grads

function Module:train(mode)
  if mode == nil then mode = true end
  if type(mode) ~= "boolean" then raise("train: expected mode to be a boolean, got " .. type(mode)) end
  rawset(self, "training", mode)
  for _, m in ipairs(self:children()) do m:train(mode) end
  return self
end

function Module:eval() return self:train(false) end

function Module:requires_grad_(flag)
  if flag == nil then flag = true end
  for _, p in ipairs(self:parameters()) do p:requires_grad_(flag) end
  return self
end

-- zero_grad({set_to_none=true}): PyTorch 2's default drops the gradients.
function Module:zero_grad(opts)
  local set_to_none = true
  if type(opts) == "table" and opts.set_to_none ~= nil then set_to_none = opts.set_to_none
  elseif type(opts) == "boolean" then set_to_none = opts end
  for _, p in ipairs(self:parameters()) do
    if set_to_none then
      p.grad = nil
    else
      local g = p.grad
      if g ~= nil then torch.no_grad(function() g:zero_() end) end
    end
  end
end

-- apply(fn): fn(m) on every child (recursively), then on self.
function Module:apply(fn)
  if type(fn) ~= "function" then raise("apply: expected a function, got " .. type(fn)) end
  for _, m in ipairs(self:children()) do m:apply(fn) end
  fn(self)
  return self
end

---------------------------------------------------------------- hooks

-- The hooks of a module, made on its first register_*hook and dropped
-- when the last is removed (a module without hooks is called straight,
-- see __call): lists in registration order, each of { fn = }.
local function add_hook(self, which, fn)
  local h = rawget(self, "_hooks")
  if h == nil then
    h = { pre = {}, forward = {}, backward = {}, backward_pre = {} }
    rawset(self, "_hooks", h)
  end
  return require("dplua.autograd")._handle(h[which], { fn = fn }, function()
    if #h.pre + #h.forward + #h.backward + #h.backward_pre == 0 and rawget(self, "_hooks") == h then
      rawset(self, "_hooks", nil)
    end
  end)
end

local function check_hook(fn, what)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    raise(what .. ": expected a function, got " .. type(fn))
  end
end

-- register_forward_pre_hook(fn): fn(module, args) runs before forward;
-- args is the list of forward's arguments. fn may return a new argument
-- list (a table) or a single new argument (anything else but nil).
function Module:register_forward_pre_hook(fn)
  check_hook(fn, "register_forward_pre_hook")
  return add_hook(self, "pre", fn)
end

-- register_forward_hook(fn): fn(module, args, output) runs after forward;
-- a value it returns (not nil) replaces the output.
function Module:register_forward_hook(fn)
  check_hook(fn, "register_forward_hook")
  return add_hook(self, "forward", fn)
end

-- register_full_backward_hook(fn): fn(module, grad_input, grad_output)
-- runs once the gradients with respect to the module's tensor arguments
-- are computed: grad_input has one entry per tensor argument (nil for one
-- that needs no gradient), grad_output one per tensor result. A list fn
-- returns replaces grad_input. The module's tensor arguments and results
-- pass through an identity autograd.Function ("BackwardHookFunction")
-- that sees their gradients, as in PyTorch.
function Module:register_full_backward_hook(fn)
  check_hook(fn, "register_full_backward_hook")
  return add_hook(self, "backward", fn)
end

-- register_full_backward_pre_hook(fn): fn(module, grad_output) runs when
-- the gradients with respect to the module's tensor results arrive, before
-- the module's backward; a list it returns replaces grad_output.
function Module:register_full_backward_pre_hook(fn)
  check_hook(fn, "register_full_backward_pre_hook")
  return add_hook(self, "backward_pre", fn)
end

local function pack(...) return { n = select("#", ...), ... } end

-- The identity Functions around a module with backward hooks; state is
-- one call's: { module =, hooks =, grad_output =, ninputs_needing_grad = }.
local hook_in, hook_out

local function call_backward_hooks(state, grad_input)
  for _, h in ipairs({ unpack(state.hooks) }) do
    local r = h.fn(state.module, grad_input, state.grad_output)
    if r ~= nil then
      if type(r) ~= "table" or is_tensor(r) then
        raise("register_full_backward_hook: a hook returned " .. type(r) .. "; expected nil or a list of gradients "
              .. "(one per tensor argument)")
      end
      grad_input = r
    end
  end
  return grad_input
end

local function backward_hook_functions()
  local Function = require("dplua.autograd").Function
  hook_in = Function:extend("BackwardHookFunction")
  function hook_in.forward(ctx, state, ...)
    ctx.state = state
    for i = 1, select("#", ...) do   -- an argument without grad stays so (its grad_input is nil)
      if not ctx.needs_input_grad[i + 1] then ctx:mark_non_differentiable((select(i, ...))) end
    end
    return ...
  end
  function hook_in.backward(ctx, ...)
    local state = ctx.state
    local grad_input = pack(...)
    local gi = call_backward_hooks(state, grad_input)
    return nil, unpack(gi, 1, grad_input.n)
  end
  hook_out = Function:extend("BackwardHookFunction")
  function hook_out.forward(ctx, state, ...)
    ctx.state = state
    return ...
  end
  function hook_out.backward(ctx, ...)
    local state = ctx.state
    local grad_output = pack(...)
    for _, h in ipairs({ unpack(state.pre_hooks) }) do
      local r = h.fn(state.module, grad_output)
      if r ~= nil then
        if type(r) ~= "table" or is_tensor(r) then
          raise("register_full_backward_pre_hook: a hook returned " .. type(r) .. "; expected nil or a list of "
                .. "gradients (one per tensor result)")
        end
        grad_output = { n = grad_output.n, unpack(r, 1, grad_output.n) }
      end
    end
    state.grad_output = grad_output
    if state.ninputs_needing_grad == 0 then   -- no hook_in node will run: call the hooks here
      call_backward_hooks(state, { n = state.ninputs })
    end
    return nil, unpack(grad_output, 1, grad_output.n)
  end
end

-- Runs the tensors among vals (a packed list) through fn.apply(state, ...)
-- and puts its results back in their places.
local function through(fn, state, vals)
  local idx, ts = {}, {}
  for i = 1, vals.n do
    if is_tensor(vals[i]) then idx[#idx + 1] = i; ts[#ts + 1] = vals[i] end
  end
  if #ts == 0 then return vals, 0 end
  local res = pack(fn.apply(state, unpack(ts)))
  local out = { n = vals.n, unpack(vals, 1, vals.n) }
  for j, i in ipairs(idx) do out[i] = res[j] end
  return out, #ts
end

function M._call_with_hooks(self, ...)
  local hooks = rawget(self, "_hooks")
  local args = pack(...)
  for _, h in ipairs({ unpack(hooks.pre) }) do
    local r = h.fn(self, args)
    if r ~= nil then
      if type(r) == "table" and not is_tensor(r) and getmetatable(r) == nil then
        args = { n = table.maxn(r), unpack(r, 1, table.maxn(r)) }
        if r.n then args.n = r.n end
      else
        args = { n = 1, r }
      end
    end
  end
  local state
  if #hooks.backward + #hooks.backward_pre > 0 and torch.is_grad_enabled() then
    if hook_in == nil then backward_hook_functions() end
    state = { module = self, hooks = hooks.backward, pre_hooks = hooks.backward_pre, grad_output = {} }
    local need = 0
    for i = 1, args.n do
      if is_tensor(args[i]) and args[i].requires_grad then need = need + 1 end
    end
    state.ninputs_needing_grad = need
    args, state.ninputs = through(hook_in, state, args)
  end
  -- forward's results: one value, or (several) a list as PyTorch's tuple
  local results = pack(self:forward(unpack(args, 1, args.n)))
  local output = results
  if results.n == 1 then output = results[1] end
  for _, h in ipairs({ unpack(hooks.forward) }) do
    local r = h.fn(self, args, output)
    if r ~= nil then output = r end
  end
  if results.n ~= 1 then
    if type(output) ~= "table" or is_tensor(output) then
      raise("register_forward_hook: forward returned " .. results.n .. " values; a hook must return a list of them")
    end
    results = { n = output.n or table.maxn(output), unpack(output, 1, output.n or table.maxn(output)) }
  else
    results = { n = 1, output }
  end
  if state ~= nil then
    if results.n == 1 and type(output) == "table" and not is_tensor(output) and getmetatable(output) == nil then
      local n = table.maxn(output)   -- a list of tensors as the one result
      local r = through(hook_out, state, { n = n, unpack(output, 1, n) })
      r.n = nil
      return r
    end
    results = through(hook_out, state, results)
  end
  return unpack(results, 1, results.n)
end

---------------------------------------------------------------- state dicts

-- A state dict is a plain table name -> tensor; its order (PyTorch's) is
-- kept aside and returned by sd:keys(); sd:items() iterates in that order.
local sd_order = setmetatable({}, { __mode = "k" })
local sd_methods = {}
local function sd_put(sd, k, v)
  local o = sd_order[sd]
  if not o.has[k] then o.has[k] = true; o.keys[#o.keys + 1] = k end
  rawset(sd, k, v)
end
-- New keys assigned by the user join the order at the end.
local sd_mt = { __index = sd_methods, __newindex = sd_put }
function sd_methods.keys(sd)
  local o = sd_order[sd]
  local out = {}
  if o then
    for _, k in ipairs(o.keys) do if rawget(sd, k) ~= nil then out[#out + 1] = k end end
    return out
  end
  for k in pairs(sd) do out[#out + 1] = k end
  table.sort(out)
  return out
end
function sd_methods.items(sd)
  local keys, i = sd_methods.keys(sd), 0
  return function()
    i = i + 1
    local k = keys[i]
    if k ~= nil then return k, rawget(sd, k) end
  end
end
function sd_methods.len(sd) return #sd_methods.keys(sd) end

local function ordered_dict()
  local sd = setmetatable({}, sd_mt)
  sd_order[sd] = { keys = {}, has = {} }
  return sd
end
M.ordered_dict, M.ordered_put, M.ordered_keys = ordered_dict, sd_put, sd_methods.keys

---------------------------------------------------------------- state dicts

-- The state-dict hooks of a module, made on the first registration: lists
-- in registration order, each of { fn = }.
local function add_state_dict_hook(self, which, fn, what)
  check_hook(fn, what)
  local h = rawget(self, "_state_dict_hooks")
  if h == nil then
    h = { save_pre = {}, save_post = {}, load_pre = {}, load_post = {} }
    rawset(self, "_state_dict_hooks", h)
  end
  return require("dplua.autograd")._handle(h[which], { fn = fn })
end
local function state_dict_hooks(self, which)
  local h = rawget(self, "_state_dict_hooks")
  return h and h[which] or {}
end
-- register_state_dict_pre_hook(fn): fn(module, prefix, keep_vars) before
-- the module's entries are written; register_state_dict_post_hook(fn):
-- fn(module, state_dict, prefix) after them and its children's (fn may
-- change state_dict); register_load_state_dict_pre_hook(fn):
-- fn(module, state_dict, prefix) before a load reads anything (fn may
-- rename or add entries: old checkpoints); register_load_state_dict_post_hook(fn):
-- fn(module, incompatible_keys) after the load, where fn may take keys out
-- of incompatible_keys.missing_keys / unexpected_keys before strict checks
-- them. As PyTorch's (2.x names).
function Module:register_state_dict_pre_hook(fn)
  return add_state_dict_hook(self, "save_pre", fn, "register_state_dict_pre_hook")
end
function Module:register_state_dict_post_hook(fn)
  return add_state_dict_hook(self, "save_post", fn, "register_state_dict_post_hook")
end
function Module:register_load_state_dict_pre_hook(fn)
  return add_state_dict_hook(self, "load_pre", fn, "register_load_state_dict_pre_hook")
end
function Module:register_load_state_dict_post_hook(fn)
  return add_state_dict_hook(self, "load_post", fn, "register_load_state_dict_post_hook")
end

-- A module class that defines get_extra_state(self) has it saved under
-- prefix .. "_extra_state" (after its parameters and buffers), and
-- set_extra_state(self, value) called with it by load_state_dict, as in
-- PyTorch (any value torch.save can write: numbers, strings, tables, tensors).
local EXTRA = "_extra_state"

-- state_dict({prefix=, keep_vars=false}): own parameters, own persistent
-- buffers, extra state, then the children's, as PyTorch; values are
-- detached tensors sharing storage with the module (keep_vars=true: the
-- parameters themselves).
function Module:state_dict(opts, sd)
  opts = opts or {}
  sd = sd or ordered_dict()
  local prefix = opts.prefix or ""
  local keep = opts.keep_vars
  for _, h in ipairs(state_dict_hooks(self, "save_pre")) do h.fn(self, prefix, keep) end
  for _, k in ipairs(self._parameters.keys) do
    local p = self._parameters.map[k]
    if p ~= nil then sd_put(sd, prefix .. k, keep and p or p:detach()) end
  end
  for _, k in ipairs(self._buffers.keys) do
    local b = self._buffers.map[k]
    if b ~= nil and not self._non_persistent[k] then sd_put(sd, prefix .. k, keep and b or b:detach()) end
  end
  if self.get_extra_state ~= nil then sd_put(sd, prefix .. EXTRA, self:get_extra_state()) end
  for _, k in ipairs(self._modules.keys) do
    local m = self._modules.map[k]
    if m ~= nil then m:state_dict({ prefix = prefix .. k .. ".", keep_vars = keep }, sd) end
  end
  for _, h in ipairs(state_dict_hooks(self, "save_post")) do h.fn(self, sd, prefix) end
  return sd
end

local function quoted(list)
  local q = {}
  for i, k in ipairs(list) do q[i] = '"' .. k .. '"' end
  return table.concat(q, ", ")
end

-- load_state_dict(sd [, {strict=true}] or strict): copies every entry into
-- the existing parameters and buffers under no_grad. Errors list the
-- missing keys, the unexpected keys and every shape mismatch, in PyTorch's
-- words; shape mismatches are errors also with strict=false. Returns
-- {missing_keys=, unexpected_keys=}.
function Module:load_state_dict(sd, opts)
  if type(sd) ~= "table" or is_module(sd) then
    raise("load_state_dict: expected a state dict (a table of name -> tensor), got " .. type(sd))
  end
  local strict = true
  if type(opts) == "boolean" then strict = opts elseif type(opts) == "table" and opts.strict ~= nil then strict = opts.strict end
  -- every module's prefix, for the hooks and the extra states
  local tree = self:named_modules()
  local post_hooks = false
  for _, e in ipairs(tree) do
    local prefix = e[1] == "" and "" or e[1] .. "."
    for _, h in ipairs(state_dict_hooks(e[2], "load_pre")) do h.fn(e[2], sd, prefix) end
    post_hooks = post_hooks or #state_dict_hooks(e[2], "load_post") > 0
  end
  local own = self:state_dict({ keep_vars = true })
  local own_keys = sd_methods.keys(own)
  local extra = {}   -- key -> the module whose set_extra_state takes it
  for _, e in ipairs(tree) do
    if e[2].set_extra_state ~= nil then extra[(e[1] == "" and "" or e[1] .. ".") .. EXTRA] = e[2] end
  end
  local missing, unexpected, errors = {}, {}, {}
  local copies, extras = {}, {}
  for _, k in ipairs(own_keys) do
    local v = rawget(sd, k)
    if v == nil then
      if extra[k] or is_tensor(rawget(own, k)) then missing[#missing + 1] = k end
    elseif extra[k] then
      extras[#extras + 1] = { extra[k], v }
    elseif not is_tensor(rawget(own, k)) then
      -- (extra state of a module that can save it but not load it: left as it is)
    elseif not is_tensor(v) then
      errors[#errors + 1] = string.format('While copying the parameter named "%s", expected a Tensor from checkpoint but received %s', k, type(v))
    else
      local dst = rawget(own, k)
      local ds, ss = tostring(dst:size()), tostring(v:size())
      if ds ~= ss then
        errors[#errors + 1] = string.format("size mismatch for %s: copying a param with shape %s from checkpoint, "
                                            .. "the shape in current model is %s.", k, ss, ds)
      else
        copies[#copies + 1] = { dst, v }
      end
    end
  end
  local given = sd_order[sd] and sd_methods.keys(sd) or nil
  if not given then
    given = {}
    for k in pairs(sd) do if type(k) == "string" then given[#given + 1] = k end end
    table.sort(given)
  end
  for _, k in ipairs(given) do
    if rawget(own, k) == nil then unexpected[#unexpected + 1] = k end
  end
  local incompatible = { missing_keys = missing, unexpected_keys = unexpected }
  local function check_strict()
    if strict then
      local m, u = incompatible.missing_keys, incompatible.unexpected_keys
      if #u > 0 then table.insert(errors, 1, "Unexpected key(s) in state_dict: " .. quoted(u) .. ". ") end
      if #m > 0 then table.insert(errors, 1, "Missing key(s) in state_dict: " .. quoted(m) .. ". ") end
    end
    if #errors > 0 then
      raise(string.format("Error(s) in loading state_dict for %s:\n\t%s", self:_get_name(), table.concat(errors, "\n\t")))
    end
  end
  -- without post hooks nothing is loaded when anything is wrong; with them
  -- (which may forgive keys), the entries that fit are loaded first, as in PyTorch
  if not post_hooks or #errors > 0 then check_strict() end
  torch.no_grad(function()
    for _, c in ipairs(copies) do c[1]:copy_(c[2]) end
  end)
  for _, c in ipairs(extras) do c[1]:set_extra_state(c[2]) end
  if post_hooks then
    for _, e in ipairs(tree) do
      for _, h in ipairs(state_dict_hooks(e[2], "load_post")) do h.fn(e[2], incompatible) end
    end
    check_strict()
  end
  return incompatible
end

-- register_backward_hook(fn): PyTorch's deprecated name; here the full hook
function Module:register_backward_hook(fn) return self:register_full_backward_hook(fn) end

-- to_empty({device =}): every parameter and buffer replaced by an
-- uninitialised tensor of its shape and dtype on device (PyTorch's way out
-- of the meta device; here a quick way to allocate a model's storage)
function Module:to_empty(opts)
  local device = type(opts) == "table" and opts.device or opts
  if device == nil then raise("to_empty: expected {device =}") end
  for _, m in ipairs(self:modules()) do
    for _, which in ipairs({ "_parameters", "_buffers" }) do
      for _, k in ipairs(m[which].keys) do
        local t = m[which].map[k]
        if t ~= nil then
          local e = torch.empty(t:size(), { dtype = t.dtype, device = device })
          if which == "_parameters" then
            m[k] = nil
            m[k] = torch.nn.Parameter(e, t.requires_grad)
          else
            m[which].map[k] = e
          end
        end
      end
    end
  end
  return self
end

---------------------------------------------------------------- moving

-- Reads to()'s arguments: a dtype, a device, a tensor (its dtype and
-- device), or {dtype=, device=}.
local function to_args(a, b)
  local dtype, device
  local function take(x)
    if x == nil then return end
    if is_tensor(x) then dtype, device = x.dtype, x.device
    elseif getmetatable(x) == torch.dtype_mt then dtype = x
    elseif type(x) == "string" and torch[x:gsub("^torch%.", "")] ~= nil
           and getmetatable(torch[x:gsub("^torch%.", "")]) == torch.dtype_mt then
      dtype = torch[x:gsub("^torch%.", "")]
    elseif type(x) == "table" and getmetatable(x) == nil then
      dtype, device = x.dtype or dtype, x.device or device
    else device = x end
  end
  take(a); take(b)
  if dtype and not dtype.is_floating_point then
    raise("Module.to: only floating point dtypes are accepted, but got desired dtype=" .. tostring(dtype))
  end
  return dtype, device
end

local function converted(t, dtype, device)
  local dt = (dtype and t:is_floating_point()) and dtype or t.dtype
  local dev = device and torch.device(device) or t.device
  if dt == t.dtype and dev == t.device then return nil end
  return t:to(dev, dt)
end

-- to(device | dtype | tensor | {dtype=, device=}): moves and casts every
-- parameter and buffer (dtype: floating ones only, as PyTorch). A parameter
-- that changes is replaced by a new Parameter holding the converted data
-- (and gradient): references taken before, e.g. by an optimizer, keep the
-- old tensor, so move the model before building its optimizer, as PyTorch
-- recommends. Returns self.
function Module:to(a, b)
  local dtype, device = to_args(a, b)
  local memo = {}   -- old parameter -> new one, so tied weights stay tied
  torch.no_grad(function()
    for _, m in ipairs(self:modules()) do
      for _, k in ipairs(m._parameters.keys) do
        local p = m._parameters.map[k]
        local np = p ~= nil and memo[p]
        local data = p ~= nil and not np and converted(p, dtype, device)
        if data then
          np = M.Parameter(data, p.requires_grad)
          local g = p.grad
          if g ~= nil then np.grad = g:to(np.device, np.dtype) end
          memo[p] = np
        end
        if np then od_set(m._parameters, k, np) end
      end
      for _, k in ipairs(m._buffers.keys) do
        local buf = m._buffers.map[k]
        local data = buf ~= nil and converted(buf, dtype, device)
        if data then od_set(m._buffers, k, data) end
      end
    end
  end)
  return self
end
function Module:float() return self:to(torch.float32) end
function Module:double() return self:to(torch.float64) end
function Module:bfloat16() return self:to(torch.bfloat16) end
function Module:type(dst_type) return self:to(dst_type) end
function Module:half() raise("half: float16 is not a dplua dtype; bfloat16() and torch.autocast give half-width floats") end
function Module:cpu() return self:to("cpu") end
function Module:cuda(index) return self:to(index and ("cuda:" .. index) or "cuda") end

---------------------------------------------------------------- copying

-- A deep copy of v: modules, parameters (new leaves holding copies of
-- the data), buffers and plain tables; functions, dtypes and other values
-- are shared. memo maps what was copied to its copy, so that a value met
-- twice (tied weights, a shared child) is copied once.
local function deepcopy(v, memo)
  if memo[v] ~= nil then return memo[v] end
  local c
  if is_tensor(v) then
    if is_parameter(v) then c = M.Parameter(v:detach():clone(), v.requires_grad)
    else c = v:detach():clone() end
  elseif is_module(v) then
    c = setmetatable({ _parameters = od_new(), _buffers = od_new(), _modules = od_new(), _non_persistent = {},
                       _attrs = {}, training = rawget(v, "training") }, getmetatable(v))
    memo[v] = c
    for _, which in ipairs({ "_parameters", "_buffers", "_modules" }) do
      local od = rawget(v, which)
      for _, k in ipairs(od.keys) do
        local x = od.map[k]
        od_set(rawget(c, which), k, x ~= nil and deepcopy(x, memo) or nil)
      end
    end
    for k in pairs(rawget(v, "_non_persistent")) do rawget(c, "_non_persistent")[k] = true end
    for k, x in pairs(rawget(v, "_attrs")) do rawget(c, "_attrs")[k] = deepcopy(x, memo) end
  elseif type(v) == "table" and getmetatable(v) == nil then
    c = {}
    memo[v] = c
    for k, x in pairs(v) do c[deepcopy(k, memo)] = deepcopy(x, memo) end
  else
    c = v
  end
  memo[v] = c
  return c
end

-- m:deepcopy(): Python's copy.deepcopy(m), a module of the same class with
-- its own copies of every parameter, buffer, child and attribute.
function Module:deepcopy() return deepcopy(self, {}) end

---------------------------------------------------------------- printing

-- Python's repr of a float (1e-05, 0.5, 1.0), for extra_repr strings.
function M.pyfloat(x)
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" end
  if x == -math.huge then return "-inf" end
  local s
  for prec = 1, 17 do
    s = string.format("%." .. prec .. "g", x)
    if tonumber(s) == x then break end
  end
  local mant, exp = s:match("^(-?[%d.]+)e([-+]%d+)$")
  local e = exp and tonumber(exp) or nil
  if e == nil then
    local digits = s:gsub("^-", "")
    if not digits:find("%.") then s = s .. ".0" end
    return s
  end
  if e >= -4 and e < 16 then
    -- %g went exponential below 1e-4 only; widen back to fixed notation
    s = string.format("%." .. math.max(0, #mant:gsub("[-.]", "") - 1 - e) .. "f", x)
    if not s:find("%.") then s = s .. ".0" end
    return s
  end
  return string.format("%se%s%02d", mant, e < 0 and "-" or "+", math.abs(e))
end

-- Python's repr of a value in extra_repr: booleans True/False, tables as tuples.
function M.pyrepr(v)
  if type(v) == "boolean" then return v and "True" or "False" end
  if v == nil then return "None" end
  if type(v) == "number" then return v % 1 == 0 and math.abs(v) < 1e15 and string.format("%d", v) or M.pyfloat(v) end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = M.pyrepr(x) end
    return "(" .. table.concat(parts, ", ") .. (#parts == 1 and ",)" or ")")
  end
  return tostring(v)
end

function Module:extra_repr() return "" end

local function addindent(s, n)
  local lines = {}
  for line in (s .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
  if #lines == 1 then return s end
  local pad = string.rep(" ", n)
  for i = 2, #lines do lines[i] = pad .. lines[i] end
  return table.concat(lines, "\n")
end

-- tostring(module): PyTorch's repr, character for character.
function Module:__repr()
  local extra_lines = {}
  local extra = self:extra_repr()
  if extra and extra ~= "" then
    for line in (extra .. "\n"):gmatch("(.-)\n") do extra_lines[#extra_lines + 1] = line end
  end
  local child_lines = {}
  for _, k in ipairs(self._modules.keys) do
    local m = self._modules.map[k]
    local mod_str = m ~= nil and tostring(m) or "None"
    child_lines[#child_lines + 1] = "(" .. k .. "): " .. addindent(mod_str, 2)
  end
  local lines = {}
  for _, l in ipairs(extra_lines) do lines[#lines + 1] = l end
  for _, l in ipairs(child_lines) do lines[#lines + 1] = l end
  local s = self:_get_name() .. "("
  if #lines > 0 then
    if #extra_lines == 1 and #child_lines == 0 then
      s = s .. extra_lines[1]
    else
      s = s .. "\n  " .. table.concat(lines, "\n  ") .. "\n"
    end
  end
  return s .. ")"
end

M.pair_list = pair_list
return M
