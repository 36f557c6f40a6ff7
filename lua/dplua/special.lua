-- dplua.special: the special functions (lgamma, digamma, polygamma,
-- erfinv, erfc, sinc, ...) as tensor methods and torch.NAME, and the
-- torch.special namespace with PyTorch's names. Each is a composition of
-- elementwise ops, so every device and dtype of those ops and autograd
-- come with it; where a formula has a branch, each branch is evaluated on
-- inputs made safe for it, so that the branch not taken gives no inf or
-- NaN to the gradient of the one taken.
local B = require("dplua.base")
local torch, methods = B.torch, B.methods
local raise, typename = B.raise, B.typename

local PI = math.pi
local LOG_PI = math.log(PI)
local HALF_LOG_2PI = 0.5 * math.log(2 * PI)
local SQRT_PI = math.sqrt(PI)
local SQRT2 = math.sqrt(2)

-- The input as a floating tensor: integers and booleans promoted to the
-- default dtype, as PyTorch's floating unary ops do.
local function want_float(fn, t)
  if not B.is_tensor(t) then raise(string.format("%s: expected a tensor, got %s", fn, typename(t))) end
  if not t.dtype.is_floating_point then return t:to(torch.get_default_dtype()) end
  return t
end

---------------------------------------------------------------- gamma

-- Lanczos' approximation (g = 7, 9 terms): relative error near 1e-15 for
-- x >= 0.5.
local LANCZOS_G = 7
local LANCZOS = { 0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
                  -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
                  1.5056327351493116e-7 }

local function lgamma_from_half(x)   -- x >= 0.5
  local z = x - 1
  local a = LANCZOS[1] + LANCZOS[2] / (z + 1)
  for i = 3, #LANCZOS do a = a + LANCZOS[i] / (z + (i - 1)) end
  local t = z + (LANCZOS_G + 0.5)
  return (z + 0.5) * t:log() - t + a:log() + HALF_LOG_2PI
end

-- lgamma(x): log |Gamma(x)|; below 0.5 by the reflection
-- Gamma(x) Gamma(1 - x) = pi / sin(pi x); +inf at 0 and the negative
-- integers. Its gradient is digamma's value (the derivative of Lanczos'
-- formula is good to only about 1e-10), through autograd.differentiable.
local function lgamma_value(t)
  local low = t:lt(0.5)
  local lg = lgamma_from_half(torch.where(low, 1 - t, t))
  local sin = (t * PI):sin():abs()
  local reflected = LOG_PI - torch.where(low, sin, 1):log() - lg
  local pole = low:logical_and(t:eq(t:floor()))
  return torch.where(pole, math.huge, torch.where(low, reflected, lg))
end

local lgamma_op
function methods.lgamma(t)
  t = want_float("lgamma", t)
  lgamma_op = lgamma_op or require("dplua.autograd").differentiable("LgammaBackward0", lgamma_value,
    function(saved, g) return g * methods.digamma(saved[1]) end)
  return lgamma_op(t)
end

-- digamma(x) for x > 0: psi(x + 10) by its asymptotic series, less
-- 1/x + ... + 1/(x + 9).
local function digamma_positive(x)
  local shifted = x + 10
  local inv2 = shifted:square():reciprocal()
  -- sum of B_2k / (2k y^2k), k = 1..6, in Horner form over 1/y^2
  local series = inv2 * (1 / 12 + inv2 * (-1 / 120 + inv2 * (1 / 252 + inv2 * (-1 / 240 + inv2 * (1 / 132
                 + inv2 * (-691 / 32760))))))
  local psi = shifted:log() - 0.5 / shifted - series
  for k = 0, 9 do psi = psi - (x + k):reciprocal() end
  return psi
end

-- digamma(x): the derivative of lgamma. Below 0 by the reflection
-- psi(1 - x) - psi(x) = pi cot(pi x); -inf at 0 and NaN at the negative
-- integers, as PyTorch.
function methods.digamma(t)
  t = want_float("digamma", t)
  local neg = t:lt(0)
  local psi = digamma_positive(torch.where(neg, 1 - t, t))
  local tan = torch.where(neg, (t * PI):tan(), 1)
  local reflected = psi - PI / tan
  local pole = neg:logical_and(t:eq(t:floor()))
  return torch.where(pole, 0 / 0, torch.where(neg, reflected, psi))
end

