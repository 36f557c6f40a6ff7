-- dplua.utils.flop_counter: torch.utils.flop_counter's FlopCounterMode,
-- the floating point operations of the products a piece of code runs
-- (matrix products, Linear layers, convolutions, attention), forward and
-- backward, by module:
--
--   local counter = torch.utils.flop_counter.FlopCounterMode({ module = model })
--   counter:run(function() model(x):sum():backward() end)
--   print(counter:get_total_flops())       -- e.g. 6 N T for a transformer's step
--   print(counter:get_table())             -- by module, then by operation
--
-- As PyTorch's, it counts 2 m k n for an (m, k) by (k, n) product and the
-- same for each of its two gradients, 2 x output elements x (input
-- channels / groups) x kernel for a convolution (and the same for each
-- gradient), and attention's two products (4 b h q k d forward, twice
-- that backward; a causal mask does not halve it). Other operations count nothing. A
-- backward is counted as its gradients flow (through a hook on each
-- counted output), so code that never runs backward counts none. A Linear
-- that a Sequential runs fused with its activation counts in the
-- Sequential.
local torch = require("dplua")
local raise, is_tensor = torch._raise, torch.is_tensor

local M = {}

local function prod(list, from, to)
  local n = 1
  for i = from or 1, to or #list do n = n * list[i] end
  return n
end

-- FLOPs of each counted operation, from its first three arguments and its
-- result: the forward count, and the backward count given which of the
-- three arguments need a gradient
local function each_gradient(f)   -- a product's two gradients, f each
  return function(needs) return ((needs[1] and 1 or 0) + (needs[2] and 1 or 0)) * f end
end
local function matmul_flops(a, _, _, out)
  local k = a:dim() == 1 and a:size(0) or a:size(-1)
  local f = 2 * out:numel() * k
  return f, each_gradient(f)
end
local function linear_flops(x, w)
  local f = 2 * x:numel() * w:size(0)   -- numel(x) / in rows, each in x out x 2
  return f, each_gradient(f)
end
local function conv_flops(_, w, _, out)
  -- 2 x output elements x (input channels / groups) x kernel elements
  local f = 2 * out:numel() * prod(w:size(), 2)
  return f, each_gradient(f)
end
local function conv_transpose_flops(x, w)
  -- the same products read from the input's side: 2 x input elements x
  -- (output channels / groups) x kernel elements
  local f = 2 * x:numel() * prod(w:size(), 2)
  return f, each_gradient(f)
end
local function attention_flops(q, k, v)
  local tq, tk, d, dv = q:size(-2), k:size(-2), q:size(-1), v:size(-1)
  local batch = q:numel() / (tq * d)
  local f = 2 * batch * tq * tk * d + 2 * batch * tq * tk * dv
  -- backward: four products of those sizes (the scores' gradient, then q's,
  -- k's and v's), whichever of them need a gradient
  return f, function(needs) return (needs[1] or needs[2] or needs[3]) and 2 * f or 0 end
end

-- name -> { table, key, formula }: where the counted functions live
local function targets()
  local F, m = torch.nn.functional, torch._methods
  return {
    { m, "matmul", "matmul", matmul_flops }, { m, "mm", "mm", matmul_flops }, { m, "bmm", "bmm", matmul_flops },
    -- (torch.NAME holds its own reference to a method)
    { torch, "matmul", "matmul", matmul_flops }, { torch, "mm", "mm", matmul_flops }, { torch, "bmm", "bmm", matmul_flops },
    { torch, "_linear", "linear", linear_flops }, { torch, "_linear_act", "linear", linear_flops },
    { F, "conv1d", "conv1d", conv_flops }, { F, "conv2d", "conv2d", conv_flops }, { F, "conv3d", "conv3d", conv_flops },
    { F, "conv_transpose1d", "conv_transpose1d", conv_transpose_flops },
    { F, "conv_transpose2d", "conv_transpose2d", conv_transpose_flops },
    { F, "conv_transpose3d", "conv_transpose3d", conv_transpose_flops },
    { F, "scaled_dot_product_attention", "scaled_dot_product_attention", attention_flops },
  }
end

---------------------------------------------------------------- the counter

local Counter = {}
Counter.__index = Counter

-- FlopCounterMode([{module =, depth = 2, display = false}]): module names
-- the counts' modules as "Model.blocks.0" (else by class); depth is how
-- deep get_table goes.
function M.FlopCounterMode(opts)
  opts = torch._options(opts, "FlopCounterMode")
  for k in pairs(opts) do
    if k ~= "module" and k ~= "depth" and k ~= "display" then raise("FlopCounterMode: unknown option '" .. tostring(k) .. "'") end
  end
  if opts.module ~= nil and not torch.nn.is_module(opts.module) then raise("FlopCounterMode: expected module to be a module") end
  local depth = opts.depth == nil and 2 or opts.depth
  if type(depth) ~= "number" or depth % 1 ~= 0 or depth < 0 then raise("FlopCounterMode: expected depth to be a count") end
  local names = {}
  if opts.module then
    local root = opts.module:_get_name()
    for _, e in ipairs(opts.module:named_modules()) do names[e[2]] = e[1] == "" and root or (root .. "." .. e[1]) end
  end
  return setmetatable({ counts = {}, order = {}, names = names, depth = depth, display = opts.display == true },
                      Counter)
