-- dplua.autograd (reached as torch.autograd): custom differentiable
-- functions (Function), gradients without .grad (grad), tensor hooks
-- (Tensor:register_hook) and gradient checking (gradcheck).
--
--   local Exp = torch.autograd.Function:extend("Exp")
--   function Exp.forward(ctx, x) local y = x:exp(); ctx:save_for_backward(y); return y end
--   function Exp.backward(ctx, g) local y = unpack(ctx.saved_tensors); return g * y end
--   local y = Exp.apply(x)
--   local gx = torch.autograd.grad(y:sum(), x)[1]
--
--   local x = torch.randn(3, 4, {dtype=torch.float64, requires_grad=true})
--   torch.autograd.gradcheck(function(a) return a:tanh():sum(1) end, {x})
--
-- gradcheck compares the full Jacobian from backward (one backward per
-- output element, on a retained graph) with central finite differences in
-- float64, element by element. It returns true, or raises an error that
-- names the input, its element, the output element and both values.
local ffi = require("ffi")
local torch = require("dplua")
local raise = torch._raise
local is_tensor = torch.is_tensor
local C = torch.C

local A = {}

local check = torch._check
local function pack(...) return { n = select("#", ...), ... } end
local function is_callable(f)
  return type(f) == "function" or (type(f) == "table" and getmetatable(f) ~= nil and getmetatable(f).__call ~= nil)
end
local function shape_str(t) return "[" .. table.concat(t:size(), ", ") .. "]" end
local function same_shape(a, b)
  local sa, sb = a:size(), b:size()
  if #sa ~= #sb then return false end
  for i = 1, #sa do if sa[i] ~= sb[i] then return false end end
  return true
end

---------------------------------------------------------------- Lua inside backward

-- The engine runs Lua for nodes whose backward is written in Lua
-- (torch.utils.checkpoint, Function) and for the hooks of tensors
-- (src/core/autograd.c, "Lua inside backward"); a graph without either
-- runs no Lua in its backward. entries[id] is the Lua side of one such
-- node or hooked tensor: e:run(grad, n, grads_in) sets grads_in[i] (a new
-- reference) for the node's i-th input, or grads_in[0] to replace a
-- hooked tensor's gradient. An entry goes when the engine says its node's
-- saved state or its tensor is gone.
local entries, next_id = {}, 0
local done_ids = ffi.new("int64_t[64]")

local function drop_done()
  repeat
    local k = C.dp_lua_nodes_done(done_ids, 64)
    for i = 0, k - 1 do entries[tonumber(done_ids[i])] = nil end
  until k < 64
end

-- A new entry's id (the caller drops it if its node is not recorded).
function A._new_entry(e)
  drop_done()
  next_id = next_id + 1
  entries[next_id] = e
  return next_id
end
function A._drop_entry(id) entries[id] = nil end