-- polygamma(n, x): the n-th derivative of digamma. n = 0 is digamma; for
-- n >= 1, (-1)^(n+1) n! sum_k 1/(x + k)^(n+1): the first 10 terms summed,
-- the rest by the asymptotic series at x + 10. Defined for x > 0 (NaN
-- elsewhere: PyTorch's values there come from the Hurwitz zeta function).
local BERNOULLI = { 1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6 }

local function factorial(n)
  local f = 1
  for i = 2, n do f = f * i end
  return f
end

local function polygamma(n, t)
  local fn = "polygamma"
  if type(n) ~= "number" or n % 1 ~= 0 or n < 0 then
    raise(fn .. ": expected n to be a non-negative integer, got " .. tostring(n))
  end
  if n > 170 then raise(fn .. ": n is at most 170 (n! overflows a double beyond), got " .. n) end
  t = want_float(fn, t)
  if n == 0 then return methods.digamma(t) end
  local positive = t:gt(0)
  local x = torch.where(positive, t, 1)
  local y = x + 10
  -- (n-1)!/y^n + n!/(2 y^(n+1)) + sum_k B_2k (2k+n-1)!/((2k)! y^(2k+n))
  local tail = factorial(n - 1) / y ^ n + factorial(n) / (2 * y ^ (n + 1))
  for k, b in ipairs(BERNOULLI) do
    tail = tail + (b * factorial(2 * k + n - 1) / factorial(2 * k)) / y ^ (2 * k + n)
  end
  local head = (x + 0):reciprocal() ^ (n + 1)
  for k = 1, 9 do head = head + (x + k):reciprocal() ^ (n + 1) end
  local sign = n % 2 == 1 and 1 or -1
  local value = (head * factorial(n) + tail) * sign
  return torch.where(positive, value, 0 / 0)
end
function torch.polygamma(n, t) return polygamma(n, t) end
function methods.polygamma(t, n) return polygamma(n, t) end

-- mvlgamma(x, p): the multivariate log-gamma function,
-- p (p - 1) / 4 log(pi) + sum_j lgamma(x - j/2), j = 0..p-1.
function methods.mvlgamma(t, p)
  if type(p) ~= "number" or p % 1 ~= 0 or p < 1 or p > 2 ^ 20 then
    raise("mvlgamma: expected p to be a positive integer up to 2^20, got " .. tostring(p))
  end
  t = want_float("mvlgamma", t)
  if not t:gt((p - 1) / 2):all():item() then
    raise(string.format("mvlgamma: all elements must be greater than (p-1)/2 = %g", (p - 1) / 2))
  end
  local s = methods.lgamma(t)
  for j = 1, p - 1 do s = s + methods.lgamma(t - j / 2) end
  return s + p * (p - 1) / 4 * LOG_PI
end

---------------------------------------------------------------- error function

-- erfcx(x) = exp(x^2) erfc(x) for x >= 2, by 60 terms of the continued
-- fraction erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x +
-- (3/2) / (x + ...)))), evaluated from its far end.
local function erfcx_large(x)
  local f = x
  for k = 60, 1, -1 do f = x + (k / 2) / f end
  return (f * SQRT_PI):reciprocal()
end

-- erfc(x) = 1 - erf(x), with its relative precision kept where it is small
-- (x >= 2, through the continued fraction).
function methods.erfc(t)
  t = want_float("erfc", t)
  local large = t:ge(2)
  local cf = erfcx_large(torch.where(large, t, 2)) * (-t:square()):exp()
  return torch.where(large, cf, 1 - t:erf())
end

-- erfcx(x) = exp(x^2) erfc(x), finite for large x.
local function erfcx(t)
  t = want_float("erfcx", t)
  local large = t:ge(2)
  local small = torch.where(large, 0, t)
  return torch.where(large, erfcx_large(torch.where(large, t, 2)), small:square():exp() * (1 - small:erf()))
end

