-- dplua.nn.init_ (reached as torch.nn.init): PyTorch's weight
-- initialisations. Each fills its tensor in place under no_grad, draws from
-- torch's RNG (torch.manual_seed makes it reproducible) and returns it.
-- (The file is not called init.lua: that name is the nn package itself.)
--
--   nn.init.kaiming_uniform_(w, {a=math.sqrt(5), mode="fan_in", nonlinearity="leaky_relu"})
--   nn.init.xavier_uniform_(w, gain)   nn.init.normal_(w, 0, 0.02)
local torch = require("dplua")
local raise = torch._raise

local I = {}

local function want_tensor(t, fn)
  if not torch.is_tensor(t) then raise(fn .. ": expected a tensor, got " .. type(t)) end
  return t
end

local function fill_with(t, make)
  torch.no_grad(function() t:copy_(make()) end)
  return t
end

-- calculate_gain(nonlinearity [, param]): PyTorch's table.
function I.calculate_gain(nonlinearity, param)
  local linear = { linear = true, conv1d = true, conv2d = true, conv3d = true, conv_transpose1d = true,
                   conv_transpose2d = true, conv_transpose3d = true, sigmoid = true }
  if linear[nonlinearity] then return 1 end
  if nonlinearity == "tanh" then return 5 / 3 end
  if nonlinearity == "relu" then return math.sqrt(2) end
  if nonlinearity == "leaky_relu" then
    local slope = param
    if slope == nil then slope = 0.01 end
    if type(slope) ~= "number" then raise("calculate_gain: negative_slope " .. tostring(slope) .. " not a valid number") end
    return math.sqrt(2 / (1 + slope * slope))
  end
  if nonlinearity == "selu" then return 3 / 4 end
  raise("calculate_gain: unsupported nonlinearity " .. tostring(nonlinearity))
end

