-- test_linalg.lua: torch.linalg (solve, inv, det, slogdet, cholesky, qr,
-- the norms, multi_dot, eigh, svd, pinv, cond, solve_triangular,
-- cholesky_solve, lstsq, matrix_power, matrix_exp, the LU family, the _ex
-- forms, tensorinv, tensorsolve, vander, householder_product, geqrf, ormqr) against PyTorch's
-- results and the gradients of
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
  qr_triangular = function(A) return L.qr(A:triu()) end,   -- nothing below the diagonal: LAPACK reflects nothing
  geqrf = function(M) return torch.geqrf(M) end,
  geqrf_triangular = function(A) return torch.geqrf(A:triu()) end,
  ormqr = function(B)
    local a, tau = torch.geqrf(inputs().A[0])
    return torch.ormqr(a, tau, B[0])
  end,
  ormqr_right_transpose = function(B)
    local a, tau = torch.geqrf(inputs().A[0])
    return torch.ormqr(a, tau, B[0]:t(), { left = false, transpose = true })
  end,
  ormqr_transpose = function(B)
    local a, tau = torch.geqrf(inputs().A[1])
    return a:ormqr(tau, B[1], true, true)
  end,
  ormqr_right = function(B)
    local a, tau = torch.geqrf(inputs().A[1])
    return torch.ormqr(a, tau, B[1]:t(), false)
  end,
  vector_norm = function(v) return L.vector_norm(v) end,
  vector_norm_3 = function(v) return L.vector_norm(v, 3) end,
  vector_norm_inf = function(B) return L.vector_norm(B, math.huge, -1) end,
  matrix_norm_fro = function(B) return L.matrix_norm(B) end,
  matrix_norm_1 = function(A) return L.matrix_norm(A, 1) end,
  matrix_norm_inf_keepdim = function(A) return L.matrix_norm(A, { ord = math.huge, keepdim = true }) end,
  norm_matrix = function(M) return L.norm(M) end,
  multi_dot = function(M, B) return L.multi_dot({ M:t(), M, B[0]:narrow(0, 0, 3) }) end,
  -- eigenvectors and singular vectors are read squared: their signs are free
  eigh = function(A)
    local w, V = L.eigh(A + A:transpose(-2, -1))
    return w, V * V
  end,
  eigh_upper = function(A)
    local w, V = L.eigh(A, "U")
    return w, V * V
  end,
  eigvalsh = function(A) return L.eigvalsh(A:matmul(A:transpose(-2, -1))) end,
  svd_u = function(M)
    local U, S = L.svd(M, false)
    return S, U * U
  end,
  svd_vh = function(M)
    local _, S, Vh = L.svd(M, { full_matrices = false })
    return S, Vh * Vh
  end,
  svd_wide = function(A)
    local _, S, Vh = L.svd(A:narrow(1, 0, 3), false)
    return S, Vh * Vh
  end,
  svd_wide_u = function(A)
    local U, S = L.svd(A:narrow(1, 0, 3), false)
    return S, U * U
  end,
  svd_full = function(M)
    local U, S = L.svd(M)
    local U3 = U:narrow(1, 0, 3)
    return S, U3 * U3
  end,
  svdvals = function(A) return L.svdvals(A) end,
  pinv = function(M) return L.pinv(M) end,
  pinv_wide = function(A) return L.pinv(A:narrow(1, 0, 3)) end,
  cond = function(A) return L.cond(A) end,
  matrix_norm_nuc = function(A) return L.matrix_norm(A, "nuc") end,
  matrix_norm_2 = function(A) return L.matrix_norm(A, 2) end,
  matrix_norm_neg2_keepdim = function(A) return L.matrix_norm(A, { ord = -2, keepdim = true }) end,
  solve_triangular = function(A, B) return L.solve_triangular(A:triu(), B, { upper = true }) end,
  solve_triangular_lower_right_unit = function(A, B)
    return L.solve_triangular(A:tril(), B:transpose(-2, -1), { upper = false, left = false, unitriangular = true })
  end,
  cholesky_solve = function(A, B)
    return torch.cholesky_solve(B, L.cholesky(A:matmul(A:transpose(-2, -1)) + torch.eye(4, f64)))
  end,
  lstsq = function(M, v) return (L.lstsq(M, v:narrow(0, 0, 5):unsqueeze(-1))) end,
  matrix_power_3 = function(A) return L.matrix_power(A, 3) end,
  matrix_power_neg2 = function(A) return L.matrix_power(A, -2) end,
  matrix_exp = function(A) return L.matrix_exp(A / 4) end,
  lu_factor = function(A) return L.lu_factor(A) end,
  lu_factor_tall = function(M) return L.lu_factor(M) end,
  lu_factor_wide = function(B) return L.lu_factor(B:transpose(-2, -1)) end,
  lu_p = function(A) return (L.lu(A)) end,
  lu_l_u = function(A) return select(2, L.lu(A)) end,
  lu_tall_l_u = function(M) return select(2, L.lu(M)) end,
  lu_unpack_p = function(M) return (torch.lu_unpack(L.lu_factor(M))) end,
  lu_solve = function(A, B)
    local LU, piv = L.lu_factor(A)
    return L.lu_solve(LU, piv, B)
  end,
  lu_solve_adjoint = function(A, B)
    local LU, piv = L.lu_factor(A)
    return L.lu_solve(LU, piv, B, { adjoint = true })
  end,
  lu_solve_right = function(A, B)
    local LU, piv = L.lu_factor(A)
    return L.lu_solve(LU, piv, B:transpose(-2, -1), { left = false })
  end,
  torch_lu_solve = function(A, B) return torch.lu_solve(B, torch.lu(A)) end,
  solve_ex = function(A, B) return L.solve_ex(A, B) end,
  inv_ex = function(A) return L.inv_ex(A) end,
  cholesky_ex_upper = function(A)
    return L.cholesky_ex(A:matmul(A:transpose(-2, -1)) + torch.eye(4, f64), { upper = true })
  end,
  cholesky_inverse = function(A) return torch.cholesky_inverse(L.cholesky(A[0]:matmul(A[0]:t()) + torch.eye(4, f64))) end,
  tensorinv = function(A) return L.tensorinv(A[0]:reshape(2, 2, 4), { ind = 2 }) end,
  tensorsolve = function(A, B) return L.tensorsolve(A[0]:reshape(4, 2, 2), B[0]:select(1, 0)) end,
  tensorsolve_dims = function(A, B) return L.tensorsolve(A[0]:reshape(2, 4, 2), B[0]:select(1, 0), { 0 }) end,
  vander = function(v) return L.vander(v:narrow(0, 0, 4):reshape(2, 2), { N = 3 }) end,
  householder_product = function(M) return L.householder_product(M, torch.tensor({ 1.2, 0.7, 1.5 }, f64)) end,
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
    T.is(loss ~= nil, r["d" .. r.inputs[1]] ~= nil, name .. ": a gradient where PyTorch has one")
    if loss == nil then return end
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
  T.raises(function() L.matrix_norm(torch.randn(2, 2), 3) end, 'ord 3 is not supported', "an unknown matrix norm")
  T.raises(function() L.qr(torch.randn(3, 3), "economic") end, "unrecognized mode", "a qr mode")
  T.raises(function() torch.ormqr(torch.randn(4, 3), torch.randn(3), torch.randn(3, 2)) end,
           "C with m = 4 rows, got A %[4, 3%], tau %[3%] and C %[3, 2%]", "ormqr: C of another height")
  T.raises(function() torch.geqrf(torch.randn(3)) end, "at least 2 dims", "geqrf of a vector")
  T.raises(function() L.eigh(torch.randn(2, 3)) end, "square matrices, but they are 2 by 3", "eigh of a non-square")
  T.raises(function() L.eigh(torch.eye(2), "X") end, 'expected UPLO to be "L" or "U"', "a bad UPLO")
  T.raises(function() L.svd(torch.randn(3)) end, "at least 2 dims", "svd of a vector")
  T.raises(function() L.solve_triangular(torch.eye(2), torch.ones(2, 1)) end, "expected the options {upper", "no upper")
  T.raises(function() L.lstsq(torch.randn(3, 2), torch.randn(4, 1)) end, "expected B with 3 rows", "lstsq's rows")
  T.raises(function() L.lstsq(torch.randn(3, 2), torch.randn(3, 1), { driver = "lapack" }) end, "should be one of", "a driver")
  T.raises(function() L.matrix_power(torch.eye(2), 0.5) end, "expected an integer power", "a fractional power")
  T.raises(function() L.matrix_exp(torch.tensor({ { 0 / 0, 0 }, { 0, 1 } }, f64)) end, "inf or a NaN", "a NaN")
  local P, Lf, Uf = L.lu(A)
  T.tensor_close(P:matmul(Lf):matmul(Uf), A, 1e-5, 1e-5, "float32 lu: P L U = A")
  local singular = torch.tensor({ { { 1.0, 2.0 }, { 2.0, 4.0 } }, { { 2.0, 1.0 }, { 1.0, 2.0 } } }, f64)
  T.is(select(2, L.solve_ex(singular, torch.ones(2, 2, 1, f64))):tolist(), { 2, 0 }, "solve_ex: info per matrix")
  T.is(select(3, L.lu_factor_ex(singular)):tolist(), { 2, 0 }, "lu_factor_ex: the first zero pivot")
  T.is(select(2, L.cholesky_ex(singular)):tolist(), { 2, 0 }, "cholesky_ex: the order of the failing minor")
  T.raises(function() L.inv_ex(singular, { check_errors = true }) end, "singular %(info = 2%)", "inv_ex check_errors")
  T.raises(function() L.lu_factor(A, { pivot = false }) end, "without pivoting is not implemented", "pivot = false")
  T.raises(function() torch.lu_unpack(L.lu_factor(A), torch.ones(2, 3, { dtype = torch.int32 })) end,
           "expected pivots of shape %(..., 4%)", "pivots of the wrong length")
  T.raises(function() torch.lu_unpack(L.lu_factor(A), torch.zeros(2, 4, { dtype = torch.int32 })) end,
           "pivots must be between 1 and 4", "pivots out of range")
  T.raises(function() L.lu_solve(L.lu_factor(A), select(2, L.lu_factor(A)), torch.ones(2, 3, 1)) end,
           "expected B of shape %(..., 4, k%)", "lu_solve: B's rows")
  T.raises(function() L.tensorinv(torch.ones(2, 3, 4), 1) end, "product of the first 1 dims of A %(2%) to equal",
           "tensorinv: not square")
  T.raises(function() L.tensorinv(torch.ones(4, 4), 2) end, "ind to be an integer from 1 to 1", "tensorinv: ind")
  T.raises(function() L.tensorsolve(torch.ones(4, 2, 2), torch.ones(3)) end, "leading dims to be B's shape",
           "tensorsolve: B's shape")
  T.raises(function() L.tensorsolve(torch.ones(4, 2, 2), torch.ones(4), { 5 }) end, "dims holds 5", "tensorsolve: a dim")
  T.raises(function() L.vander(torch.ones(3), { N = 1 }) end, "N to be an integer greater than 1", "vander: N")
  T.raises(function() L.householder_product(torch.ones(2, 3), torch.ones(2)) end, "m >= n", "householder_product: wide")
