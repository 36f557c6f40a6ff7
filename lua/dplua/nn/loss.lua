-- dplua.nn.loss: loss modules over nn.functional. Options as in PyTorch's
-- keyword arguments, in one table:
--   nn.CrossEntropyLoss({weight=w, ignore_index=-100, reduction="mean", label_smoothing=0})
-- A weight (CrossEntropyLoss's and NLLLoss's per class, BCELoss's and
-- BCEWithLogitsLoss's, and BCEWithLogitsLoss's pos_weight) is a buffer, as
-- in PyTorch, so it moves with :to() and appears in state_dict().
local torch = require("dplua")
local module = require("dplua.nn.module")
local F = require("dplua.nn.functional")
local raise = torch._raise
local Module = module.Module

local L = {}

local function opts_of(opts, fn, allowed)
  if opts == nil then return {} end
  if type(opts) == "string" then return { reduction = opts } end
  if type(opts) ~= "table" or torch.is_tensor(opts) then
    raise(fn .. ": expected an options table ({reduction=, ...}), got " .. (torch.is_tensor(opts) and "Tensor" or type(opts)))
  end
  for k in pairs(opts) do
    if not allowed[k] then raise(fn .. ": unknown option '" .. tostring(k) .. "'") end
  end
  return opts
end

local function reduction(opts, fn)
  local r = opts.reduction or "mean"
  if r ~= "none" and r ~= "mean" and r ~= "sum" then
    raise(string.format('%s: reduction must be "none", "mean" or "sum", got %s', fn, tostring(r)))
  end
  return r
end

local function number(opts, key, fn, default)
  local v = opts[key]
  if v == nil then return default end
  if type(v) ~= "number" then
    raise(string.format("%s: expected %s to be a number, got %s", fn, key, torch.is_tensor(v) and "Tensor" or type(v)))
  end
  return v
end

L.CrossEntropyLoss = Module:extend("CrossEntropyLoss")
function L.CrossEntropyLoss:__init(opts)
  opts = opts_of(opts, "CrossEntropyLoss", { weight = true, ignore_index = true, reduction = true, label_smoothing = true })
  self:register_buffer("weight", opts.weight)
  self.ignore_index = opts.ignore_index or -100
  self.reduction = reduction(opts, "CrossEntropyLoss")
  self.label_smoothing = opts.label_smoothing or 0
end
function L.CrossEntropyLoss:forward(input, target)
  return F.cross_entropy(input, target, { weight = self.weight, ignore_index = self.ignore_index,
                                          reduction = self.reduction, label_smoothing = self.label_smoothing })
end

L.NLLLoss = Module:extend("NLLLoss")
function L.NLLLoss:__init(opts)
  opts = opts_of(opts, "NLLLoss", { weight = true, ignore_index = true, reduction = true })
  self:register_buffer("weight", opts.weight)
  self.ignore_index = opts.ignore_index or -100
  self.reduction = reduction(opts, "NLLLoss")
end
function L.NLLLoss:forward(input, target)
  return F.nll_loss(input, target, { weight = self.weight, ignore_index = self.ignore_index, reduction = self.reduction })
end

-- NLLLoss2d: NLLLoss, PyTorch's older name for it over images
L.NLLLoss2d = L.NLLLoss:extend("NLLLoss2d")

L.MSELoss = Module:extend("MSELoss")
function L.MSELoss:__init(opts)
  opts = opts_of(opts, "MSELoss", { reduction = true })
  self.reduction = reduction(opts, "MSELoss")
end
function L.MSELoss:forward(input, target) return F.mse_loss(input, target, { reduction = self.reduction }) end

L.L1Loss = Module:extend("L1Loss")
L.L1Loss.__init = function(self, opts)
  opts = opts_of(opts, "L1Loss", { reduction = true })
  self.reduction = reduction(opts, "L1Loss")
end
function L.L1Loss:forward(input, target) return F.l1_loss(input, target, { reduction = self.reduction }) end

L.BCEWithLogitsLoss = Module:extend("BCEWithLogitsLoss")
function L.BCEWithLogitsLoss:__init(opts)
  opts = opts_of(opts, "BCEWithLogitsLoss", { weight = true, pos_weight = true, reduction = true })
  self:register_buffer("weight", opts.weight)
  self:register_buffer("pos_weight", opts.pos_weight)
  self.reduction = reduction(opts, "BCEWithLogitsLoss")
