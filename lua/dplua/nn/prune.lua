-- nn.utils.prune: PyTorch's pruning. Pruning `name` of a module moves the
-- parameter to `name_orig`, keeps a mask in the buffer `name_mask` (state
-- dict keys as PyTorch's) and recomputes `name = name_orig * name_mask`
-- before every forward (a forward pre-hook: the pruning method itself).
-- Pruning the same tensor again combines the masks as PyTorch's
-- PruningContainer does: the new method sees only what is left (the
-- unpruned entries, or the channels not yet all zero). `remove` makes the
-- pruning permanent.
--
-- Amounts: a whole number is a count of entries (channels for the
-- structured methods), anything else in [0, 1) the fraction of them,
-- rounded half to even as Python's round. Lua has one number type, so
-- PyTorch's amount=1.0 (everything) is written as the count.
local torch = require("dplua")

local raise = torch._raise
local is_tensor = torch.is_tensor

local prune = {}

local function typename(v) return is_tensor(v) and "Tensor" or type(v) end
local function shape_str(t) return "[" .. table.concat(t:size(), ", ") .. "]" end

---------------------------------------------------------------- amounts

local function is_count(amount) return amount % 1 == 0 end

local function check_amount(amount, fn)
  if type(amount) ~= "number" or amount ~= amount then
    raise(string.format("%s: invalid type for amount: %s; expected a number", fn, typename(amount)))
  end
  if amount < 0 or (not is_count(amount) and amount > 1) then
    raise(string.format("%s: amount=%s should either be a fraction in [0, 1) or a non-negative whole number",
                        fn, tostring(amount)))
  end
  return amount
end

-- Python's round: halves go to the even neighbour
local function round_half_even(x)
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then return f + 1 end
  return f
end

-- how many of n to prune, checked against n
local function count_to_prune(amount, n, fn)
  if is_count(amount) then
    if amount > n then
      raise(string.format("%s: amount=%d should be smaller than the number of parameters to prune=%d", fn, amount, n))
    end
    return amount
  end
  return round_half_even(amount * n)
end

---------------------------------------------------------------- methods

-- BasePruningMethod: a class of pruning methods. A method of one's own:
--   local Every2nd = prune.BasePruningMethod:extend("Every2nd")
--   Every2nd.PRUNING_TYPE = "unstructured"
--   function Every2nd:compute_mask(t, default_mask) ... return mask end
--   Every2nd:apply(module, "weight" [, {importance_scores =, ...}])
-- compute_mask(t, default_mask) gets the importance scores (the tensor
-- itself by default) and the mask so far, and returns the new mask.
local BasePruningMethod = { __name = "BasePruningMethod" }
BasePruningMethod.__index = BasePruningMethod
prune.BasePruningMethod = BasePruningMethod

local function construct(cls, ...)
  local self = setmetatable({}, cls)
  if cls.__init then cls.__init(self, ...) end
  return self
end

function BasePruningMethod:extend(name)
  local cls = setmetatable({ __name = name }, { __index = self, __call = construct, __tostring = function() return name end })
  cls.__index = cls
  cls.__call = BasePruningMethod.__call
  cls.__tostring = BasePruningMethod.__tostring
  return cls
end
setmetatable(BasePruningMethod, { __call = construct })

function BasePruningMethod:__tostring() return self.__name .. "()" end

function BasePruningMethod:compute_mask()
  raise(self.__name .. ": a pruning method must define compute_mask(t, default_mask)")
end

-- the pruned tensor: the original times the mask
function BasePruningMethod:apply_mask(module)
  local name = self._tensor_name
  local orig, mask = module[name .. "_orig"], module[name .. "_mask"]
  return mask:to(orig.dtype) * orig
end

-- as a forward pre-hook: the pruned tensor recomputed before forward
function BasePruningMethod:__call(module)
  module[self._tensor_name] = self:apply_mask(module)
end

-- prune.remove's work: the pruned tensor becomes the parameter again (the
-- same Parameter object, its values masked), name_orig and name_mask gone
function BasePruningMethod:remove(module)
  local name = self._tensor_name
  local orig = module._parameters.map[name .. "_orig"]
  local weight = torch.no_grad(function() return self:apply_mask(module) end)
  module[name] = nil
  module:_remove_parameter(name .. "_orig")
  module:_remove_buffer(name .. "_mask")
  torch.no_grad(function() orig:copy_(weight) end)
  module[name] = orig
