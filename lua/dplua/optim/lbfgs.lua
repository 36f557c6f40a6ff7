-- dplua.optim.lbfgs: L-BFGS with PyTorch's algorithm and options, the
-- optimizer of the neural style transfer tutorial. step(closure) runs up
-- to max_iter iterations, each reevaluating closure (which zeroes the
-- gradients, computes the loss, calls backward and returns the loss):
--
--   local opt = torch.optim.LBFGS({ img }, { lr = 1, line_search_fn = "strong_wolfe" })
--   opt:step(function()
--     opt:zero_grad()
--     local loss = style_loss(img)
--     loss:backward()
--     return loss
--   end)
--
-- The two-loop recursion runs on the parameters' flattened gradient (one
-- group, as PyTorch's); the scalars (dot products, the line search) on
-- the host.
local torch = require("dplua")
local raise = torch._raise
local Optimizer = require("dplua.optim.optimizer")

local LBFGS = {}
LBFGS.__index = LBFGS
LBFGS.__name = "LBFGS"

local defaults = { lr = 1, max_iter = 20, max_eval = false, tolerance_grad = 1e-7, tolerance_change = 1e-9,
                   history_size = 100, line_search_fn = false }

-- LBFGS(params [, {lr=1, max_iter=20, max_eval=max_iter * 5 / 4,
-- tolerance_grad=1e-7, tolerance_change=1e-9, history_size=100,
-- line_search_fn=nil | "strong_wolfe"}])
local function new(params, opts)
  local fn = "LBFGS"
  if torch.is_tensor(params) then params = { params } end
  if type(params) ~= "table" or #params == 0 then raise(fn .. ": expected a non-empty list of parameters") end
  if type(params[1]) == "table" and not torch.is_tensor(params[1]) then   -- param groups
    if #params > 1 then raise(fn .. " doesn't support per-parameter options (parameter groups)") end
    params = params[1].params
  end
  for i, p in ipairs(params) do
    if not torch.is_tensor(p) then raise(string.format("%s: expected a tensor at position %d", fn, i)) end
  end
  opts = opts or {}
  local group = { params = params }
  for k in pairs(opts) do
    if defaults[k] == nil then raise(string.format("%s: unknown option '%s'", fn, tostring(k))) end
  end
  for k, v in pairs(defaults) do
    local o = opts[k]
    if o == nil then o = v end
    group[k] = o
  end
  if group.max_eval == false then group.max_eval = math.floor(group.max_iter * 5 / 4) end
  if group.line_search_fn == false then group.line_search_fn = nil end
  if group.line_search_fn ~= nil and group.line_search_fn ~= "strong_wolfe" then
    raise(fn .. ': only "strong_wolfe" is supported as line_search_fn')
  end
  if type(group.lr) ~= "number" or group.lr < 0 then raise(fn .. ": Invalid learning rate: " .. tostring(group.lr)) end
  local self = setmetatable({ param_groups = { group }, defaults = defaults, state = { func_evals = 0, n_iter = 0 } },
                            LBFGS)
  return self
end
setmetatable(LBFGS, { __call = function(_, ...) return new(...) end })

function LBFGS:zero_grad()
  for _, p in ipairs(self.param_groups[1].params) do p.grad = nil end
end

-- every parameter's gradient (zeros for one without), as one flat tensor
function LBFGS:_flat_grad()
  local parts = {}
  for i, p in ipairs(self.param_groups[1].params) do
    local g = p.grad
    parts[i] = g ~= nil and g:reshape(-1) or torch.zeros(p:numel(), { dtype = p.dtype, device = p.device })
  end
  return torch.cat(parts, 0)
end

-- the parameters += step * direction, direction flat
function LBFGS:_add(step, direction)
  local at = 0
  torch.no_grad(function()
    for _, p in ipairs(self.param_groups[1].params) do
      local n = p:numel()
      p:add_(direction:narrow(0, at, n):view(p:size()), step)
      at = at + n
    end
  end)
end

local function evaluate(closure)
  local loss = torch.enable_grad(closure)
  if torch.is_tensor(loss) then return loss:item(), loss end
  if type(loss) ~= "number" then raise("LBFGS.step: expected the closure to return the loss") end
  return loss, loss
end