end
function L.BCEWithLogitsLoss:forward(input, target)
  return F.binary_cross_entropy_with_logits(input, target, { weight = self.weight, pos_weight = self.pos_weight,
                                                             reduction = self.reduction })
end

L.BCELoss = Module:extend("BCELoss")
function L.BCELoss:__init(opts)
  opts = opts_of(opts, "BCELoss", { weight = true, reduction = true })
  self:register_buffer("weight", opts.weight)
  self.reduction = reduction(opts, "BCELoss")
end
function L.BCELoss:forward(input, target)
  return F.binary_cross_entropy(input, target, { weight = self.weight, reduction = self.reduction })
end

L.SmoothL1Loss = Module:extend("SmoothL1Loss")
function L.SmoothL1Loss:__init(opts)
  opts = opts_of(opts, "SmoothL1Loss", { reduction = true, beta = true })
  self.reduction = reduction(opts, "SmoothL1Loss")
  self.beta = number(opts, "beta", "SmoothL1Loss", 1.0)
  if not (self.beta >= 0) then raise("SmoothL1Loss: beta must be non-negative, got " .. tostring(self.beta)) end
end
function L.SmoothL1Loss:forward(input, target)
  return F.smooth_l1_loss(input, target, { reduction = self.reduction, beta = self.beta })
end

L.HuberLoss = Module:extend("HuberLoss")
function L.HuberLoss:__init(opts)
  opts = opts_of(opts, "HuberLoss", { reduction = true, delta = true })
  self.reduction = reduction(opts, "HuberLoss")
  self.delta = number(opts, "delta", "HuberLoss", 1.0)
  if not (self.delta > 0) then raise("HuberLoss: delta must be positive, got " .. tostring(self.delta)) end
end
function L.HuberLoss:forward(input, target)
  return F.huber_loss(input, target, { reduction = self.reduction, delta = self.delta })
end

-- KLDivLoss({reduction="mean", log_target=false}): reduction may also be
-- "batchmean", the divergence's definition (see F.kl_div).
L.KLDivLoss = Module:extend("KLDivLoss")
function L.KLDivLoss:__init(opts)
  opts = opts_of(opts, "KLDivLoss", { reduction = true, log_target = true })
  local r = opts.reduction or "mean"
  if r ~= "none" and r ~= "mean" and r ~= "sum" and r ~= "batchmean" then
    raise('KLDivLoss: reduction must be "none", "mean", "sum" or "batchmean", got ' .. tostring(r))
  end
  self.reduction = r
  self.log_target = opts.log_target or false
  if type(self.log_target) ~= "boolean" then
    raise("KLDivLoss: expected log_target to be a boolean, got " .. type(self.log_target))
  end
end
function L.KLDivLoss:forward(input, target)
  return F.kl_div(input, target, { reduction = self.reduction, log_target = self.log_target })
end

L.SoftMarginLoss = Module:extend("SoftMarginLoss")
function L.SoftMarginLoss:__init(opts)
  opts = opts_of(opts, "SoftMarginLoss", { reduction = true })
  self.reduction = reduction(opts, "SoftMarginLoss")
end
function L.SoftMarginLoss:forward(input, target)
  return F.soft_margin_loss(input, target, { reduction = self.reduction })
end

-- The losses over a pair of inputs and a target of 1 or -1, with a margin.
local function margin_loss(name, default)
  local cls = Module:extend(name)
  function cls:__init(opts)
    opts = opts_of(opts, name, { margin = true, reduction = true })
    self.margin = number(opts, "margin", name, default)
    self.reduction = reduction(opts, name)
  end
  return cls
end

L.CosineEmbeddingLoss = margin_loss("CosineEmbeddingLoss", 0)
function L.CosineEmbeddingLoss:forward(input1, input2, target)
  return F.cosine_embedding_loss(input1, input2, target, { margin = self.margin, reduction = self.reduction })
end

L.MarginRankingLoss = margin_loss("MarginRankingLoss", 0)
function L.MarginRankingLoss:forward(input1, input2, target)
  return F.margin_ranking_loss(input1, input2, target, { margin = self.margin, reduction = self.reduction })
end

L.HingeEmbeddingLoss = margin_loss("HingeEmbeddingLoss", 1.0)
function L.HingeEmbeddingLoss:forward(input, target)
  return F.hinge_embedding_loss(input, target, { margin = self.margin, reduction = self.reduction })
