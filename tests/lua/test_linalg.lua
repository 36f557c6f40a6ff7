-- test_linalg.lua: torch.linalg (solve, inv, det, slogdet, cholesky, qr,
-- the norms, multi_dot) against PyTorch's results and the gradients of
-- their inputs in float64 (tests/ref/linalg.lua, written by
-- scripts/gen_linalg_ref.py); float32; bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local L = torch.linalg
local ref = dofile(here .. "/../ref/linalg.lua")
local f64 = { dtype = torch.float64 }

-- the generator's inputs
local function inputs()
  local A = T.filled(torch, { 2, 4, 4 }, function(k) return math.sin(1 + 0.7 * k) * 2 end) + torch.eye(4, f64) * 3
  return {
    A = A,
    B = T.filled(torch, { 2, 4, 3 }, function(k) return math.cos(2 + 1.1 * k) end),
    M = T.filled(torch, { 5, 3 }, function(k) return math.sin(0.5 + 1.3 * k * k) end),
    v = T.filled(torch, { 6 }, function(k) return math.cos(0.3 + 1.7 * k) end),
  }
end

local cases = {
  solve = function(A, B) return L.solve(A, B) end,
  solve_vector = function(A) return L.solve(A, torch.tensor({ 1.0, -2.0, 0.5, 3.0 }, f64)) end,
  inv = function(A) return L.inv(A) end,
  det = function(A) return L.det(A) end,
  slogdet = function(A) return L.slogdet(A) end,
  cholesky = function(A) return L.cholesky(A:matmul(A:transpose(-2, -1)) + torch.eye(4, f64)) end,
  qr = function(M) return L.qr(M) end,
  qr_wide_complete = function(A) return L.qr(A[0]:narrow(0, 0, 3), "complete") end,
  vector_norm = function(v) return L.vector_norm(v) end,
  vector_norm_3 = function(v) return L.vector_norm(v, 3) end,
  vector_norm_inf = function(B) return L.vector_norm(B, math.huge, -1) end,
  matrix_norm_fro = function(B) return L.matrix_norm(B) end,
  matrix_norm_1 = function(A) return L.matrix_norm(A, 1) end,
  matrix_norm_inf_keepdim = function(A) return L.matrix_norm(A, { ord = math.huge, keepdim = true }) end,
  norm_matrix = function(M) return L.norm(M) end,
  multi_dot = function(M, B) return L.multi_dot({ M:t(), M, B[0]:narrow(0, 0, 3) }) end,
}

local function weights(y) return torch.arange(0, y:numel(), f64):cos():reshape(y:size()) end

for _, name in ipairs(T.sorted_keys(cases)) do
  T.run(name .. " against PyTorch", function()
    local r = ref[name]
    local xs = inputs()
    local args = {}
    for i, n in ipairs(r.inputs) do args[i] = xs[n]:requires_grad_() end
    local y, y2 = cases[name](unpack(args))
    T.is(y:size(), r.shape, name .. ": shape")
    T.values_close(y:detach():reshape(-1):tolist(), r.y, 1e-10, 1e-12, name .. ": result")
    if r.y2 then T.values_close(y2:detach():reshape(-1):tolist(), r.y2, 1e-10, 1e-12, name .. ": second result") end
    local loss
    for _, o in ipairs({ y, y2 }) do
      if o ~= nil and o.requires_grad then
        local part = (o * weights(o)):sum()
        loss = loss and loss + part or part
      end
    end
    loss:backward()
    for i, n in ipairs(r.inputs) do
      T.values_close(args[i].grad:reshape(-1):tolist(), r["d" .. n], 1e-9, 1e-11, name .. ": gradient of " .. n)
    end
  end)
end

T.run("float32, batches, upper, bad input", function()
  local A = inputs().A:float()
  local X = L.solve(A, torch.ones(2, 4, 1))
  T.tensor_close(A:matmul(X), torch.ones(2, 4, 1), 1e-5, 1e-5, "float32 solve")
  local S = torch.tensor({ { 4.0, 2.0 }, { 2.0, 3.0 } }, f64)
  local U = L.cholesky(S, { upper = true })
  T.tensor_close(U:t():mm(U), S, 1e-14, 1e-14, "cholesky upper: U^T U = A")
  T.raises(function() L.cholesky(torch.tensor({ { 1.0, 2.0 }, { 2.0, 1.0 } }, f64)) end,
           "not positive%-definite %(the leading minor of order 2", "an indefinite matrix")
  T.raises(function() L.inv(torch.tensor({ { 1.0, 2.0 }, { 2.0, 4.0 } }, f64)) end, "singular", "a singular matrix")
  T.raises(function() L.solve(torch.randn(3, 4), torch.randn(3)) end, "square matrices, but they are 3 by 4", "not square")
  T.raises(function() L.solve(torch.randn(3, 3), torch.randn(4, 2)) end, "Incompatible shapes", "B's rows")
  T.raises(function() L.det(torch.arange(4):view(2, 2)) end, "expected a floating point A", "integers")
  T.raises(function() L.matrix_norm(torch.randn(2, 2), "nuc") end, 'ord nuc is not supported', "the nuclear norm")
  T.raises(function() L.qr(torch.randn(3, 3), "economic") end, "unrecognized mode", "a qr mode")
end)

T.done_testing()
