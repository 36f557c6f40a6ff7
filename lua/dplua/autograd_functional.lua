-- dplua.autograd_functional: torch.autograd.functional's first-order
-- functions: jacobian, vjp and jvp, built on torch.autograd.grad.
--
--   local J = torch.autograd.functional.jacobian(f, x)       -- f(x)'s shape then x's
--   local y, g = torch.autograd.functional.vjp(f, x, v)       -- v^T J
--
-- The inputs are a tensor or a list of tensors (a list gives one result
-- per input), as are the outputs of func. Without double backward
-- (create_graph), the second-order ones (hessian, hvp, vhp) are not here:
-- each raises a message that says so.
local torch = require("dplua")
local raise, is_tensor = torch._raise, torch.is_tensor

local M = {}

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

-- inputs as a list of fresh leaves that require grad, and whether they
-- came as one tensor
local function leaves(inputs, fn)
  local single = is_tensor(inputs)
  local list = single and { inputs } or inputs
  if type(list) ~= "table" or #list == 0 then
    raise(fn .. ": expected inputs to be a tensor or a non-empty list of tensors, got " .. typename(inputs))
  end
  local out = {}
  for i, t in ipairs(list) do
    if not is_tensor(t) then raise(string.format("%s: expected inputs[%d] to be a tensor, got %s", fn, i, typename(t))) end
    if not t.dtype.is_floating_point then
      raise(string.format("%s: expected inputs[%d] to be floating point, got %s", fn, i, t.dtype.name))
    end
    out[i] = t:detach():clone():requires_grad_(true)
  end
  return out, single
end

-- func's outputs as a list, and whether it returned one tensor
local function outputs_of(func, ins, fn)
  if type(func) ~= "function" and not (getmetatable(func) and getmetatable(func).__call) then
    raise(fn .. ": expected func to be callable, got " .. typename(func))
  end
  local r = torch.enable_grad(function() return { func(unpack(ins)) } end)
  local single = #r == 1 and is_tensor(r[1])
  local outs = single and r or (#r == 1 and type(r[1]) == "table" and r[1] or r)
  for i, o in ipairs(outs) do
    if not is_tensor(o) then raise(string.format("%s: func's output %d is a %s, expected a tensor", fn, i, typename(o))) end
  end
  return outs, single
end

-- the gradient of o (a scalar, or weighted by go) with respect to every
-- input; zeros where an input is unused or o needs no gradient
local function grads_of(o, ins, go)
  if not o.requires_grad then
    local z = {}
    for i, x in ipairs(ins) do z[i] = torch.zeros_like(x) end
    return z
  end
  local g = torch.autograd.grad(o, ins, { grad_outputs = go, retain_graph = true, allow_unused = true })
  for i, x in ipairs(ins) do
    if g[i] == nil then g[i] = torch.zeros_like(x) end
  end
  return g
end

local function detached(list)
  local out = {}
  for i, t in ipairs(list) do out[i] = t:detach() end
  return out
end

-- jacobian(func, inputs [, {create_graph, strict, vectorize, strategy}]):
-- for each output and input, the tensor of shape output:size() ..
-- input:size() holding d output / d input, one backward pass per output
-- element. One input and one output give a tensor; lists give a list (per
-- output) of lists (per input), or a list when one side is single.
function M.jacobian(func, inputs, opts)
  local fn = "jacobian"
  if type(opts) == "table" and opts.create_graph then raise(fn .. ": create_graph=true is not supported (no double backward)") end
  local ins, single_in = leaves(inputs, fn)
  local outs, single_out = outputs_of(func, ins, fn)
  local result = {}
  for oi, o in ipairs(outs) do
    local flat = o:reshape(-1)
    local rows = {}
    for i = 1, #ins do rows[i] = {} end
    for k = 0, flat:numel() - 1 do
      local g = grads_of(flat[k], ins)
      for i = 1, #ins do rows[i][k + 1] = g[i]:reshape(-1) end
    end
    local per_input = {}
    for i, x in ipairs(ins) do
      local shape = o:size()
      for _, s in ipairs(x:size()) do shape[#shape + 1] = s end
      local J = #rows[i] > 0 and torch.stack(rows[i]) or torch.zeros({ 0, x:numel() }, { dtype = x.dtype, device = x.device })
      per_input[i] = J:reshape(shape)
    end
    result[oi] = single_in and per_input[1] or per_input
  end
  if single_out then return result[1] end
  return result
end

-- vjp(func, inputs [, v]): func's outputs and v^T J (v: a tensor or a
-- list, one per output; nil for a single-element output), per input.
function M.vjp(func, inputs, v, opts)
  local fn = "vjp"
  if type(opts) == "table" and opts.create_graph then raise(fn .. ": create_graph=true is not supported (no double backward)") end
  local ins, single_in = leaves(inputs, fn)
  local outs, single_out = outputs_of(func, ins, fn)
  local vs = v == nil and {} or (is_tensor(v) and { v } or v)
  local total = {}
  for i, x in ipairs(ins) do total[i] = torch.zeros_like(x) end
  for oi, o in ipairs(outs) do
    local go = vs[oi]
    if go == nil and o:numel() ~= 1 then
      raise(string.format("%s: v is needed for output %d, which has %d elements", fn, oi, o:numel()))
    end
    if go ~= nil and table.concat(go:size(), ",") ~= table.concat(o:size(), ",") then
      raise(string.format("%s: v[%d] has shape [%s], expected the output's [%s]", fn, oi, table.concat(go:size(), ", "),
                          table.concat(o:size(), ", ")))
    end
    local g = grads_of(o, ins, go)
    for i = 1, #ins do total[i] = total[i] + g[i] end
  end
  local y = detached(outs)
  return single_out and y[1] or y, single_in and total[1] or total
end

-- jvp(func, inputs [, v]): func's outputs and J v (v: one tensor per
-- input; nil for a single-element input), per output, through the
-- Jacobian (one backward pass per output element).
function M.jvp(func, inputs, v, opts)
  local fn = "jvp"
  if type(opts) == "table" and opts.create_graph then raise(fn .. ": create_graph=true is not supported (no double backward)") end
  local ins = leaves(inputs, fn)
  local vs = v == nil and {} or (is_tensor(v) and { v } or v)
  for i, x in ipairs(ins) do
    if vs[i] == nil and x:numel() ~= 1 then
      raise(string.format("%s: v is needed for input %d, which has %d elements", fn, i, x:numel()))
    end
    if vs[i] ~= nil and table.concat(vs[i]:size(), ",") ~= table.concat(x:size(), ",") then
      raise(string.format("%s: v[%d] has shape [%s], expected the input's [%s]", fn, i, table.concat(vs[i]:size(), ", "),
                          table.concat(x:size(), ", ")))
    end
  end
  local outs, single_out = outputs_of(func, ins, fn)
  local result = {}
  for oi, o in ipairs(outs) do
    local flat = o:reshape(-1)
    local acc = torch.zeros({ flat:numel() }, { dtype = o.dtype, device = o.device })
    for k = 0, flat:numel() - 1 do
      local g = grads_of(flat[k], ins)
      local s = 0
      for i, x in ipairs(ins) do
        local vi = vs[i] or torch.ones_like(x)
        s = s + (g[i] * vi):sum()
      end
      acc[k] = s
    end
    result[oi] = acc:reshape(o:size())
  end
  local y = detached(outs)
  if single_out then return y[1], result[1] end
  return y, result
end

for _, name in ipairs({ "hessian", "hvp", "vhp" }) do
  M[name] = function()
    raise(name .. ": second derivatives need create_graph (double backward), which dplua's autograd does not record")
  end
end

return M
