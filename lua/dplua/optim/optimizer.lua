-- dplua.optim.optimizer: the Optimizer base class of SGD, Adam(W) and the
-- optimizers of optim.define (RMSprop, Adagrad, Adadelta, a user's own).
--
-- Each parameter group is flattened once, at construction, with
-- torch._flatten_params: its parameters become views of one flat buffer and
-- their gradients land in one flat gradient buffer (per dtype and device;
-- a group mixing them gets one bucket for each). The optimizer state
-- (momentum, exp_avg, ...) is a flat buffer beside them, so step() is one
-- fused C call per bucket over the flat buffers.
--
-- PyTorch skips parameters whose .grad is nil: their state does not
-- advance. When some parameters of a bucket have no gradient (or a
-- gradient that is not in their flat slot, e.g. assigned by hand), or their
-- step counts have diverged, the bucket falls back to one call per
-- parameter, on views of the same flat buffers. Step counts are kept per
-- parameter in that case and collapse back to one count when they agree.
--
-- state_dict() and load_state_dict() use PyTorch's layout:
--   { state = { [0] = {step=, exp_avg=, exp_avg_sq=}, [1] = ... },
--     param_groups = { {lr=, betas=, ..., params={0, 1}} } }
-- with 0-based parameter indices in group order; `step` is a Lua number
-- (a 0-d tensor is accepted on load), the state tensors are views of the
-- flat state buffers.
local ffi = require("ffi")
local torch = require("dplua")
local raise = torch._raise
local C = torch.C

local Optimizer = {}
Optimizer.__index = Optimizer
Optimizer.__name = "Optimizer"


local function typename(x) return torch.is_tensor(x) and "Tensor" or type(x) end

local function copy_value(v)
  if type(v) ~= "table" or torch.is_tensor(v) then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = copy_value(x) end
  return c
end
-- (param group options are copied so; ZeroRedundancyOptimizer copies its groups the same way)
Optimizer._copy_value = copy_value

-- A subclass: Cls(params, opts) builds an instance.
function Optimizer.extend(name)
  local cls = setmetatable({}, { __index = Optimizer, __call = function(c, ...) return c.new(...) end })
  cls.__index = cls
  cls.__name = name
  cls.__tostring = Optimizer.__tostring
  return cls
end

---------------------------------------------------------------- construction

-- params: a list of tensors, model:parameters(), model:named_parameters(),
-- or a list of group tables { {params=..., lr=...}, ... }.
local function to_groups(params, fn)
  if torch.is_tensor(params) then
    raise(fn .. ": params should be a list of tensors or of param-group tables, but got a single Tensor (write {t})")
  end
  if type(params) ~= "table" then
    raise(fn .. ": params should be a list of tensors or of param-group tables, got " .. typename(params))
  end
  if params[1] == nil then raise(fn .. ": optimizer got an empty parameter list") end
  local first = params[1]
  if torch.is_tensor(first) or (type(first) == "table" and type(first[1]) == "string") then
    return { { params = params } }
  end
  if type(first) ~= "table" then
    raise(string.format("%s: optimizer can only optimize Tensors, but parameter 1 is %s", fn, typename(first)))
  end
  return params
end

-- Options not in the defaults that PyTorch users pass; accepted and ignored
-- (every step here is fused) unless they ask for something unsupported.
local ignored = { foreach = true, fused = true, capturable = true, differentiable = true }

local function check_options(self, opts)
  for k, v in pairs(opts) do
    if self.defaults[k] == nil and not ignored[k] then
      raise(string.format("%s: unknown option '%s'", self.__name, tostring(k)))
    end
  end
end

local state_proxy   -- opt.state (below, beside the state dicts)

function Optimizer.init(self, params, opts, defaults)
  opts = opts or {}
  if type(opts) ~= "table" then raise(self.__name .. ": expected an options table, got " .. typename(opts)) end
  self.defaults = {}
  for k, v in pairs(defaults) do self.defaults[k] = copy_value(v) end
  -- every optimizer ascends with maximize, as PyTorch's (step_buckets)
  if self.defaults.maximize == nil then self.defaults.maximize = false end
  check_options(self, opts)
  for k, v in pairs(opts) do if self.defaults[k] ~= nil then self.defaults[k] = copy_value(v) end end
  self:_validate(self.defaults)
  self.param_groups = {}
  self._buckets = {}      -- per group: a list of buckets
  self._where = {}        -- param -> { bucket, index in bucket }
  self._step_count = 0
  self.state = state_proxy(self)
  for _, g in ipairs(to_groups(params, self.__name)) do self:add_param_group(g) end
  return self
end

-- Splits a bucket whose parameters all lie in flat buffers already (a
-- DDP's, or another optimizer's) into runs of neighbours there, which then
-- stay where they are: moved into a buffer of this group's own, they would
-- leave the DDP's, and its all-reduce would no longer see their gradients.
-- A group that is one run (the usual case) stays one bucket; parameters
-- of their own storages are flattened together as before.
local run_buf = ffi.new("dp_tensor*[?]", 4096)
local function split_in_place(b)
  local n = #b.params
  if n > 4096 then return { b } end
  for j, p in ipairs(b.params) do run_buf[j - 1] = p.p end
  local runs, i = {}, 0
  while i < n do
    local k = C.dp_flat_run_length(n - i, run_buf + i)
    if k == 0 then return { b } end
    local run = { params = {} }
    for j = i + 1, i + k do run.params[#run.params + 1] = b.params[j] end
    runs[#runs + 1] = run
    i = i + k
  end
  return runs
end

-- A group's parameters in buckets of one dtype and device, each flattened.
local function make_buckets(self, params)
  local by_key, keys = {}, {}
  for _, p in ipairs(params) do
    local key = tostring(p.dtype) .. "@" .. tostring(p.device)
    local b = by_key[key]
    if not b then
      b = { params = {} }
      by_key[key], keys[#keys + 1] = b, key
    end
    b.params[#b.params + 1] = p
  end
  local order = {}
  for _, key in ipairs(keys) do
    for _, run in ipairs(split_in_place(by_key[key])) do order[#order + 1] = run end
  end
  for _, b in ipairs(order) do
    b.flat_param, b.flat_grad = torch._flatten_params(b.params)
    b.offsets, b.numels = {}, {}
    local off = 0
    for j, p in ipairs(b.params) do
      b.offsets[j], b.numels[j] = off, p:numel()
      off = off + b.numels[j]
      self._where[p] = { b, j }
    end
    b.itemsize = b.params[1].dtype.itemsize
    b.step, b.steps, b.state = 0, nil, {}
    -- the same, as C arrays for dp_flat_grad_status (b.params keeps the tensors alive)
    b.c_params, b.c_offsets = ffi.new("dp_tensor*[?]", #b.params), ffi.new("int64_t[?]", #b.params)
    for j, p in ipairs(b.params) do b.c_params[j - 1], b.c_offsets[j - 1] = p.p, b.offsets[j] end
  end
  return order
end

-- add_param_group({params=..., lr=..., ...}): missing options come from
-- the defaults.
function Optimizer:add_param_group(group)
  local fn = self.__name
  if type(group) ~= "table" or torch.is_tensor(group) then
    raise(fn .. ": expected a param group table {params=..., ...}, got " .. typename(group))
  end
  local params = group.params
  if torch.is_tensor(params) then params = { params } end
  if type(params) ~= "table" then raise(fn .. ": a param group needs a 'params' list of tensors") end
  local list = {}
  for i, p in ipairs(params) do
    if type(p) == "table" and torch.is_tensor(p[2]) then p = p[2] end   -- {name, param} pairs
    if not torch.is_tensor(p) then
      raise(string.format("%s: optimizer can only optimize Tensors, but parameter %d is %s", fn, i, typename(p)))
    end
    if not p.is_leaf then raise(string.format("%s: can't optimize a non-leaf Tensor (parameter %d)", fn, i)) end
    if self._where[p] then raise(fn .. ": some parameters appear in more than one parameter group") end
    for j = 1, i - 1 do
      if list[j] == p then raise(fn .. ": a parameter group holds the same parameter twice") end
    end
    list[i] = p
  end
  if #list == 0 then raise(fn .. ": optimizer got an empty parameter list") end
  local g = {}
  for k, v in pairs(group) do g[k] = copy_value(v) end
  g.params = list
  for k, v in pairs(self.defaults) do if g[k] == nil then g[k] = copy_value(v) end end
  if type(g.maximize) ~= "boolean" then raise(fn .. ": expected maximize to be a boolean, got " .. typename(g.maximize)) end
  self:_validate(g)
  local buckets = make_buckets(self, list)
  self.param_groups[#self.param_groups + 1] = g
  self._buckets[#self.param_groups] = buckets
end

---------------------------------------------------------------- gradients

-- all: every parameter has its gradient in its flat slot; any: some have one.
local all_box, any_box = ffi.new("int[1]"), ffi.new("int[1]")
local function grad_status(b, fn)
  local st = C.dp_flat_grad_status(fn, b.flat_param.p, b.flat_grad.p, #b.params, b.c_params, b.c_offsets, all_box,
                                   any_box)
  if st ~= 0 then raise(ffi.string(C.dp_last_error())) end
  return all_box[0] ~= 0, any_box[0] ~= 0
end
Optimizer._grad_status = grad_status

-- zero_grad({set_to_none=true}): drops the gradients (the flat slots stay,
-- the next backward writes into them); set_to_none=false zeroes them.
function Optimizer:zero_grad(opts)
  local set_to_none = true
  if type(opts) == "table" and opts.set_to_none ~= nil then set_to_none = opts.set_to_none
  elseif type(opts) == "boolean" then set_to_none = opts end
  for _, group in ipairs(self.param_groups) do
    for _, p in ipairs(group.params) do
      if set_to_none then
        p.grad = nil
      else
        local g = p.grad
        if g ~= nil then g:zero_() end
      end
    end
  end
end

---------------------------------------------------------------- stepping

-- State made during a CUDA graph capture would be made again (zeroed) by
-- every replay: as in PyTorch, steps must run eagerly before a capture.
function Optimizer._no_new_state_in_capture(self_name, what)
  if torch.cuda.is_current_stream_capturing() then
    raise(string.format("%s.step: its %s would be created inside a CUDA graph capture, and every replay would reset "
                        .. "it: run a step eagerly before torch.cuda.graph (as in PyTorch)", self_name, what))
  end
end

-- A flat state buffer of the bucket, created as zeros on first use (of
-- the parameters' dtype unless dtype is given).
function Optimizer._state_buffer(b, name, self_name, dtype)
  local s = b.state[name]
  if s == nil then
    Optimizer._no_new_state_in_capture(self_name or "optimizer", name)
    s = torch.zeros_like(b.flat_param, { dtype = dtype })
    b.state[name] = s
  end
  return s
end

local function narrow(t, b, j)
  if t == nil then return nil end
  return t:narrow(0, b.offsets[j], b.numels[j])
end
Optimizer._narrow = narrow

-- Per-parameter fallback: calls fn(j, grad) for every parameter with a
-- gradient and advances its own step count.
function Optimizer._each_with_grad(b, fn)
  if b.steps == nil then
    b.steps = {}
    for j = 1, #b.params do b.steps[j] = b.step end
  end
  for j, p in ipairs(b.params) do
    local g = p.grad
    if g ~= nil then
      fn(j, g:contiguous():reshape(-1), b.steps[j])   -- (a gradient set by hand may be a view)
      b.steps[j] = b.steps[j] + 1
    end
  end
  local s = b.steps[1]
  for j = 2, #b.steps do if b.steps[j] ~= s then return end end
  b.step, b.steps = s, nil
end

-- maximize: PyTorch's optimizers step with -grad. When every gradient is
-- its slot of the bucket's flat buffer, that buffer is negated in place
-- around the step and negated back (exactly: a sign flip); otherwise each
-- parameter's gradient is swapped for a negated copy and put back (they
-- may be shared between parameters, views or expanded). Either way every
-- update, a user's included, ascends and p.grad is left as it was.
local function step_negated(self, group, b, all)
  if all then
    b.flat_grad:neg_()
    local ok, err = pcall(self._step_bucket, self, group, b, b.steps == nil)
    b.flat_grad:neg_()
    if not ok then error(err, 0) end
    return
  end
  local kept = {}
  for j, p in ipairs(b.params) do
    local g = p.grad
    kept[j] = g
    if g ~= nil then p.grad = g:neg() end
  end
  local ok, err = pcall(self._step_bucket, self, group, b, false)
  for j, p in ipairs(b.params) do p.grad = kept[j] end
  if not ok then error(err, 0) end
end

-- A named function rather than a closure made per call: creating a
-- closure is not compiled by LuaJIT and would leave every step interpreted.
local function step_buckets(self)
  for gi, group in ipairs(self.param_groups) do
    for _, b in ipairs(self._buckets[gi]) do
      local all, any = grad_status(b, self.__name)
      if any then
        if group.maximize then step_negated(self, group, b, all)
        else self:_step_bucket(group, b, all and b.steps == nil) end
      end
    end
  end
end

-- step([closure]): one fused update per bucket, under no_grad; the closure
-- (if any) recomputes the loss with grad enabled and its value is returned.
local function fused_step(self, closure)
  local loss
  if closure ~= nil then
    if type(closure) ~= "function" then raise(self.__name .. ".step: expected a closure function, got " .. typename(closure)) end
    loss = torch.enable_grad(closure)
  end
  torch.no_grad(step_buckets, self)
  self._step_count = self._step_count + 1
  return loss
end

---------------------------------------------------------------- hooks

-- Step hooks, PyTorch's: for every optimizer (optim.optimizer.register_
-- optimizer_step_pre_hook / _post_hook) and for one (opt:register_step_
-- pre_hook / _post_hook). hook(optimizer, args), args the list of step's
-- arguments; a pre hook may return a new list. The global pre hooks run
-- first, then the optimizer's; after the step its post hooks, then the
-- global ones. Each register returns a handle whose :remove() takes it out.
local global_hooks = { pre = {}, post = {} }
local any_global_hook = false

local function check_hook(fn, what)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    raise(what .. ": expected a function, got " .. typename(fn))
  end
end

local function hooks_of(self)
  local h = rawget(self, "_hooks")
  if h == nil then
    h = { pre = {}, post = {}, state_dict_pre = {}, state_dict_post = {}, load_pre = {}, load_post = {} }
    rawset(self, "_hooks", h)
  end
  return h
end

local function add_hook(list, fn, what)
  check_hook(fn, what)
  return require("dplua.autograd")._handle(list, { fn = fn })
end

-- runs the hooks of lists in order (each list copied: a hook may remove
-- itself); returns the last list a pre hook returned, or args
local function run_hooks(lists, self, args, what)
  for _, list in ipairs(lists) do
    for _, h in ipairs({ unpack(list) }) do
      local r = h.fn(self, args)
      if r ~= nil then
        if type(r) ~= "table" then
          raise(string.format("%s must return nil or a list of new arguments, but got %s", what, typename(r)))
        end
        args = r
      end
    end
  end
  return args
end

-- step_fn(self, ...) with the hooks around it
function Optimizer._hooked_step(self, step_fn, ...)
  local h = rawget(self, "_hooks")
  if not any_global_hook and (h == nil or (#h.pre == 0 and #h.post == 0)) then return step_fn(self, ...) end
  h = h or hooks_of(self)
  local args = run_hooks({ global_hooks.pre, h.pre }, self, { n = select("#", ...), ... }, "a step pre hook")
  local loss = step_fn(self, unpack(args, 1, args.n or #args))
  run_hooks({ h.post, global_hooks.post }, self, args, "a step post hook")
  return loss
end

function Optimizer:step(...) return Optimizer._hooked_step(self, fused_step, ...) end

-- The registrations of one optimizer's hooks, by the list each fills.
-- The step's: hook(optimizer, args) as above. The state dicts': a pre hook
-- runs hook(optimizer) before state_dict(), a post hook hook(optimizer,
-- state_dict) after it and may return a new one; a load pre hook
-- hook(optimizer, state_dict) before load_state_dict() and may return the
-- dict to load, a load post hook hook(optimizer) after it.
for name, list in pairs({ register_step_pre_hook = "pre", register_step_post_hook = "post",
                          register_state_dict_pre_hook = "state_dict_pre",
                          register_state_dict_post_hook = "state_dict_post",
                          register_load_state_dict_pre_hook = "load_pre",
                          register_load_state_dict_post_hook = "load_post" }) do
  Optimizer[name] = function(self, fn) return add_hook(hooks_of(self)[list], fn, name) end
end
-- for every optimizer's step
function Optimizer.register_optimizer_step_pre_hook(fn)
  any_global_hook = true
  return add_hook(global_hooks.pre, fn, "register_optimizer_step_pre_hook")
end
function Optimizer.register_optimizer_step_post_hook(fn)
  any_global_hook = true
  return add_hook(global_hooks.post, fn, "register_optimizer_step_post_hook")
end

-- fn(self, v) with the hooks of kind pre and post around it: a hook's
-- value, where it returns one, replaces v (the state dict)
local function with_dict_hooks(self, pre, post, fn, v)
  local h = rawget(self, "_hooks")
  if h == nil then return fn(self, v) end
  for _, hk in ipairs({ unpack(h[pre]) }) do
    local r = hk.fn(self, v)
    if r ~= nil and v ~= nil then v = r end
  end
  local out = fn(self, v)
  for _, hk in ipairs({ unpack(h[post]) }) do
    local r = hk.fn(self, out)
    if r ~= nil and out ~= nil then out = r end
  end
  return out
end

---------------------------------------------------------------- state dicts

-- A capturable optimizer's count lives in b.step_t (replays of a CUDA
-- graph advance it, not b.step). _sync_step brings b.step up to date from
-- it before b.step is read by parameter; _store_step writes a changed
-- b.step back into the same tensor (a graph may hold its memory, so it is
-- never replaced).
function Optimizer._sync_step(b)
  if b.step_t ~= nil then b.step = b.step_t:item() end
end

function Optimizer._store_step(b)
  if b.step_t ~= nil and b.steps == nil then b.step_t:fill_(b.step) end
end

local function param_step(b, j) return b.steps and b.steps[j] or b.step end

-- The state of parameter p (its bucket b, its index j there; b's step
-- brought up to date): a table of views of the flat state buffers in p's
-- shape, or nil before p's first step
local function param_state(self, p, b, j)
  local step = param_step(b, j)
  if step == 0 then return nil end
  local st = self:_param_state(b, j, step)
  if st ~= nil then
    -- the flat buffers' slices take p's shape (Adafactor's own tensors have theirs)
    local shape, n = p:size(), p:numel()
    for k, v in pairs(st) do
      if torch.is_tensor(v) and v:dim() == 1 and v:numel() == n then st[k] = v:view(shape) end
    end
  end
  return st
end

-- opt.state: PyTorch's optimizer.state, indexed by parameter (opt.state[p]
-- is param_state's table, nil before p's first step), and pairs(opt.state)
-- walks the parameters that have state, in group order
state_proxy = function(self)
  local function lookup(p)
    local where = torch.is_tensor(p) and self._where[p]
    if not where then return nil end
    Optimizer._sync_step(where[1])
    return param_state(self, p, where[1], where[2])
  end
  local function walk()
    local gi, i = 1, 0
    return function()
      while true do
        local group = self.param_groups[gi]
        if group == nil then return nil end
        i = i + 1
        local p = group.params[i]
        if p == nil then
          gi, i = gi + 1, 0
        else
          local st = lookup(p)
          if st ~= nil then return p, st end
        end
      end
    end
  end
  return setmetatable({}, {
    __index = function(_, p) return lookup(p) end,
    __newindex = function() raise(self.__name .. ".state: the state lives in the optimizer's flat buffers; "
                                  .. "change it in place (opt.state[p].exp_avg:zero_()) or through load_state_dict") end,
    __pairs = walk,
  })
end

local function state_dict(self)
  local state, groups, idx = {}, {}, 0
  for gi in ipairs(self.param_groups) do
    for _, b in ipairs(self._buckets[gi]) do Optimizer._sync_step(b) end
  end
  for gi, group in ipairs(self.param_groups) do
    local g = {}
    for k, v in pairs(group) do if k ~= "params" then g[k] = copy_value(v) end end
    local ids = {}
    for i, p in ipairs(group.params) do
      ids[i] = idx
      local where = self._where[p]
      state[idx] = param_state(self, p, where[1], where[2])
      idx = idx + 1
    end
    g.params = ids
    groups[gi] = g
  end
  return { state = state, param_groups = groups }
end

local function load_state_dict(self, sd)
  local fn = self.__name .. ".load_state_dict"
  if type(sd) ~= "table" or type(sd.param_groups) ~= "table" then
    raise(fn .. ": expected a state dict with 'state' and 'param_groups'")
  end
  local saved = sd.param_groups
  if #saved ~= #self.param_groups then
    raise(string.format("%s: loaded state dict has a different number of parameter groups (%d, the optimizer has %d)",
                        fn, #saved, #self.param_groups))
  end
  for gi, group in ipairs(self.param_groups) do
    local ids = saved[gi].params or {}
    if #ids ~= #group.params then
      raise(string.format("%s: loaded state dict contains a parameter group that doesn't match the size of optimizer's group "
                          .. "(group %d: %d parameters, the optimizer has %d)", fn, gi - 1, #ids, #group.params))
    end
  end
  local state = sd.state or {}
  torch.no_grad(function()
    for gi, group in ipairs(self.param_groups) do
      local sg = saved[gi]
      for k, v in pairs(sg) do if k ~= "params" then group[k] = copy_value(v) end end
      for i, p in ipairs(group.params) do
        local where = self._where[p]
        local b, j = where[1], where[2]
        if b.steps == nil then
          b.steps = {}
          for jj = 1, #b.params do b.steps[jj] = b.step end
        end
        local st = state[sg.params[i]]
        local step = 0
        if st ~= nil then
          step = self:_load_param_state(b, j, st, fn, sg.params[i], group)
        end
        b.steps[j] = step
      end
    end
    for gi in ipairs(self.param_groups) do
      for _, b in ipairs(self._buckets[gi]) do
        if b.steps then
          local s = b.steps[1]
          local same = true
          for j = 2, #b.steps do same = same and b.steps[j] == s end
          if same then b.step, b.steps = s, nil end
        end
        Optimizer._store_step(b)
      end
    end
  end)
end

function Optimizer:state_dict() return with_dict_hooks(self, "state_dict_pre", "state_dict_post", state_dict) end
function Optimizer:load_state_dict(sd) with_dict_hooks(self, "load_pre", "load_post", load_state_dict, sd) end

-- Copies a saved state tensor into the bucket's flat buffer (of dtype, if given).
function Optimizer._load_buffer(b, j, name, value, fn, id, dtype)
  if not torch.is_tensor(value) then
    raise(string.format("%s: state[%d].%s should be a tensor, got %s", fn, id, name, typename(value)))
  end
  if value:numel() ~= b.numels[j] then
    raise(string.format("%s: state[%d].%s has %d elements, the parameter %d", fn, id, name, value:numel(), b.numels[j]))
  end
  narrow(Optimizer._state_buffer(b, name, nil, dtype), b, j):copy_(value:reshape(-1))
end

function Optimizer._step_number(v, fn, id)
  if torch.is_tensor(v) then v = v:item() end
  if type(v) ~= "number" or v < 0 or v % 1 ~= 0 then
    raise(string.format("%s: state[%d].step should be a non-negative integer, got %s", fn, id, tostring(v)))
  end
  return v
end

---------------------------------------------------------------- printing

local function pyrepr(v)
  if type(v) == "boolean" then return v and "True" or "False" end
  if v == nil then return "None" end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = pyrepr(x) end
    return "(" .. table.concat(parts, ", ") .. ")"
  end
  return tostring(v)
end

-- tostring(opt): PyTorch's layout ("SGD (\nParameter Group 0\n    lr: 0.1\n...)").
function Optimizer:__tostring()
  local lines = { self.__name .. " (" }
  for gi, group in ipairs(self.param_groups) do
    lines[#lines + 1] = "Parameter Group " .. (gi - 1)
    local keys = {}
    for k in pairs(group) do if k ~= "params" then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do lines[#lines + 1] = "    " .. k .. ": " .. pyrepr(group[k]) end
  end
  lines[#lines + 1] = ")"
  return table.concat(lines, "\n")
end

return Optimizer
