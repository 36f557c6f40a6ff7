-- dplua.func: torch.func's transforms (functorch): functional_call, grad,
-- grad_and_value, vjp, jacrev and vmap, over dplua's tape autograd.
--
--   local params = {}                                   -- name -> tensor
--   for name, p in model:named_parameters() do params[name] = p:detach() end
--   local function loss(ps, x, y) return F.mse_loss(torch.func.functional_call(model, ps, x), y) end
--   local g = torch.func.grad(loss)(params, x, y)       -- name -> gradient
--   local per_sample = torch.func.vmap(torch.func.grad(loss), { nil, 0, 0 })(params, xs, ys)
--
-- An argument is a tensor or a table of tensors (a dict by name or a list),
-- PyTorch's pytrees of one level. vmap runs the function once per entry of
-- the mapped dim and stacks the results (the same results as PyTorch's,
-- without its batching of the ops themselves), so it serves per-sample
-- computations of modest batch sizes.
local torch = require("dplua")
local raise, is_tensor = torch._raise, torch.is_tensor

local M = {}

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end
local function pack(...) return { n = select("#", ...), ... } end
local function is_callable(f)
  return type(f) == "function" or (getmetatable(f) ~= nil and getmetatable(f).__call ~= nil)
end

-- The tensors of an argument (a tensor or a table of them) in a fixed
-- order, and a function rebuilding the argument's shape from such a list.
local function leaves(arg, fn)
  if is_tensor(arg) then return { arg }, function(list) return list[1] end end
  if type(arg) ~= "table" then raise(string.format("%s: expected a tensor or a table of tensors, got %s", fn, typename(arg))) end
  local keys = {}
  for k in pairs(arg) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local list = {}
  for i, k in ipairs(keys) do
    if not is_tensor(arg[k]) then
      raise(string.format("%s: expected the entry %s to be a tensor, got %s", fn, tostring(k), typename(arg[k])))
    end
    list[i] = arg[k]
  end
  return list, function(values)
    local out = {}
    for i, k in ipairs(keys) do out[k] = values[i] end
    return out
  end
end

---------------------------------------------------------------- functional_call