-- erfinv(y): Giles' single-precision approximation, refined by Newton's
-- method on erf (two steps without recording, the last one recorded so that
-- the gradient is 1 / erf'(x) = sqrt(pi)/2 exp(x^2)). +-inf at +-1, NaN
-- beyond.
local GILES_CENTRAL = { 2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                        -0.00125372503, -0.00417768164, 0.246640727, 1.50140941 }
local GILES_TAIL = { -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                     -0.0076224613, 0.00943887047, 1.00167406, 2.83297682 }

local function horner(coefs, w)
  local p = coefs[1] + w * 0
  for i = 2, #coefs do p = p * w + coefs[i] end
  return p
end

function methods.erfinv(t)
  t = want_float("erfinv", t)
  local inside = t:abs():lt(1)
  local y = torch.where(inside, t, 0)
  local newton = function(x, target)
    return x - (x:erf() - target) * (x:square():exp() * (SQRT_PI / 2))
  end
  local x = torch.no_grad(function()
    local yd = y:detach()
    local w = -((1 - yd) * (1 + yd)):log()
    local central = horner(GILES_CENTRAL, w - 2.5)
    local tail = horner(GILES_TAIL, w:clamp(5, nil):sqrt() - 3)
    local x0 = torch.where(w:lt(5), central, tail) * yd
    return newton(newton(x0, yd), yd)
  end)
  local value = newton(x, y)
  return torch.where(inside, value, torch.where(t:abs():eq(1), t:detach() * math.huge, 0 / 0))
end

---------------------------------------------------------------- others

-- sinc(x) = sin(pi x) / (pi x), 1 at 0.
function methods.sinc(t)
  t = want_float("sinc", t)
  local zero = t:eq(0)
  local px = torch.where(zero, 1, t) * PI
  return torch.where(zero, 1, px:sin() / px)
end

-- xlog1py(x, y) = x log(1 + y), 0 where x is 0 (also where log(1 + y) is
-- infinite or NaN there); its gradient in x is log(1 + y), as PyTorch's.
function methods.xlog1py(t, other)
  t = want_float("xlog1py", t)
  if not B.is_tensor(other) and type(other) ~= "number" then
    raise("xlog1py: expected other to be a tensor or a number, got " .. typename(other))
  end
  local l = B.is_tensor(other) and other:log1p() or torch.full_like(t, math.log(1 + other))
  return t * torch.where(t:eq(0):logical_and(l:abs():lt(math.huge):logical_not()), 0, l)
end

-- entr(x) = -x log(x): 0 at 0, -inf below.
local function entr(t)
  t = want_float("entr", t)
  local pos = t:gt(0)
  local v = -t * torch.where(pos, t, 1):log()
  return torch.where(pos, v, torch.where(t:lt(0), -math.huge, t * 0))
end

-- ndtr(x): the standard normal's distribution function; ndtri its inverse;
-- log_ndtr its logarithm, kept finite far in the lower tail through erfcx.
local function ndtr(t) return methods.erfc(-want_float("ndtr", t) / SQRT2) * 0.5 end

local function log_ndtr(t)
  t = want_float("log_ndtr", t)
  local z = -t / SQRT2
  local far, upper = z:ge(2), t:gt(0)
  local zs = torch.where(far, z, 2)
  local tail = -zs:square() + erfcx_large(zs):log() - math.log(2)
  local mid = torch.where(far, 0, torch.where(upper, -t, t))
  local p = ndtr(mid)
  return torch.where(far, tail, torch.where(upper, (-p):log1p(), p:log()))
end

-- ndtri(p): for q = min(p, 1 - p) (1 - p is exact there), sqrt(2)
-- erfinv(2q - 1), or below q = 1e-6 the tail's -sqrt(u - log u - log 2pi)
-- with u = -2 log q (2q - 1 has lost q's digits there), refined by
-- Newton's method on log ndtr(x) = log q, which stays well-behaved in the
-- tail; the last step recorded (gradient 1 / phi(x)), the sign turned back
-- for p > 1/2.
local LOG_SQRT_2PI = 0.5 * math.log(2 * PI)
local function ndtri(t)
  t = want_float("ndtri", t)
  local upper = t:gt(0.5)
  local q = torch.where(upper, 1 - t, t)
  local inside = q:gt(0)
  local log_q = torch.where(inside, q, 0.25):log()
  local newton = function(x, target)
    local l = log_ndtr(x)
    return x - (l - target) * (l + x:square() / 2 + LOG_SQRT_2PI):exp()
  end
  local x = torch.no_grad(function()
    local target = log_q:detach()
    local u = target * -2
    local tail = -(u - u:log() - math.log(2 * PI)):clamp(0, nil):sqrt()
    local x0 = torch.where(target:lt(math.log(1e-6)), tail, methods.erfinv(target:exp() * 2 - 1) * SQRT2)
    for _ = 1, 3 do x0 = newton(x0, target) end
    return x0
  end)
  local lower = torch.where(inside, newton(x, log_q), torch.where(q:eq(0), -math.huge, 0 / 0))
  return torch.where(upper, -lower, lower)
end

---------------------------------------------------------------- modified Bessel functions

-- I_nu(|x|) for nu = 0 or 1, times exp(-|x|) when scaled: the power series
-- (positive terms, 100 of them) up to 30, above it the asymptotic series
-- e^x / sqrt(2 pi x) sum_k c_k / (8x)^k, c_k = c_(k-1) (-(4 nu^2 - (2k - 1)^2)) / k.
local function bessel_i(t, nu, scaled)
  local x = t:abs()
  local small = x:le(30)
  local xs = torch.where(small, x, 0)
  local q = (xs / 2):square()
  -- I_1's series keeps x's sign (odd, and with its gradient at 0)
  local term = nu == 0 and torch.ones_like(xs) or torch.where(small, t, 0) / 2
  local sum = term
  for k = 1, 100 do
    term = term * q / (k * (k + nu))
    sum = sum + term
  end
  if scaled then sum = sum * (-xs):exp() end
  local xl = torch.where(small, 31, x)
  local inv = (xl * 8):reciprocal()
  local series, c, pw = torch.ones_like(xl), 1, torch.ones_like(xl)
  local mu = 4 * nu * nu
  for k = 1, 12 do
    c = c * -(mu - (2 * k - 1) ^ 2) / k
    pw = pw * inv
    series = series + pw * c
  end
  local large = series / (xl * (2 * PI)):sqrt()
  if not scaled then large = large * xl:exp() end
  if nu == 1 then large = large * t:sign() end
  return torch.where(small, sum, large)
end
local function bessel(name, nu, scaled)
  return function(t) return bessel_i(want_float(name, t), nu, scaled) end
end
methods.i0 = bessel("i0", 0, false)
local i0e, i1, i1e = bessel("i0e", 0, true), bessel("i1", 1, false), bessel("i1e", 1, true)

-- K_nu(x) e^x for x >= 2 and 0 <= nu <= 1: the integral of
-- exp(-2x sinh(t/2)^2) cosh(nu t) over t > 0, by the trapezoidal rule in s =
-- t sqrt(x) (step 0.3 up to s = 9.6). The integrand is even and analytic in
-- a strip, so the rule's error falls as exp(-2 pi d / h): below 1e-17 here.
local K_STEP, K_NODES = 0.3, 32
local function bessel_k_scaled_large(x, nu)
  local rs = x:rsqrt()
  local sum = torch.zeros_like(x) + 0.5
  for j = 1, K_NODES do
    local t = rs * (j * K_STEP)
    local term = ((t * 0.5):sinh():square() * x * -2):exp()
    if nu ~= 0 then term = term * (t * nu):cosh() end
    sum = sum + term
  end
  return sum * rs * K_STEP
end

local EULER = 0.57721566490153286
-- K_0 and K_1 for 0 < x <= 2 by their series (A&S 9.6.13, 9.6.11), with
-- I_0 and I_1's
local function bessel_k_small(x, nu)
  local q = (x * 0.5):square()
  local log_half = (x * 0.5):log()
  local term, sum = torch.ones_like(x), nil
  if nu == 0 then
    local h = 0   -- the harmonic number H_k
    sum = torch.zeros_like(x)
    for k = 1, 30 do
      h = h + 1 / k
      term = term * q / (k * k)
      sum = sum + term * h
    end
    return sum - (log_half + EULER) * bessel_i(x, 0, false)
  end
  -- sum over k >= 0 of (psi(k + 1) + psi(k + 2)) q^k / (k! (k + 1)!)
  local hk, hk1 = 0, 1
  sum = torch.zeros_like(x) + (hk + hk1 - 2 * EULER)
  for k = 1, 30 do
    hk, hk1 = hk + 1 / k, hk1 + 1 / (k + 1)
    term = term * q / (k * (k + 1))
    sum = sum + term * (hk + hk1 - 2 * EULER)
  end
  return x:reciprocal() + log_half * bessel_i(x, 1, false) - x * 0.25 * sum
end

-- K_nu(x) (scaled: times e^x) for nu = 0, 1: NaN below 0, inf at 0
local function bessel_k(name, nu, scaled)
  return function(t)
    local x = want_float(name, t)
    local small = x:le(2)
    local infinite = x:eq(math.huge)
    local xs = torch.where(small, x:clamp(torch.finfo(x.dtype).tiny, nil), 1)
    local xl = torch.where(small:logical_or(infinite), 3, x)
    local low = bessel_k_small(xs, nu)
    if scaled then low = low * xs:exp() end
    local high = bessel_k_scaled_large(xl, nu)
    if not scaled then high = high * (-xl):exp() end
    local y = torch.where(small, low, torch.where(infinite, 0, high))   -- (0 at +inf, as PyTorch)
    return torch.where(x:lt(0), 0 / 0, torch.where(x:eq(0), math.huge, y))
  end
end

-- The Hankel expansions of J_n and Y_n (n = 0, 1) for x >= 25:
-- sqrt(2 / (pi x)) (P cos chi - Q sin chi) and (P sin chi + Q cos chi), chi
-- = x - (2n + 1) pi / 4, P and Q the even and odd terms of sum a_k / x^k
-- (alternating in pairs), a_k = a_(k-1) (4n^2 - (2k - 1)^2) / (8k); at x =
-- 25 their terms are below 1e-17 well before the 24th.
local function bessel_hankel(x, n)
  local inv = x:reciprocal()
  local P, Q = torch.ones_like(x), torch.zeros_like(x)
  local a, pw = 1, torch.ones_like(x)
  for k = 1, 24 do
    a = a * (4 * n * n - (2 * k - 1) ^ 2) / (8 * k)
    pw = pw * inv
    local sign = (math.floor(k / 2) % 2 == 0) and 1 or -1
    if k % 2 == 0 then P = P + pw * (a * sign) else Q = Q + pw * (a * sign) end
  end
  local chi = x - (2 * n + 1) * PI / 4
  local amp = (inv * (2 / PI)):sqrt()
  local c, s = chi:cos(), chi:sin()
  return amp * (P * c - Q * s), amp * (P * s + Q * c)
end

-- J_0, J_1, Y_0 and Y_1 for |x| <= 25 from the trapezoidal rule on
-- Bessel's integral J_m(x) = (1/2pi) int cos(m tau - x sin tau) over a
-- period, with 128 nodes (exact to rounding for every m up to 60 here),
-- and Y_0 by Neumann's series (A&S 9.1.88) (2/pi)(log(x/2) + gamma) J_0 -
-- (4/pi) sum_k (-1)^k J_2k / k over k <= 30, Y_1 = -Y_0'. What is left of
-- the integrands is symmetric about tau = 0 and tau = pi/2, so the nodes
-- of a quarter period carry the weights of the others: J_0 = sum w
-- cos(x sin tau), J_1 = sum w sin tau sin(x sin tau), and Y_0, Y_1 the
-- same sums weighted by C(tau) = sum_k (-1)^k cos(2k tau) / k.
local J_NODES, NEUMANN_TERMS = 128, 30
local jy_nodes
local function bessel_jy_nodes()
  if jy_nodes then return jy_nodes end
  jy_nodes = {}
  for r = 0, J_NODES / 4 do
    local tau = 2 * PI * r / J_NODES
    local C = 0
    for k = 1, NEUMANN_TERMS do C = C + (k % 2 == 0 and 1 or -1) * math.cos(2 * k * tau) / k end
    jy_nodes[r] = { sin = math.sin(tau), C = C, w = 0 }
  end
  for j = 0, J_NODES - 1 do   -- each node's weight: the nodes it stands for
    local r = j <= J_NODES / 2 and j or J_NODES - j
    if r > J_NODES / 4 then r = J_NODES / 2 - r end
    jy_nodes[r].w = jy_nodes[r].w + 1 / J_NODES
  end
  return jy_nodes
end
local function bessel_jy_small(x, which)
  local j0, j1, c0, c1 = 0, 0, 0, 0   -- the sums: plain and weighted by C
  for r = 0, J_NODES / 4 do
    local node = bessel_jy_nodes()[r]
    local phi = x * node.sin
    if which ~= "j1" then
      local c = phi:cos() * node.w
      j0 = j0 + c
      if which ~= "j0" then c0 = c0 + c * node.C end
    end
    if which == "j1" or which == "y1" then
      local s = phi:sin() * (node.w * node.sin)
      j1 = j1 + s
      c1 = c1 + s * node.C
    end
  end
  if which == "j0" then return j0 elseif which == "j1" then return j1 end
  local log_term = (x * 0.5):log() + EULER
  if which == "y0" then return (j0 * log_term) * (2 / PI) - c0 * (4 / PI) end
  return (j1 * log_term - j0 / x) * (2 / PI) - c1 * (4 / PI)
end

local HANKEL_FROM = 25
local function bessel_j(name, n)
  return function(t)
    local x = want_float(name, t)
    local ax = x:abs()
    local small = ax:le(HANKEL_FROM)
    local large = bessel_hankel(torch.where(small, HANKEL_FROM + 1, ax), n)
    if n == 1 then large = large * x:sign() end   -- J_1 is odd, J_0 even
    return torch.where(small, bessel_jy_small(torch.where(small, x, 0), n == 0 and "j0" or "j1"), large)
  end
end
local function bessel_y(name, n)
  return function(t)
    local x = want_float(name, t)
    local small = x:le(HANKEL_FROM)
    local xs = torch.where(small, x:clamp(torch.finfo(x.dtype).tiny, nil), 1)
    local _, high = bessel_hankel(torch.where(small, HANKEL_FROM + 1, x), n)
    local y = torch.where(small, bessel_jy_small(xs, n == 0 and "y0" or "y1"), high)
    return torch.where(x:lt(0), 0 / 0, torch.where(x:eq(0), -math.huge, y))
  end
end

-- Ai(x): the Maclaurin series c1 f(x) - c2 g(x) (A&S 10.4.2) on [-7, 2.1];
-- above, (1/pi) sqrt(x/3) K_(1/3)(zeta), zeta = (2/3) x^(3/2); below, the
-- expansion in 1/zeta (DLMF 9.7.9). Where the two meet near -7 both are
-- good to about 2e-11 (the series loses e^zeta to cancellation).
local AI0, AI0_PRIME = 0.35502805388781724, 0.25881940379280680
local AIRY_LOW, AIRY_HIGH = -7, 2.1
local function airy_ai(t)
  t = want_float("airy_ai", t)
  local dtype = t.dtype
  local x = t:to(torch.float64)   -- (in float32 the series would lose e^zeta to cancellation)
  local mid = x:ge(AIRY_LOW):logical_and(x:le(AIRY_HIGH))
  local xm = torch.where(mid, x, 0)
  local x3 = xm * xm * xm
  local f, g = torch.ones_like(xm), xm
  local fk, gk = f, g
  for k = 1, 30 do
    fk = fk * x3 / ((3 * k - 1) * (3 * k))
    gk = gk * x3 / ((3 * k) * (3 * k + 1))
    f, g = f + fk, g + gk
  end
  local series = f * AI0 - g * AI0_PRIME
  local high = x:gt(AIRY_HIGH)
  local xh = torch.where(high, x, 3)
  local zeta_h = xh:pow(1.5) * (2 / 3)
  local above = (xh / 3):sqrt() / PI * bessel_k_scaled_large(zeta_h, 1 / 3) * (-zeta_h):exp()
  local xl = torch.where(x:lt(AIRY_LOW), -x, -AIRY_LOW + 1)
  local zeta = xl:pow(1.5) * (2 / 3)
  local inv = zeta:reciprocal()
  local even, odd = torch.ones_like(zeta), torch.zeros_like(zeta)
  local u, pw = 1, torch.ones_like(zeta)
  for k = 1, 30 do
    u = u * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / (216 * k * (2 * k - 1))
    pw = pw * inv
    local sign = (math.floor(k / 2) % 2 == 0) and 1 or -1
    if k % 2 == 0 then even = even + pw * (u * sign) else odd = odd + pw * (u * sign) end
  end
  local phase = zeta - PI / 4
  local below = (even * phase:cos() + odd * phase:sin()) / (xl:pow(0.25) * SQRT_PI)
  local y = torch.where(mid, series, torch.where(high, above, below))
  return torch.where(x:abs():lt(math.huge), y, 0 / 0):to(dtype)   -- (NaN at NaN and +-inf, as PyTorch)
end

-- spherical_bessel_j0(x) = sin(x) / x, 1 at 0
local function spherical_bessel_j0(t)
  local x = want_float("spherical_bessel_j0", t)
  local zero, infinite = x:eq(0), x:abs():eq(math.huge)
  local xs = torch.where(zero:logical_or(infinite), 1, x)
  return torch.where(zero, 1, torch.where(infinite, 0, xs:sin() / xs))
end

---------------------------------------------------------------- Hurwitz zeta

-- zeta(x, q) = sum over k >= 0 of (k + q)^-x, by Euler-Maclaurin: ten
-- terms, the integral of the rest, and twelve Bernoulli corrections (at k +
-- q >= 10 the next is below 1e-20 of the sum). inf at x = 1 and at q a
-- non-positive integer, NaN for x < 1 and for q < 0 with x not an integer,
-- as PyTorch's.
local BERNOULLI = { 1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510, 43867 / 798,
                    -174611 / 330, 854513 / 138, -236364091 / 2730 }
local ZETA_TERMS = 10
local function zeta(x, q)
  if type(x) == "number" and B.is_tensor(q) then x = torch.tensor(x, { dtype = q.dtype, device = q.device }) end
  if type(q) == "number" and B.is_tensor(x) then q = torch.tensor(q, { dtype = x.dtype, device = x.device }) end
  x, q = want_float("zeta", x), want_float("zeta", q)
  local dtype = torch.promote_types(x.dtype, q.dtype)
  -- in float64: in float32 the corrections' factors over- and underflow
  x, q = torch.broadcast_tensors(x:to(torch.float64), q:to(torch.float64))
  local pole = x:eq(1):logical_or(q:le(0):logical_and(q:eq(q:floor())))
  local undefined = x:lt(1):logical_or(q:lt(0):logical_and(x:ne(x:floor())))
  local ok = pole:logical_or(undefined):logical_not()
  local xs, qs = torch.where(ok, x, 2), torch.where(ok, q, 1)
  local sum = torch.zeros_like(xs)
  for k = 0, ZETA_TERMS - 1 do sum = sum + (qs + k):pow(-xs) end
  local w = qs + ZETA_TERMS
  local wx = w:pow(-xs)
  sum = sum + wx * w / (xs - 1) + wx * 0.5
  local rising, fact = xs, 2   -- x (x + 1) ... (x + 2j - 2) and (2j)!
  local wp = wx / w
  for j = 1, #BERNOULLI do
    sum = sum + rising * wp * (BERNOULLI[j] / fact)
    rising = rising * (xs + 2 * j - 1) * (xs + 2 * j)
    fact = fact * (2 * j + 1) * (2 * j + 2)
    wp = wp / (w * w)
  end
  -- x = +inf: q^-x alone, 1 at q = 1 and inf below; NaN elsewhere, as PyTorch
  local at_inf = torch.where(q:eq(1), 1, torch.where(q:gt(0):logical_and(q:lt(1)), math.huge, 0 / 0))
  local v = torch.where(pole, math.huge, torch.where(undefined, 0 / 0, sum))
  return torch.where(x:eq(math.huge), at_inf, v):to(dtype)
end

---------------------------------------------------------------- orthogonal polynomials

-- P_n(x) by its three-term recurrence P_(k+1) = a_k(x) P_k - b_k(x) P_(k-1)
-- from P_0 = 1 and P_1 = first(x); n a number or a tensor of integers
-- (broadcast with x; each element takes its own degree, negative ones 0).
local MAX_DEGREE = 10000
local function polynomial(name, first, step)
  return function(x, n)
    if type(x) == "number" then x = torch.tensor(x) end
    x = want_float(name, x)
    if type(n) == "number" then
      if n % 1 ~= 0 then raise(string.format("%s: expected an integer degree n, got %s", name, tostring(n))) end
    elseif not B.is_tensor(n) then
      raise(string.format("%s: expected n to be a number or a tensor of integers, got %s", name, typename(n)))
    end
    local nt = B.is_tensor(n) and n or torch.tensor(n, { dtype = torch.float64, device = x.device })
    local top = nt:numel() > 0 and math.max(nt:max():item(), 0) or 0
    if B.is_tensor(n) and not n:eq(n:floor()):all():item() then
      raise(name .. ": expected integer degrees n")
    end
    if top > MAX_DEGREE then
      raise(string.format("%s: degree %d is above the largest supported, %d (the recurrence takes a step a degree)",
                          name, top, MAX_DEGREE))
    end
    local prev, cur = torch.ones_like(x), first(x)
    local out = torch.where(nt:eq(0), prev, torch.where(nt:eq(1), cur, 0))
    for k = 1, top - 1 do
      prev, cur = cur, step(x, k, cur, prev)
      out = torch.where(nt:eq(k + 1), cur, out)
    end
    return torch.where(nt:lt(0), 0, out)
  end
end
-- Chebyshev's four kinds share the recurrence and differ in P_1
local function chebyshev(name, first) return polynomial(name, first, function(x, _, p, q) return x * 2 * p - q end) end
local polynomials = {
  chebyshev_polynomial_t = chebyshev("chebyshev_polynomial_t", function(x) return x end),
  chebyshev_polynomial_u = chebyshev("chebyshev_polynomial_u", function(x) return x * 2 end),
  chebyshev_polynomial_v = chebyshev("chebyshev_polynomial_v", function(x) return x * 2 - 1 end),
  chebyshev_polynomial_w = chebyshev("chebyshev_polynomial_w", function(x) return x * 2 + 1 end),
  hermite_polynomial_h = polynomial("hermite_polynomial_h", function(x) return x * 2 end,
                                    function(x, k, p, q) return x * 2 * p - q * (2 * k) end),
  hermite_polynomial_he = polynomial("hermite_polynomial_he", function(x) return x end,
                                     function(x, k, p, q) return x * p - q * k end),
  laguerre_polynomial_l = polynomial("laguerre_polynomial_l", function(x) return 1 - x end,
                                     function(x, k, p, q) return ((2 * k + 1 - x) * p - q * k) / (k + 1) end),
  legendre_polynomial_p = polynomial("legendre_polynomial_p", function(x) return x end,
                                     function(x, k, p, q) return (x * p * (2 * k + 1) - q * k) / (k + 1) end),
}
-- the shifted Chebyshev polynomials: P*_n(x) = P_n(2x - 1)
for _, kind in ipairs({ "t", "u", "v", "w" }) do
  local f = polynomials["chebyshev_polynomial_" .. kind]
  local name = "shifted_chebyshev_polynomial_" .. kind
  polynomials[name] = function(x, n)
    if type(x) == "number" then x = torch.tensor(x) end
    return f(want_float(name, x) * 2 - 1, n)
  end
end

---------------------------------------------------------------- incomplete gamma

-- The regularized incomplete gamma functions P(a, x) (torch.special.gammainc,
-- torch.igamma) and Q(a, x) = 1 - P (gammaincc, igammac), in float64: P's
-- series below x = a + 1 and Q's continued fraction (Lentz's method) from
-- there, STEPS terms each (converged to rounding for a up to about 1000);
-- PyTorch's values at the edges (0 at x = 0, 1 for a = 0 or x = inf, NaN
-- for negative arguments).
local STEPS = 300
local function incomplete_gamma_values(x, a, upper)
  local ok = a:gt(0):logical_and(x:gt(0)):logical_and(x:lt(math.huge)):logical_and(a:lt(math.huge))
  local as, xs = torch.where(ok, a, 1), torch.where(ok, x, 1)
  local front = (as * xs:log() - xs - as:lgamma()):exp()
  local term, ap = as:reciprocal(), as
  local sum = term
  for _ = 1, STEPS do
    ap = ap + 1
    term = term * xs / ap
    sum = sum + term
  end
  local p_series = front * sum
  local TINY = 1e-300
  local b = xs + 1 - as
  local c, d = torch.full_like(xs, 1 / TINY), b:reciprocal()
  local h = d
  for i = 1, STEPS do
    local an = (as - i) * i
    b = b + 2
    d = an * d + b
    d = torch.where(d:abs():lt(TINY), TINY, d):reciprocal()
    c = b + an / c
    c = torch.where(c:abs():lt(TINY), TINY, c)
    h = h * d * c
  end
  local q_fraction = front * h
  local series_side = xs:lt(as + 1)
  local p = torch.where(series_side, p_series, 1 - q_fraction)
  local q = torch.where(series_side, 1 - p_series, q_fraction)
  local v = upper and q or p
  -- the edges, in the order PyTorch decides them
  local zero, one, nan = torch.full_like(v, upper and 1 or 0), torch.full_like(v, upper and 0 or 1), 0 / 0
  v = torch.where(x:eq(math.huge), one, v)
  v = torch.where(a:eq(math.huge), torch.where(x:eq(math.huge), nan, zero), v)
  v = torch.where(x:eq(0), zero, v)
  v = torch.where(a:eq(0), torch.where(x:gt(0), one, nan), v)
  return torch.where(a:lt(0):logical_or(x:lt(0)):logical_or(a:ne(a)):logical_or(x:ne(x)), nan, v)