end

local hooks_field = "_pruning_hooks"

local function check_module(module, fn)
  if not torch.nn.is_module(module) then raise(fn .. ": expected a module, got " .. typename(module)) end
end

-- cls:apply(module, name [, opts]): prune module[name] with cls(opts)
-- (opts.importance_scores, of the tensor's shape, ranks the entries in
-- its place); a tensor already pruned gets the methods combined.
function BasePruningMethod.apply(cls, module, name, opts)
  local fn = "prune"
  check_module(module, fn)
  if type(name) ~= "string" then raise(fn .. ": expected the tensor's name as a string, got " .. typename(name)) end
  opts = opts or {}
  local hooks = module._attrs[hooks_field] or {}
  local old = hooks[name]
  if old == nil and module._parameters.map[name] == nil then
    raise(string.format("%s: the module has no parameter named '%s'", fn, name))
  end
  local method = cls(opts)
  method._tensor_name = name
  local added_to   -- an existing container the new method joins (taken back out if this fails)
  if old ~= nil then
    local container = old.method
    if getmetatable(container) ~= prune.PruningContainer then container = prune.PruningContainer(container)
    else added_to = container end
    container:add_pruning_method(method)
    method = container
  end
  local function undo_add() if added_to then table.remove(added_to._pruning_methods) end end
  local orig = module[name]   -- (already pruned: the pruned values)
  local scores = opts.importance_scores or orig
  if not is_tensor(scores) or table.concat(scores:size(), ",") ~= table.concat(orig:size(), ",") then
    undo_add()
    raise(string.format("%s: importance_scores should have the shape of parameter %s %s, got %s", fn, name,
                        shape_str(orig), is_tensor(scores) and shape_str(scores) or typename(scores)))
  end
  local default_mask
  if old == nil then
    module:_remove_parameter(name)
    module:register_parameter(name .. "_orig", orig)
    default_mask = torch.ones_like(orig)
  else
    default_mask = module[name .. "_mask"]:detach():clone()
  end
  local ok, mask = pcall(function()
    return torch.no_grad(function() return method:compute_mask(scores:detach(), default_mask) end)
  end)
  if not ok then   -- as it was before
    undo_add()
    if old == nil then
      module:_remove_parameter(name .. "_orig")
      module:register_parameter(name, orig)
    end
    error(mask, 0)
  end
  if old ~= nil then
    old.handle:remove()
    module[name .. "_mask"] = mask
  else
    module:register_buffer(name .. "_mask", mask)
  end
  module[name] = method:apply_mask(module)
  hooks[name] = { method = method, handle = module:register_forward_pre_hook(method) }
  module[hooks_field] = hooks
  return method
end

-- an options table or positional arguments, as names
local function args(names, ...)
  local first = ...
  if type(first) == "table" and not is_tensor(first) then return first end
  local o = {}
  for i, k in ipairs(names) do o[k] = (select(i, ...)) end
  return o
end

-- the mask with the k entries of t ranked first by key (the smallest or
-- the largest) set to 0
local function zero_ranked(t, mask, k, largest)
  mask = mask:clone()
  if k > 0 then
    local _, index = t:reshape(-1):topk(k, 0, largest)
    mask:view(-1):index_fill_(0, index, 0)
  end
  return mask
end

local function structured_check(t, dim, fn)
  if t:dim() <= 1 then
    raise(string.format("%s: structured pruning can only be applied to multidimensional tensors; found a tensor of shape %s "
                        .. "with %d dims", fn, shape_str(t), t:dim()))
  end
  if dim >= t:dim() or dim < -t:dim() then
    raise(string.format("%s: invalid dim %d for a tensor of shape %s", fn, dim, shape_str(t)))
  end
  return dim < 0 and dim + t:dim() or dim
