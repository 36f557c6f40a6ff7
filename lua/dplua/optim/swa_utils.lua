-- dplua.optim.swa_utils: torch.optim.swa_utils: AveragedModel (stochastic
-- weight averaging, or an exponential moving average with an avg_fn),
-- SWALR and update_bn, as PyTorch's.
--
--   local swa = torch.optim.swa_utils.AveragedModel(model)
--   local sched = torch.optim.swa_utils.SWALR(opt, {swa_lr = 0.05})
--   ... after each epoch from swa_start: swa:update_parameters(model); sched:step()
--   torch.optim.swa_utils.update_bn(loader, swa)
--   local ema = AveragedModel(model, {multi_avg_fn = swa_utils.get_ema_multi_avg_fn(0.999)})
local torch = require("dplua")
local raise = torch._raise
local nn = torch.nn
local lr_scheduler = require("dplua.optim.lr_scheduler")

local U = {}

local function typename(x) return torch.is_tensor(x) and "Tensor" or type(x) end

---------------------------------------------------------------- averaging functions

-- get_ema_avg_fn(decay = 0.999): avg_fn(averaged, current, n) of an
-- exponential moving average; get_ema_multi_avg_fn(decay) the same over
-- lists of tensors, updated in place.
function U.get_ema_avg_fn(decay)
  decay = decay or 0.999
  return function(averaged, current) return averaged * decay + current * (1 - decay) end
end
function U.get_ema_multi_avg_fn(decay)
  decay = decay or 0.999
  return function(averaged, current)
    for i, a in ipairs(averaged) do
      if a.dtype.is_floating_point then a:lerp_(current[i], 1 - decay)
      else a:copy_(a * decay + current[i] * (1 - decay)) end   -- an integer buffer, truncated as PyTorch's
    end
  end
end
-- get_swa_avg_fn(): the equal-weight running mean (AveragedModel's default);
-- get_swa_multi_avg_fn() over lists.
function U.get_swa_avg_fn()
  return function(averaged, current, n) return averaged + (current - averaged) / (n + 1) end
end
function U.get_swa_multi_avg_fn()
  return function(averaged, current, n)
    for i, a in ipairs(averaged) do a:add_((current[i] - a) / (n + 1)) end
  end
end

---------------------------------------------------------------- AveragedModel

-- AveragedModel(model [, {device =, avg_fn =, multi_avg_fn =, use_buffers =
-- false}]): a deep copy of model (its submodule `module`) whose parameters
-- (and buffers, with use_buffers) update_parameters(model) averages with
-- model's: copied at the first update, then avg_fn(averaged, current,
-- n_averaged) (or multi_avg_fn over the lists, in place), the equal-weight
-- running mean by default. Calling it runs the averaged copy.
local AveragedModel = nn.Module:extend("AveragedModel")
U.AveragedModel = AveragedModel

local options = { device = true, avg_fn = true, multi_avg_fn = true, use_buffers = true }