end
-- d P(a, x) / d a (float64, x and a > 0), the same two ways differentiated
-- in a: P = f S with f = x^a e^-x / Gamma(a) and S = sum t_n, t_n = x^n /
-- (a (a + 1) ... (a + n)), so P' = f ((log x - digamma(a)) S + sum t_n
-- (-sum_(k<=n) 1 / (a + k))); above x = a + 1, Q = f h with h Lentz's
-- continued fraction, whose recurrences carry their derivatives along
-- (forward mode), and P' = -Q'. Where a exceeds about 1000 the series has
-- too few terms, as for the values.
local function incomplete_gamma_da(x, a)
  local ok = a:gt(0):logical_and(x:gt(0)):logical_and(x:lt(math.huge)):logical_and(a:lt(math.huge))
  local as, xs = torch.where(ok, a, 1), torch.where(ok, x, 1)
  local series_side = xs:lt(as + 1)
  local f = (as * xs:log() - xs - as:lgamma()):exp()
  local dlogf = xs:log() - as:digamma()
  -- the series, on inputs made safe for it
  local a1, x1 = torch.where(series_side, as, 1), torch.where(series_side, xs, 0.5)
  local term, harmonic = a1:reciprocal(), a1:reciprocal()
  local sum, dsum = term, -term * harmonic
  local ap = a1
  for _ = 1, STEPS do
    ap = ap + 1
    term = term * x1 / ap
    harmonic = harmonic + ap:reciprocal()
    sum = sum + term
    dsum = dsum - term * harmonic
  end
  local dp_series = f * (dlogf * sum + dsum)
  -- the continued fraction and its derivative, on inputs made safe for it
  local a2, x2 = torch.where(series_side, 1, as), torch.where(series_side, 3, xs)
  local TINY = 1e-300
  local b = x2 + 1 - a2
  local c, dc = torch.full_like(x2, 1 / TINY), torch.zeros_like(x2)
  local d = b:reciprocal()
  local dd = d:square()             -- d(1/b)/da with b' = -1
  local h, dh = d, dd
  for i = 1, STEPS do
    local an = (a2 - i) * i         -- an' = i
    b = b + 2                       -- b' = -1 still
    local den = an * d + b
    local dden = d * i + an * dd - 1
    den = torch.where(den:abs():lt(TINY), TINY, den)
    d = den:reciprocal()
    dd = -dden * d:square()
    local cn = b + an / c
    dc = -1 + (c * i - an * dc) / c:square()
    c = torch.where(cn:abs():lt(TINY), TINY, cn)
    local dc_c = dd * c + d * dc
    dh = dh * d * c + h * dc_c
    h = h * d * c
  end
  local dq_fraction = f * (dlogf * h + dh)
  local v = torch.where(series_side, dp_series, -dq_fraction)
  return torch.where(ok, v, 0 / 0)
