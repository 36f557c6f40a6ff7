-- dplua.optim.lr_scheduler: learning-rate schedules that write
-- optimizer.param_groups[i].lr, with PyTorch 1.13's formulas (the
-- recursive ones of get_lr() on step(), the closed forms on step(epoch)),
-- so that a schedule gives exactly PyTorch's sequence of lrs.
--
--   local sched = torch.optim.lr_scheduler.SequentialLR(opt, {
--     schedulers = { LinearLR(opt, {start_factor=0.1, total_iters=5}),
--                    CosineAnnealingLR(opt, {T_max=95}) },
--     milestones = { 5 } })
--   for epoch = 1, 100 do train(); opt:step(); sched:step() end
--
-- Arguments are PyTorch's, positionally or as one options table after the
-- optimizer: StepLR(opt, 30, 0.1) or StepLR(opt, {step_size=30, gamma=0.1}).
local torch = require("dplua")
local raise = torch._raise

local S = {}

local function is_opts(x) return type(x) == "table" and x[1] == nil and getmetatable(x) == nil end

-- want_number(v, fn, what[, default]): v, a number; default when v is nil
-- and there is one.
local function want_number(v, fn, what, default)
  if v == nil and default ~= nil then return default end
  if type(v) ~= "number" then raise(string.format("%s: expected %s to be a number, got %s", fn, what, type(v))) end
  return v
end

-- want_positive(v, fn, what[, integer]): v, a number > 0 (with integer, a
-- whole number >= 1).
local function want_positive(v, fn, what, integer)
  want_number(v, fn, what)
  if integer and (v < 1 or v % 1 ~= 0) then
    raise(string.format("%s: %s must be a positive integer, got %s", fn, what, v))
  elseif v <= 0 then
    raise(string.format("%s: %s must be positive, got %s", fn, what, v))
  end
  return v
end

---------------------------------------------------------------- the base class

local LRScheduler = {}
LRScheduler.__index = LRScheduler
S.LRScheduler = LRScheduler

