-- dplua.amp: torch.amp (and torch.cuda.amp): GradScaler, and autocast
-- under the names mixed-precision programs import it by.
--
--   local scaler = torch.amp.GradScaler()
--   scaler:scale(loss):backward()
--   scaler:unscale_(opt)                      -- optional: before clipping
--   nn.utils.clip_grad_norm_(model:parameters(), 1.0)
--   scaler:step(opt)                          -- skipped when a gradient is inf or NaN
--   scaler:update()
--
-- Dynamic loss scaling as PyTorch's: the loss is multiplied by the scale
-- before backward; the gradients are divided by it before the step, which
-- is skipped when any of them is not finite; update() then halves the scale
-- (backoff_factor), or doubles it (growth_factor) after growth_interval
-- steps in a row without one. dplua autocasts to bfloat16, whose range is
-- float32's, so programs need the scaler less than float16's do; it keeps
-- their code running unchanged, and guards a step against a gradient that
-- overflowed.
local torch = require("dplua")
local raise = torch._raise

local M = {}

local function typename(x) return torch.is_tensor(x) and "Tensor" or type(x) end

local GradScaler = {}
GradScaler.__index = GradScaler
GradScaler.__name = "GradScaler"

local options = { init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5, growth_interval = 2000, enabled = true }

-- GradScaler([device,] [opts]) with opts {init_scale = 2^16, growth_factor
-- = 2, backoff_factor = 0.5, growth_interval = 2000, enabled = true}.
-- device ("cuda" or "cpu", torch.amp's first argument) changes nothing:
-- the scale is a number on the host.
function GradScaler.new(device, opts)
  local fn = "GradScaler"
  if type(device) == "table" and opts == nil then device, opts = nil, device end
  if device ~= nil and device ~= "cuda" and device ~= "cpu" then
    raise(string.format('%s: expected device "cuda" or "cpu", got %s', fn, tostring(device)))
  end
  opts = opts or {}
  if type(opts) ~= "table" then raise(fn .. ": expected an options table, got " .. typename(opts)) end
  local self = setmetatable({}, GradScaler)
  for k, v in pairs(opts) do
    if options[k] == nil then raise(string.format("%s: unknown option '%s'", fn, tostring(k))) end
    if type(v) ~= type(options[k]) then
      raise(string.format("%s: expected %s to be a %s, got %s", fn, k, type(options[k]), typename(v)))
    end
  end
  for k, default in pairs(options) do
    local v = opts[k]
    if v == nil then v = default end
    self["_" .. k] = v
  end
  if self._init_scale <= 0 then raise(fn .. ": init_scale must be positive, got " .. self._init_scale) end
  if self._growth_factor <= 1 then raise(fn .. ": the growth factor must be > 1, got " .. self._growth_factor) end
  if self._backoff_factor >= 1 or self._backoff_factor <= 0 then
    raise(fn .. ": the backoff factor must be in (0, 1), got " .. self._backoff_factor)
  end
  if self._growth_interval < 1 or self._growth_interval % 1 ~= 0 then
    raise(fn .. ": the growth interval must be a positive integer, got " .. self._growth_interval)
  end
  self._scale = self._init_scale
  self._growth_tracker = 0
  -- per optimizer: "unscaled" or "stepped" since the last update(), and
  -- whether its gradients held an inf or a NaN
  self._stages = setmetatable({}, { __mode = "k" })
  return self
end
setmetatable(GradScaler, { __call = function(_, ...) return GradScaler.new(...) end })
M.GradScaler = GradScaler

function GradScaler:is_enabled() return self._enabled end

-- scale(outputs): a tensor, or a (nested) table of tensors, multiplied by
-- the scale; returned unchanged when the scaler is disabled.
function GradScaler:scale(outputs)
  if not self._enabled then return outputs end
  if torch.is_tensor(outputs) then return outputs * self._scale end
  if type(outputs) ~= "table" then
    raise("GradScaler.scale: expected a tensor or a table of tensors, got " .. typename(outputs))
  end
  local scaled = {}
  for k, v in pairs(outputs) do scaled[k] = self:scale(v) end
  return scaled
end

local function stage_of(self, optimizer, fn)
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    raise(string.format("GradScaler.%s: expected an optimizer, got %s", fn, typename(optimizer)))
  end
  local s = self._stages[optimizer]
  if s == nil then
    s = { stage = "ready", found_inf = false }
    self._stages[optimizer] = s
  end
  return s
end

-- unscale_(optimizer): divides the gradients of the optimizer's parameters
-- by the scale in place and records whether any is not finite. Once per
-- optimizer between two update() calls.
function GradScaler:unscale_(optimizer)
  if not self._enabled then return end
  local s = stage_of(self, optimizer, "unscale_")
  if s.stage == "unscaled" then
    raise("GradScaler.unscale_: unscale_() has already been called on this optimizer since the last update()")
  elseif s.stage == "stepped" then
    raise("GradScaler.unscale_: unscale_() is being called after step()")
  end
  local grads = {}
  for _, group in ipairs(optimizer.param_groups) do
    for _, p in ipairs(group.params) do
      local g = p.grad
      if g ~= nil then grads[#grads + 1] = g end
    end
  end
  local inv = 1 / self._scale
  s.found_inf = torch.no_grad(function()
    local any = false
    local runs = torch.nn.utils._grad_runs(grads)
    local sums = {}
    for i, g in ipairs(runs) do
      g:mul_(inv)
      -- 0 where every element is finite, NaN where one is not
      sums[i] = g:mul(0):sum():to(torch.float32)
    end
    if #sums > 0 then
      local v = torch.stack(sums):sum():item()
      any = v ~= v
    end
    return any
  end)
  s.stage = "unscaled"
end

-- step(optimizer, ...): unscale_ (unless done), then optimizer:step(...)
-- unless a gradient was inf or NaN. Returns what the step returns, nil
-- when it was skipped.
function GradScaler:step(optimizer, ...)
  if not self._enabled then return optimizer:step(...) end
  local s = stage_of(self, optimizer, "step")
  if select("#", ...) > 0 then
    raise("GradScaler.step: closure use is not supported while the GradScaler is enabled")
  end
  if s.stage == "stepped" then raise("GradScaler.step: step() has already been called since the last update()") end
  if s.stage == "ready" then self:unscale_(optimizer) end
  s.stage = "stepped"
  if s.found_inf then return nil end
  return optimizer:step()
end

-- update([new_scale]): the scale for the next iteration. With new_scale
-- (a number, or a 1-element tensor) it is set to that; otherwise halved
-- (backoff_factor) when an optimizer stepped over an inf or a NaN since the
-- last update, and grown (growth_factor) after growth_interval clean
-- updates in a row.
function GradScaler:update(new_scale)
  if not self._enabled then return end
  if new_scale ~= nil then
    if torch.is_tensor(new_scale) then
      if new_scale:numel() ~= 1 then raise("GradScaler.update: new_scale should be a 1-element tensor") end
      new_scale = new_scale:item()
    end
    if type(new_scale) ~= "number" or new_scale <= 0 then
      raise("GradScaler.update: expected new_scale to be a positive number or a 1-element tensor, got " .. tostring(new_scale))
    end
    self._scale = new_scale
  else
    local checked, found = false, false
    for _, s in pairs(self._stages) do
      if s.stage ~= "ready" then checked = true; found = found or s.found_inf end
    end
    if not checked then raise("GradScaler.update: no inf checks were recorded prior to update()") end
    if found then
      self._scale = self._scale * self._backoff_factor
      self._growth_tracker = 0
    else
      self._growth_tracker = self._growth_tracker + 1
      if self._growth_tracker == self._growth_interval then
        self._scale = self._scale * self._growth_factor
        self._growth_tracker = 0
      end
    end
  end
  self._stages = setmetatable({}, { __mode = "k" })
end

-- get_scale(): the current scale (1.0 when disabled).
function GradScaler:get_scale() return self._enabled and self._scale or 1.0 end
function GradScaler:get_growth_factor() return self._growth_factor end
function GradScaler:set_growth_factor(v) self._growth_factor = v end
function GradScaler:get_backoff_factor() return self._backoff_factor end
function GradScaler:set_backoff_factor(v) self._backoff_factor = v end
function GradScaler:get_growth_interval() return self._growth_interval end
function GradScaler:set_growth_interval(v) self._growth_interval = v end

-- state_dict(): PyTorch's keys; empty when disabled.
function GradScaler:state_dict()
  if not self._enabled then return {} end
  return { scale = self._scale, growth_factor = self._growth_factor, backoff_factor = self._backoff_factor,
           growth_interval = self._growth_interval, _growth_tracker = self._growth_tracker }
end

function GradScaler:load_state_dict(sd)
  if not self._enabled then return end
  if type(sd) ~= "table" or next(sd) == nil then
    raise("GradScaler.load_state_dict: the state dict is empty: it was saved from a disabled GradScaler")
  end
  local function number(k)
    local v = sd[k]
    if torch.is_tensor(v) then v = v:item() end
    if type(v) ~= "number" then raise("GradScaler.load_state_dict: expected a number for '" .. k .. "', got " .. typename(v)) end
    return v
  end
  self._scale, self._growth_factor = number("scale"), number("growth_factor")
  self._backoff_factor, self._growth_interval = number("backoff_factor"), number("growth_interval")
  self._growth_tracker = number("_growth_tracker")
end

function GradScaler:__tostring()
  return string.format("GradScaler(scale=%g, enabled=%s)", self:get_scale(), tostring(self._enabled))
end

-- torch.amp.autocast(device_type, [opts,] fn, ...): torch.autocast.
function M.autocast(...) return torch.autocast(...) end

-- torch.cuda.amp: the same GradScaler, and autocast for "cuda" without the
-- device argument, as PyTorch's.
M.cuda = {
  GradScaler = GradScaler,
  autocast = function(...) return torch.autocast("cuda", ...) end,
}

return M
