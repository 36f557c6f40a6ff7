-- dplua.nn.utils: gradient clipping, parameter/vector conversion, and
-- utils.rnn.pad_sequence.
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

-- The gradients as runs: those that lie back to back in one flat
-- gradient buffer (an optimizer's bucket, DDP's) as one 1-D view over
-- them, any other alone; norms and scaling then cost a few launches per
-- buffer rather than per tensor, with the same result.
local ffi = require("ffi")
local C = torch.C
local runs_cap, runs_in, runs_out = 0, nil, nil
local nruns_box = ffi.new("int[1]")
function U._grad_runs(grads)
  local n = #grads
  if n > runs_cap then
    runs_cap = math.max(n, 2 * runs_cap)
    runs_in, runs_out = ffi.new("dp_tensor*[?]", runs_cap), ffi.new("dp_tensor*[?]", runs_cap)
  end
  for i, g in ipairs(grads) do runs_in[i - 1] = g.p end
  if C.dp_flat_runs(n, runs_in, runs_out, nruns_box) ~= 0 then raise(ffi.string(C.dp_last_error())) end
  local runs = {}
  for i = 0, nruns_box[0] - 1 do runs[i + 1] = torch._wrap(runs_out[i]) end
  return runs
end

-- The norm of order p of one run, as a 0-d tensor of its dtype.
local function run_norm(g, p)
  if p == math.huge then return g:abs():amax() end
  if p == 2 then return g:norm() end
  if p == 1 then return g:abs():sum() end
  return (g:abs() ^ p):sum() ^ (1 / p)
end