end

local function add(self, scope, op, flops)
  local c = self.counts[scope]
  if not c then
    c = {}
    self.counts[scope] = c
    self.order[#self.order + 1] = scope
  end
  c[op] = (c[op] or 0) + flops
end

-- run(fn, ...): fn(...) with its products counted; returns fn's results.
-- The counts add up over runs (reset() clears them).
function Counter:run(fn, ...)
  if type(fn) ~= "function" then raise("FlopCounterMode.run: expected a function, got " .. type(fn)) end
  torch._load_ops()
  local stack = { "Global" }   -- the modules being called, outermost first
  local inside = 0             -- a counted function running: what it calls is its own
  local installed = {}
  local function count(op, flops, scopes)
    for _, s in ipairs(scopes) do add(self, s, op, flops) end
  end
  for _, t in ipairs(targets()) do
    local tbl, key, op, formula = t[1], t[2], t[3], t[4]
    local original = tbl[key]
    if type(original) == "function" then
      installed[#installed + 1] = { tbl, key, original }
      tbl[key] = function(...)
        if inside > 0 then return original(...) end
        inside = inside + 1
        local res = { pcall(original, ...) }
        inside = inside - 1
        if not res[1] then error(res[2], 0) end
        local out = res[2]
        if is_tensor(out) then
          local args = { ... }
          local forward, backward = formula(args[1], args[2], args[3], out)
          local scopes = { unpack(stack) }
          count(op, forward, scopes)
          local needs = {}
          for i = 1, 3 do needs[i] = is_tensor(args[i]) and args[i].requires_grad end
          local back = backward(needs)
          if back > 0 and out.requires_grad then
            out:register_hook(function() count(op .. "_backward", back, scopes) end)
          end
        end
        return unpack(res, 2, table.maxn(res))
      end
    end
  end
  local Module = torch.nn.Module
  local previous = Module._observe_calls(function(call, m, ...)
    stack[#stack + 1] = self.names[m] or (stack[#stack] == "Global" and m:_get_name() or (stack[#stack] .. "." .. m:_get_name()))
    local res = { pcall(call, m, ...) }
    stack[#stack] = nil
    if not res[1] then error(res[2], 0) end
    return unpack(res, 2, table.maxn(res))
  end)
  local res = { pcall(fn, ...) }
  Module._observe_calls(previous)
  for k = #installed, 1, -1 do
    local e = installed[k]
    e[1][e[2]] = e[3]
  end
  if not res[1] then error(res[2], 0) end
  if self.display then print(self:get_table()) end
  return unpack(res, 2, table.maxn(res))
end

function Counter:reset()
  self.counts, self.order = {}, {}
end

-- get_total_flops(): everything counted ("Global" holds every count)
function Counter:get_total_flops()
  local total = 0
  for _, f in pairs(self.counts.Global or {}) do total = total + f end
  return total
end

-- get_flop_counts(): { scope = { op = flops } }, "Global" and each module
function Counter:get_flop_counts()
  local out = {}
  for scope, c in pairs(self.counts) do
    out[scope] = {}
    for op, f in pairs(c) do out[scope][op] = f end
  end
  return out
end

local function human(f)
  for _, u in ipairs({ { 1e12, "T" }, { 1e9, "G" }, { 1e6, "M" }, { 1e3, "K" } }) do
    if f >= u[1] then return string.format("%.3f%s", f / u[1], u[2]) end
  end
  return string.format("%d", f)
end

-- get_table([depth]): each scope down to depth (Global 0, its modules 1,
-- ...), with its operations below it, as PyTorch's table
function Counter:get_table(depth)
  depth = depth or self.depth
  local total = self:get_total_flops()
  local lines = { string.format("%-40s %12s %9s", "Module", "FLOP", "% Total") }
  for _, scope in ipairs(self.order) do
    local level = scope == "Global" and 0 or select(2, scope:gsub("%.", "")) + 1
    if level <= depth then
      local c, sum, ops = self.counts[scope], 0, {}
      for op, f in pairs(c) do sum, ops[#ops + 1] = sum + f, op end
      table.sort(ops)
      lines[#lines + 1] = string.format("%-40s %12s %8.2f%%", string.rep(" ", level) .. scope, human(sum),
                                        total > 0 and 100 * sum / total or 0)
      for _, op in ipairs(ops) do
        lines[#lines + 1] = string.format("%-40s %12s %8.2f%%", string.rep(" ", level) .. " - " .. op, human(c[op]),
                                          total > 0 and 100 * c[op] / total or 0)
      end
    end
  end
  return table.concat(lines, "\n")
end

return M
