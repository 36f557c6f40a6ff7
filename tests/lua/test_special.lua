-- test_special.lua: the special functions (lua/dplua/special.lua) and the
-- torch.special namespace against PyTorch's values and gradients
-- (tests/ref/special.lua, written by scripts/gen_special_ref.py), known
-- closed forms, float32, finite differences and bad input.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local T = require("tap")
local torch = require("dplua")
local S = torch.special
local ref = dofile(here .. "/../ref/special.lua")

local gamma_a = { 0.5, 1.0, 2.0, 5.0, 10.0, 100.0, 3.0, 50.0, 0.1, 700.0, 1.5, 20.0 }
local edge_a = { 0.0, 0.0, 2.0, -1.0, 3.0, math.huge, math.huge, 2.0 }
local functions = {  -- as in the generator
  lgamma = function(x) return x:lgamma() end,
  lgamma_poles = function(x) return torch.lgamma(x) end,
  digamma = function(x) return x:digamma() end,
  digamma_poles = function(x) return S.psi(x) end,
  polygamma_2 = function(x) return torch.polygamma(2, x) end,
  polygamma_3 = function(x) return x:polygamma(3) end,
  erfc = function(x) return x:erfc() end,
  erfcx = function(x) return S.erfcx(x) end,
  erfinv = function(x) return x:erfinv() end,
  erfinv_edges = function(x) return torch.erfinv(x) end,
  sinc = function(x) return x:sinc() end,
  entr = function(x) return S.entr(x) end,
  ndtr = function(x) return S.ndtr(x) end,
  ndtri = function(x) return S.ndtri(x) end,
  log_ndtr = function(x) return S.log_ndtr(x) end,
  multigammaln_3 = function(x) return S.multigammaln(x, 3) end,
  xlog1py = function(x) return S.xlog1py(x, x:abs() * 2 - 0.5) end,
  i0 = function(x) return x:i0() end,
  i0e = function(x) return S.i0e(x) end,
  i1 = function(x) return S.i1(x) end,
  i1e = function(x) return x:i1e() end,
  chebyshev_t_5 = function(x) return S.chebyshev_polynomial_t(x, 5) end,
  chebyshev_u_4 = function(x) return S.chebyshev_polynomial_u(x, 4) end,
  chebyshev_v_3 = function(x) return S.chebyshev_polynomial_v(x, 3) end,
  chebyshev_w_6 = function(x) return S.chebyshev_polynomial_w(x, 6) end,
  shifted_chebyshev_t_4 = function(x) return S.shifted_chebyshev_polynomial_t(x, 4) end,
  shifted_chebyshev_w_3 = function(x) return S.shifted_chebyshev_polynomial_w(x, 3) end,
  hermite_h_degrees = function(x) return S.hermite_polynomial_h(x, torch.tensor({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1 })) end,
  hermite_he_6 = function(x) return S.hermite_polynomial_he(x, 6) end,
  laguerre_l_5 = function(x) return S.laguerre_polynomial_l(x, 5) end,
  legendre_p_degrees = function(x) return S.legendre_polynomial_p(x, torch.tensor({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1 })) end,
  gammainc = function(x) return S.gammainc(torch.tensor(gamma_a, { dtype = x.dtype }), x) end,
  gammaincc = function(x) return torch.igammac(torch.tensor(gamma_a, { dtype = x.dtype }), x) end,
  gammainc_exact = function(x) return S.gammainc(torch.tensor(gamma_a, { dtype = x.dtype }), x) end,
  gammainc_edges = function(x) return torch.tensor(edge_a, { dtype = x.dtype }):igamma(x) end,
  gammaincc_edges = function(x) return S.gammaincc(torch.tensor(edge_a, { dtype = x.dtype }), x) end,
  -- d P(a, x) / d a, which PyTorch does not have: against mpmath
  gammainc_da = function(x, c)
    local a = torch.tensor(c.a, { dtype = torch.float64 }):requires_grad_()
    S.gammainc(a, x):sum():backward()
    local b = torch.tensor(c.a, { dtype = torch.float64 }):requires_grad_()
    S.gammaincc(b, x):sum():backward()
    T.tensor_close(b.grad, -a.grad, 1e-15, 1e-15, "gammaincc's gradient in a is gammainc's, negated")
    return a.grad:to(x.dtype)
  end,
  standard_gamma_grad = function(x, c) return torch._standard_gamma_grad(torch.tensor(c.a, { dtype = x.dtype }), x) end,
  zeta = function(x, c) return S.zeta(x, torch.tensor(c.q, { dtype = x.dtype })) end,
  zeta_edges = function(x, c) return S.zeta(x, torch.tensor(c.q, { dtype = x.dtype })) end,
}
for _, name in ipairs({ "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1",
                        "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "airy_ai", "spherical_bessel_j0" }) do
  functions[name] = S[name]
  functions[name .. "_edges"] = S[name]
end
-- where PyTorch's own float64 value is less exact than 1e-12 (checked
-- against math.erfc in Python: ours is the closer one)
local rtol = { erfinv = 1e-10, ndtri = 1e-10, gammainc = 1e-9, gammaincc = 5e-9, gammainc_da = 1e-11, standard_gamma_grad = 1e-6,
               airy_ai = 5e-12 }   -- (near -7, where its series and its expansion meet)

local f64 = { dtype = torch.float64 }

for _, name in ipairs(T.sorted_keys(ref)) do
  T.run(name .. " against PyTorch", function()
    local c = ref[name]
    local x = torch.tensor(c.x, f64):requires_grad_(c.dx ~= nil)
    local y = functions[name](x, c)
    local tol = rtol[name] or 1e-12
    T.values_close(y:tolist(), c.y, tol, 1e-15, name .. ": values")
    if c.dx then
      y:sum():backward()
      T.values_close(x.grad:tolist(), c.dx, tol * 10, 1e-13, name .. ": gradient")
    end
    -- float32 against float64 at the same (float32) inputs, where the
    -- value is within float32's range
    local x32 = torch.tensor(c.x, f64):float()
    local y32 = functions[name](x32, c)
    T.is(y32.dtype, torch.float32, name .. ": float32 in, float32 out")
    local got, want = y32:tolist(), functions[name](x32:double(), c):tolist()
    for i, v in ipairs(want) do
      if math.abs(v) > 3e38 or (v ~= 0 and math.abs(v) < 1e-30) then want[i] = got[i] end
    end
    T.values_close(got, want, 2e-5, 1e-6, name .. ": float32")
  end)
end

T.run("closed forms", function()
  local pi = math.pi
  local x = torch.tensor({ 1, 0.5 }, f64)
  T.values_close(torch.polygamma(1, x):tolist(), { pi ^ 2 / 6, pi ^ 2 / 2 }, 1e-14, 0, "trigamma(1) = pi^2/6, trigamma(1/2) = pi^2/2")
  T.close(torch.polygamma(2, x)[0]:item(), -2 * 1.2020569031595942, 1e-14, 0, "polygamma(2, 1) = -2 zeta(3)")
  T.close(torch.polygamma(3, x)[0]:item(), pi ^ 4 / 15, 1e-14, 0, "polygamma(3, 1) = pi^4/15")
  T.close(torch.digamma(torch.tensor({ 1.0 }, f64)):item(), -0.57721566490153286, 1e-14, 0, "digamma(1) = -gamma")
  local n = torch.tensor({ 5.0, 10.0, 20.0 }, f64)
  T.values_close(n:lgamma():exp():tolist(), { 24, 362880, 121645100408832000 }, 1e-13, 0, "Gamma(n) = (n-1)!")
  T.close(torch.tensor({ 0.5 }, f64):lgamma():item(), 0.5 * math.log(pi), 1e-14, 0, "Gamma(1/2) = sqrt(pi)")
  -- the gradient of digamma, by autograd through its composition, is trigamma
  local d = torch.tensor({ 1.0, 0.5, -0.5 }, f64):requires_grad_()
  d:digamma():sum():backward()
  T.values_close(d.grad:tolist(), { pi ^ 2 / 6, pi ^ 2 / 2, pi ^ 2 / 2 + 4 }, 1e-12, 0, "digamma's gradient")
  local y = torch.tensor({ -0.95, -0.4, 0.1, 0.6, 0.99 }, f64)
  T.tensor_close(y:erfinv():erf(), y, 1e-15, 1e-15, "erf(erfinv(y)) = y")
end)

T.run("gradients by finite differences", function()
  local function check(name, f, x)
    local ok, why = torch.autograd.gradcheck(f, { torch.tensor(x, f64):requires_grad_() }, { raise_exception = false })
    T.ok(ok, name .. ": gradcheck", why)
  end
  check("lgamma", function(a) return a:lgamma() end, { -2.3, -0.4, 0.3, 1.7, 12.0 })
  check("digamma", function(a) return a:digamma() end, { -2.3, -0.4, 0.3, 1.7, 12.0 })
  check("polygamma 1", function(a) return a:polygamma(1) end, { 0.3, 1.7, 12.0 })
  check("erfinv", function(a) return a:erfinv() end, { -0.9, -0.2, 0.5, 0.97 })
  check("erfc", function(a) return a:erfc() end, { -1.0, 0.5, 1.99, 2.01, 4.0 })
  check("sinc", function(a) return a:sinc() end, { -1.3, 0.4, 2.2 })
  check("log_ndtr", function(a) return S.log_ndtr(a) end, { -12.0, -2.5, 0.3, 4.0 })
  check("bessel_j0", S.bessel_j0, { -30.0, -3.7, 0.0, 0.4, 12.0, 26.0 })
  check("bessel_j1", S.bessel_j1, { -30.0, -3.7, 0.0, 0.4, 12.0, 26.0 })
  check("bessel_y0", S.bessel_y0, { 0.3, 5.0, 24.0, 27.0 })
  check("bessel_y1", S.bessel_y1, { 0.3, 5.0, 24.0, 27.0 })
  check("modified_bessel_k0", S.modified_bessel_k0, { 0.5, 1.9, 2.1, 10.0 })
  check("modified_bessel_k1", S.modified_bessel_k1, { 0.5, 1.9, 2.1, 10.0 })
  check("scaled_modified_bessel_k1", S.scaled_modified_bessel_k1, { 0.5, 1.9, 2.1, 10.0 })
  check("airy_ai", S.airy_ai, { -9.0, -3.0, 0.5, 3.0 })
  check("spherical_bessel_j0", S.spherical_bessel_j0, { -2.0, 0.0, 0.3, 4.0 })
  check("zeta in q", function(q) return S.zeta(3, q) end, { 0.5, 2.0, 12.0 })
  check("zeta in x", function(x) return S.zeta(x, 1.5) end, { 1.5, 2.0, 7.0 })
end)

T.run("torch.special's other names", function()
  local x = torch.tensor({ -1.5, 0.2, 3.0 }, f64)
  T.tensor_close(S.expit(x), x:sigmoid(), 0, 0, "expit")
  T.tensor_close(S.gammaln(x), x:lgamma(), 0, 0, "gammaln")
  T.tensor_close(S.erf(x), x:erf(), 0, 0, "erf")
  T.tensor_close(S.logsumexp(x, 0), x:logsumexp(0), 0, 0, "logsumexp")
  T.tensor_close(S.softmax(x, 0), x:softmax(0), 0, 0, "softmax")
  T.tensor_close(S.log1p(x:abs()), x:abs():log1p(), 0, 0, "log1p")
  T.tensor_close(x:abs():mvlgamma(1), x:abs():lgamma(), 0, 0, "mvlgamma with p 1 is lgamma")
end)

T.run("errors", function()
  local ints = torch.lgamma(torch.tensor({ 1, 4 }))
  T.is(ints.dtype, torch.float32, "an integer tensor: promoted to the default dtype, as PyTorch")
  T.values_close(ints:tolist(), { 0, math.log(6) }, 1e-6, 1e-6, "and its values")
  T.raises(function() torch.polygamma(-1, torch.ones(2)) end, "expected n to be a non%-negative integer, got %-1", "a negative n")
  T.raises(function() torch.polygamma(1.5, torch.ones(2)) end, "non%-negative integer, got 1.5", "a fractional n")
  T.raises(function() S.multigammaln(torch.ones(2), 0) end, "expected p to be a positive integer up to 2%^20, got 0", "p = 0")
  T.raises(function() S.gammainc("a", torch.ones(2)) end, "gammainc: expected a tensor, got string", "gammainc: a string")
  T.raises(function() S.chebyshev_polynomial_t(torch.ones(2), 2.5) end, "integer degree n, got 2.5", "a fractional degree")
  T.raises(function() S.legendre_polynomial_p(torch.ones(2), torch.tensor({ 1.5, 2 })) end, "expected integer degrees",
           "fractional degrees")
  T.raises(function() S.hermite_polynomial_h(torch.ones(2), 2 ^ 40) end, "above the largest supported, 10000",
           "a degree past the recurrence's bound")
  T.raises(function() S.laguerre_polynomial_l(torch.ones(2), "3") end, "expected n to be a number or a tensor",
           "a string degree")
  T.raises(function() S.multigammaln(torch.ones(2), 3) end, "all elements must be greater than %(p%-1%)/2 = 1", "x too small")
  T.raises(function() torch.polygamma(171, torch.ones(2)) end, "n is at most 170", "n too large")
  T.raises(function() S.erfcx("x") end, "erfcx: expected a tensor, got string", "not a tensor")
  T.ok(torch.polygamma(1, torch.tensor({ -0.5 })):isnan():item(), "polygamma below 0: NaN (documented)")
end)

T.done_testing()