end

-- d P / d x = x^(a-1) e^-x / Gamma(a) and d P / d a by
-- incomplete_gamma_da (PyTorch has no gradient in a); Q's are their negatives.
local function incomplete_gamma(name, upper)
  local op
  local function differentiable(x, a)
    if not ((x.requires_grad or a.requires_grad) and torch.is_grad_enabled()) then
      return incomplete_gamma_values(x, a, upper)
    end
    if op == nil then
      op = require("dplua.autograd").Function:extend(upper and "Igammac" or "Igamma")
      function op.forward(ctx, xt, at)
        ctx:save_for_backward(xt, at)
        ctx.a_requires_grad = at.requires_grad
        return incomplete_gamma_values(xt, at, upper)
      end
      function op.backward(ctx, g)
        local xt, at = unpack(ctx.saved_tensors)
        local dx = ((at - 1) * xt:log() - xt - at:lgamma()):exp()
        local da = ctx.a_requires_grad and incomplete_gamma_da(xt, at) or nil
        if upper then dx, da = -dx, da and -da end
        return g * dx, da and g * da
      end
    end
    return op.apply(x, a)
  end
  return function(a, x)
    if type(a) == "number" and B.is_tensor(x) then a = torch.tensor(a, { dtype = x.dtype, device = x.device }) end
    if type(x) == "number" and B.is_tensor(a) then x = torch.tensor(x, { dtype = a.dtype, device = a.device }) end
    a, x = want_float(name, a), want_float(name, x)
    local dtype = torch.promote_types(a.dtype, x.dtype)
    local a64, x64 = torch.broadcast_tensors(a:double(), x:to(torch.float64))
    return differentiable(x64, a64):to(dtype)
  end