end)

T.run("spectral decompositions: properties, ranks, float32, empty and batched", function()
  torch.manual_seed(4)
  local Q = L.qr(torch.randn(6, 6, f64))
  local w = torch.tensor({ -3, -1, 0.5, 0.5, 2, 7 }, f64)
  local A = Q:matmul(torch.diag_embed(w)):matmul(Q:t())
  local got, V = L.eigh(A)
  T.values_close(got:tolist(), w:tolist(), 1e-13, 1e-13, "eigh: known eigenvalues, ascending, a repeated one")
  T.tensor_close(V:t():matmul(V), torch.eye(6, f64), 1e-13, 1e-13, "eigh: orthonormal eigenvectors")
  T.tensor_close(V:matmul(torch.diag_embed(got)):matmul(V:t()), A, 1e-13, 1e-13, "eigh: V diag(w) V^T = A")
  local low = torch.randn(5, 2, f64):matmul(torch.randn(2, 4, f64))     -- rank 2
  local U, S, Vh = L.svd(low)
  T.is(T.shape(U), { 5, 5 }, "svd: full U")
  T.is(T.shape(Vh), { 4, 4 }, "svd: full Vh")
  T.tensor_close(U:t():matmul(U), torch.eye(5, f64), 1e-12, 1e-12, "svd: U orthogonal, completed past the rank")
  T.tensor_close(Vh:matmul(Vh:t()), torch.eye(4, f64), 1e-12, 1e-12, "svd: Vh orthogonal")
  T.tensor_close(U:narrow(1, 0, 4):matmul(torch.diag_embed(S)):matmul(Vh), low, 1e-12, 1e-12, "svd: U S Vh = A")
  T.is(L.matrix_rank(low):item(), 2, "matrix_rank of a rank-2 product")
  T.is(L.matrix_rank(low, { atol = 1e300 }):item(), 0, "a cutoff above every singular value")
  T.tensor_close(L.pinv(low):matmul(low):matmul(L.pinv(low)), L.pinv(low), 1e-10, 1e-10, "pinv: A+ A A+ = A+")
  local Uo, So, Vo = torch.svd(low)
  T.is(T.shape(Vo), { 4, 4 }, "torch.svd returns V (n x n)")
  T.tensor_close(Uo:matmul(torch.diag_embed(So)):matmul(Vo:t()), low, 1e-12, 1e-12, "torch.svd: U S V^T = A")
  local B = torch.randn(3, 4, 4, f64)
  local S32 = L.svdvals(B:float())
  T.is(S32.dtype, torch.float32, "float32 in, float32 out")
  T.tensor_close(S32, L.svdvals(B):float(), 1e-5, 1e-5, "float32 singular values")
  T.is(T.shape(L.svdvals(torch.zeros(0, 3, 3))), { 0, 3 }, "an empty batch")
  T.is(T.shape(L.eigvalsh(torch.zeros(2, 0, 0))), { 2, 0 }, "empty matrices")
  T.is(T.shape(L.svdvals(torch.zeros(2 ^ 40, 0, 3))), { 2 ^ 40, 0 }, "a huge batch of empty matrices: no loop over it")
  T.is(T.shape(L.det(torch.zeros(0, 3000, 3000))), { 0 }, "an empty batch of large matrices: no elimination")
  T.is(L.det(torch.zeros(2, 0, 0)):tolist(), { 1, 1 }, "the determinant of a 0 x 0 matrix is 1")
  local ok = L.matrix_power(torch.eye(3, f64) * 2, 0)
  T.tensor_close(ok, torch.eye(3, f64), 0, 0, "matrix_power(A, 0) = I")
  local R = L.matrix_exp(torch.tensor({ { 0, -math.pi }, { math.pi, 0 } }, f64))
  T.tensor_close(R, -torch.eye(2, f64), 1e-14, 1e-14, "exp of a half-turn rotation generator is -I")
end)