-- clip_grad_norm_(parameters, max_norm [, norm_type=2] [, error_if_nonfinite=false])
-- (or {error_if_nonfinite=, foreach=} in its place, or {norm_type=,
-- error_if_nonfinite=, foreach=} as the third): the total norm of all
-- gradients (as if concatenated), returned as a tensor; every gradient is
-- scaled in place by min(max_norm / (total + 1e-6), 1), as PyTorch. The
-- norm and the coefficient stay on the device (no .item(), unless
-- error_if_nonfinite asks for the check). foreach is accepted and changes
-- nothing: gradients in one flat buffer are always taken together.
-- The total norm of order p of the runs, a 0-d tensor (the first run's dtype)
local function runs_norm(runs, p, error_if_nonfinite, fn)
  local total = run_norm(runs[1], p)
  if #runs > 1 then
    local norms = { total }
    for i = 2, #runs do norms[i] = run_norm(runs[i], p):to(total.dtype) end
    total = run_norm(torch.stack(norms), p)
  end
  if error_if_nonfinite then
    local v = total:item()
    if v ~= v or v == math.huge or v == -math.huge then
      raise(string.format("%s: the total norm of order %s for gradients from `parameters` is non-finite, "
                          .. "so it cannot be clipped", fn, tostring(p)))
    end
  end
  return total
end

-- Every run scaled in place by min(max_norm / (total + 1e-6), 1)
local function scale_runs(runs, max_norm, total)
  local coef = (max_norm / (total + 1e-6)):clamp(nil, 1.0)
  local coef_as = {}
  for _, g in ipairs(runs) do
    local c = coef_as[g.dtype]
    if c == nil then
      c = g.dtype == coef.dtype and coef or coef:to(g.dtype)
      coef_as[g.dtype] = c
    end
    g:mul_(c)
  end
end

local function check_norm_type(norm_type, fn)
  norm_type = norm_type or 2
  if norm_type == "inf" then norm_type = math.huge end
  if type(norm_type) ~= "number" then raise(fn .. ": expected norm_type to be a number (or math.huge), got " .. type(norm_type)) end
  return norm_type
end
local function check_foreach(foreach, fn)
  if foreach ~= nil and type(foreach) ~= "boolean" then
    raise(fn .. ": expected foreach to be a boolean or nil, got " .. type(foreach))
  end
end

function U.clip_grad_norm_(parameters, max_norm, norm_type, opts)
  local fn = "clip_grad_norm_"
  if type(norm_type) == "table" then opts, norm_type = norm_type, norm_type.norm_type end
  if type(opts) == "boolean" then opts = { error_if_nonfinite = opts } end
  if opts ~= nil and type(opts) ~= "table" then
    raise(fn .. ": expected error_if_nonfinite (a boolean) or a table of options, got " .. type(opts))
  end
  opts = opts or {}
  check_foreach(opts.foreach, fn)
  local params = param_list(parameters, fn)
  if type(max_norm) ~= "number" then raise(fn .. ": expected max_norm to be a number, got " .. type(max_norm)) end
  norm_type = check_norm_type(norm_type, fn)
  local grads = grads_of(params)
  if #grads == 0 then return torch.tensor(0.0) end
  return torch.no_grad(function()
    local runs = U._grad_runs(grads)
    local total = runs_norm(runs, norm_type, opts.error_if_nonfinite, fn)
    scale_runs(runs, max_norm, total)
    return total
  end)
end

-- get_total_norm(tensors [, norm_type = 2, error_if_nonfinite = false,
-- foreach]) (or {norm_type =, error_if_nonfinite =, foreach =}): the norm
-- of the tensors (a tensor or a list; typically gradients) as if
-- concatenated, and clip_grads_with_norm_(parameters, max_norm, total_norm
-- [, foreach]): the parameters' gradients scaled in place by
-- min(max_norm / (total_norm + 1e-6), 1), as PyTorch's two halves of
-- clip_grad_norm_ (for a norm taken across ranks or shards in between).
function U.get_total_norm(tensors, norm_type, error_if_nonfinite, foreach)
  local fn = "get_total_norm"
  if type(norm_type) == "table" then
    norm_type, error_if_nonfinite, foreach = norm_type.norm_type, norm_type.error_if_nonfinite, norm_type.foreach
  end
  check_foreach(foreach, fn)
  norm_type = check_norm_type(norm_type, fn)
  local list = torch.is_tensor(tensors) and { tensors } or tensors
  if type(list) ~= "table" then raise(fn .. ": expected a tensor or a list of tensors, got " .. type(tensors)) end
  for i, t in ipairs(list) do
    if not torch.is_tensor(t) then raise(string.format("%s: expected tensors[%d] to be a tensor, got %s", fn, i, type(t))) end
  end
  if #list == 0 then return torch.tensor(0.0) end
  return torch.no_grad(function() return runs_norm(U._grad_runs(list), norm_type, error_if_nonfinite, fn) end)
end

function U.clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
  local fn = "clip_grads_with_norm_"
  check_foreach(foreach, fn)
  local params = param_list(parameters, fn)
  if type(max_norm) ~= "number" then raise(fn .. ": expected max_norm to be a number, got " .. type(max_norm)) end
  if type(total_norm) == "number" then total_norm = torch.tensor(total_norm) end
  if not torch.is_tensor(total_norm) then raise(fn .. ": expected total_norm to be a tensor or a number, got " .. type(total_norm)) end
  local grads = grads_of(params)
  if #grads == 0 then return end
  torch.no_grad(function() scale_runs(U._grad_runs(grads), max_norm, total_norm) end)
end

-- clip_grad_value_(parameters, clip_value): clamps every gradient in place.
U.clip_grad_norm = U.clip_grad_norm_   -- PyTorch's deprecated name

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

---------------------------------------------------------------- weight_norm, spectral_norm

-- The 2-norm of v over every dim but dim (kept as size 1 where reduced),
-- or of the whole of v when dim is -1 (PyTorch's dim=None).
local function norm_except_dim(v, dim)
  if dim == -1 then return v:norm() end
  local d = dim < 0 and dim + v:dim() or dim
  local moved = v:transpose(0, d):contiguous()
  local shape = {}
  for i = 1, v:dim() do shape[i] = 1 end
  shape[d + 1] = v:size(d)
  return moved:reshape(moved:size(0), -1):norm(2, 1):view(shape)
end
U._norm_except_dim = norm_except_dim

local function module_param(module, name, fn)
  local nn = torch.nn
  if not nn.is_module(module) then raise(fn .. ": expected a module, got " .. type(module)) end
  local w = module._parameters.map[name]
  if w == nil then raise(string.format("%s: the module has no parameter '%s'", fn, tostring(name))) end
  return w
end

-- weight_norm and spectral_norm keep, per module and name, the forward
-- pre-hook that recomputes the parameter and a function of the module
-- giving its value now; removing one takes the hook out and gives that value.
local function keep_reparametrization(module, kind, name, hook, value)
  local field = "_" .. kind .. "_hooks"
  local all = module[field] or {}
  all[name] = { handle = module:register_forward_pre_hook(hook), value = value }
  module[field] = all
end
local function take_reparametrization(module, kind, name, fn)
  local all = module["_" .. kind .. "_hooks"]
  local r = all and all[name]
  if not r then raise(string.format("%s: %s of '%s' not found in %s", fn, kind, tostring(name), tostring(module))) end
  r.handle:remove()
  all[name] = nil
  return torch.no_grad(function() return r.value(module):detach():clone() end)
end

-- weight_norm(module [, name="weight", dim=0]): the parameter split into
-- its direction name_v and its norms name_g (over every dim but dim; dim
-- -1, PyTorch's None, one norm of the whole), recombined as g * v / |v|
-- before every forward, as PyTorch's torch.nn.utils.weight_norm (whose
-- state dict keys are name_g and name_v).
function U.weight_norm(module, name, dim)
  local fn = "weight_norm"
  if type(name) == "table" then name, dim = name.name, name.dim end
  name, dim = name or "weight", dim == nil and 0 or dim
  local w = module_param(module, name, fn)
  if type(dim) ~= "number" or dim % 1 ~= 0 or dim < -1 or dim >= w:dim() then
    raise(string.format("%s: expected dim in [-1, %d), got %s", fn, w:dim(), tostring(dim)))
  end
  local nn = torch.nn
  local g = torch.no_grad(function() return norm_except_dim(w, dim) end)
  module:_remove_parameter(name)
  module[name .. "_g"] = nn.Parameter(g)
  module[name .. "_v"] = nn.Parameter(w:detach():clone())
  local function compute(m)
    local v = m[name .. "_v"]
    return v * (m[name .. "_g"] / norm_except_dim(v, dim))
  end
  module[name] = compute(module)
  keep_reparametrization(module, "weight_norm", name, function(m) m[name] = compute(m) end, compute)
  return module
end

-- remove_weight_norm(module [, name="weight"]): the recombined parameter
-- back as one Parameter, name_g and name_v gone.
function U.remove_weight_norm(module, name)
  name = name or "weight"
  local value = take_reparametrization(module, "weight_norm", name, "remove_weight_norm")
  module:_remove_parameter(name .. "_g")
  module:_remove_parameter(name .. "_v")
  module[name] = nil
  module[name] = torch.nn.Parameter(value)
  return module
end

-- spectral_norm(module [, name="weight", n_power_iterations=1, eps=1e-12,
-- dim]) (or an options table): the parameter divided by its largest
-- singular value, estimated by power iteration (n_power_iterations a
-- forward while training, the vectors kept in the buffers name_u and
-- name_v), as PyTorch's (name_orig holds the parameter). dim: 0, or 1 for
-- the transposed convolutions.
-- spectral_norm's arguments, positional or as an options table, with
-- their defaults (dim 1 for the transposed convolutions), checked
function U._spectral_args(fn, module, name, n_power_iterations, eps, dim)
  if type(name) == "table" then
    local o = name
    name, n_power_iterations, eps, dim = o.name, o.n_power_iterations, o.eps, o.dim
  end
  name, n_power_iterations, eps = name or "weight", n_power_iterations or 1, eps or 1e-12
  if type(n_power_iterations) ~= "number" or n_power_iterations < 1 or n_power_iterations % 1 ~= 0
     or n_power_iterations > 2 ^ 20 then
    raise(fn .. ": expected n_power_iterations to be a positive integer up to 2^20, got " .. tostring(n_power_iterations))
  end
  if dim == nil then
    local cls = torch.nn.is_module(module) and module:_get_name() or ""
    dim = (cls == "ConvTranspose1d" or cls == "ConvTranspose2d" or cls == "ConvTranspose3d") and 1 or 0
  end
  return name, n_power_iterations, eps, dim
end

function U.spectral_norm(module, ...)
  local fn = "spectral_norm"
  local name, n_power_iterations, eps, dim = U._spectral_args(fn, module, ...)
  local w = module_param(module, name, fn)
  if w:dim() < 1 then raise(fn .. ": expected a parameter of at least one dim") end
  local nn, F = torch.nn, torch.nn.functional
  -- the parameter as a matrix, dim's entries as rows
  local function as_matrix(t)
    local m = dim ~= 0 and t:transpose(0, dim) or t
    return m:reshape(m:size(0), -1)
  end
  local mat = as_matrix(w:detach())
  local o = { dtype = w.dtype, device = w.device }
  module:_remove_parameter(name)
  module[name .. "_orig"] = w
  module[name] = w:detach() * 1
  module:register_buffer(name .. "_u", F.normalize(torch.randn(mat:size(0), o), 2, 0, eps))
  module:register_buffer(name .. "_v", F.normalize(torch.randn(mat:size(1), o), 2, 0, eps))
  local function compute(m, iterate)
    local weight = m[name .. "_orig"]
    local wm = as_matrix(weight)
    local u, v = m[name .. "_u"], m[name .. "_v"]
    if iterate then
      torch.no_grad(function()
        for _ = 1, n_power_iterations do
          v:copy_(F.normalize(wm:t():mv(u), 2, 0, eps))
          u:copy_(F.normalize(wm:mv(v), 2, 0, eps))
        end
      end)
    end
    -- copies: the backward reads them after the next forward's iteration
    local sigma = u:clone():dot(wm:mv(v:clone()))
    return weight / sigma
  end
  module[name] = compute(module, true)
  keep_reparametrization(module, "spectral_norm", name, function(m) m[name] = compute(m, m.training) end,
                         function(m) return compute(m, false) end)
  return module
end

-- remove_spectral_norm(module [, name="weight"]): the parameter divided by
-- its current estimate of the largest singular value (no more power
-- iteration) back as one Parameter; name_orig, name_u and name_v gone.
function U.remove_spectral_norm(module, name)
  name = name or "weight"
  local value = take_reparametrization(module, "spectral_norm", name, "remove_spectral_norm")
  module:_remove_parameter(name .. "_orig")
  module[name .. "_u"], module[name .. "_v"], module[name] = nil, nil, nil
  module[name] = torch.nn.Parameter(value)
  return module
end

-- fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b [,
-- transpose = false]): the weight and bias of one convolution that computes
-- the convolution followed by the batch norm in eval mode (conv_b, bn_w and
-- bn_b may be nil: 0, 1 and 0); as Parameters.
local function fused_scale(fn, bn_rm, bn_rv, bn_eps, bn_w)
  for _, a in ipairs({ { "bn_rm", bn_rm }, { "bn_rv", bn_rv } }) do
    if not torch.is_tensor(a[2]) then raise(string.format("%s: expected %s to be a tensor, got %s", fn, a[1], type(a[2]))) end
  end
  if type(bn_eps) ~= "number" then raise(fn .. ": expected bn_eps to be a number, got " .. type(bn_eps)) end
  local scale = (bn_rv + bn_eps):rsqrt()
  return bn_w and scale * bn_w or scale
end
function U.fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b, transpose)
  local fn = "fuse_conv_bn_weights"
  if not torch.is_tensor(conv_w) or conv_w:dim() < 3 then raise(fn .. ": expected conv_w to be a convolution's weight") end
  return torch.no_grad(function()
    local scale = fused_scale(fn, bn_rm, bn_rv, bn_eps, bn_w)
    local shape = {}
    for i = 1, conv_w:dim() do shape[i] = 1 end
    shape[transpose and 2 or 1] = -1
    local w = conv_w * scale:reshape(shape)
    local b = ((conv_b or torch.zeros_like(bn_rm)) - bn_rm) * scale + (bn_b or 0)
    return torch.nn.Parameter(w), torch.nn.Parameter(b)
  end)