end
local gammainc, gammaincc = incomplete_gamma("gammainc", false), incomplete_gamma("gammaincc", true)

local WILSON_HILFERTY_FROM = 1000
-- torch._standard_gamma_grad(alpha, x): d x / d alpha of a Gamma(alpha, 1)
-- draw x at its fixed quantile, -(d P / d alpha) / density (implicit
-- reparameterisation, as PyTorch's function of that name), in float64 and
-- returned in x's dtype; what the gamma family's rsample differentiates by.
function torch._standard_gamma_grad(alpha, x)
  if not (B.is_tensor(alpha) and B.is_tensor(x)) then
    raise(string.format("_standard_gamma_grad: expected alpha and x to be tensors, got %s and %s", typename(alpha),
                        typename(x)))
  end
  local a, xx = torch.broadcast_tensors(alpha:detach():to(torch.float64), x:detach():to(torch.float64))
  local large = a:gt(WILSON_HILFERTY_FROM)
  local as = torch.where(large, 1, a)
  local density = ((as - 1) * xx:log() - xx - as:lgamma()):exp()
  local exact = -incomplete_gamma_da(xx, as) / density
  -- above, where the series would need thousands of terms: Wilson and
  -- Hilferty's x = a h^3, h = 1 - 1/(9a) + z / (3 sqrt(a)) for the normal
  -- quantile z of the draw, differentiated in a at fixed z (within 1e-6
  -- of mpmath's derivative there)
  local al = torch.where(large, a, WILSON_HILFERTY_FROM + 1)
  local ra = al:sqrt()
  local z = ((xx / al):pow(1 / 3) - 1 + (al * 9):reciprocal()) * ra * 3
  local h = 1 - (al * 9):reciprocal() + z / (ra * 3)
  local dh = (al:square() * 9):reciprocal() - z / (al * ra * 6)
  local approx = h:pow(3) + al * 3 * h:square() * dh
  return torch.where(large, approx, exact):to(x.dtype)
end
torch.igamma, torch.igammac = gammainc, gammaincc
methods.igamma, methods.igammac = gammainc, gammaincc
methods.igamma_ = function(t, other) return t:copy_(gammainc(t, other)) end
methods.igammac_ = function(t, other) return t:copy_(gammaincc(t, other)) end

---------------------------------------------------------------- torch.special

local function method(name) return function(t, ...) return torch[name](t, ...) end end

torch.special = {
  gammaln = method("lgamma"), digamma = method("digamma"), psi = method("digamma"),
  polygamma = torch.polygamma, multigammaln = method("mvlgamma"),
  erf = method("erf"), erfc = method("erfc"), erfcx = erfcx, erfinv = method("erfinv"),
  ndtr = ndtr, ndtri = ndtri, log_ndtr = log_ndtr,
  expit = method("sigmoid"), logit = method("logit"), exp2 = method("exp2"), expm1 = method("expm1"),
  log1p = method("log1p"), round = method("round"), sinc = method("sinc"),
  xlogy = method("xlogy"), xlog1py = method("xlog1py"), entr = entr,
  logsumexp = method("logsumexp"),
  softmax = function(t, dim) return t:softmax(dim) end,
  log_softmax = function(t, dim) return t:log_softmax(dim) end,
  i0 = methods.i0, i0e = i0e, i1 = i1, i1e = i1e, modified_bessel_i0 = methods.i0, modified_bessel_i1 = i1,
  gammainc = gammainc, gammaincc = gammaincc,
  modified_bessel_k0 = bessel_k("modified_bessel_k0", 0, false),
  modified_bessel_k1 = bessel_k("modified_bessel_k1", 1, false),
  scaled_modified_bessel_k0 = bessel_k("scaled_modified_bessel_k0", 0, true),
  scaled_modified_bessel_k1 = bessel_k("scaled_modified_bessel_k1", 1, true),
  bessel_j0 = bessel_j("bessel_j0", 0), bessel_j1 = bessel_j("bessel_j1", 1),
  bessel_y0 = bessel_y("bessel_y0", 0), bessel_y1 = bessel_y("bessel_y1", 1),
  spherical_bessel_j0 = spherical_bessel_j0, airy_ai = airy_ai, zeta = zeta,
}
for name, f in pairs(polynomials) do torch.special[name] = f end
methods.i0e, methods.i1, methods.i1e = i0e, i1, i1e

return {}
