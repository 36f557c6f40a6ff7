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

-- Each base lr annealed to eta_min along a half cosine, at t of T.
local function cosine_lrs(base_lrs, eta_min, t, T)
  local out = {}
  for i, base in ipairs(base_lrs) do
    out[i] = eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / T)) / 2
  end
  return out
end

-- CosineAnnealingLR(opt, T_max, eta_min=0): PyTorch 1.13's chainable form.
local Cosine = class("CosineAnnealingLR", { "T_max", "eta_min", "last_epoch" }, function(self, _, T_max, eta_min)
  self.T_max = want_positive(T_max, "CosineAnnealingLR", "T_max")
  self.eta_min = want_number(eta_min, "CosineAnnealingLR", "eta_min", 0)
end)
function Cosine:get_lr()
  local e, T, eta = self.last_epoch, self.T_max, self.eta_min
  local groups, out = self.optimizer.param_groups, {}
  if e == 0 then return group_lrs(self) end
  if self._step_count == 1 and e > 0 then return cosine_lrs(self.base_lrs, eta, e, T) end
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
  return cosine_lrs(self.base_lrs, self.eta_min, self.last_epoch, self.T_max)
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

-- A list of one function per param group from a function or a list:
-- LambdaLR's and MultiplicativeLR's lr_lambda.
local function lambdas(name, optimizer, lr_lambda)
  local n = type(optimizer) == "table" and type(optimizer.param_groups) == "table" and #optimizer.param_groups or 0
  local out = {}
  if type(lr_lambda) == "function" then
    for i = 1, n do out[i] = lr_lambda end
  elseif type(lr_lambda) == "table" then
    if #lr_lambda ~= n then raise(string.format("%s: Expected %d lr_lambdas, but got %d", name, n, #lr_lambda)) end
    for i, f in ipairs(lr_lambda) do
      if type(f) ~= "function" then raise(name .. ": expected lr_lambda " .. i .. " to be a function") end
      out[i] = f
    end
  else
    raise(name .. ": expected lr_lambda to be a function or a list of functions, got " .. type(lr_lambda))
  end
  return out
end

---------------------------------------------------------------- LambdaLR

