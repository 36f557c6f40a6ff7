-- dplua.autograd (reached as torch.autograd): gradient checking.
--
--   local x = torch.randn(3, 4, {dtype=torch.float64, requires_grad=true})
--   torch.autograd.gradcheck(function(a) return a:tanh():sum(1) end, {x})
--
-- gradcheck compares the full Jacobian from backward (one backward per
-- output element, on a retained graph) with central finite differences in
-- float64, element by element. It returns true, or raises an error that
-- names the input, its element, the output element and both values.
local torch = require("dplua")
local raise = torch._raise
local is_tensor = torch.is_tensor

local A = {}

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

-- The multi-index (0-based) of flat element i of a tensor of this shape.
local function unravel(i, shape)
  local idx = {}
  for d = #shape, 1, -1 do
    idx[d] = i % shape[d]
    i = math.floor(i / shape[d])
  end
  return idx
end

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

-- How many ReLU backwards were folded into the backward of the Linear
-- after them since the start (docs/API.md, "How the GPU path is built"):
-- read it before and after a backward to see whether a model's ReLUs fold.
function A._relu_backwards_folded()
  return tonumber(require("ffi").C.dp_relu_backwards_folded())
end

return A