-- fan_in, fan_out of a weight: size(1) and size(0) times the receptive field.
function I._calculate_fan_in_and_fan_out(t)
  local dims = t:dim()
  if dims < 2 then
    raise("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
  end
  local rf = 1
  for d = 2, dims - 1 do rf = rf * t:size(d) end
  return t:size(1) * rf, t:size(0) * rf
end

local function fan(t, mode, fn)
  mode = mode or "fan_in"
  if mode ~= "fan_in" and mode ~= "fan_out" then
    raise(fn .. ': mode ' .. tostring(mode) .. ' not supported, please use one of "fan_in", "fan_out"')
  end
  local fan_in, fan_out = I._calculate_fan_in_and_fan_out(t)
  return mode == "fan_in" and fan_in or fan_out
end

function I.uniform_(t, a, b)
  want_tensor(t, "uniform_")
  if type(a) == "table" then a, b = a.a, a.b end
  a, b = a or 0, b or 1
  return fill_with(t, function() return torch.rand_like(t) * (b - a) + a end)
end

function I.normal_(t, mean, std)
  want_tensor(t, "normal_")
  if type(mean) == "table" then mean, std = mean.mean, mean.std end
  mean, std = mean or 0, std or 1
  return fill_with(t, function() return torch.randn_like(t) * std + mean end)
end

function I.constant_(t, val)
  want_tensor(t, "constant_")
  if type(val) ~= "number" then raise("constant_: expected a number value, got " .. type(val)) end
  torch.no_grad(function() t:fill_(val) end)
  return t
end
function I.zeros_(t) return I.constant_(want_tensor(t, "zeros_"), 0) end
function I.ones_(t) return I.constant_(want_tensor(t, "ones_"), 1) end

-- The standard deviation of kaiming_*_ for tensor t, from (a, mode,
-- nonlinearity) or ({a=, mode=, nonlinearity=}); nil for a tensor with no
-- elements (nothing to fill).
local function kaiming_std(t, a, mode, nonlinearity, fn)
  want_tensor(t, fn)
  if type(a) == "table" then a, mode, nonlinearity = a.a, a.mode, a.nonlinearity end
  a, nonlinearity = a or 0, nonlinearity or "leaky_relu"
  local f = fan(t, mode, fn)
  if f == 0 then return nil end
  return I.calculate_gain(nonlinearity, a) / math.sqrt(f)
end

function I.kaiming_uniform_(t, a, mode, nonlinearity)
  local std = kaiming_std(t, a, mode, nonlinearity, "kaiming_uniform_")
  if not std then return t end
  local bound = math.sqrt(3) * std
  return I.uniform_(t, -bound, bound)
end

function I.kaiming_normal_(t, a, mode, nonlinearity)
  local std = kaiming_std(t, a, mode, nonlinearity, "kaiming_normal_")
  if not std then return t end
  return I.normal_(t, 0, std)
end

local function xavier_std(t, gain, fn)
  want_tensor(t, fn)
  if type(gain) == "table" then gain = gain.gain end
  local fan_in, fan_out = I._calculate_fan_in_and_fan_out(t)
  return (gain or 1) * math.sqrt(2 / (fan_in + fan_out))
end

function I.xavier_uniform_(t, gain)
  local a = math.sqrt(3) * xavier_std(t, gain, "xavier_uniform_")
  return I.uniform_(t, -a, a)
end

function I.xavier_normal_(t, gain)
  return I.normal_(t, 0, xavier_std(t, gain, "xavier_normal_"))
end

-- trunc_normal_(t, mean=0, std=1, a=-2, b=2): redraws values outside [a, b]
-- (a few rounds of rejection, then clamps what is left).
function I.trunc_normal_(t, mean, std, a, b)
  want_tensor(t, "trunc_normal_")
  if type(mean) == "table" then mean, std, a, b = mean.mean, mean.std, mean.a, mean.b end
  mean, std, a, b = mean or 0, std or 1, a or -2, b or 2
  return fill_with(t, function()
    local x = torch.randn_like(t) * std + mean
    for _ = 1, 8 do
      local bad = x:lt(a):logical_or(x:gt(b))
      if not bad:any():item() then break end
      x = torch.where(bad, torch.randn_like(t) * std + mean, x)
    end
    return x:clamp(a, b)
  end)
end

-- orthogonal_(t [, gain=1]): t (at least 2-D, flattened to (rows,
-- numel / rows)) filled with a (semi-)orthogonal matrix, as PyTorch's: the
-- Q of a Gaussian matrix's QR with the signs of R's diagonal, times gain.
-- The QR is modified Gram-Schmidt in float64, twice over for orthogonality
-- to rounding.
function I.orthogonal_(t, gain)
  want_tensor(t, "orthogonal_")
  if type(gain) == "table" then gain = gain.gain end
  if t:dim() < 2 then raise("orthogonal_: only tensors with 2 or more dimensions are supported") end
  local rows = t:size(0)
  local cols = t:numel() / rows
  return fill_with(t, function()
    local a = torch.randn(rows, cols, { dtype = torch.float64 })
    if rows < cols then a = a:t() end
    local m, n = a:size(0), a:size(1)            -- m >= n: n orthonormal columns
    local q = a:clone()
    local signs = {}
    for j = 0, n - 1 do
      local v = q:select(1, j)
      local r_jj
      for _ = 1, 2 do
        if j > 0 then
          local prev = q:narrow(1, 0, j)
          v = v - prev:mv(prev:t():mv(v))
        end
      end
      r_jj = v:dot(a:select(1, j)):item()
      v = v / v:norm()
      q:select(1, j):copy_(v)
      signs[j + 1] = r_jj < 0 and -1 or 1
    end
    q = q * torch.tensor(signs, { dtype = torch.float64 }):view(1, n)
    if rows < cols then q = q:t() end
    return (q * (gain or 1)):reshape(t:size()):to(t.dtype)
  end)
end

-- eye_(t): the identity matrix in a 2-D t.
function I.eye_(t)
  want_tensor(t, "eye_")
  if t:dim() ~= 2 then raise("eye_: only 2-dimensional tensors are supported") end
  return fill_with(t, function()
    return torch.eye(t:size(0), t:size(1), { dtype = t.dtype })
  end)
end

-- dirac_(t [, groups=1]): a convolution weight (out, in/groups, k...) that
-- passes each input channel through to its output channel: 1 at the
-- kernel's centre for out channel i of each group and input channel i.
function I.dirac_(t, groups)
  want_tensor(t, "dirac_")
  if type(groups) == "table" then groups = groups.groups end
  groups = groups or 1
  if t:dim() < 3 or t:dim() > 5 then raise("dirac_: only tensors with 3, 4, or 5 dimensions are supported") end
  if t:size(0) % groups ~= 0 then raise("dirac_: dim 0 must be divisible by groups") end
  local out_per = t:size(0) / groups
  local n = math.min(out_per, t:size(1))
  return fill_with(t, function()
    local w = torch.zeros(t:size(), { dtype = t.dtype })
    local centre = {}
    for d = 2, t:dim() - 1 do centre[#centre + 1] = math.floor(t:size(d) / 2) end
    for g = 0, groups - 1 do
      for i = 0, n - 1 do w[{ g * out_per + i, i, unpack(centre) }] = 1 end
    end
    return w
  end)
end

-- sparse_(t, sparsity [, std=0.01]): a 2-D t drawn from N(0, std), then
-- in each column ceil(sparsity * rows) entries (chosen at random) zeroed.
function I.sparse_(t, sparsity, std)
  want_tensor(t, "sparse_")
  if type(sparsity) == "table" then sparsity, std = sparsity.sparsity, sparsity.std end
  if t:dim() ~= 2 then raise("sparse_: only tensors with 2 dimensions are supported") end
  if type(sparsity) ~= "number" or sparsity < 0 or sparsity > 1 then
    raise("sparse_: expected sparsity in [0, 1], got " .. tostring(sparsity))
  end
  local rows, cols = t:size(0), t:size(1)
  local zeros = math.ceil(sparsity * rows)
  return fill_with(t, function()
    local w = torch.randn(rows, cols, { dtype = t.dtype }) * (std or 0.01)
    for c = 0, cols - 1 do
      local perm = torch.randperm(rows):narrow(0, 0, zeros)
      if zeros > 0 then w:select(1, c):index_fill_(0, perm, 0) end
    end
    return w
  end)
end

-- PyTorch's deprecated names without the trailing underscore
for _, name in ipairs({ "uniform", "normal", "constant", "xavier_uniform", "xavier_normal", "kaiming_uniform",
                        "kaiming_normal", "orthogonal", "sparse", "dirac", "eye" }) do
  I[name] = I[name .. "_"]
end

return I
