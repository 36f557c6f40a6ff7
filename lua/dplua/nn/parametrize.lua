-- dplua.nn.parametrize: nn.utils.parametrize (register_parametrization,
-- remove_parametrizations, is_parametrized, cached) and
-- nn.utils.parametrizations (weight_norm, spectral_norm), as PyTorch's.
--
--   local Symmetric = nn.Module:extend("Symmetric")
--   function Symmetric:forward(X) return X:triu() + X:triu(1):transpose(-1, -2) end
--   parametrize.register_parametrization(layer, "weight", Symmetric())
--   layer.weight                 -- computed from layer.parametrizations.weight.original
--
-- A parametrized tensor leaves the module's parameters: the module gets a
-- ModuleDict `parametrizations` holding, under the tensor's name, a
-- ParametrizationList of the parametrizations and the unconstrained
-- tensor `original` (original0, original1, ... when the first
-- parametrization's right_inverse returns several), so state dict keys are
-- PyTorch's. Reading module[name] runs the list on the original(s) (once
-- per `cached` region); assigning it runs the right_inverses backwards and
-- copies the result into the original(s).
local torch = require("dplua")
local raise = torch._raise
local nn = torch.nn
local Module = nn.Module
local is_tensor = torch.is_tensor

local P = {}

local function typename(x) return is_tensor(x) and "Tensor" or type(x) end

-- cached(fn, ...): fn(...) with each parametrized tensor computed at most
-- once, as PyTorch's `with parametrize.cached():`.
local cache
function P.cached(fn, ...)
  if cache ~= nil then return fn(...) end
  cache = setmetatable({}, { __mode = "k" })
  return torch._finally(function() cache = nil end, nil, pcall(fn, ...))
end

---------------------------------------------------------------- ParametrizationList

local ParametrizationList = nn.ModuleList:extend("ParametrizationList")
P.ParametrizationList = ParametrizationList

local function originals(self)
  local n = rawget(self, "_n_originals")
  if n == nil then return { self.original } end
  local out = {}
  for i = 0, n - 1 do out[i + 1] = self["original" .. i] end
  return out
end

-- the parametrized value: the modules applied in order to the original(s)
function ParametrizationList:_evaluate()
  if cache ~= nil and cache[self] ~= nil then return cache[self] end
  local value = self[0](unpack(originals(self)))
  for i = 1, #self._modules.keys - 1 do value = self[i](value) end
  if cache ~= nil then cache[self] = value end
  return value
end

-- the original(s) for a value, through the right_inverses in reverse
local function inverted(self, value)
  return torch.no_grad(function()
    for i = #self._modules.keys - 1, 0, -1 do
      local m = self[i]
      if m.right_inverse == nil then
        raise(string.format("parametrize: the parametrization %s does not implement right_inverse, so the "
                            .. "parametrized tensor cannot be assigned", m:_get_name()))
      end
      value = m:right_inverse(value)
    end
    return value
  end)
end