end

-- a mask of t's shape holding ones in the channels `index` of dim, times
-- the mask so far
local function channel_mask(t, dim, index, default_mask)
  local mask = torch.zeros_like(default_mask)
  mask:index_fill_(dim, index, 1)
  return mask * default_mask
end

-- Identity: no entry pruned (a mask of ones)
local Identity = BasePruningMethod:extend("Identity")
Identity.PRUNING_TYPE = "unstructured"
function Identity:compute_mask(_, default_mask) return default_mask end
prune.Identity = Identity

-- L1Unstructured(amount): the entries of the smallest magnitude
local L1Unstructured = BasePruningMethod:extend("L1Unstructured")
L1Unstructured.PRUNING_TYPE = "unstructured"
function L1Unstructured:__init(...)
  self.amount = check_amount(args({ "amount" }, ...).amount, "L1Unstructured")
end
function L1Unstructured:compute_mask(t, default_mask)
  return zero_ranked(t:abs(), default_mask, count_to_prune(self.amount, t:numel(), "L1Unstructured"), false)
end
prune.L1Unstructured = L1Unstructured

-- RandomUnstructured(amount): entries drawn at random
local RandomUnstructured = BasePruningMethod:extend("RandomUnstructured")
RandomUnstructured.PRUNING_TYPE = "unstructured"
function RandomUnstructured:__init(...)
  self.amount = check_amount(args({ "amount" }, ...).amount, "RandomUnstructured")
end
function RandomUnstructured:compute_mask(t, default_mask)
  local k = count_to_prune(self.amount, t:numel(), "RandomUnstructured")
  return zero_ranked(torch.rand(t:size(), { dtype = torch.float64, device = t.device }), default_mask, k, true)
end
prune.RandomUnstructured = RandomUnstructured

-- LnStructured(amount, n [, dim = -1]): the channels along dim of the
-- smallest n-norm (n a number, math.huge or -math.huge, or "fro")
local LnStructured = BasePruningMethod:extend("LnStructured")
LnStructured.PRUNING_TYPE = "structured"
function LnStructured:__init(...)
  local o = args({ "amount", "n", "dim" }, ...)
  self.amount = check_amount(o.amount, "LnStructured")
  self.n = o.n == "fro" and 2 or o.n
  if type(self.n) ~= "number" then
    raise("LnStructured: expected n to be a number (math.huge for the max norm) or \"fro\", got " .. tostring(o.n))
  end
  self.dim = o.dim == nil and -1 or o.dim
  if type(self.dim) ~= "number" or self.dim % 1 ~= 0 then raise("LnStructured: expected dim to be an integer") end