T.run("svd_lowrank and pca_lowrank: exact on low rank, the top singular values, the principal directions", function()
  torch.manual_seed(12)
  local A = torch.randn(2, 9, 3, f64):matmul(torch.randn(2, 3, 6, f64))        -- a batch of rank-3 matrices
  for _, M_ in ipairs({ A, A:transpose(-2, -1) }) do
    local U, S, V = torch.svd_lowrank(M_, 3)
    T.is(T.shape(U), { 2, M_:size(-2), 3 }, "U (..., m, q)")
    T.is(T.shape(V), { 2, M_:size(-1), 3 }, "V (..., n, q)")
    T.tensor_close(U:matmul(torch.diag_embed(S)):matmul(V:transpose(-2, -1)), M_, 1e-10, 1e-10,
                   "U diag(S) V^T is the matrix: its rank is q")
    T.tensor_close(S, L.svdvals(M_):narrow(-1, 0, 3), 1e-10, 1e-10, "S: the top singular values")
    T.tensor_close(U:transpose(-2, -1):matmul(U), torch.eye(3, f64):expand(2, 3, 3), 1e-12, 1e-12, "U orthonormal")
  end
  local X = torch.randn(500, 3, f64):matmul(torch.tensor({ { 4, 0, 0 }, { 0, 1, 0 }, { 0, 0, 0.1 } }, f64)) + 7
  local _, S, V = torch.pca_lowrank(X, 2)
  T.close(math.abs(V[0][0]:item()), 1, 0.01, 0, "pca_lowrank: the first direction is the widest axis")
  local centred = X - X:mean(0, true)
  T.tensor_close(S, L.svdvals(centred):narrow(0, 0, 2), 1e-8, 1e-8, "pca_lowrank: the centred data's singular values")
  T.raises(function() torch.svd_lowrank(A, 7) end, "q to be an integer from 1 to min%(m, n%) = 6", "q too large")
  T.raises(function() torch.svd_lowrank(A, 2, -1) end, "niter to be a non%-negative integer", "a negative niter")
end)

T.done_testing()