-- the minimum of the cubic through (x1, f1) and (x2, f2) with slopes g1 and
-- g2, within bounds (the two points by default)
local function cubic_min(x1, f1, g1, x2, f2, g2, lo, hi)
  if lo == nil then lo, hi = math.min(x1, x2), math.max(x1, x2) end
  local d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
  local d2sq = d1 * d1 - g1 * g2
  if d2sq < 0 then return (lo + hi) / 2 end
  local d2 = math.sqrt(d2sq)
  local m
  if x1 <= x2 then m = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
  else m = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2)) end
  return math.min(math.max(m, lo), hi)
end

-- A line search along d from the parameters x (their flat copy) for a step
-- t that meets the strong Wolfe conditions; obj(t) evaluates there and
-- returns the loss and the flat gradient. Returns the loss, the gradient
-- and the step it chose, and the evaluations spent.
local function strong_wolfe(obj, t, d, f, g, gtd, tolerance_change)
  local c1, c2, max_ls = 1e-4, 0.9, 25
  local d_norm = d:abs():max():item()
  local f_new, g_new = obj(t)
  local evals, gtd_new = 1, g_new:dot(d):item()
  local t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
  local done, ls_iter = false, 0
  local bracket, bf, bg, bgtd
  while ls_iter < max_ls do
    if f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev) then
      bracket, bf, bg, bgtd = { t_prev, t }, { f_prev, f_new }, { g_prev, g_new }, { gtd_prev, gtd_new }
      break
    end
    if math.abs(gtd_new) <= -c2 * gtd then
      bracket, bf, bg, done = { t }, { f_new }, { g_new }, true
      break
    end
    if gtd_new >= 0 then
      bracket, bf, bg, bgtd = { t_prev, t }, { f_prev, f_new }, { g_prev, g_new }, { gtd_prev, gtd_new }
      break
    end
    -- extrapolate
    local tmp = t
    t = cubic_min(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, t + 0.01 * (t - t_prev), t * 10)
    t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new, gtd_new
    f_new, g_new = obj(t)
    evals, gtd_new, ls_iter = evals + 1, g_new:dot(d):item(), ls_iter + 1
  end
  if ls_iter == max_ls then bracket, bf, bg = { 0, t }, { f, f_new }, { g, g_new } end
  -- zoom: shrink the bracket until a point meets the conditions
  local insufficient = false
  local low, high = 1, 2
  if bf[1] > bf[#bf] then low, high = 2, 1 end
  while not done and ls_iter < max_ls do
    if math.abs(bracket[2] - bracket[1]) * d_norm < tolerance_change then break end
    t = cubic_min(bracket[1], bf[1], bgtd[1], bracket[2], bf[2], bgtd[2])
    local bmax, bmin = math.max(bracket[1], bracket[2]), math.min(bracket[1], bracket[2])
    local eps = 0.1 * (bmax - bmin)
    if math.min(bmax - t, t - bmin) < eps then
      if insufficient or t >= bmax or t <= bmin then
        t = math.abs(t - bmax) < math.abs(t - bmin) and bmax - eps or bmin + eps
        insufficient = false
      else
        insufficient = true
      end
    else
      insufficient = false
    end
    f_new, g_new = obj(t)
    evals, gtd_new, ls_iter = evals + 1, g_new:dot(d):item(), ls_iter + 1
    if f_new > f + c1 * t * gtd or f_new >= bf[low] then
      bracket[high], bf[high], bg[high], bgtd[high] = t, f_new, g_new, gtd_new
      if bf[1] <= bf[2] then low, high = 1, 2 else low, high = 2, 1 end
    else
      if math.abs(gtd_new) <= -c2 * gtd then
        done = true
      elseif gtd_new * (bracket[high] - bracket[low]) >= 0 then
        bracket[high], bf[high], bg[high], bgtd[high] = bracket[low], bf[low], bg[low], bgtd[low]
      end
      bracket[low], bf[low], bg[low], bgtd[low] = t, f_new, g_new, gtd_new
    end
  end
  return bf[low], bg[low], bracket[low], evals
end

-- step(closure): up to max_iter iterations from the closure's loss and
-- gradient; returns the loss of the first evaluation, as PyTorch's.
local function lbfgs_step(self, closure)
  if type(closure) ~= "function" then raise("LBFGS.step: expected a closure that reevaluates the model and returns the loss") end
  local g = self.param_groups[1]
  local st = self.state
  local lr, max_iter, max_eval = g.lr, g.max_iter, g.max_eval
  local tol_grad, tol_change, history = g.tolerance_grad, g.tolerance_change, g.history_size
  local loss, orig_loss = evaluate(closure)
  local current_evals = 1
  st.func_evals = st.func_evals + 1
  local flat_grad = self:_flat_grad()
  if flat_grad:abs():max():item() <= tol_grad then return orig_loss end
  local d, t = st.d, st.t
  local old_dirs, old_stps, ro, H_diag = st.old_dirs, st.old_stps, st.ro, st.H_diag
  local prev_flat_grad, prev_loss = st.prev_flat_grad, st.prev_loss
  local n_iter = 0
  while n_iter < max_iter do
    n_iter = n_iter + 1
    st.n_iter = st.n_iter + 1
    -- the direction: the gradient's descent, then the two-loop recursion
    -- over the kept curvature pairs
    if st.n_iter == 1 then
      d = -flat_grad
      old_dirs, old_stps, ro, H_diag = {}, {}, {}, 1
    else
      local y = flat_grad - prev_flat_grad
      local s = d * t
      local ys = y:dot(s):item()
      if ys > 1e-10 then
        if #old_dirs == history then
          table.remove(old_dirs, 1)
          table.remove(old_stps, 1)
          table.remove(ro, 1)
        end
        old_dirs[#old_dirs + 1], old_stps[#old_stps + 1], ro[#ro + 1] = y, s, 1 / ys
        H_diag = ys / y:dot(y):item()
      end
      local al = {}
      local q = -flat_grad
      for i = #old_dirs, 1, -1 do
        al[i] = old_stps[i]:dot(q):item() * ro[i]
        q:add_(old_dirs[i], -al[i])
      end
      local r = q * H_diag
      for i = 1, #old_dirs do
        local be = old_dirs[i]:dot(r):item() * ro[i]
        r:add_(old_stps[i], al[i] - be)
      end
      d = r
    end
    prev_flat_grad = flat_grad:clone()
    prev_loss = loss
    -- the step: scaled by the gradient at the first iteration
    if st.n_iter == 1 then t = math.min(1, 1 / flat_grad:abs():sum():item()) * lr else t = lr end
    local gtd = flat_grad:dot(d):item()
    if gtd > -tol_change then break end
    local ls_evals = 0
    if g.line_search_fn == "strong_wolfe" then
      local x = {}
      for i, p in ipairs(g.params) do x[i] = p:detach():clone() end
      local function restore()
        torch.no_grad(function() for i, p in ipairs(g.params) do p:copy_(x[i]) end end)
      end
      local function obj(step)
        self:_add(step, d)
        local f = evaluate(closure)
        local grad = self:_flat_grad()
        restore()
        return f, grad
      end
      loss, flat_grad, t, ls_evals = strong_wolfe(obj, t, d, loss, flat_grad, gtd, tol_change)
      self:_add(t, d)
    else
      self:_add(t, d)
      if n_iter ~= max_iter then
        loss = evaluate(closure)
        flat_grad = self:_flat_grad()
        ls_evals = 1
      end
    end
    current_evals = current_evals + ls_evals
    st.func_evals = st.func_evals + ls_evals
    -- the conditions to stop
    if n_iter == max_iter or current_evals >= max_eval then break end
    if flat_grad:abs():max():item() <= tol_grad then break end
    if (d * t):abs():max():item() <= tol_change then break end
    if math.abs(loss - prev_loss) < tol_change then break end
  end
  st.d, st.t, st.old_dirs, st.old_stps, st.ro, st.H_diag = d, t, old_dirs, old_stps, ro, H_diag
  st.prev_flat_grad, st.prev_loss = prev_flat_grad, prev_loss
  return orig_loss
end

function LBFGS:step(closure) return Optimizer._hooked_step(self, lbfgs_step, closure) end
LBFGS.register_step_pre_hook = Optimizer.register_step_pre_hook
LBFGS.register_step_post_hook = Optimizer.register_step_post_hook

function LBFGS:__tostring()
  local g = self.param_groups[1]
  return string.format("LBFGS (lr: %s, max_iter: %d, history_size: %d, line_search_fn: %s)", tostring(g.lr), g.max_iter,
                       g.history_size, tostring(g.line_search_fn))
end

return LBFGS