end

-- fuse_linear_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
-- the same for a Linear followed by a BatchNorm1d over its features.
function U.fuse_linear_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b)
  local fn = "fuse_linear_bn_weights"
  if not torch.is_tensor(linear_w) or linear_w:dim() ~= 2 then raise(fn .. ": expected linear_w to be a Linear's weight") end
  return torch.no_grad(function()
    local scale = fused_scale(fn, bn_rm, bn_rv, bn_eps, bn_w)
    local w = linear_w * scale:unsqueeze(-1)
    local b = ((linear_b or torch.zeros_like(bn_rm)) - bn_rm) * scale + (bn_b or 0)
    return torch.nn.Parameter(w), torch.nn.Parameter(b)
  end)
end

-- fuse_conv_bn_eval(conv, bn [, transpose = false]) and
-- fuse_linear_bn_eval(linear, bn): a copy of conv (linear) whose output is
-- bn's of its output, both in eval mode (as PyTorch, for inference).
local function fuse_eval(fn, layer, bn, fuse, ...)
  if not torch.nn.is_module(layer) or not torch.nn.is_module(bn) then raise(fn .. ": expected two modules") end
  if layer.training or bn.training then raise(fn .. ": Fusion only for eval!") end
  if bn.running_mean == nil then raise(fn .. ": expected a batch norm that tracks running statistics") end
  local fused = layer:deepcopy()
  local w, b = fuse(layer.weight, layer.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias, ...)
  fused.weight, fused.bias = nil, nil
  fused.weight, fused.bias = w, b
  return fused