local callback = ffi.cast("dp_lua_backward", function(id, grad, n, grads_in, err, cap)
  local e = entries[tonumber(id)]
  local ok, msg
  if e == nil then
    ok, msg = false, "backward: the Lua state of a node was already freed"
  else
    ok, msg = pcall(e.run, e, grad, n, grads_in)
  end
  if ok then return 0 end
  msg = tostring(msg)
  local len = math.min(#msg, tonumber(cap) - 1)
  ffi.copy(err, msg, len)
  err[len] = 0
  return 1
end)
C.dp_set_lua_backward(callback)

-- A borrowed gradient from the engine, as a tensor of our own.
local function borrowed(p)
  if p == nil then return nil end
  C.dp_tensor_retain(p)
  return torch._wrap(p)
end

-- Hands g to the engine (a new reference).
local function give(g)
  C.dp_tensor_retain(g.p)
  return g.p
end

---------------------------------------------------------------- handles

-- What a register_*hook returns: handle:remove() takes the hook out
-- (again: nothing). PyTorch's torch.utils.hooks.RemovableHandle.
local Handle = {}
Handle.__index = Handle
function Handle:remove()
  local list = self._list
  for i = #list, 1, -1 do
    if list[i] == self._hook then table.remove(list, i) end
  end
  if #list == 0 and self._on_empty then self._on_empty() end
end
-- A handle for hook, an entry of list (list is kept in registration
-- order); on_empty, if given, runs when a remove() leaves list empty.
function A._handle(list, hook, on_empty)
  list[#list + 1] = hook
  return setmetatable({ _list = list, _hook = hook, _on_empty = on_empty }, Handle)
end

---------------------------------------------------------------- Tensor:register_hook

local function run_hooks(e, grad, n, grads_in)
  if n == 0 then   -- the leaf, its gradient accumulated: the post-accumulate hooks
    if #e.post > 0 then
      local leaf = borrowed(grad)
      for _, h in ipairs({ unpack(e.post) }) do h.fn(leaf) end
    end
    return
  end
  local g = borrowed(grad)
  local first = g
  for _, h in ipairs({ unpack(e.hooks) }) do   -- (a copy: a hook may remove itself)
    local r = h.fn(g)
    if r ~= nil then
      if not is_tensor(r) then
        raise("register_hook: a hook returned " .. type(r) .. "; expected a tensor (the new gradient) or nil")
      end
      if not same_shape(r, g) then
        raise("register_hook: a hook returned a gradient of shape " .. shape_str(r) .. ", expected the shape of "
              .. "the tensor's gradient " .. shape_str(g))
      end
      if r.dtype ~= g.dtype then
        raise("register_hook: a hook returned a gradient of dtype " .. tostring(r.dtype) .. ", expected "
              .. tostring(g.dtype))
      end
      g = r
    end
  end
  if g ~= first then grads_in[0] = give(g) end
end

-- t:register_hook(fn): fn(grad) runs whenever the gradient with respect
-- to t is computed, before it is accumulated into t.grad (a leaf) or
-- passed on along the graph; a tensor it returns replaces the gradient.
-- The tensor's hook entry (made on its first hook): its hooks and its
-- post-accumulate hooks.
local function hook_entry(t)
  local id = tonumber(C.dp_lua_hook_id(t.p))
  local e = id ~= 0 and entries[id] or nil
  if e == nil then
    e = { hooks = {}, post = {}, run = run_hooks }
    id = A._new_entry(e)
    local st = C.dp_set_lua_hook(t.p, id)
    if st ~= 0 then A._drop_entry(id); check(st) end
    -- once its last hook is removed the tensor calls no Lua again; the
    -- handle does not keep the tensor alive
    local owner = setmetatable({ t = t }, { __mode = "v" })
    e.on_empty = function()
      local o = owner.t
      if #e.hooks + #e.post == 0 and o ~= nil and tonumber(C.dp_lua_hook_id(o.p)) == id
         and C.dp_set_lua_hook(o.p, 0) == 0 then
        A._drop_entry(id)
      end
    end
  end
  return e
end

function A._register_hook(t, fn)
  if not is_callable(fn) then raise("register_hook: expected a function, got " .. type(fn)) end
  if not t.requires_grad then
    raise("register_hook: cannot register a hook on a tensor that doesn't require gradient")
  end
  local e = hook_entry(t)
  return A._handle(e.hooks, { fn = fn }, e.on_empty)
end

-- t:register_post_accumulate_grad_hook(fn): fn(t) runs once a backward has
-- accumulated t's gradient into t.grad (a leaf only), as PyTorch's: the
-- place for an optimizer step per parameter during backward, so that the
-- gradient can be dropped at once (torch.autograd.grad does not run it).
function A._register_post_accumulate_grad_hook(t, fn)
  local name = "register_post_accumulate_grad_hook"
  if not is_callable(fn) then raise(name .. ": expected a function, got " .. type(fn)) end
  if not t.requires_grad then raise(name .. ": cannot register a hook on a tensor that doesn't require gradient") end
  if not t.is_leaf then raise(name .. ": post accumulate grad hooks cannot be registered on non-leaf tensors") end
  local e = hook_entry(t)
  return A._handle(e.post, { fn = fn }, e.on_empty)
end

-- t:retain_grad(): a non-leaf tensor keeps its gradient in t.grad after
-- each backward, accumulated as a leaf's, through a hook that holds the
-- tensor weakly (a leaf keeps its gradient anyway: nothing to do).
local retaining = setmetatable({}, { __mode = "k" })
function A._retain_grad(t)
  if not t.requires_grad then raise("retain_grad: can't retain_grad on Tensor that has requires_grad=False") end
  if t.is_leaf or retaining[t] then return end
  retaining[t] = true
  local ref = setmetatable({ t = t }, { __mode = "v" })
  A._register_hook(t, function(g)
    local owner = ref.t
    if owner ~= nil then
      local old = owner.grad
      owner.grad = old ~= nil and old + g or g:detach():clone()
    end
  end)
end
function A._retains_grad(t) return retaining[t] == true end

---------------------------------------------------------------- Function

-- torch.autograd.Function: a differentiable operation whose forward and
-- backward are Lua functions.
--
--   local F2 = torch.autograd.Function:extend("MulAdd")
--   function F2.forward(ctx, a, b, k)       -- tensors and any other values
--     ctx:save_for_backward(a, b); ctx.k = k
--     return a * b * k, a + b               -- one result or several
--   end
--   function F2.backward(ctx, g1, g2)       -- one gradient per result
--     local a, b = unpack(ctx.saved_tensors)
--     return g1 * b * ctx.k + g2, g1 * a * ctx.k + g2, nil   -- one per argument
--   end
--   local y, s = F2.apply(a, b, 3)          -- F2:apply(a, b, 3) too
--
-- forward runs without recording; the results that are floating point
-- tensors (and not marked non-differentiable) then share one node, named
-- "<Name>Backward", whose backward calls backward(ctx, ...) with grad
-- mode off. A result that got no gradient is given zeros (unless
-- ctx:set_materialize_grads(false), then nil). backward returns one value
-- per argument of forward: a tensor of the argument's shape, or nil (for
-- an argument that is no tensor, or needs no gradient); trailing nils may
-- be left out, more values than arguments are an error unless nil.
local Function = {}
Function.__index = Function
A.Function = Function

local Ctx = {}
Ctx.__index = Ctx
function Ctx:save_for_backward(...)
  local saved = pack(...)
  for i = 1, saved.n do
    if saved[i] ~= nil and not is_tensor(saved[i]) then
      raise(string.format("save_for_backward: argument %d is %s; only tensors (or nil) can be saved", i, type(saved[i])))
    end
  end
  rawset(self, "saved_tensors", saved)
end
function Ctx:mark_non_differentiable(...)
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if not is_tensor(t) then raise("mark_non_differentiable: expected tensors, got " .. type(t)) end
    self._non_differentiable[#self._non_differentiable + 1] = t.p
  end
end
function Ctx:set_materialize_grads(flag) self._materialize = flag ~= false end

-- Function:extend("Name"): a new Function class; define Name.forward and
-- Name.backward on it, call Name.apply(...).
function Function.extend(parent, name)
  if parent ~= Function and (type(parent) ~= "table" or getmetatable(parent) ~= Function) then
    raise('Function.extend: call it as torch.autograd.Function:extend("Name") (with a colon)')
  end
  if type(name) ~= "string" or name == "" then
    raise('Function.extend: expected a class name string, e.g. Function:extend("MyExp"), got ' .. type(name))
  end
  local cls = setmetatable({ __name = name }, Function)
  cls.apply = function(...) return A._apply(cls, ...) end
  return cls
end
function Function.forward(ctx)
  raise("Function.forward: define forward(ctx, ...) on the Function class")
end
function Function.backward(ctx)
  raise("Function.backward: define backward(ctx, ...) on the Function class")
end

local args_buf = ffi.new("dp_tensor*[?]", 256)
local one_buf = ffi.new("dp_tensor*[1]")
local outp = ffi.new("dp_tensor*[1]")

local function lua_node(value, n, inputs, id, name)
  check(C.dp_lua_node(outp, value.p, n, inputs, id, name))
  return torch._wrap(outp[0])
end

-- The Function node's backward: the results' gradients gathered by the
-- result nodes (e.grads) go to cls.backward, whose answer is checked and
-- handed to the engine for the tensor arguments.
local function function_backward(e, _, _, grads_in)
  local cls, ctx, name = e.cls, e.ctx, e.name
  local gouts = {}
  for k = 1, e.nout do
    local g = e.grads[k]
    local o = e.outs[k]
    if g == nil and o and ctx._materialize then g = torch.zeros(o.shape, { dtype = o.dtype, device = o.device }) end
    gouts[k] = g
  end
  e.grads = {}
  local res = pack(cls.backward(ctx, unpack(gouts, 1, e.nout)))
  local nargs = e.nargs
  for i = nargs + 1, res.n do
    if res[i] ~= nil then
      raise(string.format("function %s returned an incorrect number of gradients (expected %d, got %d)",
                          name, nargs, res.n))
    end
  end
  for i = 1, nargs do
    local g, slot = res[i], e.slot[i]
    if g ~= nil then
      if not is_tensor(g) then
        raise(string.format("function %s returned a %s as the gradient of argument %d; expected a tensor or nil",
                            name, type(g), i))
      end
      if slot == nil then
        raise(string.format("function %s returned a gradient for argument %d, which is a %s, not a tensor; "
                            .. "return nil for it", name, i, e.arg_types[i]))
      end
      local shape = e.arg_shapes[i]
      if not same_shape(g, shape) then
        raise(string.format("function %s returned an invalid gradient for argument %d: got shape %s, expected %s",
                            name, i, shape_str(g), shape_str(shape)))
      end
      if ctx.needs_input_grad[i] then
        if g.dtype ~= shape.dtype then g = g:to(shape.dtype) end
        grads_in[slot] = give(g)
      end
    end
  end
end

-- A result's node: hands its gradient to the Function's node, which runs
-- after every result's node that this backward reaches.
local function result_backward(e, grad)
  local m = entries[e.parent]
  if m then m.grads[e.k] = borrowed(grad) end
end

-- What the node's backward checks a gradient against: the argument's
-- shape and dtype, without keeping the argument alive.
local function shape_of(t)
  local s = t:size()
  return setmetatable({ dtype = t.dtype }, { __index = { size = function() return s end } })
end

function A._apply(cls, ...)
  local args = pack(...)
  local first = 1
  if args[1] == cls then first = 2 end   -- cls:apply(...)
  local nargs = args.n - first + 1
  local ctx = setmetatable({ needs_input_grad = {}, _non_differentiable = {}, _materialize = true,
                             saved_tensors = {} }, Ctx)
  local fargs = {}
  local record = torch.is_grad_enabled()
  local any = false
  local ntensors = 0
  for i = 1, nargs do
    local a = args[first + i - 1]
    fargs[i] = a
    local needs = record and is_tensor(a) and a.requires_grad or false
    ctx.needs_input_grad[i] = needs
    any = any or needs
    if is_tensor(a) then ntensors = ntensors + 1 end
  end
  if ntensors > 256 then raise(cls.__name .. ".apply: at most 256 tensor arguments, got " .. ntensors) end
  local outs = pack(torch.no_grad(cls.forward, ctx, unpack(fargs, 1, nargs)))
  if not any then return unpack(outs, 1, outs.n) end
  local name = cls.__name .. "Backward"
  local non_diff = {}
  for _, p in ipairs(ctx._non_differentiable) do non_diff[tostring(ffi.cast("uintptr_t", p))] = true end
  local function differentiable(o)
    return is_tensor(o) and o:is_floating_point() and not non_diff[tostring(ffi.cast("uintptr_t", o.p))]
  end
  local anchor
  for k = 1, outs.n do
    if differentiable(outs[k]) then anchor = outs[k]; break end
  end
  if anchor == nil then return unpack(outs, 1, outs.n) end

  -- the Function's node, on a tensor that only the results' nodes hold
  local e = { run = function_backward, cls = cls, ctx = ctx, name = name, nargs = nargs, nout = outs.n,
              outs = {}, grads = {}, slot = {}, arg_shapes = {}, arg_types = {} }
  local j = 0
  for i = 1, nargs do   -- (filled after forward, which may apply Functions of its own)
    local a = fargs[i]
    e.arg_types[i] = type(a)
    if is_tensor(a) then
      args_buf[j] = a.p
      e.slot[i], e.arg_shapes[i], j = j, shape_of(a), j + 1
    end
  end
  local id = A._new_entry(e)
  local ok, hub = pcall(lua_node, anchor, ntensors, args_buf, id, name)
  if not ok then A._drop_entry(id); error(hub, 0) end

  local results = {}
  for k = 1, outs.n do
    local o = outs[k]
    if differentiable(o) then
      local rid = A._new_entry({ run = result_backward, parent = id, k = k })
      one_buf[0] = hub.p
      local ok2, r = pcall(lua_node, o, 1, one_buf, rid, name)
      if not ok2 then A._drop_entry(rid); error(r, 0) end
      e.outs[k] = { shape = o:size(), dtype = o.dtype, device = o.device }
      results[k] = r
    elseif is_tensor(o) and o.requires_grad then
      results[k] = o:detach()
    else
      results[k] = o
    end
  end
  return unpack(results, 1, outs.n)
end

---------------------------------------------------------------- grad

local function tensor_list(x, what, fn)
  fn = fn or "grad"
  if is_tensor(x) then return { x }, 1 end
  if type(x) ~= "table" then
    raise(string.format("%s: expected %s to be a tensor or a list of tensors, got %s", fn, what, type(x)))
  end
  local n = table.maxn(x)
  for i = 1, n do
    if not is_tensor(x[i]) then
      raise(string.format("%s: expected %s[%d] to be a tensor, got %s", fn, what, i, type(x[i])))
    end
  end
  if n == 0 then raise(fn .. ": " .. what .. " is empty") end
  return x, n
end

-- The walk may run Lua (a Function's backward, a hook), which LuaJIT
-- allows only from an FFI call it did not compile.
local function run_grad(nout, outs, gouts, nin, ins, res, retain)
  return C.dp_grad(nout, outs, gouts, nin, ins, res, retain and 1 or 0)
end
jit.off(run_grad)

-- grad(outputs, inputs [, {grad_outputs=, retain_graph=, create_graph=false,
-- allow_unused=false}]): the gradients of outputs (a tensor or a list)
-- with respect to inputs (a tensor or a list, leaves or not), as a list
-- with one tensor per input (nil for an unused input with allow_unused).
-- .grad of no tensor is touched. create_graph=true is not supported.
function A.grad(outputs, inputs, opts)
  if opts ~= nil and type(opts) ~= "table" then raise("grad: expected an options table, got " .. type(opts)) end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "grad_outputs" and k ~= "retain_graph" and k ~= "create_graph" and k ~= "allow_unused"
       and k ~= "only_inputs" then
      raise("grad: unknown option '" .. tostring(k) .. "' (expected grad_outputs, retain_graph, create_graph, allow_unused)")
    end
  end
  if opts.create_graph then
    raise("grad: create_graph=true is not supported: backward formulas run without recording, so the "
          .. "gradients cannot be differentiated again")
  end
  local outs, nout = tensor_list(outputs, "outputs")
  local ins, nin = tensor_list(inputs, "inputs")
  local gouts = opts.grad_outputs
  if is_tensor(gouts) then gouts = { gouts } end
  if gouts ~= nil and type(gouts) ~= "table" then
    raise("grad: expected grad_outputs to be a tensor or a list, got " .. type(gouts))
  end
  gouts = gouts or {}
  if table.maxn(gouts) > nout then
    raise(string.format("grad: grad_outputs has %d entries, expected one per output (%d)", table.maxn(gouts), nout))
  end
  local outs_buf = ffi.new("dp_tensor*[?]", nout)
  local gouts_buf = ffi.new("dp_tensor*[?]", nout)
  for i = 1, nout do
    local o, g = outs[i], gouts[i]
    if not o.requires_grad then
      raise(string.format("grad: outputs[%d] does not require grad and does not have a grad_fn", i))
    end
    if g ~= nil then
      if not is_tensor(g) then raise(string.format("grad: grad_outputs[%d] is a %s, expected a tensor", i, type(g))) end
      if not same_shape(g, o) then
        raise(string.format("grad: grad_outputs[%d] has shape %s, expected the shape of outputs[%d] %s",
                            i, shape_str(g), i, shape_str(o)))
      end
    elseif o:numel() ~= 1 then
      raise(string.format("grad: grad can be implicitly created only for scalar outputs; outputs[%d] has shape %s, "
                          .. "pass grad_outputs", i, shape_str(o)))
    end
    outs_buf[i - 1] = o.p
    gouts_buf[i - 1] = g and g.p or nil
  end
  local ins_buf = ffi.new("dp_tensor*[?]", nin)
  local res = ffi.new("dp_tensor*[?]", nin)
  for i = 1, nin do
    if not ins[i].requires_grad then raise(string.format("grad: inputs[%d] does not require grad", i)) end
    ins_buf[i - 1] = ins[i].p
  end
  check(run_grad(nout, outs_buf, gouts_buf, nin, ins_buf, res, opts.retain_graph))
  local grads = {}
  for i = 1, nin do
    if res[i - 1] ~= nil then
      grads[i] = torch._wrap(res[i - 1])
    end
  end
  for i = 1, nin do
    if grads[i] == nil and not opts.allow_unused then
      raise(string.format("grad: inputs[%d] appears to not have been used in the graph (pass allow_unused=true "
                          .. "to get nil for it)", i))
    end
  end
  return grads
end

-- backward(tensors [, grad_tensors] [, {retain_graph=, inputs=}]): as
-- tensor:backward for one tensor; for a list, one walk from all of them
-- (each weighted by its grad_tensors entry), gradients summed into .grad.
-- With inputs, only their .grad receive gradients.
function A.backward(tensors, grad_tensors, opts)
  if opts == nil and type(grad_tensors) == "table" and table.maxn(grad_tensors) == 0 and next(grad_tensors) ~= nil then
    grad_tensors, opts = nil, grad_tensors
  end
  opts = torch._options(opts, "backward")
  for k in pairs(opts) do
    if k ~= "retain_graph" and k ~= "create_graph" and k ~= "inputs" then
      raise("backward: unknown option '" .. tostring(k) .. "' (expected retain_graph, create_graph, inputs)")
    end
  end
  if opts.create_graph then raise("backward: create_graph=true is not supported (see torch.autograd.grad)") end
  local outs = tensor_list(tensors, "tensors", "backward")
  if opts.inputs ~= nil then
    local ins = tensor_list(opts.inputs, "inputs", "backward")
    local grads = A.grad(outs, ins, { grad_outputs = grad_tensors, retain_graph = opts.retain_graph,
                                      allow_unused = true })
    for i, p in ipairs(ins) do
      local g = grads[i]
      if g ~= nil then
        if p.grad == nil then p.grad = g else p.grad:add_(g) end
      end
    end
    return
  end
  if is_tensor(grad_tensors) then grad_tensors = { grad_tensors } end
  grad_tensors = grad_tensors or {}
  if #outs == 1 then return outs[1]:backward(grad_tensors[1], opts.retain_graph) end
  local root
  for i, o in ipairs(outs) do
    local g = grad_tensors[i]
    if g == nil and o:numel() ~= 1 then
      raise(string.format("backward: grad can be implicitly created only for scalar outputs; tensors[%d] has "
                          .. "shape %s, pass grad_tensors", i, shape_str(o)))
    end
    if g ~= nil and not (is_tensor(g) and same_shape(g, o)) then
      raise(string.format("backward: grad_tensors[%d] must be a tensor of the shape of tensors[%d] %s", i, i,
                          shape_str(o)))
    end
    local term = torch.enable_grad(function() return (g and o * g or o):sum() end)
    root = root and root + term or term
  end
  root:backward(nil, opts.retain_graph)
end

-- The grad modes, as PyTorch also reaches them through torch.autograd
A.no_grad, A.enable_grad, A.set_grad_enabled = torch.no_grad, torch.enable_grad, torch.set_grad_enabled
A.inference_mode = torch.inference_mode

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

-- The multi-index (0-based) of flat element i of a tensor of this shape
-- (also torch.testing's, for its messages).
local function unravel(i, shape)
  local idx = {}
  for d = #shape, 1, -1 do
    idx[d] = i % shape[d]
    i = math.floor(i / shape[d])
  end
  return idx
end
A._unravel = unravel

local function index_str(idx) return "[" .. table.concat(idx, ", ") .. "]" end

-- The differentiable outputs of fn(...): a tensor or a list of tensors.
local function outputs_of(res)
  local outs = {}
  if is_tensor(res) then outs[1] = res
  elseif type(res) == "table" then
    for _, o in ipairs(res) do if is_tensor(o) then outs[#outs + 1] = o end end
  end
  local diff = {}
  for _, o in ipairs(outs) do
    if o:is_floating_point() then diff[#diff + 1] = o end
  end
  return diff
end

local function call(fn, inputs, n)
  local res = { fn(unpack(inputs, 1, n)) }
  if #res == 1 then return outputs_of(res[1]) end
  return outputs_of(res)
end

-- Every output element, flattened and concatenated, as Lua numbers.
local function flat_values(outs)
  local vals = {}
  for _, o in ipairs(outs) do
    local e = torch._elements(o)
    for _, v in ipairs(e) do vals[#vals + 1] = v end
  end
  return vals
end

local function element(t, idx)
  if #idx == 0 then return t end
  return t[idx]
end

-- gradcheck(fn, inputs, {eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=true}):
-- inputs is a tensor or a list (tensors that require grad are checked;
-- other values are passed through to fn). Checked inputs must be float64.
function A.gradcheck(fn, inputs, opts)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    raise("gradcheck: expected a function, got " .. typename(fn))
  end
  if is_tensor(inputs) then inputs = { inputs } end
  if type(inputs) ~= "table" then raise("gradcheck: expected inputs to be a tensor or a list, got " .. typename(inputs)) end
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-3
  local raise_exception = opts.raise_exception ~= false
  local n = table.maxn(inputs)

  local checked = {}
  for i = 1, n do
    local x = inputs[i]
    if is_tensor(x) and x.requires_grad then
      if x.dtype ~= torch.float64 then
        raise(string.format("gradcheck: input %d is %s; gradcheck needs float64 inputs (use :double())", i, tostring(x.dtype)))
      end
      if not x.is_leaf then raise(string.format("gradcheck: input %d must be a leaf tensor", i)) end
      checked[#checked + 1] = i
    end
  end
  if #checked == 0 then raise("gradcheck: expected at least one input tensor that requires grad") end

  -- analytic Jacobian, one backward per output element
  local outs = call(fn, inputs, n)
  if #outs == 0 then raise("gradcheck: fn returned no floating point tensor") end
  local saved_grads = {}
  for _, i in ipairs(checked) do saved_grads[i] = inputs[i].grad; inputs[i].grad = nil end
  local analytic = {}     -- analytic[k][r] = d out_r / d input_k (flat)
  for _, i in ipairs(checked) do analytic[i] = {} end
  local row = 0
  for _, o in ipairs(outs) do
    local m = o:numel()
    local shape = o:size()
    for r = 0, m - 1 do
      row = row + 1
      if o.requires_grad then
        local go = torch.zeros_like(o)
        element(go, unravel(r, shape)):fill_(1)
        o:backward(go, { retain_graph = true })
      end
      for _, i in ipairs(checked) do
        local g = inputs[i].grad
        analytic[i][row] = g and torch._elements(g) or false
        inputs[i].grad = nil
      end
    end
  end
  for _, i in ipairs(checked) do inputs[i].grad = saved_grads[i] end

  -- numeric Jacobian, central differences
  local function fail(msg)
    if raise_exception then raise(msg) end
    return false, msg
  end
  return torch.no_grad(function()
    for _, i in ipairs(checked) do
      local x = inputs[i]
      local shape = x:size()
      for j = 0, x:numel() - 1 do
        local idx = unravel(j, shape)
        local e = element(x, idx)
        local orig = e:item()
        e:fill_(orig + eps)
        local plus = flat_values(call(fn, inputs, n))
        e:fill_(orig - eps)
        local minus = flat_values(call(fn, inputs, n))
        e:fill_(orig)
        for r = 1, #plus do
          local numeric = (plus[r] - minus[r]) / (2 * eps)
          local arow = analytic[i][r]
          local a = arow and arow[j + 1] or 0
          if not (math.abs(a - numeric) <= atol + rtol * math.abs(numeric)) then
            return fail(string.format("gradcheck: Jacobian mismatch for output element %d with respect to input %d, "
                                      .. "element %s:\nnumerical:%.10g\nanalytical:%.10g",
                                      r - 1, i, index_str(idx), numeric, a))
          end
        end
      end
    end
    return true
  end)
end

-- How many ReLU and tanh GELU backwards were folded into the backward of
-- the Linear after them since the start (docs/AUTOGRAD.md): read it before
-- and after a backward to see whether a model's activations fold.
function A._activation_backwards_folded()
  return tonumber(require("ffi").C.dp_activation_backwards_folded())
end

-- differentiable(name, values, backward): f(a, ...) for a tensor a (and
-- other arguments) computed by values(a, ...) (any number of tensors), with
-- the gradient with respect to a given by backward(saved, grads...), saved
-- = {a, results...}. The autograd Function, named name, is made on the
-- first call that records; a call that records nothing runs values alone.
-- (lgamma, eigh and svd use it: their values come from elsewhere than
-- differentiable tensor ops, or from ops whose derivative is less exact.)
function A.differentiable(name, values, backward)
  local fn
  return function(a, ...)
    if not (torch.is_grad_enabled() and a.requires_grad) then return values(a, ...) end
    if fn == nil then
      fn = Function:extend(name)
      function fn.forward(ctx, x, ...)
        local r = { values(x, ...) }
        ctx:save_for_backward(x, unpack(r))
        return unpack(r)
      end
      function fn.backward(ctx, ...) return backward(ctx.saved_tensors, ...) end
    end
    return fn.apply(a, ...)
  end
end

-- torch.autograd.functional (jacobian, vjp, jvp) loads on first use
torch._lazy(A, { functional = function() return require("dplua.autograd_functional") end })


---------------------------------------------------------------- anomaly detection

-- set_detect_anomaly(mode [, check_nan]): while on, every backward checks
-- the gradients each node computes and fails at the first holding NaN,
-- naming the node (PyTorch's "Function 'MulBackward0' returned nan values
-- in its 0th output.") and adding the traceback of the forward call that
-- made it. Slow, as PyTorch's: each gradient is inspected (a GPU
-- synchronisation each), and each op of the forward takes a traceback.
-- check_nan = false keeps the tracebacks without the checks.
local anomaly, anomaly_nan = false, true
function A.set_detect_anomaly(mode, check_nan)
  if type(mode) ~= "boolean" then
    raise("set_detect_anomaly: expected mode to be a boolean, got " .. type(mode))
  end
  if check_nan ~= nil and type(check_nan) ~= "boolean" then
    raise("set_detect_anomaly: expected check_nan to be a boolean, got " .. type(check_nan))
  end
  anomaly, anomaly_nan = mode, check_nan ~= false
  C.dp_set_detect_anomaly((mode and anomaly_nan) and 1 or 0)
  torch._set_anomaly_traces(mode)
end

-- detect_anomaly(fn, ...): fn(...) with anomaly detection on, the mode
-- before it restored after (also when fn fails); returns what fn returns
function A.detect_anomaly(fn, ...)
  if not is_callable(fn) then
    raise("detect_anomaly: expected a function to run with anomaly detection, got " .. type(fn))
  end
  local was = { anomaly, anomaly_nan }
  A.set_detect_anomaly(true)
  return torch._finally(function(w) A.set_detect_anomaly(w[1], w[2]) end, was, pcall(fn, ...))
end

function A.is_anomaly_enabled() return anomaly end
function A.is_anomaly_check_nan_enabled() return anomaly and anomaly_nan end

return A