-- LambdaLR(opt, lr_lambda): lr = initial_lr * lr_lambda(epoch); one
-- function, or a list with one per param group.
local LambdaLR = class("LambdaLR", { "lr_lambda", "last_epoch" }, function(self, optimizer, lr_lambda)
  self.lr_lambdas = lambdas("LambdaLR", optimizer, lr_lambda)
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

---------------------------------------------------------------- MultiStepLR

-- MultiStepLR(opt, milestones, gamma=0.1): lr * gamma at each milestone (a
-- milestone listed twice multiplies twice).
local MultiStepLR = class("MultiStepLR", { "milestones", "gamma", "last_epoch" }, function(self, _, milestones, gamma)
  if type(milestones) ~= "table" then raise("MultiStepLR: expected milestones to be a list of epochs") end
  self.milestones = {}
  for i, m in ipairs(milestones) do self.milestones[i] = want_number(m, "MultiStepLR", "each milestone") end
  table.sort(self.milestones)
  self.gamma = want_number(gamma, "MultiStepLR", "gamma", 0.1)
end)
function MultiStepLR:get_lr()
  local hits = 0
  for _, m in ipairs(self.milestones) do if m == self.last_epoch then hits = hits + 1 end end
  local out = group_lrs(self)
  for i, lr in ipairs(out) do out[i] = lr * self.gamma ^ hits end
  return out
end
function MultiStepLR:_get_closed_form_lr()
  local passed = 0   -- bisect_right: milestones <= last_epoch
  for _, m in ipairs(self.milestones) do if m <= self.last_epoch then passed = passed + 1 end end
  local out = {}
  for i, base in ipairs(self.base_lrs) do out[i] = base * self.gamma ^ passed end
  return out
end

---------------------------------------------------------------- ExponentialLR

-- ExponentialLR(opt, gamma): lr * gamma every epoch.
local ExponentialLR = class("ExponentialLR", { "gamma", "last_epoch" }, function(self, _, gamma)
  self.gamma = want_number(gamma, "ExponentialLR", "gamma")
end)
function ExponentialLR:get_lr()
  local out = group_lrs(self)
  if self.last_epoch == 0 then return out end
  for i, lr in ipairs(out) do out[i] = lr * self.gamma end
  return out
end
function ExponentialLR:_get_closed_form_lr()
  local out = {}
  for i, base in ipairs(self.base_lrs) do out[i] = base * self.gamma ^ self.last_epoch end
  return out
end


---------------------------------------------------------------- MultiplicativeLR

-- MultiplicativeLR(opt, lr_lambda): lr * lr_lambda(epoch) every epoch.
local MultiplicativeLR = class("MultiplicativeLR", { "lr_lambda", "last_epoch" },
                               function(self, optimizer, lr_lambda)
  self.lr_lambdas = lambdas("MultiplicativeLR", optimizer, lr_lambda)
end)
function MultiplicativeLR:get_lr()
  local out = group_lrs(self)
  if self.last_epoch > 0 then
    for i, lr in ipairs(out) do out[i] = lr * self.lr_lambdas[i](self.last_epoch) end
  end
  return out
end
MultiplicativeLR.state_dict = LambdaLR.state_dict

---------------------------------------------------------------- ConstantLR

-- ConstantLR(opt, factor=1/3, total_iters=5): lr * factor until total_iters.
local ConstantLR = class("ConstantLR", { "factor", "total_iters", "last_epoch" },
                         function(self, _, factor, total_iters)
  factor = want_number(factor, "ConstantLR", "factor", 1 / 3)
  if factor > 1 or factor < 0 then raise("ConstantLR: Constant multiplicative factor expected to be between 0 and 1.") end
  self.factor = factor
  self.total_iters = want_number(total_iters, "ConstantLR", "total_iters", 5)
end)
function ConstantLR:get_lr()
  local out = group_lrs(self)
  if self.last_epoch == 0 then
    for i, lr in ipairs(out) do out[i] = lr * self.factor end
  elseif self.last_epoch == self.total_iters then
    for i, lr in ipairs(out) do out[i] = lr * (1 / self.factor) end
  end
  return out
end
function ConstantLR:_get_closed_form_lr()
  local out = {}
  local f = self.factor + (self.last_epoch >= self.total_iters and 1 or 0) * (1 - self.factor)
  for i, base in ipairs(self.base_lrs) do out[i] = base * f end
  return out
end

---------------------------------------------------------------- PolynomialLR

-- PolynomialLR(opt, total_iters=5, power=1): lr falls as
-- (1 - epoch / total_iters)^power to 0 at total_iters.
local PolynomialLR = class("PolynomialLR", { "total_iters", "power", "last_epoch" },
                           function(self, _, total_iters, power)
  self.total_iters = want_number(total_iters, "PolynomialLR", "total_iters", 5)
  self.power = want_number(power, "PolynomialLR", "power", 1)
end)
function PolynomialLR:get_lr()
  local out, e, n = group_lrs(self), self.last_epoch, self.total_iters
  if e == 0 or e > n then return out end
  local decay = ((1 - e / n) / (1 - (e - 1) / n)) ^ self.power
  for i, lr in ipairs(out) do out[i] = lr * decay end
  return out
end
function PolynomialLR:_get_closed_form_lr()
  local out, n = {}, self.total_iters
  for i, base in ipairs(self.base_lrs) do out[i] = base * (1 - math.min(n, self.last_epoch) / n) ^ self.power end
  return out
end

---------------------------------------------------------------- CosineAnnealingWarmRestarts

-- CosineAnnealingWarmRestarts(opt, T_0, T_mult=1, eta_min=0): cosine
-- annealing from the base lr to eta_min over T_i epochs, restarting with
-- T_i = T_0, T_0 T_mult, ...; step(epoch) takes fractional epochs
-- (sched:step(epoch + i / iters) inside an epoch), as PyTorch.
local WarmRestarts = class("CosineAnnealingWarmRestarts", { "T_0", "T_mult", "eta_min", "last_epoch" })
function WarmRestarts.new(optimizer, T_0, T_mult, eta_min, last_epoch)
  local fn = "CosineAnnealingWarmRestarts"
  local self = setmetatable({}, WarmRestarts)
  self.T_0 = want_positive(T_0, fn, "T_0", true)
  self.T_mult = want_number(T_mult, fn, "T_mult", 1)
  if self.T_mult < 1 or self.T_mult % 1 ~= 0 then raise(fn .. ": Expected integer T_mult >= 1, but got " .. self.T_mult) end
  self.eta_min = want_number(eta_min, fn, "eta_min", 0)
  self.T_i = self.T_0
  self.T_cur = last_epoch or -1
  return LRScheduler.init(self, optimizer, last_epoch)
end
function WarmRestarts:get_lr()
  return cosine_lrs(self.base_lrs, self.eta_min, self.T_cur, self.T_i)
end
function WarmRestarts:step(epoch)
  self._step_count = self._step_count + 1
  if epoch == nil and self.last_epoch < 0 then epoch = 0 end
  if epoch == nil then
    epoch = self.last_epoch + 1
    self.T_cur = self.T_cur + 1
    if self.T_cur >= self.T_i then
      self.T_cur = self.T_cur - self.T_i
      self.T_i = self.T_i * self.T_mult
    end
  else
    want_number(epoch, self.__name .. ".step", "epoch")
    if epoch < 0 then raise(self.__name .. ".step: Expected non-negative epoch, but got " .. epoch) end
    if epoch >= self.T_0 then
      if self.T_mult == 1 then
        self.T_cur = epoch % self.T_0
      else
        local n = math.floor(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1) / math.log(self.T_mult))
        self.T_cur = epoch - self.T_0 * (self.T_mult ^ n - 1) / (self.T_mult - 1)
        self.T_i = self.T_0 * self.T_mult ^ n
      end
    else
      self.T_i = self.T_0
      self.T_cur = epoch
    end
  end
  self.last_epoch = math.floor(epoch)
  local values = self:get_lr()
  self._last_lr = {}
  for i, group in ipairs(self.optimizer.param_groups) do
    group.lr = values[i]
    self._last_lr[i] = values[i]
  end
