-- dplua.spectral: the symmetric eigendecomposition (eigh) and the
-- singular value decomposition (svd) for torch.linalg. Both are computed
-- on the host in float64 by Jacobi rotations, one matrix of the batch at a
-- time (a GPU tensor is copied back and the results copied over):
-- cyclic Jacobi for eigh, one-sided (Hestenes) Jacobi for svd, which is
-- accurate to rounding relative to each singular value. Their gradients
-- are the analytic ones (PyTorch's formulas), through autograd Functions,
-- so any device's backward is a few tensor ops. Meant, as the rest of
-- linalg, for the matrices of models and losses (up to a few hundred).
local torch = require("dplua")

local M = {}

local EPS = 2.220446049250313e-16

-- A plane rotation of two runs of x: for k = 0 .. count - 1, the entries
-- at i + k step and j + k step (0-based) become c xi - s xj and s xi + c xj.
local function rotate(x, count, step, i, j, c, s)
  for k = 0, count - 1 do
    local a, b = x[i + k * step + 1], x[j + k * step + 1]
    x[i + k * step + 1], x[j + k * step + 1] = c * a - s * b, s * a + c * b
  end
end

-- A matrix (n x m, row-major, 1-based) of one batch entry as a Lua array.
local function host_matrices(A)
  local n, m = A:size(-2), A:size(-1)
  local flat = A:detach():double():cpu():contiguous():reshape(-1):tolist()
  local count = #flat / (n * m)   -- (the callers take empty matrices apart)
  local out = {}
  for b = 0, count - 1 do
    local a = {}
    for k = 1, n * m do a[k] = flat[b * n * m + k] end
    out[b + 1] = a
  end
  return out, n, m
end

---------------------------------------------------------------- eigh

-- Cyclic Jacobi on the symmetric a (n x n, overwritten): eigenvalues in
-- ascending order and the eigenvectors as the columns of v (row-major).
local function jacobi_eigh(a, n)
  local v = {}
  for i = 0, n - 1 do
    for j = 0, n - 1 do v[i * n + j + 1] = i == j and 1 or 0 end
  end
  local total = 0
  for k = 1, n * n do total = total + a[k] * a[k] end
  for _ = 1, 100 do
    local off = 0
    for p = 0, n - 2 do
      for q = p + 1, n - 1 do off = off + a[p * n + q + 1] ^ 2 end
    end
    if off <= (EPS * EPS) * total * 1e-4 or off == 0 then break end
    for p = 0, n - 2 do
      for q = p + 1, n - 1 do
        local apq = a[p * n + q + 1]
        if apq ~= 0 then
          local app, aqq = a[p * n + p + 1], a[q * n + q + 1]
          local theta = (aqq - app) / (2 * apq)
          local t = (theta >= 0 and 1 or -1) / (math.abs(theta) + math.sqrt(theta * theta + 1))
          local c = 1 / math.sqrt(t * t + 1)
          local s = t * c
          rotate(a, n, n, p, q, c, s)                          -- columns p and q
          rotate(a, n, 1, p * n, q * n, c, s)                  -- rows p and q
          rotate(v, n, n, p, q, c, s)
        end
      end
    end
  end
  local order = {}
  for i = 1, n do order[i] = i - 1 end
  table.sort(order, function(i, j)
    local x, y = a[i * n + i + 1], a[j * n + j + 1]
    if x ~= y then return x < y end
    return i < j
  end)
  local values, vectors = {}, {}
  for c, i in ipairs(order) do
    values[c] = a[i * n + i + 1]
    for k = 0, n - 1 do vectors[k * n + c] = v[k * n + i + 1] end
  end
  return values, vectors
end

-- The eigenvalues (..., n) and eigenvectors (..., n, n) of A's lower
-- (uplo "L") or upper triangle, reflected, as tensors like A.
-- identity matrices (rows x cols) for every batch entry of A, and zeros
-- (..., k): the factors of empty matrices, made without a loop over a
-- batch that may be large
local function eyes(A, rows, cols)
  local shape = A:size()
  shape[#shape - 1], shape[#shape] = rows, cols
  return torch.eye(rows, cols, { dtype = A.dtype, device = A.device }):expand(shape):contiguous()
end
local function empty_values(A, k)
  local shape = A:size()
  shape[#shape], shape[#shape - 1] = nil, k
  return torch.zeros(shape, { dtype = A.dtype, device = A.device })
end

local function eigh_values(A, uplo)
  if A:numel() == 0 then return empty_values(A, A:size(-1)), eyes(A, A:size(-1), A:size(-1)) end
  local mats, n = host_matrices(A)
  local vals, vecs = {}, {}
  for _, a in ipairs(mats) do
    for i = 0, n - 1 do
      for j = i + 1, n - 1 do
        if uplo == "U" then a[j * n + i + 1] = a[i * n + j + 1] else a[i * n + j + 1] = a[j * n + i + 1] end
      end
    end
    local w, v = jacobi_eigh(a, n)
    for _, x in ipairs(w) do vals[#vals + 1] = x end
    for _, x in ipairs(v) do vecs[#vecs + 1] = x end
  end
  local batch = A:size()
  batch[#batch] = nil
  local o = { dtype = A.dtype }
  local L = (#vals > 0 and torch.tensor(vals, o) or torch.zeros(0, o)):reshape(batch):to(A.device)
  local V = (#vecs > 0 and torch.tensor(vecs, o) or torch.zeros(0, o)):reshape(A:size()):to(A.device)
  return L, V
end

-- 1 / (x_j - x_i) off the diagonal of the last two dims, 0 on it
local function inverse_gaps(x)
  local gaps = x:unsqueeze(-2) - x:unsqueeze(-1)
  local n = x:size(-1)
  local eye = torch.eye(n, { dtype = torch.bool, device = x.device })
  return torch.where(eye, 0, 1 / torch.where(eye, 1, gaps))
end

-- gA = V (diag(gL) + F o (V^T gV)) V^T, F_ij = 1 / (L_j - L_i) off the
-- diagonal; symmetric, as PyTorch's
local function eigh_backward(saved, gL, gV)
  local L, V = saved[2], saved[3]
  local inner = V:transpose(-2, -1):matmul(gV) * inverse_gaps(L) + torch.diag_embed(gL)
  local gA = V:matmul(inner):matmul(V:transpose(-2, -1))
  return (gA + gA:transpose(-2, -1)) * 0.5
end

local eigh_op
function M.eigh(A, uplo)
  eigh_op = eigh_op or require("dplua.autograd").differentiable("LinalgEighBackward0", eigh_values, eigh_backward)
  return eigh_op(A, uplo)
end

---------------------------------------------------------------- svd

-- One-sided Jacobi on the columns of a (m x n, m >= n, row-major,
-- overwritten): singular values in descending order, U (m x n) and V
-- (n x n), row-major; U's columns for zero singular values completed to an
-- orthonormal set.
local function orthonormal_completion(u, m, k, cols)
  -- columns 0..k-1 of u (m x cols) are orthonormal where their norm is 1;
  -- the others become unit vectors orthogonal to the rest
  local function dot_col(x, j)
    local s = 0
    for r = 0, m - 1 do s = s + x[r + 1] * u[r * cols + j + 1] end
    return s
  end
  local basis = 0
  for j = 0, cols - 1 do
    local norm = 0
    for r = 0, m - 1 do norm = norm + u[r * cols + j + 1] ^ 2 end
    if j >= k or math.abs(norm - 1) > 1e-8 then
      while basis < m do
        local x = {}
        for r = 0, m - 1 do x[r + 1] = r == basis and 1 or 0 end
        basis = basis + 1
        for _ = 1, 2 do                                         -- Gram-Schmidt, twice for accuracy
          for i = 0, cols - 1 do
            if i ~= j and (i < j or i < k) then
              local d = dot_col(x, i)
              for r = 0, m - 1 do x[r + 1] = x[r + 1] - d * u[r * cols + i + 1] end
            end
          end
        end
        local nx = 0
        for r = 1, m do nx = nx + x[r] ^ 2 end
        nx = math.sqrt(nx)
        if nx > 1e-6 then
          for r = 0, m - 1 do u[r * cols + j + 1] = x[r + 1] / nx end
          break
        end
      end
    end
  end
end

local function jacobi_svd(a, m, n)
  local v = {}
  for i = 0, n - 1 do
    for j = 0, n - 1 do v[i * n + j + 1] = i == j and 1 or 0 end
  end
  for _ = 1, 100 do
    local rotated = false
    for p = 0, n - 2 do
      for q = p + 1, n - 1 do
        local alpha, beta, gamma = 0, 0, 0
        for r = 0, m - 1 do
          local x, y = a[r * n + p + 1], a[r * n + q + 1]
          alpha, beta, gamma = alpha + x * x, beta + y * y, gamma + x * y
        end
        if gamma ~= 0 and math.abs(gamma) > EPS * math.sqrt(alpha * beta) then
          rotated = true
          local zeta = (beta - alpha) / (2 * gamma)
          local t = (zeta >= 0 and 1 or -1) / (math.abs(zeta) + math.sqrt(1 + zeta * zeta))
          local c = 1 / math.sqrt(1 + t * t)
          local s = c * t
          rotate(a, m, n, p, q, c, s)
          rotate(v, n, n, p, q, c, s)
        end
      end
    end
    if not rotated then break end
  end
  local norms = {}
  for j = 0, n - 1 do
    local s = 0
    for r = 0, m - 1 do s = s + a[r * n + j + 1] ^ 2 end
    norms[j + 1] = math.sqrt(s)
  end
  local order = {}
  for j = 1, n do order[j] = j - 1 end
  table.sort(order, function(i, j)
    if norms[i + 1] ~= norms[j + 1] then return norms[i + 1] > norms[j + 1] end
    return i < j
  end)
  local S, U, V = {}, {}, {}
  local rank = 0
  for c, j in ipairs(order) do
    local s = norms[j + 1]
    S[c] = s
    if s > 0 then rank = c end
    for r = 0, m - 1 do U[r * n + c] = s > 0 and a[r * n + j + 1] / s or 0 end
    for r = 0, n - 1 do V[r * n + c] = v[r * n + j + 1] end
  end
  return S, U, V, rank
end

-- U (..., m, k or m), S (..., k), Vh (..., k or n, n) of A, k = min(m, n).
local function svd_values(A, full_matrices)
  local m, n = A:size(-2), A:size(-1)
  local k = math.min(m, n)
  if A:numel() == 0 then
    return eyes(A, m, full_matrices and m or k), empty_values(A, k), eyes(A, full_matrices and n or k, n)
  end
  local mats = host_matrices(A)
  local tall = m >= n
  local ucols, vrows = full_matrices and m or k, full_matrices and n or k
  local Us, Ss, Vhs = {}, {}, {}
  for _, a in ipairs(mats) do
    local rows, cols = m, n
    if not tall then                                            -- A^T = U' S V'^T
      local t = {}
      for i = 0, m - 1 do
        for j = 0, n - 1 do t[j * m + i + 1] = a[i * n + j + 1] end
      end
      a, rows, cols = t, n, m
    end
    local S, U, V, rank = jacobi_svd(a, rows, cols)           -- U rows x cols, V cols x cols
    -- the left vectors to rows x (full and rows or cols), completed
    local lw = full_matrices and rows or cols
    local Ufull = {}
    for r = 0, rows - 1 do
      for c = 0, lw - 1 do Ufull[r * lw + c + 1] = c < cols and U[r * cols + c + 1] or 0 end
    end
    orthonormal_completion(Ufull, rows, rank, lw)
    -- back to A's orientation: U = Ufull (tall) or V (wide)
    local left, right, lcols, rrows
    if tall then left, lcols, right, rrows = Ufull, lw, V, cols
    else left, lcols, right, rrows = V, cols, Ufull, lw end
    -- left is m x lcols; right holds the right vectors as columns (n x rrows)
    for r = 0, m - 1 do
      for c = 0, ucols - 1 do Us[#Us + 1] = left[r * lcols + c + 1] end
    end
    for c = 1, k do Ss[#Ss + 1] = S[c] end
    for r = 0, vrows - 1 do                                    -- Vh = right^T
      for c = 0, n - 1 do Vhs[#Vhs + 1] = right[c * rrows + r + 1] end
    end
  end
  local batch = A:size()
  batch[#batch], batch[#batch - 1] = nil, nil
  local function shaped(list, ...)
    local shape = { unpack(batch) }
    for _, s in ipairs({ ... }) do shape[#shape + 1] = s end
    local t = #list > 0 and torch.tensor(list, { dtype = A.dtype }) or torch.zeros(0, { dtype = A.dtype })
    return t:reshape(shape):to(A.device)
  end
  return shaped(Us, m, ucols), shaped(Ss, k), shaped(Vhs, vrows, n)
end

-- PyTorch's svd_backward for real matrices, over the k leading
-- vectors: gA = U [(skew(U^T gU) S + S skew(V^T gV)) / E + diag(gS)] V^T
-- + (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T), skew(X) = X -
-- X^T, E_jk = S_k^2 - S_j^2 (1 on the diagonal)
local function svd_backward(saved, gU, gS, gVh)
  local U, S, Vh = saved[2], saved[3], saved[4]
  local k = S:size(-1)
  U, Vh, gU = U:narrow(-1, 0, k), Vh:narrow(-2, 0, k), gU:narrow(-1, 0, k)
  local V, gV = Vh:transpose(-2, -1), gVh:narrow(-2, 0, k):transpose(-2, -1)
  local m, n = U:size(-2), V:size(-2)
  local s2 = S:square()
  local eye = torch.eye(k, { dtype = torch.bool, device = S.device })
  local E = torch.where(eye, 1, s2:unsqueeze(-2) - s2:unsqueeze(-1))
  local UtgU, VtgV = U:transpose(-2, -1):matmul(gU), V:transpose(-2, -1):matmul(gV)
  local sum = (UtgU - UtgU:transpose(-2, -1)) * S:unsqueeze(-2) + S:unsqueeze(-1) * (VtgV - VtgV:transpose(-2, -1))
  local gA = U:matmul(sum / E + torch.diag_embed(gS)):matmul(Vh)
  if m > k then gA = gA + ((gU - U:matmul(UtgU)) / S:unsqueeze(-2)):matmul(Vh) end
  if n > k then gA = gA + U:matmul(((gV - V:matmul(VtgV)) / S:unsqueeze(-2)):transpose(-2, -1)) end
  return gA
end

local svd_op
function M.svd(A, full_matrices)
  svd_op = svd_op or require("dplua.autograd").differentiable("LinalgSvdBackward0", svd_values, svd_backward)
  return svd_op(A, full_matrices)
end

return M
