-- dplua.linalg: torch.linalg's norms, solve, inv, det, slogdet,
-- cholesky, qr, multi_dot, cross, vecdot, solve_triangular, lstsq,
-- matrix_power and matrix_exp as compositions of tensor ops
-- over the last two dims (any batch dims before them), so that every
-- device and autograd come with them. The factorizations take one step of
-- a few ops a column (LU with partial pivoting, Cholesky by columns,
-- Householder QR with LAPACK's sign convention): exact to rounding, and
-- meant for the matrices of models and their losses (up to a few
-- hundred), not for large dense solves. eigh and svd (and what is built
-- on them: pinv, matrix_rank, cond, the spectral norms) come from
-- dplua/spectral.lua, computed on the host.
--
--   local x = torch.linalg.solve(A, b)
--   local q, r = torch.linalg.qr(A)
--   local n = torch.linalg.vector_norm(v, 2, -1)
local torch = require("dplua")
local raise, is_tensor = torch._raise, torch.is_tensor

local M = {}

local function typename(v) return is_tensor(v) and "Tensor" or type(v) end

local function want_float(fn, t, what)
  if not is_tensor(t) then raise(string.format("%s: expected %s to be a tensor, got %s", fn, what, typename(t))) end
  if not t.dtype.is_floating_point then
    raise(string.format("%s: expected a floating point %s, got %s", fn, what, t.dtype.name))
  end
  return t
end

local function want_square(fn, A)
  want_float(fn, A, "A")
  if A:dim() < 2 or A:size(-1) ~= A:size(-2) then
    raise(string.format("%s: A must be batches of square matrices, but they are %s matrices", fn,
                        A:dim() < 2 and "not" or (A:size(-2) .. " by " .. A:size(-1))))
  end
  return A:size(-1)
end

-- The batch's rows k of A (..., n, m) as (..., 1, m).
local function row(A, k) return A:narrow(-2, k, 1) end

---------------------------------------------------------------- norms

-- vector_norm(x [, ord=2, dim, keepdim=false]) (or {ord=, dim=, keepdim=}):
-- (sum |x|^ord)^(1/ord) over dim (a number, a list, or every dim); ord
-- inf and -inf the largest and smallest |x|, 0 the count of non-zeros.
function M.vector_norm(x, ord, dim, keepdim)
  local fn = "linalg.vector_norm"
  if type(ord) == "table" then ord, dim, keepdim = ord.ord, ord.dim, ord.keepdim end
  want_float(fn, x, "x")
  ord = ord == nil and 2 or ord
  if type(ord) ~= "number" then raise(fn .. ": expected ord to be a number, got " .. typename(ord)) end
  local dims = dim
  if dims == nil then
    dims = {}
    for d = 0, x:dim() - 1 do dims[#dims + 1] = d end
  elseif type(dims) == "number" then
    dims = { dims }
  end
  if type(dims) ~= "table" or torch.is_tensor(dims) then
    raise(fn .. ": expected dim to be a number or a list of dims, got " .. typename(dims))
  end
  for _, d in ipairs(dims) do
    if type(d) ~= "number" or d % 1 ~= 0 or d < -math.max(x:dim(), 1) or d >= math.max(x:dim(), 1) then
      raise(string.format("%s: dim %s is out of range for a tensor of %d dims", fn, tostring(d), x:dim()))
    end
  end
  local a = x:abs()
  local function over(t, op)
    local out = t
    for _, d in ipairs(dims) do out = op(out, d) end
    if keepdim then return out end
    local sorted = {}
    for i, d in ipairs(dims) do sorted[i] = d < 0 and d + x:dim() or d end
    table.sort(sorted, function(p, q) return p > q end)
    for _, d in ipairs(sorted) do out = out:squeeze(d) end
    return out
  end
  if x:dim() == 0 then return a end
  if ord == math.huge then return over(a, function(t, d) return t:amax(d, true) end) end
  if ord == -math.huge then return over(a, function(t, d) return t:amin(d, true) end) end
  local sum = function(t, d) return t:sum(d, true) end
  if ord == 0 then return over(a:ne(0):to(x.dtype), sum) end
  if ord == 1 then return over(a, sum) end
  if ord == 2 then return over(a * a, sum):sqrt() end
  return over(a:pow(ord), sum):pow(1 / ord)
end

-- matrix_norm(A [, ord="fro", dim={-2, -1}, keepdim=false]) (or an options
-- table): "fro", 1 and -1 (the largest and smallest column sum of |A|),
-- inf and -inf (row sums), "nuc" (the sum of the singular values), 2 and
-- -2 (the largest and the smallest).
function M.matrix_norm(A, ord, dim, keepdim)
  local fn = "linalg.matrix_norm"
  if type(ord) == "table" then ord, dim, keepdim = ord.ord, ord.dim, ord.keepdim end
  want_float(fn, A, "A")
  if A:dim() < 2 then raise(fn .. ": expected a tensor of at least 2 dims") end
  ord, dim = ord or "fro", dim or { -2, -1 }
  local nd = A:dim()
  local function valid(d) return type(d) == "number" and d % 1 == 0 and d >= -nd and d < nd end
  if type(dim) ~= "table" or #dim ~= 2 or not valid(dim[1]) or not valid(dim[2]) then
    local shown = tostring(dim)
    if type(dim) == "table" then
      local parts = {}
      for i = 1, #dim do parts[i] = tostring(dim[i]) end
      shown = "{" .. table.concat(parts, ", ") .. "}"
    end
    raise(string.format("%s: expected dim to be a list of two dims of A (from %d to %d), got %s", fn, -nd, nd - 1, shown))
  end
  local r, c = dim[1] < 0 and dim[1] + nd or dim[1], dim[2] < 0 and dim[2] + nd or dim[2]
  if r == c then raise(fn .. ": expected dim to be two different dims, got " .. r .. " twice") end
  local function keep(t)
    if keepdim then return t end
    if r > c then return t:squeeze(r):squeeze(c) end
    return t:squeeze(c):squeeze(r)
  end
  local a = A:abs()
  if ord == "fro" then return keep((a * a):sum(r, true):sum(c, true):sqrt()) end
  if ord == 1 then return keep(a:sum(r, true):amax(c, true)) end
  if ord == -1 then return keep(a:sum(r, true):amin(c, true)) end
  if ord == math.huge then return keep(a:sum(c, true):amax(r, true)) end
  if ord == -math.huge then return keep(a:sum(c, true):amin(r, true)) end
  if ord == "nuc" or ord == 2 or ord == -2 then
    local moved = A:movedim({ r, c }, { -2, -1 })
    local S = M.svdvals(moved)
    local v = ord == "nuc" and S:sum(-1) or (ord == 2 and S:amax(-1) or S:amin(-1))
    if keepdim then
      local lo, hi = math.min(r, c), math.max(r, c)
      v = v:unsqueeze(lo):unsqueeze(hi)
    end
    return v
  end
  raise(string.format('%s: ord %s is not supported (expected "fro", "nuc", 1, -1, 2, -2, inf or -inf)', fn, tostring(ord)))
end

-- norm(x [, ord, dim, keepdim]): a vector norm over one dim (or all, with
-- ord nil), a matrix norm over two dims (or of a 2-D x with ord given).
function M.norm(x, ord, dim, keepdim)
  if type(ord) == "table" and not is_tensor(ord) then ord, dim, keepdim = ord.ord, ord.dim, ord.keepdim end
  want_float("linalg.norm", x, "x")
  local matrix = (type(dim) == "table" and #dim == 2) or (dim == nil and ord ~= nil and x:dim() == 2)
  if matrix then return M.matrix_norm(x, ord, dim, keepdim) end
  if dim == nil and ord == nil then return M.vector_norm(x:reshape(-1), 2, 0, false) end
  return M.vector_norm(x, ord, dim, keepdim)
end

---------------------------------------------------------------- LU with partial pivoting

-- Gaussian elimination of A (..., n, n) with partial pivoting, applied to
-- the columns of B (..., n, k) too: U upper triangular, B transformed
-- alike, the pivots U's diagonal, and the number of row swaps of each
-- matrix (..., 1, 1), for the determinant's sign.
local function eliminate(A, B)
  local n = A:size(-1)
  local M_ = B and torch.cat({ A, B }, -1) or A
  local swaps = n > 0 and torch.zeros_like(A:narrow(-1, 0, 1):narrow(-2, 0, 1)) or nil
  if A:numel() == 0 then return A, B, swaps end   -- an empty batch: nothing to eliminate
  local idx = torch.arange(n, { dtype = torch.int64, device = A.device })
  for k = 0, n - 2 do
    -- the row of the largest |entry| of column k at or below the diagonal
    local col = M_:narrow(-1, k, 1):narrow(-2, k, n - k):abs()
    local _, p = col:max(-2, true)                                   -- (..., 1, 1), from 0
    p = p + k
    -- swap rows k and p: each matrix's rows gathered from their source rows
    local shape = M_:size()
    shape[#shape] = 1
    local r = idx:view(n, 1):expand(shape)
    local pe = p:expand(shape)
    local src = torch.where(r:eq(k), pe, torch.where(r:eq(pe), k, r))
    M_ = M_:gather(-2, src:expand(M_:size()))
    swaps = swaps + p:ne(k):to(A.dtype)
    -- eliminate below the pivot
    local pivot = M_:narrow(-2, k, 1):narrow(-1, k, 1)
    local below = M_:narrow(-2, k + 1, n - k - 1)
    local factors = below:narrow(-1, k, 1) / pivot
    below = below - factors * M_:narrow(-2, k, 1)
    M_ = torch.cat({ M_:narrow(-2, 0, k + 1), below }, -2)
  end
  local U = M_:narrow(-1, 0, n)
  return U, B and M_:narrow(-1, n, M_:size(-1) - n), swaps
end

-- The solution of U X = B, U upper triangular, by back substitution.
local function back_substitute(U, B)
  local n = U:size(-1)
  if U:numel() == 0 or B:numel() == 0 then return B:clone() end
  local xs = {}
  for k = n - 1, 0, -1 do
    local rhs = row(B, k)
    if k < n - 1 then
      local rest = torch.cat({ unpack(xs, 1, n - 1 - k) }, -2)       -- rows k+1 .. n-1 of X
      rhs = rhs - U:narrow(-2, k, 1):narrow(-1, k + 1, n - 1 - k):matmul(rest)
    end
    table.insert(xs, 1, rhs / U:narrow(-2, k, 1):narrow(-1, k, 1))
  end
  return torch.cat(xs, -2)
end

local function check_invertible(fn, U)
  local d = U:diagonal(0, -2, -1)
  if d:eq(0):any():item() then
    raise(fn .. ": The diagonal element of U is zero, the inversion could not be completed because the input matrix is singular")
  end
end

-- solve(A, B [, {left=true}]): X with A X = B, B (..., n, k) or a vector
-- (..., n); with left=false, X A = B.
function M.solve(A, B, opts)
  local fn = "linalg.solve"
  local n = want_square(fn, A)
  want_float(fn, B, "B")
  if type(opts) == "table" and opts.left == false then
    return M.solve(A:transpose(-2, -1), B:transpose(-2, -1)):transpose(-2, -1)
  end
  local vector = B:dim() == A:dim() - 1 or B:dim() == 1
  local b = vector and B:unsqueeze(-1) or B
  if b:size(-2) ~= n then
    raise(string.format("%s: Incompatible shapes of A and B for the equation AX = B (%s and %s)", fn,
                        table.concat(A:size(), "x"), table.concat(B:size(), "x")))
  end
  local shape = torch.broadcast_shapes({ unpack(A:size(), 1, A:dim() - 2) }, { unpack(b:size(), 1, b:dim() - 2) })
  local As, bs = { unpack(shape) }, { unpack(shape) }
  As[#As + 1], As[#As + 2] = n, n
  bs[#bs + 1], bs[#bs + 2] = n, b:size(-1)
  local U, C = eliminate(A:expand(As), b:expand(bs))
  check_invertible(fn, U)
  local X = back_substitute(U, C)
  return vector and X:squeeze(-1) or X
end

-- inv(A): the inverse, as solve(A, I).
function M.inv(A)
  local n = want_square("linalg.inv", A)
  local I = torch.eye(n, { dtype = A.dtype, device = A.device })
  local shape = A:size()
  local U, C = eliminate(A, I:expand(shape))
  check_invertible("linalg.inv", U)
  return back_substitute(U, C)
end

-- det(A), slogdet(A) (sign, log|det|), logdet(A): through the pivots.
function M.det(A)
  local n = want_square("linalg.det", A)
  if n == 0 or A:numel() == 0 then
    local shape = A:size()
    shape[#shape], shape[#shape - 1] = nil, nil
    return torch.ones(shape, { dtype = A.dtype, device = A.device })
  end
  local U, _, swaps = eliminate(A)
  local sign = 1 - (swaps:remainder(2)) * 2
  return U:diagonal(0, -2, -1):prod(-1) * sign:squeeze(-1):squeeze(-1)
end
function M.slogdet(A)
  local n = want_square("linalg.slogdet", A)
  if n == 0 or A:numel() == 0 then
    local shape = A:size()
    shape[#shape], shape[#shape - 1] = nil, nil
    return torch.ones(shape, { dtype = A.dtype, device = A.device }), torch.zeros(shape, { dtype = A.dtype, device = A.device })
  end
  local U, _, swaps = eliminate(A)
  local d = U:diagonal(0, -2, -1)
  local sign = (1 - swaps:remainder(2) * 2):squeeze(-1):squeeze(-1) * d:sign():prod(-1)
  return sign, d:abs():log():sum(-1)
end
function M.logdet(A)
  local sign, logabs = M.slogdet(A)
  return torch.where(sign:lt(0), 0 / 0, torch.where(sign:eq(0), -math.huge, logabs))
end

---------------------------------------------------------------- Cholesky, QR

-- The columns of L, one at a time. With tolerant, a matrix whose leading
-- minor of order j is not positive-definite is recorded in info (the first
-- such j, else 0) instead of raising, and its factor is not meaningful.
local function cholesky_lower(A, fn, tolerant)
  local n = A:size(-1)
  local batch = A:size()
  batch[#batch], batch[#batch - 1] = nil, nil
  local info = torch.zeros(batch, { dtype = torch.int32, device = A.device })
  if A:numel() == 0 then return A:clone(), info end
  local cols = {}
  for j = 0, n - 1 do
    local rows = A:narrow(-2, j, n - j):narrow(-1, j, 1)              -- (..., n - j, 1)
    if j > 0 then
      local Lp = torch.cat(cols, -1)                                  -- (..., n, j)
      local lj = Lp:narrow(-2, j, 1)                                  -- row j (..., 1, j)
      rows = rows - Lp:narrow(-2, j, n - j):matmul(lj:transpose(-2, -1))
    end
    local d = rows:narrow(-2, 0, 1)
    local bad = d:le(0):logical_or(d:ne(d))
    if tolerant then
      info = torch.where(info:eq(0):logical_and(bad:squeeze(-1):squeeze(-1)), j + 1, info):to(torch.int32)
      d = torch.where(bad, torch.ones_like(d), d)
    elseif bad:any():item() then
      raise(string.format("%s: The factorization could not be completed because the input is not positive-definite "
                          .. "(the leading minor of order %d is not positive-definite).", fn, j + 1))
    end
    local col = rows / d:sqrt()
    if j > 0 then
      local zshape = col:size()
      zshape[#zshape - 1] = j
      col = torch.cat({ torch.zeros(zshape, { dtype = A.dtype, device = A.device }), col }, -2)
    end
    cols[j + 1] = col
  end
  return torch.cat(cols, -1), info
end

-- cholesky(A [, {upper=false}]): L lower triangular with A = L L^T, A
-- symmetric positive-definite (else an error naming the minor).
function M.cholesky(A, opts)
  local fn = "linalg.cholesky"
  want_square(fn, A)
  local L = cholesky_lower(A, fn, false)
  if type(opts) == "table" and opts.upper then return L:transpose(-2, -1) end
  return L
end

-- The Householder reflections that make A (..., m, n) upper triangular,
-- with LAPACK's signs (R's diagonal is -sign(x_0) |x| of each column's
-- reflected part x) and LAPACK's choice of no reflection where x is zero
-- below its first entry: R (all m rows) and, per reflection, {k, v,
-- scale} (H = I - scale v v^T acting on rows k..m-1, v[0] = x_0 - R[k, k]).
local function householder_reflections(A)
  local m, n = A:size(-2), A:size(-1)
  local R, vs = A, {}
  for k = 0, math.min(m, n) - 1 do
    if k == m - 1 then break end   -- a single entry: no reflection (LAPACK's tau = 0 there)
    local x = R:narrow(-2, k, m - k):narrow(-1, k, 1)                -- (..., m - k, 1)
    local x0, rest = x:narrow(-2, 0, 1), x:narrow(-2, 1, m - k - 1)
    local rest2 = (rest * rest):sum(-2, true)
    local norm = (x0 * x0 + rest2):sqrt()
    local alpha = torch.where(rest2:eq(0), x0, torch.where(x0:ge(0), -norm, norm))   -- R[k, k] after it
    local v = torch.cat({ x0 - alpha, rest }, -2)
    local vnorm2 = (v * v):sum(-2, true)
    local none = vnorm2:eq(0)
    local scale = torch.where(none, 0, 2 / torch.where(none, 1, vnorm2))
    local below = R:narrow(-2, k, m - k)
    below = below - v:matmul(v:transpose(-2, -1):matmul(below)) * scale
    R = torch.cat({ R:narrow(-2, 0, k), below }, -2)
    vs[#vs + 1] = { k, v, scale }
  end
  return R, vs
end

-- qr(A [, mode="reduced"]): Q with orthonormal columns and R upper
-- triangular, A = Q R, by Householder reflections with LAPACK's signs, so
-- that Q and R are PyTorch's. mode "complete" gives the square Q, "r" R alone.
function M.qr(A, mode)
  local fn = "linalg.qr"
  if type(mode) == "table" then mode = mode.mode end
  mode = mode or "reduced"
  if mode ~= "reduced" and mode ~= "complete" and mode ~= "r" then
    raise(fn .. ': qr received unrecognized mode ' .. tostring(mode) .. ' but expected one of "reduced" (default), "r", or "complete"')
  end
  want_float(fn, A, "A")
  if A:dim() < 2 then raise(fn .. ": expected a tensor of at least 2 dims") end
  local m, n = A:size(-2), A:size(-1)
  local kmax = math.min(m, n)
  if A:numel() == 0 then   -- an empty batch or empty matrices: no reflections
    local qshape, rshape = A:size(), A:size()
    qshape[#qshape] = mode == "complete" and m or kmax
    rshape[#rshape - 1] = mode == "complete" and m or kmax
    local R0 = torch.zeros(rshape, { dtype = A.dtype, device = A.device })
    if mode == "r" then return nil, R0 end
    return torch.eye(m, qshape[#qshape], { dtype = A.dtype, device = A.device }):expand(qshape):contiguous(), R0
  end
  local R, vs = householder_reflections(A)
  local rows = mode == "complete" and m or kmax
  local Rout = R:narrow(-2, 0, rows):triu()
  if mode == "r" then return nil, Rout end
  -- Q: the reflections applied, last to first, to the first columns of I
  local cols = mode == "complete" and m or kmax
  local shape = A:size()
  shape[#shape] = cols
  local Q = torch.eye(m, cols, { dtype = A.dtype, device = A.device }):expand(shape)
  for i = #vs, 1, -1 do
    local k, v, scale = vs[i][1], vs[i][2], vs[i][3]
    local below = Q:narrow(-2, k, m - k)
    below = below - v:matmul(v:transpose(-2, -1):matmul(below)) * scale
    Q = torch.cat({ Q:narrow(-2, 0, k), below }, -2)
  end
  return Q, Rout
end

-- torch.geqrf(A): LAPACK's compact QR, as PyTorch's: `a` holds R on and
-- above the diagonal and each reflection's vector (scaled to 1 at the
-- diagonal, which is not stored) below it, tau (..., min(m, n)) the
-- reflections' factors, so that householder_product(a, tau) is Q. Like
-- PyTorch's it has no gradient: its results are detached.
local function geqrf(A)
  local fn = "geqrf"
  want_float(fn, A, "A")
  if A:dim() < 2 then raise(fn .. ": expected a tensor of at least 2 dims") end
  return torch.no_grad(function()
    local m, n = A:size(-2), A:size(-1)
    local kmax = math.min(m, n)
    local tshape = A:size()
    table.remove(tshape)
    tshape[#tshape] = kmax
    local a, tau = A:clone(), torch.zeros(tshape, { dtype = A.dtype, device = A.device })
    if A:numel() == 0 then return a, tau end
    local R, vs = householder_reflections(A)
    a = R:triu()
    for _, r in ipairs(vs) do
      local k, v, scale = r[1], r[2], r[3]
      local v0 = v:narrow(-2, 0, 1)
      local safe = v0:eq(0)
      local below = v:narrow(-2, 1, m - k - 1) / torch.where(safe, 1, v0)        -- (..., m - k - 1, 1)
      a:narrow(-2, k + 1, m - k - 1):narrow(-1, k, 1):copy_(below)
      tau:narrow(-1, k, 1):copy_((scale * v0 * v0):squeeze(-1))
    end
    return a, tau
  end)
end

---------------------------------------------------------------- eigenvalues and singular values

local spectral = require("dplua.spectral")

-- eigh(A [, UPLO = "L"]): the eigenvalues (ascending) and eigenvectors
-- (columns) of the symmetric matrices A, read from their lower (or upper)
-- triangle; eigvalsh(A [, UPLO]) the eigenvalues alone.
function M.eigh(A, uplo)
  local fn = "linalg.eigh"
  if type(uplo) == "table" then uplo = uplo.UPLO or uplo.uplo end
  want_square(fn, A)
  uplo = uplo or "L"
  if uplo ~= "L" and uplo ~= "U" then raise(fn .. ': expected UPLO to be "L" or "U", got ' .. tostring(uplo)) end
  return spectral.eigh(A, uplo)
end
function M.eigvalsh(A, uplo) return (M.eigh(A, uplo)) end

local function want_matrix(fn, A)
  want_float(fn, A, "A")
  if A:dim() < 2 then raise(fn .. ": expected a tensor of at least 2 dims (a matrix or a batch of them)") end
end

-- svd(A [, full_matrices = true]) (or {full_matrices =}): U, S (descending)
-- and Vh with A = U diag(S) Vh; svdvals(A) the singular values alone.
function M.svd(A, full_matrices)
  local fn = "linalg.svd"
  if type(full_matrices) == "table" then full_matrices = full_matrices.full_matrices end
  want_matrix(fn, A)
  if full_matrices == nil then full_matrices = true end
  return spectral.svd(A, full_matrices)
end
function M.svdvals(A)
  want_matrix("linalg.svdvals", A)
  local _, S = spectral.svd(A, false)
  return S
end

-- the default cutoff of pinv and matrix_rank: max(m, n) eps S_max
local function cutoff(S, A, atol, rtol)
  local eps = A.dtype == torch.float64 and 2.220446049250313e-16 or 1.1920928955078125e-07
  if rtol == nil then rtol = (atol == nil or atol == 0) and eps * math.max(A:size(-2), A:size(-1)) or 0 end
  local smax = S:numel() > 0 and S:amax(-1, true) or S:sum(-1, true)
  return torch.maximum(smax * rtol, torch.full_like(smax, atol or 0))
end

-- pinv(A [, {atol =, rtol =, hermitian =}]): the pseudo-inverse through
-- the SVD, singular values at or below max(atol, rtol S_max) taken as 0.
function M.pinv(A, opts)
  local fn = "linalg.pinv"
  if type(opts) == "number" then opts = { rtol = opts } end
  opts = opts or {}
  want_matrix(fn, A)
  local U, S, Vh = spectral.svd(A, false)
  local keep = S:gt(cutoff(S:detach(), A, opts.atol, opts.rtol))
  local inv = torch.where(keep, 1 / torch.where(keep, S, 1), 0)
  return (Vh:transpose(-2, -1) * inv:unsqueeze(-2)):matmul(U:transpose(-2, -1))
end

-- matrix_rank(A [, {atol =, rtol =, hermitian =}]): the singular values
-- above the cutoff, counted (int64).
function M.matrix_rank(A, opts)
  local fn = "linalg.matrix_rank"
  if type(opts) == "number" then opts = { atol = opts, rtol = 0 } end
  opts = opts or {}
  want_matrix(fn, A)
  local S = M.svdvals(A:detach())
  return S:gt(cutoff(S, A, opts.atol, opts.rtol)):sum(-1)
end

-- cond(A [, p = nil]): S_max / S_min (p nil or 2), S_min / S_max (-2), or
-- the norm of A times that of its inverse for the other matrix norms.
function M.cond(A, p)
  local fn = "linalg.cond"
  want_matrix(fn, A)
  if p == nil or p == 2 or p == -2 then
    local S = M.svdvals(A)
    local hi, lo = S:narrow(-1, 0, 1):squeeze(-1), S:narrow(-1, S:size(-1) - 1, 1):squeeze(-1)
    return p == -2 and lo / hi or hi / lo
  end
  return M.matrix_norm(A, p) * M.matrix_norm(M.inv(A), p)
end

-- solve_triangular(A, B, {upper =, left = true, unitriangular = false}):
-- X with A X = B (X A = B with left false), A triangular, by substitution.
function M.solve_triangular(A, B, opts)
  local fn = "linalg.solve_triangular"
  if type(opts) ~= "table" or opts.upper == nil then
    raise(fn .. ": expected the options {upper = true | false [, left, unitriangular]}")
  end
  local n = want_square(fn, A)
  want_float(fn, B, "B")
  if opts.left == false then
    return M.solve_triangular(A:transpose(-2, -1), B:transpose(-2, -1),
                              { upper = not opts.upper, unitriangular = opts.unitriangular }):transpose(-2, -1)
  end
  if B:dim() < 2 or B:size(-2) ~= n then
    raise(string.format("%s: expected B of shape (..., %d, k) for A (..., %d, %d), got [%s]", fn, n, n, n,
                        table.concat(B:size(), ", ")))
  end
  local T = opts.upper and A:triu() or A:tril()
  if opts.upper == false then            -- a lower solve is an upper one with rows and columns reversed
    local X = M.solve_triangular(T:flip({ -2, -1 }), B:flip(-2), { upper = true, unitriangular = opts.unitriangular })
    return X:flip(-2)
  end
  if opts.unitriangular then T = T - torch.diag_embed(T:diagonal(0, -2, -1)) + torch.eye(n, { dtype = A.dtype, device = A.device }) end
  local shape = torch.broadcast_shapes({ unpack(T:size(), 1, T:dim() - 2) }, { unpack(B:size(), 1, B:dim() - 2) })
  local Ts, Bs = { unpack(shape) }, { unpack(shape) }
  Ts[#Ts + 1], Ts[#Ts + 2] = n, n
  Bs[#Bs + 1], Bs[#Bs + 2] = n, B:size(-1)
  return back_substitute(T:expand(Ts), B:expand(Bs))
end

-- cholesky_solve(B, L [, {upper = false}]) (torch.cholesky_solve): X with
-- A X = B for A = L L^T (or U^T U with upper).
function M.cholesky_solve(B, L, opts)
  local upper = type(opts) == "table" and opts.upper or opts == true
  local lower = upper and L:transpose(-2, -1) or L
  local Y = M.solve_triangular(lower, B, { upper = false })
  return M.solve_triangular(lower:transpose(-2, -1), Y, { upper = true })
end

-- lstsq(A, B [, {rcond =, driver =}]): the least-squares (minimum-norm)
-- solution X of A X = B, through the pseudo-inverse, with what PyTorch's
-- CPU drivers return beside it: "gelsy" (the default) the ranks; "gelsd"
-- and "gelss" also the singular values and, when m > n and every A has
-- full rank, the residuals |A X - B|^2 of each column; "gels" nothing
-- more. Returned as solution, residuals, rank, singular_values (empty
-- tensors for what the driver leaves out).
local drivers = { gelsy = true, gelsd = true, gelss = true, gels = true }
function M.lstsq(A, B, opts)
  local fn = "linalg.lstsq"
  want_matrix(fn, A)
  want_float(fn, B, "B")
  opts = type(opts) == "table" and opts or {}
  local driver = opts.driver or "gelsy"
  if not drivers[driver] then
    raise(fn .. ': parameter `driver` should be one of (gels, gelsy, gelsd, gelss), got ' .. tostring(driver))
  end
  local vector = B:dim() == A:dim() - 1
  local b = vector and B:unsqueeze(-1) or B
  if b:size(-2) ~= A:size(-2) then
    raise(string.format("%s: expected B with %d rows for A of %d rows, got [%s]", fn, A:size(-2), A:size(-2),
                        table.concat(B:size(), ", ")))
  end
  local X = M.pinv(A, opts.rcond and { rtol = opts.rcond } or nil):matmul(b)
  local empty = torch.zeros(0, { dtype = A.dtype, device = A.device })
  local residuals, rank, S = empty, torch.zeros(0, { dtype = torch.int64, device = A.device }), empty
  if driver ~= "gels" then
    local sv = M.svdvals(A:detach())
    rank = sv:gt(cutoff(sv, A, nil, opts.rcond)):sum(-1)
    if driver ~= "gelsy" then
      S = sv
      local m, n = A:size(-2), A:size(-1)
      if m > n and rank:eq(n):all():item() then residuals = (A:matmul(X) - b):square():sum(-2) end
    end
  end
  return vector and X:squeeze(-1) or X, residuals, rank, S
end

-- matrix_power(A, k): A^k by repeated squaring; k < 0 inverts first.
function M.matrix_power(A, k)
  local fn = "linalg.matrix_power"
  local n = want_square(fn, A)
  if type(k) ~= "number" or k % 1 ~= 0 or math.abs(k) > 2 ^ 53 then
    raise(fn .. ": expected an integer power, got " .. tostring(k))
  end
  if k < 0 then A, k = M.inv(A), -k end
  local result = torch.eye(n, { dtype = A.dtype, device = A.device }):expand(A:size())
  local base, first = A, true
  while k > 0 do
    if k % 2 == 1 then result = first and base or result:matmul(base); first = false end
    k = math.floor(k / 2)
    if k > 0 then base = base:matmul(base) end
  end
  return first and result:clone() or result
end

-- matrix_exp(A): scaling by 2^-s until the 1-norm is at most 1/2, 18 terms
-- of the Taylor series, then s squarings.
function M.matrix_exp(A)
  local n = want_square("linalg.matrix_exp", A)
  local norm = A:numel() > 0 and A:detach():abs():sum(-2):amax():item() or 0
  if norm ~= norm or norm == math.huge then raise("linalg.matrix_exp: the matrix holds an inf or a NaN") end
  local s = norm > 0.5 and math.ceil(math.log(norm / 0.5) / math.log(2)) or 0
  local X = A / 2 ^ s
  local I = torch.eye(n, { dtype = A.dtype, device = A.device }):expand(A:size())
  local term, sum = I, I
  for k = 1, 18 do
    term = term:matmul(X) / k
    sum = sum + term
  end
  for _ = 1, s do sum = sum:matmul(sum) end
  return sum
end

---------------------------------------------------------------- LU factors, the _ex forms, tensor solves

-- Swaps rows k and p (p (..., 1, 1), from 0) of every matrix of X (..., m, c).
local function swap_rows(X, k, p, idx)
  local shape = X:size()
  shape[#shape] = 1
  local r = idx:view(-1, 1):expand(shape)
  local pe = p:expand(shape)
  local src = torch.where(r:eq(k), pe, torch.where(r:eq(pe), k, r))
  return X:gather(-2, src:expand(X:size()))
end

-- lu_factor(A [, {pivot = true}]): LU with partial pivoting of A (..., m, n),
-- as LAPACK's getrf: LU holds L's multipliers below the diagonal (L's unit
-- diagonal is implied) and U on and above it; pivots (..., min(m, n)),
-- int32 and from 1: row i was swapped with row pivots[i] at step i. A zero
-- column leaves its step without elimination (U's diagonal holds the 0).
function M.lu_factor(A, opts)
  local fn = "linalg.lu_factor"
  want_matrix(fn, A)
  if torch._options(opts, fn).pivot == false then
    raise(fn .. ": LU without pivoting is not implemented on the CPU (nor is it in PyTorch); use pivot = true")
  end
  local m, n = A:size(-2), A:size(-1)
  local k = math.min(m, n)
  local pshape = A:size()
  pshape[#pshape] = nil
  pshape[#pshape] = k
  if A:numel() == 0 then return A:clone(), torch.ones(pshape, { dtype = torch.int32, device = A.device }):cumsum(-1):int() end
  local idx = torch.arange(m, { dtype = torch.int64, device = A.device })
  local LU, pivots = A, {}
  for j = 0, k - 1 do
    local _, p = LU:narrow(-1, j, 1):narrow(-2, j, m - j):abs():max(-2, true)   -- (..., 1, 1), from 0
    p = p + j
    LU = swap_rows(LU, j, p, idx)
    pivots[j + 1] = p:squeeze(-1)
    if j < m - 1 then
      local top, pivot_row, below = LU:narrow(-2, 0, j), LU:narrow(-2, j, 1), LU:narrow(-2, j + 1, m - j - 1)
      local pivot = pivot_row:narrow(-1, j, 1)
      local col = below:narrow(-1, j, 1)
      local factors = torch.where(pivot:eq(0), torch.zeros_like(col), col / pivot)
      local parts = { below:narrow(-1, 0, j), factors }
      if j < n - 1 then
        parts[3] = below:narrow(-1, j + 1, n - j - 1) - factors * pivot_row:narrow(-1, j + 1, n - j - 1)
      end
      local rows = { pivot_row, torch.cat(parts, -1) }
      if j > 0 then table.insert(rows, 1, top) end
      LU = torch.cat(rows, -2)
    end
  end
  return LU, (torch.cat(pivots, -1) + 1):to(torch.int32)
end

-- lu_factor_ex(A [, {pivot, check_errors = false}]): LU, pivots and info,
-- info (...) int32: the first i (from 1) with U[i, i] = 0, else 0.
local function zero_pivot_info(U)
  local d = U:diagonal(0, -2, -1)
  local k = d:size(-1)
  if k == 0 then return torch.zeros(d:size(), { dtype = torch.int32, device = U.device }):sum(-1):int() end
  -- 1 + the position of the first zero: the largest of (zero) * (k - i), turned back into i
  local order = torch.arange(k, 0, -1, { dtype = torch.int64, device = U.device })
  local first = (d:eq(0):long() * order):max(-1)
  return torch.where(first:eq(0), first, k - first + 1):to(torch.int32)
end
local function raise_on_info(fn, info, what)
  local bad = info:ne(0)
  if bad:any():item() then
    raise(string.format("%s: %s (info = %d)", fn, what, info:masked_select(bad):reshape(-1)[0]:item()))
  end
end
function M.lu_factor_ex(A, opts)
  local fn = "linalg.lu_factor_ex"
  opts = torch._options(opts, fn)
  local LU, pivots = M.lu_factor(A, { pivot = opts.pivot })
  local info = zero_pivot_info(LU:narrow(-1, 0, math.min(A:size(-2), A:size(-1))):narrow(-2, 0, math.min(A:size(-2), A:size(-1))))
  if opts.check_errors then raise_on_info(fn, info, "U is singular") end
  return LU, pivots, info
end

-- The row order P^T A of each matrix of pivots (..., k) for m rows: row i
-- of P^T A is row perm[i] of A (..., m), int64.
local function permutation(pivots, m)
  local shape = pivots:size()
  shape[#shape] = m
  local perm = torch.arange(m, { dtype = torch.int64, device = pivots.device }):expand(shape):clone()
  local piv = pivots:long() - 1
  local idx = torch.arange(m, { dtype = torch.int64, device = pivots.device })
  for i = 0, pivots:size(-1) - 1 do
    local p = piv:narrow(-1, i, 1)
    perm = swap_rows(perm:unsqueeze(-1), i, p:unsqueeze(-1), idx):squeeze(-1)
  end
  return perm
end

-- lu_unpack(LU, pivots [, unpack_data = true, unpack_pivots = true]): P, L
-- and U with A = P L U (P (..., m, m), L (..., m, k) unit lower, U (..., k, n)).
function M.lu_unpack(LU, pivots, unpack_data, unpack_pivots)
  local fn = "lu_unpack"
  if type(unpack_data) == "table" then unpack_data, unpack_pivots = unpack_data.unpack_data, unpack_data.unpack_pivots end
  want_matrix(fn, LU)
  local m, n = LU:size(-2), LU:size(-1)
  local k = math.min(m, n)
  if not is_tensor(pivots) or pivots:dim() ~= LU:dim() - 1 or pivots:size(-1) ~= k then
    raise(string.format("%s: expected pivots of shape (..., %d) for LU (..., %d, %d), got %s", fn, k, m, n,
                        is_tensor(pivots) and ("[" .. table.concat(pivots:size(), ", ") .. "]") or typename(pivots)))
  end
  if pivots.dtype ~= torch.int32 and pivots.dtype ~= torch.int64 then
    raise(fn .. ": expected int32 pivots (as lu_factor returns), got " .. tostring(pivots.dtype))
  end
  if pivots:numel() > 0 and (pivots:lt(1):any():item() or pivots:gt(m):any():item()) then
    raise(string.format("%s: pivots must be between 1 and %d (the rows)", fn, m))
  end
  local P, L, U
  if unpack_pivots ~= false then
    local perm = permutation(pivots, m)
    -- (P^T)[i, perm[i]] = 1
    P = torch.nn.functional.one_hot(perm, m):to(LU.dtype):transpose(-2, -1)
  end
  if unpack_data ~= false then
    local eye = torch.eye(m, k, { dtype = LU.dtype, device = LU.device })
    L = LU:narrow(-1, 0, k):tril(-1) + eye
    U = LU:narrow(-2, 0, k):triu()
  end
  return P, L, U
end

-- lu(A [, {pivot = true}]): P, L, U with A = P L U.
function M.lu(A, opts)
  local LU, pivots = M.lu_factor(A, opts)
  return M.lu_unpack(LU, pivots)
end

-- lu_solve(LU, pivots, B [, {left = true, adjoint = false}]): X with A X = B
-- (A^T X = B with adjoint; X A = B with left false) for A = P L U.
function M.lu_solve(LU, pivots, B, opts)
  local fn = "linalg.lu_solve"
  opts = torch._options(opts, fn)
  want_square(fn, LU)
  want_float(fn, B, "B")
  if opts.left == false then
    return M.lu_solve(LU, pivots, B:transpose(-2, -1), { adjoint = not opts.adjoint }):transpose(-2, -1)
  end
  local n = LU:size(-1)
  if B:dim() < 2 or B:size(-2) ~= n then
    raise(string.format("%s: expected B of shape (..., %d, k) for LU (..., %d, %d), got [%s]", fn, n, n, n,
                        table.concat(B:size(), ", ")))
  end
  local P, L, U = M.lu_unpack(LU, pivots)
  if opts.adjoint then   -- U^T L^T P^T X = B
    local Y = M.solve_triangular(U:transpose(-2, -1), B, { upper = false })
    return P:matmul(M.solve_triangular(L:transpose(-2, -1), Y, { upper = true, unitriangular = true }))
  end
  local Y = M.solve_triangular(L, P:transpose(-2, -1):matmul(B), { upper = false, unitriangular = true })
  return M.solve_triangular(U, Y, { upper = true })
end

-- solve_ex(A, B [, {left, check_errors = false}]) and inv_ex(A [, {check_errors}]):
-- the result and info (...) int32, 0 where A is invertible, else the first
-- zero pivot's position from 1 (the result there is not meaningful).
function M.solve_ex(A, B, opts)
  local fn = "linalg.solve_ex"
  opts = torch._options(opts, fn)
  want_square(fn, A)
  local info = zero_pivot_info((eliminate(A)))
  if opts.check_errors then raise_on_info(fn, info, "the input matrix is singular") end
  local ok = info:eq(0):unsqueeze(-1):unsqueeze(-1)
  local safe = torch.where(ok, A, torch.eye(A:size(-1), { dtype = A.dtype, device = A.device }))
  local X = M.solve(safe, B, { left = opts.left })
  return X, info
end
function M.inv_ex(A, opts)
  local fn = "linalg.inv_ex"
  opts = torch._options(opts, fn)
  local n = want_square(fn, A)
  local info = zero_pivot_info((eliminate(A)))
  if opts.check_errors then raise_on_info(fn, info, "the input matrix is singular") end
  local ok = info:eq(0):unsqueeze(-1):unsqueeze(-1)
  local eye = torch.eye(n, { dtype = A.dtype, device = A.device })
  return torch.where(ok, M.inv(torch.where(ok, A, eye)), 0 / 0), info
end

-- cholesky_ex(A [, {upper = false, check_errors = false}]): L and info (...)
-- int32, 0 where A is positive-definite, else the order of the first
-- leading minor that is not (L is then not meaningful there).
function M.cholesky_ex(A, opts)
  local fn = "linalg.cholesky_ex"
  opts = torch._options(opts, fn)
  want_square(fn, A)
  local L, info = cholesky_lower(A, fn, true)
  if opts.check_errors then raise_on_info(fn, info, "the input is not positive-definite") end
  L = torch.where(info:eq(0):unsqueeze(-1):unsqueeze(-1), L, 0 / 0)
  return opts.upper and L:transpose(-2, -1) or L, info
end

-- tensorinv(A [, ind = 2]): the inverse of A read as a matrix of its first
-- ind dims by the rest, shaped (rest..., first ind...).
function M.tensorinv(A, ind)
  local fn = "linalg.tensorinv"
  if type(ind) == "table" then ind = ind.ind end
  ind = ind or 2
  want_float(fn, A, "A")
  if type(ind) ~= "number" or ind % 1 ~= 0 or ind < 1 or ind >= A:dim() then
    raise(string.format("%s: expected ind to be an integer from 1 to %d, got %s", fn, A:dim() - 1, tostring(ind)))
  end
  local sizes = A:size()
  local rows, cols = 1, 1
  for i = 1, #sizes do if i <= ind then rows = rows * sizes[i] else cols = cols * sizes[i] end end
  if rows ~= cols then
    raise(string.format("%s: expected the product of the first %d dims of A (%d) to equal the product of the rest (%d)",
                        fn, ind, rows, cols))
  end
  local shape = { unpack(sizes, ind + 1) }
  for i = 1, ind do shape[#shape + 1] = sizes[i] end
  return M.inv(A:reshape(rows, cols)):reshape(shape)
end

-- tensorsolve(A, B [, dims]): X with tensordot(A, X, X:dim()) = B, A's
-- dims in `dims` (a list) first moved to its end.
function M.tensorsolve(A, B, dims)
  local fn = "linalg.tensorsolve"
  if type(dims) == "table" and dims.dims ~= nil then dims = dims.dims end
  want_float(fn, A, "A")
  want_float(fn, B, "B")
  if dims ~= nil then
    local moved, last = {}, {}
    for _, d in ipairs(dims) do
      if type(d) ~= "number" or d % 1 ~= 0 or d < -A:dim() or d >= A:dim() then
        raise(string.format("%s: dims holds %s, expected dims of A (from %d to %d)", fn, tostring(d), -A:dim(),
                            A:dim() - 1))
      end
      d = d < 0 and d + A:dim() or d
      moved[d], last[#last + 1] = true, d
    end
    local order = {}
    for d = 0, A:dim() - 1 do if not moved[d] then order[#order + 1] = d end end
    for _, d in ipairs(last) do order[#order + 1] = d end
    A = A:permute(order)
  end
  local nb = B:dim()
  for i = 1, nb do
    if A:size(i - 1) ~= B:size(i - 1) then
      raise(string.format("%s: expected A's leading dims to be B's shape [%s], got A [%s]", fn,
                          table.concat(B:size(), ", "), table.concat(A:size(), ", ")))
    end
  end
  local xshape = { unpack(A:size(), nb + 1) }
  local cols = 1
  for _, s in ipairs(xshape) do cols = cols * s end
  if cols ~= B:numel() then
    raise(string.format("%s: expected the product of A's trailing dims (%d) to equal B's size (%d)", fn, cols,
                        B:numel()))
  end
  return M.solve(A:reshape(B:numel(), cols), B:reshape(-1)):reshape(xshape)
end

-- vander(x [, {N = x's size}]): x (..., n) to (..., n, N), the columns
-- x^0, x^1, ..., x^(N-1).
function M.vander(x, N)
  local fn = "linalg.vander"
  if type(N) == "table" then N = N.N end
  if not is_tensor(x) or x:dim() < 1 then raise(fn .. ": expected a tensor of at least 1 dim") end
  N = N or x:size(-1)
  if type(N) ~= "number" or N % 1 ~= 0 or N < 2 then
    raise(fn .. ": expected N to be an integer greater than 1, got " .. tostring(N))
  end
  local shape = x:size()
  shape[#shape + 1] = N - 1
  local ones = torch.ones_like(x):unsqueeze(-1)
  return torch.cat({ ones, x:unsqueeze(-1):expand(shape) }, -1):cumprod(-1)
end

-- householder_product(A, tau): the first n columns of H_1 ... H_k, H_i =
-- I - tau_i v_i v_i^T with v_i column i of A below the diagonal and 1 on it
-- (as geqrf returns them).
function M.householder_product(A, tau)
  local fn = "linalg.householder_product"
  want_matrix(fn, A)
  want_float(fn, tau, "tau")
  local m, n = A:size(-2), A:size(-1)
  local k = tau:size(-1)
  if m < n or k > n or tau:dim() ~= A:dim() - 1 then
    raise(string.format("%s: expected A (..., m, n) with m >= n and tau (..., k) with k <= n, got A [%s] and tau [%s]",
                        fn, table.concat(A:size(), ", "), table.concat(tau:size(), ", ")))
  end
  local Q = torch.eye(m, { dtype = A.dtype, device = A.device })
  local V = A:tril(-1) + torch.eye(m, n, { dtype = A.dtype, device = A.device })
  for i = 0, k - 1 do
    local v = V:narrow(-1, i, 1)                                         -- (..., m, 1)
    local t = tau:narrow(-1, i, 1):unsqueeze(-1)                         -- (..., 1, 1)
    Q = Q - (Q:matmul(v) * t):matmul(v:transpose(-2, -1))
  end
  return Q:narrow(-1, 0, n)
end

-- torch.ormqr(A, tau, C [, left = true, transpose = false]) (or {left =,
-- transpose =}): C multiplied by the Q of geqrf's (A, tau) without forming
-- it: Q C, Q^T C, C Q or C Q^T, the reflections applied one by one, as
-- PyTorch's. Differentiable in all three.
local function ormqr(A, tau, C, left, transpose)
  local fn = "ormqr"
  if type(left) == "table" then left, transpose = left.left, left.transpose end
  if left == nil then left = true end
  want_matrix(fn, A)
  want_float(fn, tau, "tau")
  want_float(fn, C, "C")
  if C:dim() < 2 or tau:dim() < 1 then
    raise(string.format("%s: expected tau of at least 1 dim and C of at least 2, got tau [%s] and C [%s]", fn,
                        table.concat(tau:size(), ", "), table.concat(C:size(), ", ")))
  end
  local m, k = A:size(-2), tau:size(-1)
  local rows = left and C:size(-2) or C:size(-1)
  if rows ~= m or k > math.min(m, A:size(-1)) then
    raise(string.format("%s: expected A (..., m, n), tau (..., k) with k <= min(m, n) and C with m = %d %s, got A [%s], "
                        .. "tau [%s] and C [%s]", fn, m, left and "rows" or "columns", table.concat(A:size(), ", "),
                        table.concat(tau:size(), ", "), table.concat(C:size(), ", ")))
  end
  local V = A:tril(-1) + torch.eye(m, A:size(-1), { dtype = A.dtype, device = A.device })
  -- Q = H_1 ... H_k: Q C applies H_k first, Q^T C H_1 first; C Q H_1
  -- first, C Q^T H_k first
  local forward = (left and transpose) or (not left and not transpose)
  for step = 1, k do
    local i = forward and step - 1 or k - step
    local v = V:narrow(-1, i, 1)                                         -- (..., m, 1)
    local t = tau:narrow(-1, i, 1):unsqueeze(-1)                         -- (..., 1, 1)
    if left then
      C = C - v:matmul(v:transpose(-2, -1):matmul(C)) * t
    else
      C = C - C:matmul(v):matmul(v:transpose(-2, -1)) * t
    end
  end
  return C
end

---------------------------------------------------------------- randomized low-rank SVD and PCA

-- An orthonormal basis (..., m, q) of A's range by q random directions and
-- niter subspace iterations (Halko, Martinsson and Tropp), as PyTorch's.
local function range_basis(A, q, niter)
  local n = A:size(-1)
  local shape = A:size()
  shape[#shape - 1], shape[#shape] = n, q
  local Q = M.qr(A:matmul(torch.randn(shape, { dtype = A.dtype, device = A.device })))
  for _ = 1, niter do
    Q = M.qr(A:transpose(-2, -1):matmul(Q))
    Q = M.qr(A:matmul(Q))
  end
  return Q
end
local function lowrank_args(fn, A, q, niter)
  want_matrix(fn, A)
  local m, n = A:size(-2), A:size(-1)
  if type(q) ~= "number" or q % 1 ~= 0 or q < 1 or q > math.min(m, n) then
    raise(string.format("%s: expected q to be an integer from 1 to min(m, n) = %d, got %s", fn, math.min(m, n),
                        tostring(q)))
  end
  if type(niter) ~= "number" or niter % 1 ~= 0 or niter < 0 then
    raise(fn .. ": expected niter to be a non-negative integer, got " .. tostring(niter))
  end
end
-- svd_lowrank(A [, q = 6, niter = 2, M]): U (..., m, q), S (..., q) and V
-- (..., n, q) of a randomized SVD of A - M (M broadcast, optional): close to
-- the top q singular triplets, exact for a matrix of rank at most q.
function M.svd_lowrank(A, q, niter, Mean)
  local fn = "svd_lowrank"
  if type(q) == "table" then q, niter, Mean = q.q, q.niter, q.M end
  q, niter = q or 6, niter or 2
  lowrank_args(fn, A, q, niter)
  if Mean ~= nil then A = A - Mean end
  local m, n = A:size(-2), A:size(-1)
  local wide = m < n
  if wide then A = A:transpose(-2, -1) end
  local Q = range_basis(A, q, niter)
  local U, S, Vh = M.svd(Q:transpose(-2, -1):matmul(A), false)
  U = Q:matmul(U)
  local V = Vh:transpose(-2, -1)
  if wide then U, V = V, U end
  return U, S, V
end
-- pca_lowrank(A [, q = min(6, m, n), center = true, niter = 2]): the
-- principal directions of A's rows: svd_lowrank of A less its column means.
function M.pca_lowrank(A, q, center, niter)
  local fn = "pca_lowrank"
  if type(q) == "table" then q, center, niter = q.q, q.center, q.niter end
  want_matrix(fn, A)
  q = q or math.min(6, A:size(-2), A:size(-1))
  if center == false then return M.svd_lowrank(A, q, niter or 2) end
  return M.svd_lowrank(A, q, niter or 2, A:mean(-2, true))
end

---------------------------------------------------------------- torch.NAME forms

-- The older names under torch: torch.svd(A [, some = true, compute_uv =
-- true]) returns U, S, V (not Vh; the reduced factors unless some is
-- false); torch.pinverse(A [, rcond = 1e-15]); the others as linalg's.
M.torch = {
  svd = function(A, some, compute_uv)
    if type(some) == "table" then some, compute_uv = some.some, some.compute_uv end
    local U, S, Vh = M.svd(A, some == false)
    if compute_uv == false then
      return torch.zeros_like(U), S, torch.zeros_like(Vh)
    end
    return U, S, Vh:transpose(-2, -1)
  end,
  pinverse = function(A, rcond) return M.pinv(A, { rtol = rcond or 1e-15 }) end,
  cholesky_solve = M.cholesky_solve,
  -- cholesky_inverse(L [, upper = false]): the inverse of L L^T (U^T U)
  cholesky_inverse = function(L, upper)
    if type(upper) == "table" then upper = upper.upper end
    local n = want_square("cholesky_inverse", L)
    return M.cholesky_solve(torch.eye(n, { dtype = L.dtype, device = L.device }):expand(L:size()), L, upper == true)
  end,
  -- lu(A [, pivot = true, get_infos = false]): the packed factors and pivots
  -- (and info), as linalg.lu_factor(_ex)
  lu = function(A, pivot, get_infos)
    if type(pivot) == "table" then pivot, get_infos = pivot.pivot, pivot.get_infos end
    local LU, pivots, info = M.lu_factor_ex(A, { pivot = pivot })
    if get_infos then return LU, pivots, info end
    return LU, pivots
  end,
  -- lu_solve(B, LU, pivots): linalg.lu_solve's arguments in the older order
  lu_solve = function(B, LU, pivots) return M.lu_solve(LU, pivots, B) end,
  lu_unpack = M.lu_unpack,
  orgqr = M.householder_product,
  geqrf = geqrf,
  ormqr = ormqr,
  svd_lowrank = M.svd_lowrank,
  pca_lowrank = M.pca_lowrank,
  matrix_exp = M.matrix_exp,
  matrix_power = M.matrix_power,
  det = M.det, logdet = M.logdet, slogdet = M.slogdet, inverse = M.inv,
  cholesky = function(A, upper) return M.cholesky(A, { upper = upper == true }) end,
  qr = function(A, some) return M.qr(A, some == false and "complete" or "reduced") end,
  triangular_solve = function(B, A, upper, transpose, unitriangular)
    if type(upper) == "table" then
      local o = upper
      upper, transpose, unitriangular = o.upper, o.transpose, o.unitriangular
    end
    if upper == nil then upper = true end
    want_float("triangular_solve", B, "B")
    want_float("triangular_solve", A, "A")
    local T = transpose and A:transpose(-2, -1) or A
    local X = M.solve_triangular(T, B, { upper = (upper and not transpose) or (not upper and transpose),
                                         unitriangular = unitriangular })
    return X, A:clone()
  end,
}

---------------------------------------------------------------- products

-- multi_dot(list): the product of the matrices in order (the first may be
-- a vector, as the last).
function M.multi_dot(list)
  if type(list) ~= "table" or #list < 2 then raise("linalg.multi_dot: expected a list of at least two tensors") end
  local out = list[1]
  for i = 2, #list do out = out:matmul(list[i]) end
  return out
end

-- cross(a, b [, dim=-1]), vecdot(a, b [, dim=-1]), matmul, diagonal.
function M.cross(a, b, dim) return a:cross(b, dim or -1) end
function M.vecdot(a, b, dim)
  if type(dim) == "table" then dim = dim.dim end
  return (a * b):sum(dim or -1)
end
function M.matmul(a, b) return a:matmul(b) end
function M.diagonal(A, opts)
  opts = opts or {}
  return A:diagonal(opts.offset or 0, opts.dim1 or -2, opts.dim2 or -1)
end

return M