-- functional_call(module, parameters_and_buffers, args [, kwargs]): the
-- module called on args (a tensor or a list of arguments) with the named
-- tensors (a table name -> tensor, "fc1.weight" style, or a list of such
-- tables) standing in for its parameters and buffers during the call; the
-- module is left as it was, also when the call raises.
function M.functional_call(module, tensors, args, kwargs)
  local fn = "functional_call"
  if not torch.nn.is_module(module) then raise(fn .. ": expected a module, got " .. typename(module)) end
  if type(tensors) ~= "table" then raise(fn .. ": expected a table of name -> tensor, got " .. typename(tensors)) end
  local dicts = tensors[1] ~= nil and tensors or { tensors }
  local swapped = {}
  for _, dict in ipairs(dicts) do
    for name, t in pairs(dict) do
      if not is_tensor(t) then raise(string.format("%s: expected a tensor for '%s', got %s", fn, tostring(name), typename(t))) end
      local path, leaf = tostring(name):match("^(.*)%.([^.]+)$")
      if not path then path, leaf = "", name end
      local owner = module:get_submodule(path)
      local od = owner._parameters.has[leaf] and owner._parameters or (owner._buffers.has[leaf] and owner._buffers or nil)
      if od == nil then raise(string.format("%s: the module has no parameter or buffer '%s'", fn, tostring(name))) end
      swapped[#swapped + 1] = { od, leaf, od.map[leaf] }
      od.map[leaf] = t
    end
  end
  local function restore()
    for i = #swapped, 1, -1 do
      local s = swapped[i]
      s[1].map[s[2]] = s[3]
    end
  end
  local call_args = (is_tensor(args) or type(args) ~= "table") and { args } or args
  local n = table.maxn(call_args)
  if kwargs ~= nil then n = n + 1; call_args = { unpack(call_args, 1, n - 1) }; call_args[n] = kwargs end
  return torch._finally(restore, nil, pcall(module, unpack(call_args, 1, n)))
end

-- stack_module_state(models): the parameters and the buffers of a list of
-- models of the same structure, each name's tensors stacked along a new
-- first dim (parameters as new leaves that require grad where the
-- originals did), for functional_call under vmap: a model ensemble in one
-- call, as PyTorch's.
function M.stack_module_state(models)
  local fn = "stack_module_state"
  if type(models) ~= "table" or #models == 0 then raise(fn .. ": expected a non-empty list of modules") end
  local function stacked(kind)
    local out, names = {}, nil
    for i, m in ipairs(models) do
      if not torch.nn.is_module(m) then raise(string.format("%s: models[%d] is not a module", fn, i)) end
      local list = kind == "params" and m:named_parameters() or m:named_buffers()
      local here = {}
      for j, e in ipairs(list) do here[j] = e[1] end
      if names == nil then names = here
      elseif table.concat(here, ",") ~= table.concat(names, ",") then
        raise(string.format("%s: models[%d]'s %s are not models[1]'s (%s against %s)", fn, i,
                            kind == "params" and "parameters" or "buffers", table.concat(here, ", "), table.concat(names, ", ")))
      end
    end
    for j, name in ipairs(names) do
      local ts = {}
      for i, m in ipairs(models) do
        local list = kind == "params" and m:named_parameters() or m:named_buffers()
        ts[i] = list[j][2]:detach()
      end
      local t = torch.stack(ts)
      if kind == "params" and models[1]:named_parameters()[j][2].requires_grad then t:requires_grad_(true) end
      out[name] = t
    end
    return out
  end
  return stacked("params"), stacked("buffers")
end

---------------------------------------------------------------- grad, vjp, jacrev

-- arg (a tensor or a table of them) rebuilt from fresh leaves that require
-- grad, which are appended to inputs; returns the new arg and how to
-- regroup its gradients
local function with_fresh_leaves(arg, inputs, fn)
  local ts, shape = leaves(arg, fn)
  local fresh = {}
  for j, t in ipairs(ts) do
    if not t.dtype.is_floating_point then raise(fn .. ": the arguments to differentiate must be floating point") end
    fresh[j] = t:detach():requires_grad_(true)
    inputs[#inputs + 1] = fresh[j]
  end
  return shape(fresh), { shape = shape, n = #fresh }
end

-- the gradients of inputs (zeros for one unused) regrouped per argument
local function regrouped(grads, inputs, records)
  for k, t in ipairs(inputs) do
    if grads[k] == nil then grads[k] = torch.zeros_like(t) end
  end
  local results, at = {}, 0
  for i, r in ipairs(records) do
    results[i] = r.shape({ unpack(grads, at + 1, at + r.n) })
    at = at + r.n
  end
  return results
end

local function argnums_of(argnums, nargs, fn)
  local single = argnums == nil or type(argnums) == "number"
  local list = argnums == nil and { 0 } or (single and { argnums } or argnums)
  for _, a in ipairs(list) do
    if type(a) ~= "number" or a % 1 ~= 0 or a < 0 or a >= nargs then
      raise(string.format("%s: argnums %s is out of range for %d arguments", fn, tostring(a), nargs))
    end
  end
  return list, single
end

-- grad_and_value(func [, {argnums = 0, has_aux = false}]): a function of
-- func's arguments giving the gradient of func's scalar output with
-- respect to the arguments at argnums (0-based; each a tensor or a table
-- of tensors, the gradient shaped alike), then the output (and, with
-- has_aux, func's second result). grad(func [, opts]) gives the gradient
-- (and the aux) alone.
function M.grad_and_value(func, opts)
  local fn = "grad_and_value"
  opts = opts or {}
  if not is_callable(func) then raise(fn .. ": expected a function, got " .. typename(func)) end
  return function(...)
    local nargs = select("#", ...)
    local args = { ... }
    local list, single = argnums_of(opts.argnums, nargs, fn)
    local inputs, records = {}, {}
    for i, a in ipairs(list) do args[a + 1], records[i] = with_fresh_leaves(args[a + 1], inputs, fn) end
    local out, aux = torch.enable_grad(function() return func(unpack(args, 1, nargs)) end)
    if not is_tensor(out) or out:numel() ~= 1 then
      raise(fn .. ": expected func to return a tensor of one element, got " .. (is_tensor(out) and tostring(out:size()) or typename(out)))
    end
    local grads = out.requires_grad and torch.autograd.grad(out, inputs, { allow_unused = true }) or {}
    local results = regrouped(grads, inputs, records)
    local g = single and results[1] or results
    if opts.has_aux then return g, out:detach(), aux end
    return g, out:detach()
  end
end

function M.grad(func, opts)
  local gv = M.grad_and_value(func, opts)
  local has_aux = opts and opts.has_aux
  return function(...)
    local g, _, aux = gv(...)
    if has_aux then return g, aux end
    return g
  end
end

-- vjp(func, primals...): func's output and a function of cotangents (one
-- per output, shaped as it) giving the vector-Jacobian product for each
-- primal.
function M.vjp(func, ...)
  local fn = "vjp"
  local primals = { ... }
  local n = select("#", ...)
  local inputs, records = {}, {}
  for i = 1, n do primals[i], records[i] = with_fresh_leaves(primals[i], inputs, fn) end
  local out = torch.enable_grad(function() return func(unpack(primals, 1, n)) end)
  local outs = is_tensor(out) and { out } or out
  local function vjp_fn(...)
    local cts = select("#", ...) == 1 and not is_tensor((...)) and (...) or { ... }
    local grads = torch.autograd.grad(outs, inputs, { grad_outputs = cts, retain_graph = true, allow_unused = true })
    return unpack(regrouped(grads, inputs, records), 1, n)
  end
  local detached = is_tensor(out) and out:detach() or out
  return detached, vjp_fn
end

-- jacrev(func [, {argnums = 0}]): a function giving the Jacobian of func's
-- output with respect to the argument at argnums (output dims then input
-- dims), through torch.autograd.functional.jacobian.
function M.jacrev(func, opts)
  if not is_callable(func) then raise("jacrev: expected a function, got " .. typename(func)) end
  local argnum = opts and opts.argnums or 0
  return function(...)
    local args = { ... }
    local n = select("#", ...)
    if type(argnum) ~= "number" or argnum < 0 or argnum >= n then
      raise("jacrev: argnums " .. tostring(argnum) .. " is out of range for " .. n .. " arguments")
    end
    return torch.autograd.functional.jacobian(function(x)
      local a = { unpack(args, 1, n) }
      a[argnum + 1] = x
      return func(unpack(a, 1, n))
    end, args[argnum + 1])
  end
end

-- jacfwd(func [, {argnums = 0}]): the same Jacobian as jacrev (computed
-- in reverse mode: dplua has no forward-mode autograd, and the values are
-- the same).
M.jacfwd = M.jacrev

---------------------------------------------------------------- vmap

-- vmap(func [, in_dims = 0, out_dims = 0]): a function mapping func over
-- dim in_dims of its arguments (a number for all, or a list with one
-- entry per argument: a dim, or nil for an argument passed whole; a table
-- argument maps each of its tensors), calling func once per index and
-- stacking its results (a tensor, or several, or a table of tensors) along
-- out_dims. The mapped sizes must agree.
function M.vmap(func, in_dims, out_dims)
  local fn = "vmap"
  if in_dims == nil then in_dims = 0 end
  out_dims = out_dims or 0
  return function(...)
    local n = select("#", ...)
    local args = { ... }
    local dims = {}
    for i = 1, n do
      if type(in_dims) == "number" then dims[i] = in_dims
      elseif type(in_dims) == "table" then dims[i] = in_dims[i]
      else raise(fn .. ": expected in_dims to be a number or a list, got " .. typename(in_dims)) end
    end
    local size
    for i = 1, n do
      if dims[i] ~= nil then
        local ts = leaves(args[i], fn)
        for _, t in ipairs(ts) do
          local d = dims[i] < 0 and dims[i] + t:dim() or dims[i]
          if d < 0 or d >= t:dim() then
            raise(string.format("%s: in_dim %d is out of range for argument %d of %d dims", fn, dims[i], i, t:dim()))
          end
          if size ~= nil and t:size(d) ~= size then
            raise(string.format("%s: Expected all tensors to have the same size in the mapped dimension, got sizes %d and %d",
                                fn, size, t:size(d)))
          end
          size = t:size(d)
        end
      end
    end
    if size == nil then raise(fn .. ": at least one argument must be mapped (in_dims all nil)") end
    local per_call = {}
    for b = 0, size - 1 do
      local call = {}
      for i = 1, n do
        if dims[i] == nil then call[i] = args[i]
        else
          local ts, shape = leaves(args[i], fn)
          local picked = {}
          for j, t in ipairs(ts) do picked[j] = t:select(dims[i], b) end
          call[i] = shape(picked)
        end
      end
      per_call[b + 1] = pack(func(unpack(call, 1, n)))
    end
    return M._stack_results(per_call, out_dims, fn)
  end
end

-- stacks each result position (a tensor, or a table of tensors) of the calls
function M._stack_results(per_call, out_dims, fn)
  local nres = per_call[1].n
  local out = {}
  for r = 1, nres do
    local od = type(out_dims) == "table" and out_dims[r] or out_dims
    local first = per_call[1][r]
    local function stack(get)
      local list = {}
      for b, call in ipairs(per_call) do list[b] = get(call[r]) end
      return torch.stack(list, od)
    end
    if is_tensor(first) then
      out[r] = stack(function(v) return v end)
    elseif type(first) == "number" then
      out[r] = stack(function(v) return torch.tensor(v) end)
    elseif type(first) == "table" then
      local res = {}
      for k in pairs(first) do res[k] = stack(function(v) return v[k] end) end
      out[r] = res
    else
      raise(string.format("%s: the function returned a %s; expected tensors (or tables of them)", fn, typename(first)))
    end
  end
  return unpack(out, 1, nres)
end

return M
