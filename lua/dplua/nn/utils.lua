-- dplua.nn.utils: gradient clipping and parameter/vector conversion.
local torch = require("dplua")
local raise = torch._raise

local U = {}

local function param_list(parameters, fn)
  if torch.is_tensor(parameters) then return { parameters } end
  if type(parameters) ~= "table" then
    raise(fn .. ": expected a tensor or a list of tensors (e.g. model:parameters()), got " .. type(parameters))
  end
  for i, p in ipairs(parameters) do
    if not torch.is_tensor(p) then raise(string.format("%s: expected a tensor at position %d, got %s", fn, i, type(p))) end
  end
  return parameters
end

local function grads_of(params)
  local grads = {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g ~= nil then grads[#grads + 1] = g end
  end
  return grads
end

-- clip_grad_norm_(parameters, max_norm [, norm_type=2] [, error_if_nonfinite=false])
-- (or {error_if_nonfinite=} in its place, or {norm_type=, error_if_nonfinite=}
-- as the third): the total norm of all gradients (as if concatenated),
-- returned as a tensor; every gradient is scaled in place by
-- min(max_norm / (total + 1e-6), 1), as PyTorch.
function U.clip_grad_norm_(parameters, max_norm, norm_type, opts)
  local fn = "clip_grad_norm_"
  if type(norm_type) == "table" then opts, norm_type = norm_type, norm_type.norm_type end
  if type(opts) == "boolean" then opts = { error_if_nonfinite = opts } end
  if opts ~= nil and type(opts) ~= "table" then
    raise(fn .. ": expected error_if_nonfinite (a boolean) or a table of options, got " .. type(opts))
  end
  opts = opts or {}
  local params = param_list(parameters, fn)
  if type(max_norm) ~= "number" then raise(fn .. ": expected max_norm to be a number, got " .. type(max_norm)) end
  norm_type = norm_type or 2
  if norm_type == "inf" then norm_type = math.huge end
  if type(norm_type) ~= "number" then raise(fn .. ": expected norm_type to be a number (or math.huge), got " .. type(norm_type)) end
  local grads = grads_of(params)
  if #grads == 0 then return torch.tensor(0.0) end
  return torch.no_grad(function()
    local total
    if norm_type == math.huge then
      local maxes = {}
      for i, g in ipairs(grads) do maxes[i] = g:abs():max() end
      total = #maxes == 1 and maxes[1] or torch.stack(maxes):max()
    else
      local norms = {}
      for i, g in ipairs(grads) do
        if norm_type == 2 then norms[i] = g:square():sum():sqrt()
        elseif norm_type == 1 then norms[i] = g:abs():sum()
        else norms[i] = (g:abs() ^ norm_type):sum() ^ (1 / norm_type) end
      end
      local stacked = torch.stack(norms)
      if norm_type == 2 then total = stacked:square():sum():sqrt()
      elseif norm_type == 1 then total = stacked:sum()
      else total = (stacked ^ norm_type):sum() ^ (1 / norm_type) end
    end
    if opts.error_if_nonfinite then
      local v = total:item()
      if v ~= v or v == math.huge or v == -math.huge then
        raise(string.format("%s: the total norm of order %s for gradients from `parameters` is non-finite, "
                            .. "so it cannot be clipped", fn, tostring(norm_type)))
      end
    end
    local coef = (max_norm / (total + 1e-6)):clamp(nil, 1.0)
    for _, g in ipairs(grads) do g:mul_(coef:to(g.dtype)) end
    return total
  end)
end

-- clip_grad_value_(parameters, clip_value): clamps every gradient in place.
function U.clip_grad_value_(parameters, clip_value)
  local params = param_list(parameters, "clip_grad_value_")
  if type(clip_value) ~= "number" then raise("clip_grad_value_: expected clip_value to be a number") end
  torch.no_grad(function()
    for _, g in ipairs(grads_of(params)) do g:clamp_(-clip_value, clip_value) end
  end)
end

-- parameters_to_vector(params): one 1-D tensor of all parameters.
function U.parameters_to_vector(parameters)
  local params = param_list(parameters, "parameters_to_vector")
  local flat = {}
  for i, p in ipairs(params) do flat[i] = p:reshape(-1) end
  return torch.cat(flat, 0)
end

-- vector_to_parameters(vec, params): copies slices of vec into the parameters.
function U.vector_to_parameters(vec, parameters)
  local params = param_list(parameters, "vector_to_parameters")
  if not torch.is_tensor(vec) or vec:dim() ~= 1 then raise("vector_to_parameters: expected a 1-D tensor") end
  local total = 0
  for _, p in ipairs(params) do total = total + p:numel() end
  if total ~= vec:numel() then
    raise(string.format("vector_to_parameters: the vector has %d elements, the parameters %d", vec:numel(), total))
  end
  torch.no_grad(function()
    local off = 0
    for _, p in ipairs(params) do
      local n = p:numel()
      p:copy_(vec:narrow(0, off, n):view(p:size()))
      off = off + n
    end
  end)
end

return U
