-- dplua.nn.loss: loss modules over nn.functional. Options as in PyTorch's
-- keyword arguments, in one table:
--   nn.CrossEntropyLoss({weight=w, ignore_index=-100, reduction="mean", label_smoothing=0})
-- A class weight (and BCEWithLogitsLoss's pos_weight) is a buffer, as in
-- PyTorch, so it moves with :to() and appears in state_dict().
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

return L