end
function LnStructured:compute_mask(t, default_mask)
  local fn = "LnStructured"
  local dim = structured_check(t, self.dim, fn)
  local channels = t:size(dim)
  local k = count_to_prune(self.amount, channels, fn)
  if k == 0 then return default_mask end
  local others = {}
  for d = 0, t:dim() - 1 do if d ~= dim then others[#others + 1] = d end end
  local norms = torch.linalg.vector_norm(t, self.n, others)
  local _, keep = norms:topk(channels - k, 0, true)
  return channel_mask(t, dim, keep, default_mask)
end
prune.LnStructured = LnStructured

-- RandomStructured(amount [, dim = -1]): channels along dim drawn at random
local RandomStructured = BasePruningMethod:extend("RandomStructured")
RandomStructured.PRUNING_TYPE = "structured"
function RandomStructured:__init(...)
  local o = args({ "amount", "dim" }, ...)
  self.amount = check_amount(o.amount, "RandomStructured")
  self.dim = o.dim == nil and -1 or o.dim
  if type(self.dim) ~= "number" or self.dim % 1 ~= 0 then raise("RandomStructured: expected dim to be an integer") end
end
function RandomStructured:compute_mask(t, default_mask)
  local fn = "RandomStructured"
  local dim = structured_check(t, self.dim, fn)
  local channels = t:size(dim)
  local k = count_to_prune(self.amount, channels, fn)
  if k == 0 then return default_mask end
  local _, keep = torch.rand(channels, { dtype = torch.float64, device = t.device }):topk(channels - k, 0, true)
  return channel_mask(t, dim, keep, default_mask)
end
prune.RandomStructured = RandomStructured

-- CustomFromMask(mask): the entries where mask is 0
local CustomFromMask = BasePruningMethod:extend("CustomFromMask")
CustomFromMask.PRUNING_TYPE = "global"
function CustomFromMask:__init(...)
  self.mask = args({ "mask" }, ...).mask
  if not is_tensor(self.mask) then raise("CustomFromMask: expected mask to be a tensor, got " .. typename(self.mask)) end
end
function CustomFromMask:compute_mask(_, default_mask)
  if table.concat(self.mask:size(), ",") ~= table.concat(default_mask:size(), ",") then
    raise(string.format("CustomFromMask: expected a mask of the tensor's shape %s, got %s", shape_str(default_mask),
                        shape_str(self.mask)))
  end
  return default_mask * self.mask:to(default_mask.dtype)
end
prune.CustomFromMask = CustomFromMask

-- PruningContainer(method...): the methods applied to one tensor in turn,
-- each on what the ones before left
local PruningContainer = BasePruningMethod:extend("PruningContainer")
function PruningContainer:__init(...)
  self._pruning_methods = {}
  for i = 1, select("#", ...) do self:add_pruning_method((select(i, ...))) end
end
function PruningContainer:add_pruning_method(method)
  if getmetatable(method) == nil or method.compute_mask == nil then
    raise("PruningContainer: expected a pruning method, got " .. typename(method))
  end
  if self._tensor_name ~= nil and method._tensor_name ~= self._tensor_name then
    raise(string.format("PruningContainer: can only add pruning methods acting on the parameter named '%s', got '%s'",
                        self._tensor_name, tostring(method._tensor_name)))
  end
  self._tensor_name = method._tensor_name
  self._pruning_methods[#self._pruning_methods + 1] = method
end
function PruningContainer:__tostring()
  local names = {}
  for i, m in ipairs(self._pruning_methods) do names[i] = tostring(m) end
  return "PruningContainer(" .. table.concat(names, ", ") .. ")"
end
-- the last method's mask on the part the mask so far leaves: the entries
-- still 1 (unstructured), the channels not all 0 (structured), or all
function PruningContainer:compute_mask(t, default_mask)
  local method = self._pruning_methods[#self._pruning_methods]
  local kind = method.PRUNING_TYPE
  local new_mask = default_mask:clone()
  if kind == "unstructured" then
    local left = default_mask:eq(1)
    local partial = method:compute_mask(t:masked_select(left), default_mask:masked_select(left))
    return new_mask:masked_scatter(left, partial:to(new_mask.dtype))
  elseif kind == "structured" then
    if type(method.dim) ~= "number" then raise("PruningContainer: a structured pruning method must have a dim") end
    local dim = structured_check(t, method.dim, tostring(method))
    local others = {}
    for d = 0, t:dim() - 1 do if d ~= dim then others[#others + 1] = d end end
    local kept = default_mask:sum(others):ne(0):nonzero():reshape(-1)
    local partial = method:compute_mask(t:index_select(dim, kept), default_mask:index_select(dim, kept))
    return new_mask:index_copy(dim, kept, partial:to(new_mask.dtype))
  elseif kind == "global" then
    return method:compute_mask(t, default_mask)
  end
  raise(string.format("PruningContainer: unrecognized PRUNING_TYPE %s of %s", tostring(kind), tostring(method)))
end
prune.PruningContainer = PruningContainer

---------------------------------------------------------------- the functions

function prune.identity(module, name)
  Identity:apply(module, name)
  return module
end

-- l1_unstructured(module, name, amount [, importance_scores]) (or
-- (module, name, {amount =, importance_scores =}))
function prune.l1_unstructured(module, name, ...)
  L1Unstructured:apply(module, name, args({ "amount", "importance_scores" }, ...))
  return module
end

function prune.random_unstructured(module, name, ...)
  RandomUnstructured:apply(module, name, args({ "amount" }, ...))
  return module
end

-- ln_structured(module, name, amount, n, dim [, importance_scores])
function prune.ln_structured(module, name, ...)
  local o = args({ "amount", "n", "dim", "importance_scores" }, ...)
  if o.dim == nil then raise("ln_structured: expected dim, the dim of the channels to prune") end
  LnStructured:apply(module, name, o)
  return module
end

-- random_structured(module, name, amount, dim)
function prune.random_structured(module, name, ...)
  local o = args({ "amount", "dim" }, ...)
  if o.dim == nil then raise("random_structured: expected dim, the dim of the channels to prune") end
  RandomStructured:apply(module, name, o)
  return module
end

function prune.custom_from_mask(module, name, mask)
  CustomFromMask:apply(module, name, { mask = mask })
  return module
end

-- global_unstructured(parameters, pruning_method [, opts]): the tensors
-- {module, name} of the list ranked together, by pruning_method (an
-- unstructured method's class, e.g. prune.L1Unstructured) built with opts
-- (its amount counts over all of them); opts.importance_scores, a list in
-- the order of parameters, ranks them in their place.
function prune.global_unstructured(parameters, pruning_method, opts)
  local fn = "global_unstructured"
  if type(parameters) ~= "table" or is_tensor(parameters) then
    raise(fn .. ": expected parameters as a list of {module, name} pairs, got " .. typename(parameters))
  end
  if type(pruning_method) ~= "table" or pruning_method.apply ~= BasePruningMethod.apply then
    raise(fn .. ": expected pruning_method to be a pruning method's class, got " .. typename(pruning_method))
  end
  opts = opts or {}
  if pruning_method.PRUNING_TYPE ~= "unstructured" then
    raise(string.format('%s: only "unstructured" pruning methods are supported, got %s of type %s', fn,
                        pruning_method.__name, tostring(pruning_method.PRUNING_TYPE)))
  end
  local scores, masks = {}, {}
  for i, pair in ipairs(parameters) do
    if type(pair) ~= "table" or not torch.nn.is_module(pair[1]) or type(pair[2]) ~= "string" then
      raise(string.format("%s: parameters[%d] should be a {module, name} pair", fn, i))
    end
    local t = pair[1][pair[2]]
    if not is_tensor(t) then raise(string.format("%s: the module of parameters[%d] has no tensor '%s'", fn, i, pair[2])) end
    local s = opts.importance_scores and opts.importance_scores[i] or t
    scores[i] = s:detach():reshape(-1)
    local m = pair[1][pair[2] .. "_mask"]
    masks[i] = (m or torch.ones_like(t)):reshape(-1)
  end
  local container = PruningContainer()
  container._tensor_name = "temp"
  local method = pruning_method(opts)
  method._tensor_name = "temp"
  container:add_pruning_method(method)
  local final = torch.no_grad(function() return container:compute_mask(torch.cat(scores), torch.cat(masks)) end)
  local at = 0
  for i, pair in ipairs(parameters) do
    local n = masks[i]:numel()
    prune.custom_from_mask(pair[1], pair[2], final:narrow(0, at, n):reshape(pair[1][pair[2]]:size()))
    at = at + n
  end
end

-- remove(module, name): the pruning made permanent
function prune.remove(module, name)
  check_module(module, "remove")
  local hooks = module._attrs[hooks_field]
  local h = hooks and hooks[name]
  if h == nil then
    raise(string.format("remove: parameter '%s' of module %s has to be pruned before pruning can be removed",
                        tostring(name), module:_get_name()))
  end
  h.handle:remove()
  hooks[name] = nil
  h.method:remove(module)
  return module
end

-- is_pruned(module): whether it or a module inside it is pruned
function prune.is_pruned(module)
  check_module(module, "is_pruned")
  for _, m in ipairs(module:modules()) do
    local hooks = m._attrs[hooks_field]
    if hooks and next(hooks) ~= nil then return true end
  end
  return false
end

return prune