-- module[name] = value: the original(s) set so that the module reads value
function ParametrizationList:_assign(value)
  local new = inverted(self, value)
  local list = rawget(self, "_n_originals") and new or { new }
  local olds = originals(self)
  if #list ~= #olds then
    raise(string.format("parametrize: right_inverse returned %d tensors, the parametrization has %d originals", #list, #olds))
  end
  torch.no_grad(function()
    for i, o in ipairs(olds) do
      if not is_tensor(list[i]) or table.concat(list[i]:size(), ",") ~= table.concat(o:size(), ",") then
        raise("parametrize: right_inverse must return tensors of the originals' shapes")
      end
      o:copy_(list[i])
    end
  end)
end

local function as_parameter(t, like)
  if nn.is_parameter(like) then return nn.Parameter(t, like.requires_grad) end
  return t
end

function ParametrizationList:__init(modules, original, unsafe)
  for _, m in ipairs(modules) do self:append(m) end
  local first = modules[1]
  if first.right_inverse == nil then
    self.original = original
    return
  end
  local new = torch.no_grad(function() return first:right_inverse(original) end)
  if is_tensor(new) then
    if not unsafe and (new.dtype ~= original.dtype or table.concat(new:size(), ",") ~= table.concat(original:size(), ",")) then
      raise("register_parametrization: right_inverse must return a tensor of the original's shape and dtype")
    end
    torch.no_grad(function() original:copy_(new) end)
    self.original = original
  elseif type(new) == "table" then
    rawset(self, "_n_originals", #new)
    for i, t in ipairs(new) do
      if not is_tensor(t) then raise("register_parametrization: right_inverse must return tensors") end
      self["original" .. (i - 1)] = as_parameter(t:detach():clone(), original)
    end
  else
    raise("register_parametrization: right_inverse must return a tensor or a list of tensors, got " .. typename(new))
  end
end

---------------------------------------------------------------- register, remove

local function check_module(module, fn)
  if not nn.is_module(module) then raise(fn .. ": expected a module, got " .. typename(module)) end
end

-- is_parametrized(module [, tensor_name]): whether the module (or that
-- tensor of it) has a parametrization.
function P.is_parametrized(module, name)
  local par = rawget(module, "_parametrized")
  if par == nil then return false end
  if name == nil then return next(par) ~= nil end
  return par[name] == true
end

-- register_parametrization(module, tensor_name, parametrization [,
-- {unsafe = false}]): module[tensor_name] (a parameter or a buffer) becomes
-- parametrization(original); a second registration on the same name
-- chains after the first. Unless unsafe, the value must keep the
-- original's shape and dtype.
function P.register_parametrization(module, name, parametrization, opts)
  local fn = "register_parametrization"
  check_module(module, fn)
  if not nn.is_module(parametrization) then
    raise(fn .. ": expected the parametrization to be a module, got " .. typename(parametrization))
  end
  local unsafe = type(opts) == "table" and opts.unsafe or opts == true
  if P.is_parametrized(module, name) then
    local list = module.parametrizations[name]
    local before = list:_evaluate()
    list:append(parametrization)
    local after = list:_evaluate()
    if not unsafe and (after.dtype ~= before.dtype or table.concat(after:size(), ",") ~= table.concat(before:size(), ",")) then
      list:_remove_module(list._modules.keys[#list._modules.keys])
      raise(fn .. ": the parametrization changes the tensor's shape or dtype (pass {unsafe = true} to allow it)")
    end
    return module
  end
  local original = module._parameters.map[name]
  local kind = "parameter"
  if original == nil then original, kind = module._buffers.map[name], "buffer" end
  if original == nil then
    raise(string.format("%s: the module has no parameter or buffer named '%s'", fn, tostring(name)))
  end
  local list = ParametrizationList({ parametrization }, original, unsafe)
  if not unsafe then
    local value = list:_evaluate()
    if not is_tensor(value) then raise(fn .. ": the parametrization must return a tensor, got " .. typename(value)) end
    if value.dtype ~= original.dtype or table.concat(value:size(), ",") ~= table.concat(original:size(), ",") then
      raise(string.format("%s: the parametrization changes the tensor's shape or dtype ([%s] %s to [%s] %s; "
                          .. "pass {unsafe = true} to allow it)", fn, table.concat(original:size(), ", "),
                          original.dtype.name, table.concat(value:size(), ", "), value.dtype.name))
    end
  end
  if kind == "parameter" then module:_remove_parameter(name) else module:_remove_buffer(name) end
  if module._modules.map.parametrizations == nil then module.parametrizations = nn.ModuleDict() end
  module.parametrizations[name] = list
  rawset(list, "_kind", kind)
  local par = rawget(module, "_parametrized") or {}
  par[name] = true
  rawset(module, "_parametrized", par)
  return module
end

-- remove_parametrizations(module, tensor_name [, leave_parametrized =
-- true]): the tensor a plain parameter (or buffer) again, holding the
-- parametrized value (or the original, with leave_parametrized false).
function P.remove_parametrizations(module, name, leave_parametrized)
  local fn = "remove_parametrizations"
  check_module(module, fn)
  if not P.is_parametrized(module, name) then
    raise(string.format("%s: module %s does not have a parametrization on %s", fn, module:_get_name(), tostring(name)))
  end
  if leave_parametrized == nil then leave_parametrized = true end
  local list = module.parametrizations[name]
  local olds = originals(list)
  local value
  if leave_parametrized then
    value = torch.no_grad(function() return list:_evaluate() end)
  elseif #olds > 1 then
    raise(fn .. ": cannot leave unparametrized (leave_parametrized = false) a tensor parametrized in terms of "
          .. "several tensors")
  end
  local kept = olds[1]
  if leave_parametrized then
    if #olds == 1 and value.dtype == kept.dtype and table.concat(value:size(), ",") == table.concat(kept:size(), ",") then
      torch.no_grad(function() kept:copy_(value) end)
    else
      kept = as_parameter(value:detach():clone(), kept)
    end
  end
  module._parametrized[name] = nil
  local dict = module.parametrizations
  dict:_remove_module(name)
  if #dict:keys() == 0 then module:_remove_module("parametrizations") end
  if rawget(list, "_kind") == "buffer" then
    module:register_buffer(name, kept:detach())
  else
    module[name] = nn.is_parameter(kept) and kept or nn.Parameter(kept)
  end
  return module
end

---------------------------------------------------------------- parametrizations

local U = require("dplua.nn.utils")
local parametrizations = {}
P.parametrizations = parametrizations

-- weight_norm(module [, name = "weight", dim = 0]): the tensor as
-- original0 * original1 / |original1| (g and v; norms over every dim but
-- dim, -1 for the whole), as PyTorch 2's parametrizations.weight_norm.
local WeightNorm = Module:extend("_WeightNorm")
function WeightNorm:__init(dim) self.dim = dim end
function WeightNorm:forward(g, v) return v * (g / U._norm_except_dim(v, self.dim)) end
function WeightNorm:right_inverse(w)
  return { U._norm_except_dim(w, self.dim), w }
end

function parametrizations.weight_norm(module, name, dim)
  if type(name) == "table" then name, dim = name.name, name.dim end
  name, dim = name or "weight", dim == nil and 0 or dim
  local w = module._parameters.map[name]
  if w ~= nil and (type(dim) ~= "number" or dim % 1 ~= 0 or dim < -1 or dim >= w:dim()) then
    raise(string.format("weight_norm: expected dim in [-1, %d), got %s", w:dim(), tostring(dim)))
  end
  return P.register_parametrization(module, name, WeightNorm(dim), { unsafe = true })
end

-- spectral_norm(module [, name = "weight", n_power_iterations = 1, eps =
-- 1e-12, dim]) (or an options table): the tensor divided by its largest
-- singular value, from power iteration on the buffers _u and _v (15
-- iterations at registration, n_power_iterations a forward in training),
-- as PyTorch's parametrizations.spectral_norm. A 1-D tensor is
-- normalised instead.
local SpectralNorm = Module:extend("_SpectralNorm")
function SpectralNorm:__init(weight, n_power_iterations, dim, eps)
  self.dim, self.eps, self.n_power_iterations = dim, eps, n_power_iterations
  if weight:dim() > 1 then
    local F = nn.functional
    local wm = self:_as_matrix(weight:detach())
    local o = { dtype = weight.dtype, device = weight.device }
    self:register_buffer("_u", F.normalize(torch.randn(wm:size(0), o), 2, 0, eps))
    self:register_buffer("_v", F.normalize(torch.randn(wm:size(1), o), 2, 0, eps))
    self:_power_method(wm, 15)
  end
end
function SpectralNorm:_as_matrix(w)
  local m = self.dim ~= 0 and w:movedim(self.dim, 0) or w
  return m:reshape(m:size(0), -1)
end
function SpectralNorm:_power_method(wm, n)
  local F = nn.functional
  torch.no_grad(function()
    for _ = 1, n do
      self._u:copy_(F.normalize(wm:mv(self._v), 2, 0, self.eps))
      self._v:copy_(F.normalize(wm:t():mv(self._u), 2, 0, self.eps))
    end
  end)
end
function SpectralNorm:forward(weight)
  if weight:dim() == 1 then return nn.functional.normalize(weight, 2, 0, self.eps) end
  local wm = self:_as_matrix(weight)
  if self.training then self:_power_method(wm:detach(), self.n_power_iterations) end
  local u, v = self._u:clone(), self._v:clone()
  return weight / u:dot(wm:mv(v))
end
function SpectralNorm:right_inverse(value) return value end

function parametrizations.spectral_norm(module, ...)
  local fn = "spectral_norm"
  check_module(module, fn)
  local name, n_power_iterations, eps, dim = U._spectral_args(fn, module, ...)
  local w = module._parameters.map[name] or module._buffers.map[name]
  if w == nil then raise(string.format("%s: the module has no parameter or buffer named '%s'", fn, tostring(name))) end
  return P.register_parametrization(module, name, SpectralNorm(w, n_power_iterations, dim, eps))
end

-- orthogonal(module [, name = "weight", {orthogonal_map =, use_trivialization
-- = true}]): the matrix (or each of a batch) kept orthogonal (orthonormal
-- columns, or rows where it is wide), as PyTorch's: "matrix_exp" (square
-- by default) is exp(A - A^T) of the lower triangle A, "cayley" (I - A/2)^-1
-- (I + A/2), "householder" (tall by default) the product of the lower
-- triangle's reflections; with use_trivialization the buffer `base` holds
-- the orthogonalized matrix it started from and the map is applied after
-- it (the original starts at -I, which every map turns into I).
local Orthogonal = Module:extend("_Orthogonal")
function Orthogonal:__init(weight, map, trivial)
  self.shape, self.orthogonal_map, self.trivial = weight:size(), map, trivial
end
-- PyTorch's test: Q^T Q close to I within 10 n eps (and rtol 1e-5)
local function is_orthogonal(Q)
  local n, k = Q:size(-2), Q:size(-1)
  local eye = torch.eye(k, { dtype = Q.dtype, device = Q.device })
  return torch.allclose(Q:transpose(-2, -1):matmul(Q), eye, 1e-5, 10 * n * torch.finfo(Q.dtype).eps)
end
-- Q of A's QR with R's diagonal made positive (the same Q PyTorch's
-- _make_orthogonal gives)
local function make_orthogonal(A)
  local Q, R = torch.linalg.qr(A)
  return Q * R:diagonal(0, -2, -1):sign():unsqueeze(-2)
end
function Orthogonal:forward(X)
  local n, k = X:size(-2), X:size(-1)
  local transposed = n < k
  if transposed then X, n, k = X:transpose(-2, -1), k, n end
  local Q
  if self.orthogonal_map == "householder" then
    local A = X:tril(-1)
    local tau = 2 / (1 + A:square():sum(-2))
    Q = torch.linalg.householder_product(A, tau) * X:diagonal(0, -2, -1):trunc():unsqueeze(-2)
  else
    X = X:tril()
    if n ~= k then
      local shape = X:size()
      shape[#shape] = n - k
      X = torch.cat({ X, torch.zeros(shape, { dtype = X.dtype, device = X.device }) }, -1)
    end
    local A = X - X:transpose(-2, -1)
    if self.orthogonal_map == "matrix_exp" then
      Q = torch.linalg.matrix_exp(A)
    else
      local eye = torch.eye(n, { dtype = A.dtype, device = A.device })
      Q = torch.linalg.solve(eye - A * 0.5, eye + A * 0.5)
    end
    if n ~= k then Q = Q:narrow(-1, 0, k) end
  end
  if self.base ~= nil then Q = self.base:matmul(Q) end
  return transposed and Q:transpose(-2, -1) or Q
end
function Orthogonal:right_inverse(Q)
  if table.concat(Q:size(), ",") ~= table.concat(self.shape, ",") then
    raise(string.format("orthogonal: expected a matrix or batch of matrices of shape [%s], got a tensor of shape [%s]",
                        table.concat(self.shape, ", "), table.concat(Q:size(), ", ")))
  end
  local init = Q
  local n, k = Q:size(-2), Q:size(-1)
  local transposed = n < k
  if transposed then Q, n, k = Q:transpose(-2, -1), k, n end
  if not self.trivial then
    if self.orthogonal_map ~= "householder" then
      -- at registration the original is kept as it is (PyTorch's too)
      if not self.registered then return init end
      raise("orthogonal: it is not possible to assign to the matrix exponential or the Cayley parametrizations " ..
            "when use_trivialization = false")
    end
    -- the reflections of Q's QR, with the diagonal holding the signs the
    -- forward multiplies by (flipped where LAPACK made no reflection: the
    -- forward's reflection of a zero vector is -1 there)
    return torch.no_grad(function()
      local A, tau = torch.geqrf(Q)
      local d = A:diagonal(0, -2, -1):sign()
      A:diagonal(0, -2, -1):copy_(torch.where(tau:eq(0), -d, d))
      return transposed and A:transpose(-2, -1):contiguous() or A
    end)
  end
  return torch.no_grad(function()
    local base
    if n == k then
      base = is_orthogonal(Q) and Q:clone() or make_orthogonal(Q)
    else   -- completed into an n x n orthogonal matrix
      local shape = Q:size()
      shape[#shape] = n - k
      base = make_orthogonal(torch.cat({ Q, torch.randn(shape, { dtype = Q.dtype, device = Q.device }) }, -1))
    end
    if self._buffers.map.base ~= nil then self.base = base else self:register_buffer("base", base) end
    local eye = torch.eye(init:size(-2), init:size(-1), { dtype = init.dtype, device = init.device })
    return (-eye):expand(init:size()):clone()
  end)
end

function parametrizations.orthogonal(module, name, opts)
  local fn = "orthogonal"
  check_module(module, fn)
  if type(name) == "table" then name, opts = name.name, name end
  name = name or "weight"
  opts = torch._options(opts, fn)
  local w = module._parameters.map[name] or module._buffers.map[name]
  if w == nil then raise(string.format("%s: the module has no parameter or buffer named '%s'", fn, tostring(name))) end
  if w:dim() < 2 then raise(string.format("%s: expected a matrix, got a tensor of %d dims", fn, w:dim())) end
  local n, k = w:size(-2), w:size(-1)
  local map = opts.orthogonal_map or (n == k and "matrix_exp" or "householder")
  if map ~= "matrix_exp" and map ~= "cayley" and map ~= "householder" then
    raise(fn .. ': orthogonal_map has to be one of "matrix_exp", "cayley", "householder", got ' .. tostring(map))
  end
  local trivial = opts.use_trivialization ~= false
  local orth = Orthogonal(w, map, trivial)
  P.register_parametrization(module, name, orth, { unsafe = true })
  orth.registered = true
  return module
end

return P