function AveragedModel:__init(model, opts)
  local fn = "AveragedModel"
  if not nn.is_module(model) then raise(fn .. ": expected a module to average, got " .. typename(model)) end
  opts = opts or {}
  if type(opts) ~= "table" then raise(fn .. ": expected an options table, got " .. typename(opts)) end
  for k in pairs(opts) do
    if not options[k] then raise(string.format("%s: unknown option '%s'", fn, tostring(k))) end
  end
  if opts.avg_fn ~= nil and opts.multi_avg_fn ~= nil then
    raise(fn .. ": expected at most one of avg_fn and multi_avg_fn")
  end
  for _, k in ipairs({ "avg_fn", "multi_avg_fn" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      raise(string.format("%s: expected %s to be a function, got %s", fn, k, typename(opts[k])))
    end
  end
  self.module = model:deepcopy()
  if opts.device ~= nil then self.module:to(opts.device) end
  self:register_buffer("n_averaged", torch.zeros({}, { dtype = torch.int64, device = opts.device }))
  self.avg_fn, self.multi_avg_fn, self.use_buffers = opts.avg_fn, opts.multi_avg_fn, opts.use_buffers == true
end

function AveragedModel:forward(...) return self.module(...) end

local function tensors_of(m, use_buffers)
  local out = m:parameters()
  if use_buffers then
    for _, b in ipairs(m:buffers()) do out[#out + 1] = b end
  end
  return out
end

function AveragedModel:update_parameters(model)
  local fn = "AveragedModel.update_parameters"
  if not nn.is_module(model) then raise(fn .. ": expected the module being averaged, got " .. typename(model)) end
  local mine, theirs = tensors_of(self.module, self.use_buffers), tensors_of(model, self.use_buffers)
  if #mine ~= #theirs then
    raise(string.format("%s: the model has %d %s, the averaged copy %d", fn, #theirs,
                        self.use_buffers and "parameters and buffers" or "parameters", #mine))
  end
  torch.no_grad(function()
    local n = self.n_averaged:item()
    local current = {}
    for i, p in ipairs(theirs) do
      local a, b = table.concat(p:size(), ", "), table.concat(mine[i]:size(), ", ")
      if a ~= b then
        raise(string.format("%s: tensor %d has shape [%s] in the model but [%s] in the averaged copy", fn, i, a, b))
      end
      current[i] = p:detach():to(mine[i].device)
    end
    if n == 0 then
      for i, a in ipairs(mine) do a:copy_(current[i]) end
    elseif self.multi_avg_fn then
      self.multi_avg_fn(mine, current, n)
    else
      local avg = self.avg_fn or U.get_swa_avg_fn()
      for i, a in ipairs(mine) do a:copy_(avg(a, current[i], n)) end
    end
    if not self.use_buffers then
      -- the buffers follow the model's, as PyTorch 2's (1.13 left them as
      -- they were copied)
      local own, model_buffers = self.module:buffers(), model:buffers()
      for i, b in ipairs(own) do
        if model_buffers[i] ~= nil then b:copy_(model_buffers[i]:detach():to(b.device)) end
      end
    end
    self.n_averaged:add_(1)
  end)
end

---------------------------------------------------------------- update_bn

local batch_norms = { BatchNorm1d = true, BatchNorm2d = true, BatchNorm3d = true, SyncBatchNorm = true }
local function is_batch_norm(m) return batch_norms[m:_get_name()] and m.running_mean ~= nil end

-- update_bn(loader, model [, device]): the running statistics of every
-- BatchNorm of model recomputed over one pass of loader (any iterable of
-- batches: a DataLoader, or a list; a batch that is a table gives its
-- first entry as the input), as a cumulative average; momentum and the
-- training mode are put back afterwards.
function U.update_bn(loader, model, device)
  local fn = "update_bn"
  if not nn.is_module(model) then raise(fn .. ": expected a module, got " .. typename(model)) end
  local saved = {}
  for _, m in ipairs(model:modules()) do
    if is_batch_norm(m) then
      m:reset_running_stats()
      saved[#saved + 1] = { m, m.momentum }
      m.momentum = false
    end
  end
  if #saved == 0 then return end
  local was_training = model.training
  model:train()
  local function run(batch)
    local input = batch
    if type(batch) == "table" and not torch.is_tensor(batch) then input = batch[1] end
    if not torch.is_tensor(input) then raise(fn .. ": expected batches of tensors (or tables whose first entry is one)") end
    if device ~= nil then input = input:to(device) end
    model(input)
  end
  if type(loader) == "table" and getmetatable(loader) == nil then
    for _, batch in ipairs(loader) do run(batch) end
  elseif type(loader) == "function" then
    for batch in loader do run(batch) end
  elseif (type(loader) == "userdata" or type(loader) == "table") and loader.iter then
    for batch in loader:iter() do run(batch) end   -- a DataLoader: its first value is the input
  else
    raise(fn .. ": expected a DataLoader, a list of batches or an iterator function, got " .. typename(loader))
  end
  for _, s in ipairs(saved) do s[1].momentum = s[2] end
  model:train(was_training)
end

---------------------------------------------------------------- SWALR

-- SWALR(optimizer, swa_lr [, anneal_epochs = 10, anneal_strategy = "cos",
-- last_epoch = -1]) or SWALR(optimizer, {swa_lr =, ...}): each group's lr
-- annealed from its value to swa_lr (a number, or one per group) over
-- anneal_epochs, by a cosine or linearly, then held.
local SWALR = setmetatable({}, { __index = lr_scheduler.LRScheduler })
SWALR.__index = SWALR
SWALR.__name = "SWALR"
U.SWALR = SWALR

local anneal_funcs = {
  cos = function(t) return (1 - math.cos(math.pi * t)) / 2 end,
  linear = function(t) return t end,
}

function SWALR.new(optimizer, swa_lr, anneal_epochs, anneal_strategy, last_epoch)
  local fn = "SWALR"
  if type(swa_lr) == "table" and swa_lr[1] == nil then
    local o = swa_lr
    swa_lr, anneal_epochs, anneal_strategy, last_epoch = o.swa_lr, o.anneal_epochs, o.anneal_strategy, o.last_epoch
  end
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    raise(fn .. ": expected an optimizer (with param_groups), got " .. typename(optimizer))
  end
  local groups = optimizer.param_groups
  local lrs = type(swa_lr) == "table" and swa_lr or {}
  if type(swa_lr) == "number" then
    for i = 1, #groups do lrs[i] = swa_lr end
  elseif type(swa_lr) ~= "table" then
    raise(fn .. ": expected swa_lr to be a number or a list of numbers, got " .. typename(swa_lr))
  end
  if #lrs ~= #groups then
    raise(string.format("%s: swa_lr must have the same length as optimizer.param_groups: swa_lr has %d, "
                        .. "optimizer.param_groups has %d", fn, #lrs, #groups))
  end
  anneal_epochs = anneal_epochs == nil and 10 or anneal_epochs
  if type(anneal_epochs) ~= "number" or anneal_epochs < 0 or anneal_epochs % 1 ~= 0 then
    raise(fn .. ": anneal_epochs must be equal or greater than 0, got " .. tostring(anneal_epochs))
  end
  anneal_strategy = anneal_strategy or "cos"
  if not anneal_funcs[anneal_strategy] then
    raise(fn .. ": anneal_strategy must be one of 'cos' or 'linear', instead got " .. tostring(anneal_strategy))
  end
  for i, group in ipairs(groups) do group.swa_lr = lrs[i] end
  local self = setmetatable({}, SWALR)
  self.anneal_epochs, self.anneal_strategy = anneal_epochs, anneal_strategy
  self.anneal_func = anneal_funcs[anneal_strategy]
  return lr_scheduler.LRScheduler.init(self, optimizer, last_epoch)
end
setmetatable(SWALR, { __index = lr_scheduler.LRScheduler, __call = function(_, ...) return SWALR.new(...) end })

-- the lr before an annealing step of weight alpha, from the one after it
local function before(lr, swa_lr, alpha)
  if alpha == 1 then return swa_lr end
  return (lr - alpha * swa_lr) / (1 - alpha)
end

function SWALR:get_lr()
  local step = self._step_count - 1
  if self.anneal_epochs == 0 then step = math.max(1, step) end
  local span = math.max(1, self.anneal_epochs)
  local prev_alpha = self.anneal_func(math.max(0, math.min(1, (step - 1) / span)))
  local alpha = self.anneal_func(math.max(0, math.min(1, step / span)))
  local out = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    local prev = before(group.lr, group.swa_lr, prev_alpha)
    out[i] = group.swa_lr * alpha + prev * (1 - alpha)
  end
  return out
end

return U