-- class(name, params[, fields]): the scheduler class S[name], whose call,
-- cls(optimizer, ...), takes the arguments after the optimizer
-- positionally or as one options table with the names in params, and
-- hands them to cls.new(optimizer, ...) in that order. With fields, the
-- last param is last_epoch and cls.new is made: fields(self, optimizer,
-- ...) checks the others and sets self's fields from them, then
-- LRScheduler.init takes the first step.
local function class(name, params, fields)
  local function call(c, optimizer, ...)
    local o = ...
    if not is_opts(o) then return c.new(optimizer, ...) end
    local args = {}
    for i, p in ipairs(params) do args[i] = o[p] end
    return c.new(optimizer, unpack(args, 1, #params))
  end
  local cls = setmetatable({}, { __index = LRScheduler, __call = call })
  cls.__index = cls
  cls.__name = name
  if fields then
    function cls.new(optimizer, ...)
      local self = setmetatable({}, cls)
      fields(self, optimizer, ...)
      return LRScheduler.init(self, optimizer, (select(#params, ...)))
    end
  end
  S[name] = cls
  return cls
end

-- Sets the initial lrs and takes the first step (last_epoch -1 -> 0).
function LRScheduler.init(self, optimizer, last_epoch)
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    raise(self.__name .. ": expected an optimizer (with param_groups), got " .. type(optimizer))
  end
  self.optimizer = optimizer
  last_epoch = last_epoch or -1
  if last_epoch == -1 then
    for _, group in ipairs(optimizer.param_groups) do
      if group.initial_lr == nil then group.initial_lr = group.lr end
    end
  else
    for i, group in ipairs(optimizer.param_groups) do
      if group.initial_lr == nil then
        raise(string.format("%s: param 'initial_lr' is not specified in param_groups[%d] when resuming an optimizer",
                            self.__name, i - 1))
      end
    end
  end
  self.base_lrs = {}
  for i, group in ipairs(optimizer.param_groups) do self.base_lrs[i] = group.initial_lr end
  self.last_epoch = last_epoch
  self:_initial_step()
  return self
end

function LRScheduler:_initial_step()
  self.optimizer._step_count = 0
  self._step_count = 0
  self:step()
end

function LRScheduler:get_last_lr()
  local out = {}
  for i, v in ipairs(self._last_lr) do out[i] = v end
  return out
end

function LRScheduler:get_lr() raise(self.__name .. ": get_lr is not implemented") end

-- step([epoch]): the next lr (recursive form), or the lr of a given epoch
-- (closed form where there is one).
function LRScheduler:step(epoch)
  self._step_count = self._step_count + 1
  local values
  if epoch == nil then
    self.last_epoch = self.last_epoch + 1
    values = self:get_lr()
  else
    want_number(epoch, self.__name .. ".step", "epoch")
    self.last_epoch = epoch
    values = self._get_closed_form_lr and self:_get_closed_form_lr() or self:get_lr()
  end
  local groups = self.optimizer.param_groups
  for i, group in ipairs(groups) do group.lr = values[i] end
  self._last_lr = {}
  for i, group in ipairs(groups) do self._last_lr[i] = group.lr end
end

local function copy_plain(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = copy_plain(x) end
  return c
end

-- state_dict(): every field but the optimizer (and functions), as PyTorch.
function LRScheduler:state_dict()
  local sd = {}
  for k, v in pairs(self) do
    if k ~= "optimizer" and type(v) ~= "function" then sd[k] = copy_plain(v) end
  end
  return sd
end

function LRScheduler:load_state_dict(sd)
  if type(sd) ~= "table" then raise(self.__name .. ".load_state_dict: expected a table, got " .. type(sd)) end
  for k, v in pairs(sd) do
    if k ~= "optimizer" then self[k] = copy_plain(v) end
  end
end

local function group_lrs(self)
  local out = {}
  for i, group in ipairs(self.optimizer.param_groups) do out[i] = group.lr end
  return out
end

---------------------------------------------------------------- StepLR

-- StepLR(opt, step_size, gamma=0.1): lr * gamma every step_size epochs.
local StepLR = class("StepLR", { "step_size", "gamma", "last_epoch" }, function(self, _, step_size, gamma)
  self.step_size = want_positive(step_size, "StepLR", "step_size", true)
  self.gamma = want_number(gamma, "StepLR", "gamma", 0.1)
end)
function StepLR:get_lr()
  if self.last_epoch == 0 or self.last_epoch % self.step_size ~= 0 then return group_lrs(self) end
  local out = group_lrs(self)
  for i, lr in ipairs(out) do out[i] = lr * self.gamma end
  return out
end
function StepLR:_get_closed_form_lr()
  local out = {}
  for i, base in ipairs(self.base_lrs) do
    out[i] = base * self.gamma ^ math.floor(self.last_epoch / self.step_size)
  end
  return out
end

---------------------------------------------------------------- CosineAnnealingLR

-- CosineAnnealingLR(opt, T_max, eta_min=0): PyTorch 1.13's chainable form.
local Cosine = class("CosineAnnealingLR", { "T_max", "eta_min", "last_epoch" }, function(self, _, T_max, eta_min)
  self.T_max = want_positive(T_max, "CosineAnnealingLR", "T_max")
  self.eta_min = want_number(eta_min, "CosineAnnealingLR", "eta_min", 0)
end)
function Cosine:get_lr()
  local e, T, eta = self.last_epoch, self.T_max, self.eta_min
  local groups, out = self.optimizer.param_groups, {}
  if e == 0 then return group_lrs(self) end
  if self._step_count == 1 and e > 0 then
    for i, base in ipairs(self.base_lrs) do
      out[i] = eta + (base - eta) * (1 + math.cos(e * math.pi / T)) / 2
    end
    return out
  end
  if (e - 1 - T) % (2 * T) == 0 then
    for i, base in ipairs(self.base_lrs) do
      out[i] = groups[i].lr + (base - eta) * (1 - math.cos(math.pi / T)) / 2
    end
    return out
  end
  for i, group in ipairs(groups) do
    out[i] = (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (group.lr - eta) + eta
  end
  return out
end
function Cosine:_get_closed_form_lr()
  local out = {}
  for i, base in ipairs(self.base_lrs) do
    out[i] = self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
  end
  return out
end

---------------------------------------------------------------- LinearLR

-- LinearLR(opt, start_factor=1/3, end_factor=1, total_iters=5).
local LinearLR = class("LinearLR", { "start_factor", "end_factor", "total_iters", "last_epoch" },
                       function(self, _, start_factor, end_factor, total_iters)
  start_factor = want_number(start_factor, "LinearLR", "start_factor", 1 / 3)
  end_factor = want_number(end_factor, "LinearLR", "end_factor", 1)
  if start_factor > 1 or start_factor <= 0 then
    raise("LinearLR: Starting multiplicative factor expected to be greater than 0 and less or equal to 1, got " .. start_factor)
  end
  if end_factor > 1 or end_factor < 0 then
    raise("LinearLR: Ending multiplicative factor expected to be between 0 and 1, got " .. end_factor)
  end
  self.start_factor, self.end_factor = start_factor, end_factor
  self.total_iters = want_number(total_iters, "LinearLR", "total_iters", 5)
end)
function LinearLR:get_lr()
  local out = group_lrs(self)
  if self.last_epoch == 0 then
    for i, lr in ipairs(out) do out[i] = lr * self.start_factor end
    return out
  end
  if self.last_epoch > self.total_iters then return out end
  local s, e = self.start_factor, self.end_factor
  for i, lr in ipairs(out) do
    out[i] = lr * (1 + (e - s) / (self.total_iters * s + (self.last_epoch - 1) * (e - s)))
  end
  return out
end
function LinearLR:_get_closed_form_lr()
  local out, s, e = {}, self.start_factor, self.end_factor
  for i, base in ipairs(self.base_lrs) do
    out[i] = base * (s + (e - s) * math.min(self.total_iters, self.last_epoch) / self.total_iters)
  end
  return out
end

---------------------------------------------------------------- LambdaLR

-- LambdaLR(opt, lr_lambda): lr = initial_lr * lr_lambda(epoch); one
-- function, or a list with one per param group.
local LambdaLR = class("LambdaLR", { "lr_lambda", "last_epoch" }, function(self, optimizer, lr_lambda)
  local n = type(optimizer) == "table" and type(optimizer.param_groups) == "table" and #optimizer.param_groups or 0
  if type(lr_lambda) == "function" then
    self.lr_lambdas = {}
    for i = 1, n do self.lr_lambdas[i] = lr_lambda end
  elseif type(lr_lambda) == "table" then
    if #lr_lambda ~= n then raise(string.format("LambdaLR: Expected %d lr_lambdas, but got %d", n, #lr_lambda)) end
    self.lr_lambdas = {}
    for i, f in ipairs(lr_lambda) do
      if type(f) ~= "function" then raise("LambdaLR: expected lr_lambda " .. i .. " to be a function") end
      self.lr_lambdas[i] = f
    end
  else
    raise("LambdaLR: expected lr_lambda to be a function or a list of functions, got " .. type(lr_lambda))
  end
end)
function LambdaLR:get_lr()
  local out = {}
  for i, base in ipairs(self.base_lrs) do out[i] = base * self.lr_lambdas[i](self.last_epoch) end
  return out
end
function LambdaLR:state_dict()
  local sd = LRScheduler.state_dict(self)
  sd.lr_lambdas = nil
  return sd
end

---------------------------------------------------------------- SequentialLR

-- SequentialLR(opt, schedulers, milestones): schedulers[i+1] takes over at
-- milestones[i] (restarted at epoch 0), as PyTorch 1.13.
local Sequential = class("SequentialLR", { "schedulers", "milestones", "last_epoch" })
function Sequential.new(optimizer, schedulers, milestones, last_epoch)
  if type(schedulers) ~= "table" or #schedulers == 0 then raise("SequentialLR: expected a non-empty list of schedulers") end
  if type(milestones) ~= "table" then raise("SequentialLR: expected a list of milestones") end
  for i, s in ipairs(schedulers) do
    if type(s) ~= "table" or s.optimizer ~= optimizer then
      raise(string.format("SequentialLR: Sequential Schedulers expects all schedulers to belong to the same optimizer, "
                          .. "but got schedulers at index %d to be different than the optimizer passed in.", i - 1))
    end
  end
  if #milestones ~= #schedulers - 1 then
    raise(string.format("SequentialLR: Sequential Schedulers expects number of schedulers provided to be one more than "
                        .. "the number of milestone points, but got number of schedulers %d and the number of "
                        .. "milestones to be equal to %d", #schedulers, #milestones))
  end
  local self = setmetatable({}, Sequential)
  self._schedulers, self._milestones = schedulers, milestones
  self.last_epoch = (last_epoch or -1) + 1
  self.optimizer = optimizer
  for _, group in ipairs(optimizer.param_groups) do group.lr = group.initial_lr end
  for _, s in ipairs(schedulers) do s.last_epoch = s.last_epoch - 1 end
  schedulers[1]:_initial_step()
  self._last_lr = schedulers[1]:get_last_lr()
  return self
end
function Sequential:step()
  self.last_epoch = self.last_epoch + 1
  -- bisect_right: the number of milestones <= last_epoch
  local idx = 0
  for _, m in ipairs(self._milestones) do if m <= self.last_epoch then idx = idx + 1 end end
  local s = self._schedulers[idx + 1]
  if idx > 0 and self._milestones[idx] == self.last_epoch then s:step(0) else s:step() end
  self._last_lr = s:get_last_lr()
end
function Sequential:state_dict()
  local sd = {}
  for k, v in pairs(self) do
    if k ~= "optimizer" and k ~= "_schedulers" then sd[k] = copy_plain(v) end
  end
  sd._schedulers = {}
  for i, s in ipairs(self._schedulers) do sd._schedulers[i] = s:state_dict() end
  return sd
end
function Sequential:load_state_dict(sd)
  for k, v in pairs(sd) do
    if k ~= "optimizer" and k ~= "_schedulers" then self[k] = copy_plain(v) end
  end
  for i, s in ipairs(sd._schedulers or {}) do self._schedulers[i]:load_state_dict(s) end
end

return S