end

---------------------------------------------------------------- OneCycleLR, CyclicLR

-- One value, or one per param group, as a list of n.
local function per_group(fn, n, v, what, default)
  v = v == nil and default or v
  if type(v) == "table" then
    if #v ~= n then raise(string.format("%s: expected %d values for %s, got %d", fn, n, what, #v)) end
    for _, x in ipairs(v) do want_number(x, fn, what) end
    return v
  end
  want_number(v, fn, what)
  local out = {}
  for i = 1, n do out[i] = v end
  return out
end

-- The momentum (SGD's) or beta1 (Adam's) the cyclic schedules move: set
-- to m in a group.
local function set_momentum(self, group, m)
  if self.use_beta1 then group.betas = { m, group.betas[2] } else group.momentum = m end
end

-- cycle_momentum's setup: the optimizer must have a momentum or betas;
-- each group starts at its max_momentum (unless resuming) and keeps its
-- max_momentum and base_momentum.
local function cycled_momentum(self, fn, optimizer, maxes, bases, last_epoch)
  local d = optimizer.defaults or {}
  if d.momentum == nil and d.betas == nil then
    raise(fn .. ": optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
  end
  self.use_beta1 = d.betas ~= nil
  if (last_epoch or -1) == -1 then
    for i, group in ipairs(optimizer.param_groups) do
      set_momentum(self, group, maxes[i])
      group.max_momentum, group.base_momentum = maxes[i], bases[i]
    end
  end
end

-- OneCycleLR(opt, max_lr, total_steps | epochs and steps_per_epoch,
-- pct_start=0.3, anneal_strategy="cos", cycle_momentum=true,
-- base_momentum=0.85, max_momentum=0.95, div_factor=25,
-- final_div_factor=1e4, three_phase=false): Smith's 1cycle policy, stepped
-- once per batch. The lr rises from max_lr / div_factor to max_lr, then
-- falls to max_lr / div_factor / final_div_factor; with cycle_momentum
-- the momentum (SGD) or beta1 (Adam, AdamW) moves the opposite way.
local OneCycleLR = class("OneCycleLR", { "max_lr", "total_steps", "epochs", "steps_per_epoch", "pct_start",
                                         "anneal_strategy", "cycle_momentum", "base_momentum", "max_momentum",
                                         "div_factor", "final_div_factor", "three_phase", "last_epoch" })
function OneCycleLR.new(optimizer, max_lr, total_steps, epochs, steps_per_epoch, pct_start, anneal_strategy,
                        cycle_momentum, base_momentum, max_momentum, div_factor, final_div_factor, three_phase,
                        last_epoch)
  local fn = "OneCycleLR"
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    raise(fn .. ": expected an optimizer (with param_groups), got " .. type(optimizer))
  end
  local self = setmetatable({}, OneCycleLR)
  if total_steps == nil and epochs == nil and steps_per_epoch == nil then
    raise(fn .. ": You must define either total_steps OR (epochs AND steps_per_epoch)")
  elseif total_steps ~= nil then
    self.total_steps = want_positive(total_steps, fn, "total_steps", true)
  else
    self.total_steps = want_positive(epochs, fn, "epochs", true) * want_positive(steps_per_epoch, fn, "steps_per_epoch", true)
  end
  pct_start = want_number(pct_start, fn, "pct_start", 0.3)
  if pct_start < 0 or pct_start > 1 then raise(fn .. ": Expected float between 0 and 1 pct_start, but got " .. pct_start) end
  anneal_strategy = anneal_strategy or "cos"
  if anneal_strategy ~= "cos" and anneal_strategy ~= "linear" then
    raise(fn .. ': anneal_strategy must by one of "cos" or "linear", instead got ' .. tostring(anneal_strategy))
  end
  self.anneal_strategy = anneal_strategy
  div_factor = want_number(div_factor, fn, "div_factor", 25)
  final_div_factor = want_number(final_div_factor, fn, "final_div_factor", 1e4)
  local n, T = #optimizer.param_groups, self.total_steps
  if three_phase then
    self._schedule_phases = {
      { end_step = pct_start * T - 1, start_lr = "initial_lr", end_lr = "max_lr", start_momentum = "max_momentum", end_momentum = "base_momentum" },
      { end_step = 2 * pct_start * T - 2, start_lr = "max_lr", end_lr = "initial_lr", start_momentum = "base_momentum", end_momentum = "max_momentum" },
      { end_step = T - 1, start_lr = "initial_lr", end_lr = "min_lr", start_momentum = "max_momentum", end_momentum = "max_momentum" },
    }
  else
    self._schedule_phases = {
      { end_step = pct_start * T - 1, start_lr = "initial_lr", end_lr = "max_lr", start_momentum = "max_momentum", end_momentum = "base_momentum" },
      { end_step = T - 1, start_lr = "max_lr", end_lr = "min_lr", start_momentum = "base_momentum", end_momentum = "max_momentum" },
    }
  end
  local max_lrs = per_group(fn, n, max_lr, "max_lr")
  if (last_epoch or -1) == -1 then
    for i, group in ipairs(optimizer.param_groups) do
      group.initial_lr = max_lrs[i] / div_factor
      group.lr = group.initial_lr
      group.max_lr = max_lrs[i]
      group.min_lr = group.initial_lr / final_div_factor
    end
  end
  self.cycle_momentum = cycle_momentum ~= false
  if self.cycle_momentum then
    cycled_momentum(self, fn, optimizer, per_group(fn, n, max_momentum, "max_momentum", 0.95),
                    per_group(fn, n, base_momentum, "base_momentum", 0.85), last_epoch)
  end
  return LRScheduler.init(self, optimizer, last_epoch)
end
local function anneal(strategy, from, to, pct)
  if strategy == "cos" then return to + (from - to) / 2 * (math.cos(math.pi * pct) + 1) end
  return (to - from) * pct + from
end
function OneCycleLR:get_lr()
  local step = self.last_epoch
  if step > self.total_steps then
    raise(string.format("OneCycleLR: Tried to step %d times. The specified number of total steps is %d",
                        step, self.total_steps))
  end
  local out, phases = {}, self._schedule_phases
  for gi, group in ipairs(self.optimizer.param_groups) do
    local start = 0
    for i, phase in ipairs(phases) do
      if step <= phase.end_step or i == #phases then
        local pct = (step - start) / (phase.end_step - start)
        out[gi] = anneal(self.anneal_strategy, group[phase.start_lr], group[phase.end_lr], pct)
        if self.cycle_momentum then
          set_momentum(self, group, anneal(self.anneal_strategy, group[phase.start_momentum], group[phase.end_momentum],
                                           pct))
        end
        break
      end
      start = phase.end_step
    end
  end
  return out
end

-- CyclicLR(opt, base_lr, max_lr, step_size_up=2000, step_size_down,
-- mode="triangular", gamma=1, scale_fn, scale_mode, cycle_momentum=true,
-- base_momentum=0.8, max_momentum=0.9): Smith's cyclical learning rates,
-- stepped once per batch: the lr climbs from base_lr to max_lr over
-- step_size_up steps and back over step_size_down (step_size_up when not
-- given), the cycle's height scaled by "triangular" (1), "triangular2"
-- (halved each cycle), "exp_range" (gamma^steps) or scale_fn(x) of the
-- cycle or (scale_mode "iterations") the step; the momentum (or beta1)
-- moves the other way.
local CyclicLR = class("CyclicLR", { "base_lr", "max_lr", "step_size_up", "step_size_down", "mode", "gamma",
                                     "scale_fn", "scale_mode", "cycle_momentum", "base_momentum", "max_momentum",
                                     "last_epoch" })
function CyclicLR.new(optimizer, base_lr, max_lr, step_size_up, step_size_down, mode, gamma, scale_fn, scale_mode,
                      cycle_momentum, base_momentum, max_momentum, last_epoch)
  local fn = "CyclicLR"
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    raise(fn .. ": expected an optimizer (with param_groups), got " .. type(optimizer))
  end
  local self = setmetatable({}, CyclicLR)
  local n = #optimizer.param_groups
  if base_lr == nil or max_lr == nil then raise(fn .. ": expected base_lr and max_lr") end
  local base_lrs = per_group(fn, n, base_lr, "base_lr")
  if (last_epoch or -1) == -1 then
    for i, group in ipairs(optimizer.param_groups) do group.lr = base_lrs[i] end
  end
  self.max_lrs = per_group(fn, n, max_lr, "max_lr")
  local up = want_positive(step_size_up or 2000, fn, "step_size_up")
  local down = step_size_down == nil and up or want_positive(step_size_down, fn, "step_size_down")
  self.total_size, self.step_ratio = up + down, up / (up + down)
  self.mode, self.gamma = mode or "triangular", want_number(gamma, fn, "gamma", 1)
  if scale_fn ~= nil then
    if type(scale_fn) ~= "function" then raise(fn .. ": expected scale_fn to be a function") end
    self.scale_fn, self.scale_mode = scale_fn, scale_mode or "cycle"
  elseif self.mode == "triangular" then
    self.scale_fn, self.scale_mode = function() return 1 end, "cycle"
  elseif self.mode == "triangular2" then
    self.scale_fn, self.scale_mode = function(x) return 1 / 2 ^ (x - 1) end, "cycle"
  elseif self.mode == "exp_range" then
    local g = self.gamma
    self.scale_fn, self.scale_mode = function(x) return g ^ x end, "iterations"
  else
    raise(fn .. ': mode must be "triangular", "triangular2" or "exp_range" (or give scale_fn), got ' .. tostring(mode))
  end
  if self.scale_mode ~= "cycle" and self.scale_mode ~= "iterations" then
    raise(fn .. ': scale_mode must be "cycle" or "iterations", got ' .. tostring(self.scale_mode))
  end
  self.cycle_momentum = cycle_momentum ~= false
  if self.cycle_momentum then
    self.base_momentums = per_group(fn, n, base_momentum, "base_momentum", 0.8)
    self.max_momentums = per_group(fn, n, max_momentum, "max_momentum", 0.9)
    cycled_momentum(self, fn, optimizer, self.max_momentums, self.base_momentums, last_epoch)
  end
  LRScheduler.init(self, optimizer, last_epoch)
  self.base_lrs = base_lrs
  return self
end
function CyclicLR:get_lr()
  local cycle = math.floor(1 + self.last_epoch / self.total_size)
  local x = 1 + self.last_epoch / self.total_size - cycle
  local scale = x <= self.step_ratio and x / self.step_ratio or (x - 1) / (self.step_ratio - 1)
  local s = self.scale_fn(self.scale_mode == "cycle" and cycle or self.last_epoch)
  local out = {}
  for i, base in ipairs(self.base_lrs) do out[i] = base + (self.max_lrs[i] - base) * scale * s end
  if self.cycle_momentum then
    for i, group in ipairs(self.optimizer.param_groups) do
      set_momentum(self, group, self.max_momentums[i] - (self.max_momentums[i] - self.base_momentums[i]) * scale * s)
    end
  end
  return out
end

---------------------------------------------------------------- ChainedScheduler

-- ChainedScheduler(schedulers): each step steps every scheduler in turn,
-- their factors multiplying.
local Chained = class("ChainedScheduler", { "schedulers" })
function Chained.new(schedulers)
  if type(schedulers) ~= "table" or #schedulers == 0 then raise("ChainedScheduler: expected a non-empty list of schedulers") end
  local self = setmetatable({}, Chained)
  self._schedulers = schedulers
  self.optimizer = schedulers[1].optimizer
  self._last_lr = group_lrs(schedulers[#schedulers])
  return self
end
-- called as ChainedScheduler(list) or ChainedScheduler({schedulers = list}): no optimizer first
getmetatable(Chained).__call = function(_, schedulers)
  if type(schedulers) == "table" and schedulers.schedulers then schedulers = schedulers.schedulers end
  return Chained.new(schedulers)
end
function Chained:step()
  for _, s in ipairs(self._schedulers) do s:step() end
  self._last_lr = group_lrs(self._schedulers[#self._schedulers])
end
Chained.state_dict = Sequential.state_dict
Chained.load_state_dict = Sequential.load_state_dict

---------------------------------------------------------------- ReduceLROnPlateau

-- ReduceLROnPlateau(opt, mode="min", factor=0.1, patience=10,
-- threshold=1e-4, threshold_mode="rel", cooldown=0, min_lr=0, eps=1e-8):
-- step(metric) after each evaluation; lr * factor once the metric has not
-- improved (by threshold) for more than patience steps.
local Plateau = class("ReduceLROnPlateau", { "mode", "factor", "patience", "threshold", "threshold_mode",
                                             "cooldown", "min_lr", "eps", "verbose" })
function Plateau.new(optimizer, mode, factor, patience, threshold, threshold_mode, cooldown, min_lr, eps)
  local fn = "ReduceLROnPlateau"
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    raise(fn .. ": expected an optimizer (with param_groups), got " .. type(optimizer))
  end
  local self = setmetatable({}, Plateau)
  self.optimizer = optimizer
  self.factor = want_number(factor, fn, "factor", 0.1)
  if self.factor >= 1 then raise(fn .. ": Factor should be < 1.0.") end
  self.mode = mode or "min"
  if self.mode ~= "min" and self.mode ~= "max" then raise(fn .. ": mode " .. tostring(self.mode) .. " is unknown!") end
  self.threshold_mode = threshold_mode or "rel"
  if self.threshold_mode ~= "rel" and self.threshold_mode ~= "abs" then
    raise(fn .. ": threshold mode " .. tostring(self.threshold_mode) .. " is unknown!")
  end
  self.patience = want_number(patience, fn, "patience", 10)
  self.threshold = want_number(threshold, fn, "threshold", 1e-4)
  self.cooldown = want_number(cooldown, fn, "cooldown", 0)
  self.eps = want_number(eps, fn, "eps", 1e-8)
  local n = #optimizer.param_groups
  self.min_lrs = {}
  if type(min_lr) == "table" then
    if #min_lr ~= n then raise(string.format("%s: expected %d min_lrs, got %d", fn, n, #min_lr)) end
    for i, v in ipairs(min_lr) do self.min_lrs[i] = want_number(v, fn, "min_lr") end
  else
    min_lr = want_number(min_lr, fn, "min_lr", 0)
    for i = 1, n do self.min_lrs[i] = min_lr end
  end
  self.best = self.mode == "min" and math.huge or -math.huge
  self.num_bad_epochs, self.cooldown_counter, self.last_epoch = 0, 0, 0
  self._last_lr = group_lrs(self)
  return self
end
function Plateau:is_better(a, best)
  if self.mode == "min" then
    return self.threshold_mode == "rel" and a < best * (1 - self.threshold) or a < best - self.threshold
  end
  return self.threshold_mode == "rel" and a > best * (self.threshold + 1) or a > best + self.threshold
end
-- step(metric): metric a number or a one-element tensor (read on the host).
function Plateau:step(metric)
  if torch.is_tensor(metric) then metric = metric:item() end
  want_number(metric, "ReduceLROnPlateau.step", "the metric")
  self.last_epoch = self.last_epoch + 1
  if self:is_better(metric, self.best) then
    self.best, self.num_bad_epochs = metric, 0
  else
    self.num_bad_epochs = self.num_bad_epochs + 1
  end
  if self.cooldown_counter > 0 then
    self.cooldown_counter = self.cooldown_counter - 1
    self.num_bad_epochs = 0
  end
  if self.num_bad_epochs > self.patience then
    for i, group in ipairs(self.optimizer.param_groups) do
      local new = math.max(group.lr * self.factor, self.min_lrs[i])
      if group.lr - new > self.eps then group.lr = new end
    end
    self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
  end
  self._last_lr = group_lrs(self)
end

return S