end


-- A loss module over F[fname] whose options (names, with PyTorch's
-- defaults in defaults) are kept as fields, a weight as a buffer, and
-- handed back to the function, which checks them, at every call.
local function options_loss(name, fname, names, defaults)
  local cls = Module:extend(name)
  local allowed = { reduction = true }
  for _, k in ipairs(names) do allowed[k] = true end
  function cls:__init(opts)
    opts = opts_of(opts, name, allowed)
    self.reduction = reduction(opts, name)
    for _, k in ipairs(names) do
      local v = opts[k]
      if v == nil then v = defaults[k] end
      if k == "weight" then self:register_buffer(k, v) else self[k] = v end
    end
  end
  function cls:forward(...)
    local o = { reduction = self.reduction }
    for _, k in ipairs(names) do o[k] = self[k] end
    local args = { ... }
    args[select("#", ...) + 1] = o
    return F[fname](unpack(args, 1, select("#", ...) + 1))
  end
  return cls
end

L.PoissonNLLLoss = options_loss("PoissonNLLLoss", "poisson_nll_loss", { "log_input", "full", "eps" },
                                { log_input = true, full = false, eps = 1e-8 })
L.GaussianNLLLoss = options_loss("GaussianNLLLoss", "gaussian_nll_loss", { "full", "eps" }, { full = false, eps = 1e-6 })
L.TripletMarginLoss = options_loss("TripletMarginLoss", "triplet_margin_loss", { "margin", "p", "eps", "swap" },
                                   { margin = 1.0, p = 2.0, eps = 1e-6, swap = false })
L.TripletMarginWithDistanceLoss = options_loss("TripletMarginWithDistanceLoss", "triplet_margin_with_distance_loss",
                                               { "distance_function", "margin", "swap" }, { margin = 1.0, swap = false })
L.MultiMarginLoss = options_loss("MultiMarginLoss", "multi_margin_loss", { "p", "margin", "weight" },
                                 { p = 1, margin = 1.0 })
L.MultiLabelMarginLoss = options_loss("MultiLabelMarginLoss", "multilabel_margin_loss", {}, {})
L.MultiLabelSoftMarginLoss = options_loss("MultiLabelSoftMarginLoss", "multilabel_soft_margin_loss", { "weight" }, {})
L.CTCLoss = options_loss("CTCLoss", "ctc_loss", { "blank", "zero_infinity" }, { blank = 0, zero_infinity = false })

---------------------------------------------------------------- AdaptiveLogSoftmaxWithLoss

