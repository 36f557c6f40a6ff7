-- dplua.linalg: torch.linalg's norms, solve, inv, det, slogdet,
-- cholesky, qr, multi_dot, cross, vecdot, as compositions of tensor ops
-- over the last two dims (any batch dims before them), so that every
-- device and autograd come with them. The factorizations take one step of
-- a few ops a column (LU with partial pivoting, Cholesky by columns,
-- Householder QR with LAPACK's sign convention): exact to rounding, and
-- meant for the matrices of models and their losses (up to a few
-- hundred), not for large dense solves.
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
-- inf and -inf (row sums). "nuc", 2 and -2 need singular values, which
-- are not here.
function M.matrix_norm(A, ord, dim, keepdim)
  local fn = "linalg.matrix_norm"
  if type(ord) == "table" then ord, dim, keepdim = ord.ord, ord.dim, ord.keepdim end
  want_float(fn, A, "A")
  if A:dim() < 2 then raise(fn .. ": expected a tensor of at least 2 dims") end
  ord, dim = ord or "fro", dim or { -2, -1 }
  local r, c = dim[1] < 0 and dim[1] + A:dim() or dim[1], dim[2] < 0 and dim[2] + A:dim() or dim[2]
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
  raise(string.format('%s: ord %s is not supported (expected "fro", 1, -1, inf or -inf)', fn, tostring(ord)))
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
  local swaps = torch.zeros_like(A:narrow(-1, 0, 1):narrow(-2, 0, 1))
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
  if n == 0 then return torch.ones(A:size(), { dtype = A.dtype }):sum({ -2, -1 }) end
  local U, _, swaps = eliminate(A)
  local sign = 1 - (swaps:remainder(2)) * 2
  return U:diagonal(0, -2, -1):prod(-1) * sign:squeeze(-1):squeeze(-1)
end
function M.slogdet(A)
  want_square("linalg.slogdet", A)
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

-- cholesky(A [, {upper=false}]): L lower triangular with A = L L^T, A
-- symmetric positive-definite (else an error naming the minor).
function M.cholesky(A, opts)
  local fn = "linalg.cholesky"
  local n = want_square(fn, A)
  local cols = {}
  for j = 0, n - 1 do
    local rows = A:narrow(-2, j, n - j):narrow(-1, j, 1)              -- (..., n - j, 1)
    if j > 0 then
      local Lp = torch.cat(cols, -1)                                  -- (..., n, j)
      local lj = Lp:narrow(-2, j, 1)                                  -- row j (..., 1, j)
      rows = rows - Lp:narrow(-2, j, n - j):matmul(lj:transpose(-2, -1))
    end
    local d = rows:narrow(-2, 0, 1)
    if d:le(0):logical_or(d:ne(d)):any():item() then
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
  local L = torch.cat(cols, -1)
  if type(opts) == "table" and opts.upper then return L:transpose(-2, -1) end
  return L
end

-- qr(A [, mode="reduced"]): Q with orthonormal columns and R upper
-- triangular, A = Q R, by Householder reflections with LAPACK's signs
-- (R's diagonal is -sign(x_0) |x| of each column's reflected part), so
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
  local R = A
  local vs = {}
  for k = 0, kmax - 1 do
    if k == m - 1 then break end   -- a single entry: no reflection (LAPACK's tau = 0 there)
    local x = R:narrow(-2, k, m - k):narrow(-1, k, 1)                -- (..., m - k, 1)
    local x0 = x:narrow(-2, 0, 1)
    local norm = (x * x):sum(-2, true):sqrt()
    local alpha = torch.where(x0:ge(0), -norm, norm)                  -- R[k, k] after the reflection
    local v = torch.cat({ x0 - alpha, x:narrow(-2, 1, m - k - 1) }, -2)
    local vnorm2 = (v * v):sum(-2, true)
    local safe = vnorm2:eq(0)
    local scale = torch.where(safe, 0, 2 / torch.where(safe, 1, vnorm2))
    local below = R:narrow(-2, k, m - k)
    below = below - v:matmul(v:transpose(-2, -1):matmul(below)) * scale
    R = torch.cat({ R:narrow(-2, 0, k), below }, -2)
    vs[#vs + 1] = { k, v, scale }
  end
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