end
function U.fuse_conv_bn_eval(conv, bn, transpose)
  return fuse_eval("fuse_conv_bn_eval", conv, bn, U.fuse_conv_bn_weights, transpose)
end
function U.fuse_linear_bn_eval(linear, bn)
  return fuse_eval("fuse_linear_bn_eval", linear, bn, U.fuse_linear_bn_weights)
end

-- skip_init(module_class, ...): the module built with those arguments; its
-- parameters' values are left unspecified, as PyTorch's (here they are the
-- usual initial ones: initialising is cheap on the host).
function U.skip_init(cls, ...)
  if type(cls) ~= "table" or getmetatable(cls) == nil then raise("skip_init: expected a module class") end
  return cls(...)
end

-- rnn.pad_sequence(sequences [, batch_first = false, padding_value = 0]) or
-- pad_sequence(sequences, {batch_first =, padding_value =}): tensors of
-- shape (L_i, *) stacked into (L_max, B, *), or (B, L_max, *) with
-- batch_first, each padded at its end with padding_value (F.pad, then
-- stack: the gradient reaches each sequence).
U.rnn = {}
function U.rnn.pad_sequence(sequences, batch_first, padding_value)
  local fn = "pad_sequence"
  if type(batch_first) == "table" then batch_first, padding_value = batch_first.batch_first, batch_first.padding_value end
  if type(sequences) ~= "table" or #sequences == 0 then
    raise(fn .. ": expected a non-empty list of tensors")
  end
  local first, longest = sequences[1], 0
  for i, t in ipairs(sequences) do
    if not torch.is_tensor(t) or t:dim() == 0 then
      raise(string.format("%s: expected a tensor of at least 1 dim at position %d, got %s", fn, i,
                          torch.is_tensor(t) and "a 0-d tensor" or type(t)))
    end
    if t:dim() ~= first:dim() then
      raise(string.format("%s: expected the sequences to have the same trailing dims, got %d-D at position %d and %d-D first",
                          fn, t:dim(), i, first:dim()))
    end
    for d = 1, t:dim() - 1 do
      if t:size(d) ~= first:size(d) then
        raise(string.format("%s: expected the sequences to have the same trailing dims, got dim %d of %d at position %d and %d first",
                            fn, d, t:size(d), i, first:size(d)))
      end
    end
    longest = math.max(longest, t:size(0))
  end
  local F = torch.nn.functional
  local padded = {}
  for i, t in ipairs(sequences) do
    local pad = {}
    for _ = 1, 2 * (t:dim() - 1) do pad[#pad + 1] = 0 end
    pad[#pad + 1], pad[#pad + 2] = 0, longest - t:size(0)
    padded[i] = F.pad(t, pad, "constant", padding_value or 0)
  end
  return torch.stack(padded, batch_first and 0 or 1)
end

-- PackedSequence: the steps of sequences of different lengths packed
-- time-major without their padding, as PyTorch's: data (sum of lengths,
-- *), batch_sizes (int64 on the CPU: how many sequences are still running
-- at each step), and, unless the batch came sorted longest first,
-- sorted_indices (the batch's order, longest first) and unsorted_indices
-- (its inverse). The recurrent layers take and give it.
local PackedSequence = {}
PackedSequence.__index = PackedSequence
U.rnn.PackedSequence = PackedSequence
function U.rnn.is_packed(x) return getmetatable(x) == PackedSequence end
function PackedSequence:to(...)
  local p = setmetatable({}, PackedSequence)
  p.data, p.batch_sizes = self.data:to(...), self.batch_sizes
  p.sorted_indices = self.sorted_indices and self.sorted_indices:to(p.data.device)
  p.unsorted_indices = self.unsorted_indices and self.unsorted_indices:to(p.data.device)
  return p
end
function PackedSequence:__tostring()
  return string.format("PackedSequence(data=%s, batch_sizes=%s)", tostring(self.data:size()),
                       tostring(self.batch_sizes))
end

-- The batch sizes of each step for lengths sorted longest first.
local function batch_sizes_of(lengths)
  local sizes = {}
  for t = 1, lengths[1] do
    local n = 0
    for _, len in ipairs(lengths) do if len >= t then n = n + 1 end end
    sizes[t] = n
  end
  return sizes
end

-- Packs x (T, N, *), its batch already sorted longest first, by sizes.
function U.rnn._pack_sorted(x, sizes, sorted_indices, unsorted_indices)
  local parts = {}
  for t, n in ipairs(sizes) do parts[t] = x[t - 1]:narrow(0, 0, n) end
  local p = setmetatable({}, PackedSequence)
  p.data = torch.cat(parts, 0)
  p.batch_sizes = torch.tensor(sizes, { dtype = torch.int64 })
  p.sorted_indices, p.unsorted_indices = sorted_indices, unsorted_indices
  return p
end

-- The padded (T, N, *) of a packed sequence, its batch in sorted order,
-- and the sorted lengths (a Lua list).
function U.rnn._unpack_sorted(p, padding_value, total_length)
  local sizes = p.batch_sizes:tolist()
  local N, steps, at = sizes[1], {}, 0
  local rest = { unpack(p.data:size(), 2) }
  for t, n in ipairs(sizes) do
    local rows = p.data:narrow(0, at, n)
    at = at + n
    if n < N then
      local pad = { N - n, unpack(rest) }
      rows = torch.cat({ rows, torch.full(pad, padding_value or 0, { dtype = p.data.dtype, device = p.data.device }) }, 0)
    end
    steps[t] = rows
  end
  for _ = #sizes + 1, total_length or #sizes do
    steps[#steps + 1] = torch.full({ N, unpack(rest) }, padding_value or 0, { dtype = p.data.dtype, device = p.data.device })
  end
  local lengths = {}
  for n = 1, N do
    local len = 0
    for _, size in ipairs(sizes) do if size >= n then len = len + 1 end end
    lengths[n] = len
  end
  return torch.stack(steps, 0), lengths
end

-- pack_padded_sequence(input, lengths [, batch_first=false,
-- enforce_sorted=true]) or with {batch_first=, enforce_sorted=}: input
-- (T, N, *) (or (N, T, *)), lengths a list or a 1-D tensor, each in [1, T].
function U.rnn.pack_padded_sequence(input, lengths, batch_first, enforce_sorted)
  local fn = "pack_padded_sequence"
  if type(batch_first) == "table" then batch_first, enforce_sorted = batch_first.batch_first, batch_first.enforce_sorted end
  if not torch.is_tensor(input) or input:dim() < 2 then raise(fn .. ": expected input to be a tensor of at least 2 dims") end
  local list = torch.is_tensor(lengths) and lengths:reshape(-1):tolist() or lengths
  local x = batch_first and input:transpose(0, 1) or input
  local T, N = x:size(0), x:size(1)
  if type(list) ~= "table" or #list ~= N then
    raise(string.format("%s: expected %d lengths (one a sequence of the batch), got %s", fn, N,
                        type(list) == "table" and #list or type(list)))
  end
  for i, len in ipairs(list) do
    if type(len) ~= "number" or len % 1 ~= 0 or len < 1 or len > T then
      raise(string.format("%s: length %s of sequence %d is not within [1, %d] (every sequence needs a step)", fn,
                          tostring(len), i - 1, T))
    end
  end
  local sorted_indices, unsorted_indices
  local order = {}
  for i = 1, N do order[i] = i end
  local sorted = true
  for i = 2, N do sorted = sorted and list[i] <= list[i - 1] end
  if not sorted then
    if enforce_sorted ~= false then
      raise(fn .. ": the lengths must be sorted in decreasing order when enforce_sorted is true "
            .. "(pass enforce_sorted = false to have the batch sorted)")
    end
    table.sort(order, function(a, b) return list[a] > list[b] or (list[a] == list[b] and a < b) end)
    local inverse = {}
    for i, o in ipairs(order) do inverse[o] = i - 1 end
    for i = 1, N do order[i] = order[i] - 1 end
    sorted_indices = torch.tensor(order, { dtype = torch.int64, device = x.device })
    unsorted_indices = torch.tensor(inverse, { dtype = torch.int64, device = x.device })
    x = x:index_select(1, sorted_indices)
    local sl = {}
    for i, o in ipairs(order) do sl[i] = list[o + 1] end
    list = sl
  end
  return U.rnn._pack_sorted(x, batch_sizes_of(list), sorted_indices, unsorted_indices)
end

-- pad_packed_sequence(sequence [, batch_first=false, padding_value=0,
-- total_length]) or with an options table: the padded batch in its
-- original order and the lengths (an int64 tensor).
function U.rnn.pad_packed_sequence(sequence, batch_first, padding_value, total_length)
  local fn = "pad_packed_sequence"
  if type(batch_first) == "table" then
    local o = batch_first
    batch_first, padding_value, total_length = o.batch_first, o.padding_value, o.total_length
  end
  if not U.rnn.is_packed(sequence) then raise(fn .. ": expected a PackedSequence") end
  local T = sequence.batch_sizes:size(0)
  if total_length ~= nil and total_length < T then
    raise(string.format("%s: total_length %d is shorter than the longest sequence (%d)", fn, total_length, T))
  end
  local padded, lengths = U.rnn._unpack_sorted(sequence, padding_value, total_length)
  local len_t = torch.tensor(lengths, { dtype = torch.int64 })
  if sequence.unsorted_indices then
    padded = padded:index_select(1, sequence.unsorted_indices)
    len_t = len_t:index_select(0, sequence.unsorted_indices:cpu())
  end
  if batch_first then padded = padded:transpose(0, 1) end
  return padded, len_t
end

-- pack_sequence(sequences [, enforce_sorted=true]): tensors (L_i, *) packed.
function U.rnn.pack_sequence(sequences, enforce_sorted)
  if type(enforce_sorted) == "table" then enforce_sorted = enforce_sorted.enforce_sorted end
  if type(sequences) ~= "table" or #sequences == 0 then raise("pack_sequence: expected a non-empty list of tensors") end
  local lengths = {}
  for i, t in ipairs(sequences) do
    if not torch.is_tensor(t) or t:dim() == 0 then
      raise(string.format("pack_sequence: expected a tensor of at least 1 dim at position %d", i))
    end
    lengths[i] = t:size(0)
  end
  return U.rnn.pack_padded_sequence(U.rnn.pad_sequence(sequences), lengths, false, enforce_sorted)
end

-- unpack_sequence(packed): the list of sequences (L_i, *) again.
function U.rnn.unpack_sequence(packed)
  local padded, lengths = U.rnn.pad_packed_sequence(packed, true)
  local out = {}
  for i, len in ipairs(lengths:tolist()) do out[i] = padded[i - 1]:narrow(0, 0, len) end
  return out
end

-- unpad_sequence(padded, lengths [, batch_first = false]): the list of
-- sequences (L_i, *) that pad_sequence padded; lengths a list or a tensor
function U.rnn.unpad_sequence(padded, lengths, batch_first)
  local fn = "unpad_sequence"
  if type(batch_first) == "table" then batch_first = batch_first.batch_first end
  if not torch.is_tensor(padded) or padded:dim() < 2 then
    raise(fn .. ": expected padded to be a tensor of at least 2 dims (time, batch, *)")
  end
  if torch.is_tensor(lengths) then lengths = lengths:tolist() end
  if type(lengths) ~= "table" then raise(fn .. ": expected lengths to be a list or a tensor, got " .. type(lengths)) end
  if not batch_first then padded = padded:transpose(0, 1) end
  local n, steps = padded:size(0), padded:size(1)
  if #lengths ~= n then
    raise(string.format("%s: expected %d lengths (one per sequence of the batch), got %d", fn, n, #lengths))
  end
  local out = {}
  for i, len in ipairs(lengths) do
    if type(len) ~= "number" or len % 1 ~= 0 or len < 0 or len > steps then
      raise(string.format("%s: length %d is %s, expected an integer in [0, %d]", fn, i, tostring(len), steps))
    end
    out[i] = padded[i - 1]:narrow(0, 0, len)
  end
  return out
end

-- nn.utils.stateless: PyTorch's older home of functional_call
U.stateless = { functional_call = function(...) return torch.func.functional_call(...) end }

-- nn.utils.parametrize, parametrizations and prune load on first use
torch._lazy(U, {
  prune = function() return require("dplua.nn.prune") end,
  parametrize = function() return require("dplua.nn.parametrize") end,
  parametrizations = function() return require("dplua.nn.parametrize").parametrizations end,
})

return U