-- AdaptiveLogSoftmaxWithLoss(in_features, n_classes, cutoffs [, div_value =
-- 4, head_bias = false]) (or an options table after cutoffs): Grave et
-- al.'s adaptive softmax, as PyTorch's: the head predicts the first
-- cutoffs[1] classes and one entry per cluster; cluster i (classes
-- cutoffs[i] .. cutoffs[i+1] - 1) is a Linear(in, in / div_value^i) then a
-- Linear to its classes. forward(input, target) returns output (each
-- target's log-probability) and loss (the mean of -output); log_prob(input)
-- every class's log-probability, predict(input) the most probable class.
L.AdaptiveLogSoftmaxWithLoss = Module:extend("AdaptiveLogSoftmaxWithLoss")
local ASM = L.AdaptiveLogSoftmaxWithLoss
function ASM:__init(in_features, n_classes, cutoffs, div_value, head_bias)
  local fn = "AdaptiveLogSoftmaxWithLoss"
  local opts = {}
  if type(div_value) == "table" then opts = div_value; div_value, head_bias = opts.div_value, opts.head_bias end
  for _, a in ipairs({ { "in_features", in_features }, { "n_classes", n_classes } }) do
    if type(a[2]) ~= "number" or a[2] % 1 ~= 0 or a[2] < 1 then
      raise(string.format("%s: expected %s to be a positive integer, got %s", fn, a[1], tostring(a[2])))
    end
  end
  if type(cutoffs) ~= "table" or #cutoffs == 0 then raise(fn .. ": expected cutoffs to be a non-empty list of class counts") end
  for i, c in ipairs(cutoffs) do
    if type(c) ~= "number" or c % 1 ~= 0 or c <= 0 or c > n_classes - 1 or (i > 1 and c <= cutoffs[i - 1]) then
      raise(fn .. ": cutoffs should be a sequence of unique, positive integers sorted in an increasing order, where "
            .. "each value is between 1 and n_classes-1")
    end
  end
  self.in_features, self.n_classes = in_features, n_classes
  self.cutoffs = {}
  for i, c in ipairs(cutoffs) do self.cutoffs[i] = c end
  self.cutoffs[#self.cutoffs + 1] = n_classes
  self.div_value = div_value or 4.0
  self.head_bias = head_bias == true
  self.shortlist_size = self.cutoffs[1]
  self.n_clusters = #self.cutoffs - 1
  self.head_size = self.shortlist_size + self.n_clusters
  local o = { bias = self.head_bias, dtype = opts.dtype, device = opts.device }
  self.head = torch.nn.Linear(in_features, self.head_size, o)
  self.tail = torch.nn.ModuleList()
  for i = 1, self.n_clusters do
    local hsz = math.floor(in_features / self.div_value ^ i)
    local osz = self.cutoffs[i + 1] - self.cutoffs[i]
    local lo = { bias = false, dtype = opts.dtype, device = opts.device }
    self.tail:append(torch.nn.Sequential(torch.nn.Linear(in_features, hsz, lo), torch.nn.Linear(hsz, osz, lo)))
  end
end

function ASM:forward(input, target)
  local fn = "AdaptiveLogSoftmaxWithLoss"
  if not torch.is_tensor(input) or not torch.is_tensor(target) then raise(fn .. ": expected input and target tensors") end
  local batched = input:dim() == 2
  if not batched then
    if input:dim() ~= 1 or target:dim() ~= 0 then
      raise(fn .. ": 1D target tensor expects 2D input tensors, but found inputs with size " .. tostring(input:size()))
    end
    input, target = input:unsqueeze(0), target:unsqueeze(0)
  elseif target:dim() ~= 1 then
    raise(fn .. ": 0D or 1D target tensor expected, multi-target not supported")
  end
  if input:size(0) ~= target:size(0) then
    raise(fn .. ": Input and target should have the same size in the batch dimension.")
  end
  if input:size(1) ~= self.in_features then
    raise(string.format("%s: expected input of %d features, got %d", fn, self.in_features, input:size(1)))
  end
  local n = target:size(0)
  local lo, hi = target:min():item(), target:max():item()
  if n > 0 and (lo < 0 or hi >= self.n_classes) then
    raise(string.format("%s: Target values should be in [0, %d], but values in range [%d, %d] were found.", fn,
                        self.n_classes - 1, lo, hi))
  end
  local output = torch.zeros(n, { dtype = input.dtype, device = input.device })
  local gather = target:clone()
  local bounds = { 0 }
  for _, c in ipairs(self.cutoffs) do bounds[#bounds + 1] = c end
  for i = 2, #bounds - 1 do
    local mask = target:ge(bounds[i]):logical_and(target:lt(bounds[i + 1]))
    local rows = mask:nonzero():reshape(-1)
    if rows:numel() > 0 then
      local relative = target:index_select(0, rows) - bounds[i]
      local logp = self.tail[i - 2](input:index_select(0, rows)):log_softmax(1)
      output = output:index_copy(0, rows, logp:gather(1, relative:unsqueeze(1)):squeeze(1))
      gather:index_fill_(0, rows, self.shortlist_size + i - 2)
    end
  end
  local head_logp = self.head(input):log_softmax(1)
  output = output + head_logp:gather(1, gather:unsqueeze(1)):squeeze(1)
  local loss = (-output):mean()
  if not batched then output = output:squeeze(0) end
  return output, loss
end

-- log_prob(input): (N, n_classes) log-probabilities of every class
function ASM:log_prob(input)
  local batched = input:dim() == 2
  local x = batched and input or input:unsqueeze(0)
  local head_logp = self.head(x):log_softmax(1)
  local parts = { head_logp:narrow(1, 0, self.shortlist_size) }
  for i = 1, self.n_clusters do
    local cluster = self.tail[i - 1](x):log_softmax(1)
    parts[#parts + 1] = cluster + head_logp:narrow(1, self.shortlist_size + i - 1, 1)
  end
  local out = torch.cat(parts, 1)
  return batched and out or out:squeeze(0)
end

-- predict(input): the class of largest log-probability
function ASM:predict(input) return (self:log_prob(input):argmax(-1)) end

function ASM:extra_repr() return "" end

return L
