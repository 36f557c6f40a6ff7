#!/usr/bin/python3
"""Writes tests/ref/special.lua: PyTorch's special functions (lgamma,
digamma, polygamma, erfinv, erfc, erfcx, sinc, xlog1py, entr, ndtr, ndtri,
log_ndtr, multigammaln, the modified Bessel functions i0, i0e, i1, i1e and
the orthogonal polynomials, gammainc and gammaincc) on fixed float64 inputs, with the gradient of their
sum where PyTorch has one; the Bessel functions J, Y and K, Airy's Ai and
the Hurwitz zeta from mpmath; for tests/lua/test_special.lua.
    cd scripts && /usr/bin/python3 gen_special_ref.py > ../tests/ref/special.lua
"""
import torch
import torch.special as S
from reflua import lua_value, print_cases

inf, nan = float("inf"), float("nan")
wide = [-3.7, -2.5, -1.2, -0.5, 0.1, 0.5, 1.0, 1.5, 2.0, 3.3, 7.5, 25.0, 150.0, 1e4]
bessel = [-35.0, -3.7, -0.5, 0.0, 0.1, 1.0, 2.5, 12.0, 29.5, 30.5, 80.0, 600.0]
unit = [-1.0, -0.9, -0.35, 0.0, 0.2, 0.5, 0.75, 1.0, 1.7, -2.5, 0.999, 3.0]
degrees = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1]
gamma_a = [0.5, 1.0, 2.0, 5.0, 10.0, 100.0, 3.0, 50.0, 0.1, 700.0, 1.5, 20.0]
gamma_x = [0.3, 1.0, 5.0, 2.0, 12.0, 95.0, 0.01, 60.0, 1e-5, 690.0, 40.0, 19.5]
edge_a = [0.0, 0.0, 2.0, -1.0, 3.0, inf, inf, 2.0]
edge_x = [1.0, 0.0, 0.0, 1.0, inf, 1.0, inf, -0.5]
cases = {  # name: (function, inputs, whether to record the gradient)
    "lgamma": (torch.lgamma, wide, True),
    "lgamma_poles": (torch.lgamma, [0.0, -1.0, -4.0], False),
    "digamma": (torch.digamma, wide, False),   # PyTorch's trigamma is good to ~1e-9: tested on its own
    "digamma_poles": (torch.digamma, [0.0, -1.0, -3.0], False),
    "polygamma_2": (lambda x: torch.polygamma(2, x), [0.1, 0.5, 1.0, 2.5, 7.0, 30.0], True),
    "polygamma_3": (lambda x: torch.polygamma(3, x), [0.1, 0.5, 1.0, 2.5, 7.0, 30.0], False),
    "erfc": (torch.erfc, [-3.0, -1.0, 0.0, 0.5, 1.9, 2.0, 2.5, 4.0, 6.0, 10.0, 26.0], True),
    "erfcx": (S.erfcx, [-3.0, -1.0, 0.0, 0.5, 1.9, 2.0, 2.5, 4.0, 6.0, 10.0, 26.0, 1e3], False),
    "erfinv": (torch.erfinv, [-0.999999, -0.9, -0.3, 0.0, 0.2, 0.7, 0.99, 0.9999999], True),
    "erfinv_edges": (torch.erfinv, [-1.0, 1.0, 1.5, -2.0], False),
    "sinc": (torch.sinc, [-2.5, -1.0, -0.3, 0.0, 1e-9, 0.5, 1.0, 3.7], True),
    "entr": (S.entr, [-1.0, 0.0, 0.3, 1.0, 2.5], False),
    "ndtr": (S.ndtr, [-40.0, -10.0, -3.0, 0.0, 1.5, 8.0], True),
    "ndtri": (S.ndtri, [1e-10, 0.01, 0.3, 0.5, 0.8, 0.999], True),
    "log_ndtr": (S.log_ndtr, [-40.0, -10.0, -3.0, -2.0, 0.0, 2.0, 8.0], True),
    "multigammaln_3": (lambda x: S.multigammaln(x, 3), [1.5, 2.0, 4.25, 10.0], True),
    "xlog1py": (lambda x: S.xlog1py(x, x.abs() * 2 - 0.5), [0.0, 0.3, 1.0, 2.5, -0.2], True),
    "i0": (torch.i0, bessel, True),
    "i0e": (S.i0e, bessel, True),
    "i1": (S.i1, bessel, True),
    "i1e": (S.i1e, bessel, True),
    "chebyshev_t_5": (lambda x: S.chebyshev_polynomial_t(x, 5), unit, False),
    "chebyshev_u_4": (lambda x: S.chebyshev_polynomial_u(x, 4), unit, False),
    "chebyshev_v_3": (lambda x: S.chebyshev_polynomial_v(x, 3), unit, False),
    "chebyshev_w_6": (lambda x: S.chebyshev_polynomial_w(x, 6), unit, False),
    "shifted_chebyshev_t_4": (lambda x: S.shifted_chebyshev_polynomial_t(x, 4), unit, False),
    "shifted_chebyshev_w_3": (lambda x: S.shifted_chebyshev_polynomial_w(x, 3), unit, False),
    "hermite_h_degrees": (lambda x: S.hermite_polynomial_h(x, torch.tensor(degrees)), unit, False),
    "hermite_he_6": (lambda x: S.hermite_polynomial_he(x, 6), unit, False),
    "laguerre_l_5": (lambda x: S.laguerre_polynomial_l(x, 5), unit, False),
    "legendre_p_degrees": (lambda x: S.legendre_polynomial_p(x, torch.tensor(degrees)), unit, False),
    "gammainc": (lambda x: S.gammainc(torch.tensor(gamma_a, dtype=x.dtype), x), gamma_x, True),
    "gammaincc": (lambda x: S.gammaincc(torch.tensor(gamma_a, dtype=x.dtype), x), gamma_x, True),
    "gammainc_edges": (lambda x: S.gammainc(torch.tensor(edge_a, dtype=x.dtype), x), edge_x, False),
    "gammaincc_edges": (lambda x: S.gammaincc(torch.tensor(edge_a, dtype=x.dtype), x), edge_x, False),
}

out = {}
for name, (f, values, grad) in cases.items():
    x = torch.tensor(values, dtype=torch.float64, requires_grad=grad)
    y = f(x)
    c = {"x": values, "y": y.tolist()}
    if grad:
        y.sum().backward()
        c["dx"] = x.grad.tolist()
    out[name] = c
# P(a, x) to 40 digits (mpmath), where PyTorch's own values for large a are
# good to about 1e-10
import mpmath
mpmath.mp.dps = 40
out["gammainc_exact"] = {"x": gamma_x,
                         "y": [float(mpmath.gammainc(a, 0, x, regularized=True)) for a, x in zip(gamma_a, gamma_x)]}
# d P(a, x) / d a (PyTorch has no gradient in a) to 40 digits
out["gammainc_da"] = {"x": gamma_x, "a": gamma_a,
                      "y": [float(mpmath.diff(lambda s: mpmath.gammainc(s, 0, x, regularized=True), a))
                            for a, x in zip(gamma_a, gamma_x)]}
# d x / d a of a Gamma(a, 1) draw x at its quantile, -(d P / d a) / density,
# to 40 digits: what the gamma family's rsample differentiates by (below and
# above a = 1000, where torch._standard_gamma_grad changes method)
sg_a = [0.5, 2.0, 30.0, 999.0, 1001.0, 1001.0, 1001.0, 1e4, 1e4, 1e5]
sg_x = [0.3, 3.5, 25.0, 1050.0, 1001.0, 1064.28, 937.72, 1e4, 10200.0, 99000.0]
out["standard_gamma_grad"] = {"x": sg_x, "a": sg_a, "y": [
    float(-mpmath.diff(lambda s: mpmath.gammainc(s, 0, x, regularized=True), a)
          / mpmath.exp((a - 1) * mpmath.log(x) - x - mpmath.loggamma(a))) for a, x in zip(sg_a, sg_x)]}
# the Bessel functions of the first and second kinds, K, Airy's Ai and the
# Hurwitz zeta to 30 digits (mpmath): PyTorch's own float64 values are off by
# up to 3e-11 (J) and 1e-10 (Ai) in places; its values at the edges (0,
# negative inputs, poles) as they are
mpmath.mp.dps = 30
jx = [-100.0, -30.0, -25.5, -3.7, -0.5, 1e-3, 0.1, 1.0, 2.404825557695773, 5.0, 12.0, 24.9, 25.1, 30.0, 80.0, 600.0]
yx = [1e-3, 0.1, 0.89, 1.0, 2.5, 5.0, 12.0, 24.9, 25.1, 30.0, 80.0, 600.0]
kx = [1e-3, 0.1, 1.0, 1.99, 2.01, 5.0, 12.0, 30.0, 80.0, 600.0]
ax = [-40.0, -10.0, -7.5, -7.01, -6.99, -6.5, -3.0, -1.0, 0.0, 0.5, 2.0, 2.09, 2.11, 5.0, 10.0, 30.0, 100.0]
zx = [1.5, 2.0, 3.0, 4.5, 10.0, 30.0, 2.0, 3.0, 2.5, 50.0]
zq = [1.0, 0.5, 2.0, 10.0, 0.1, 1.0, -1.5, -2.5, 1e3, 0.3]
exact = {
    "bessel_j0": (jx, lambda x: mpmath.besselj(0, x)),
    "bessel_j1": (jx, lambda x: mpmath.besselj(1, x)),
    "bessel_y0": (yx, lambda x: mpmath.bessely(0, x)),
    "bessel_y1": (yx, lambda x: mpmath.bessely(1, x)),
    "modified_bessel_k0": (kx, lambda x: mpmath.besselk(0, x)),
    "modified_bessel_k1": (kx, lambda x: mpmath.besselk(1, x)),
    "scaled_modified_bessel_k0": (kx, lambda x: mpmath.besselk(0, x) * mpmath.exp(x)),
    "scaled_modified_bessel_k1": (kx, lambda x: mpmath.besselk(1, x) * mpmath.exp(x)),
    "airy_ai": (ax, mpmath.airyai),
    "spherical_bessel_j0": ([-10.0, -1.0, 1e-5, 0.5, 3.14, 20.0], lambda x: mpmath.sin(x) / x),
}
for name, (xs, f) in exact.items():
    out[name] = {"x": xs, "y": [float(f(mpmath.mpf(v))) for v in xs]}
out["zeta"] = {"x": zx, "q": zq, "y": [float(mpmath.zeta(x, q)) for x, q in zip(zx, zq)]}
far = [inf, -inf, nan]
edges = {"bessel_j0": [0.0] + far, "bessel_j1": [0.0, -0.0] + far, "bessel_y0": [0.0, -1.0] + far,
         "bessel_y1": [0.0, -1.0] + far, "modified_bessel_k0": [0.0, -1.0] + far,
         "modified_bessel_k1": [0.0, -1.0] + far, "scaled_modified_bessel_k0": [0.0, -1.0] + far,
         "scaled_modified_bessel_k1": [0.0, -1.0] + far, "spherical_bessel_j0": [0.0] + far,
         "airy_ai": [200.0] + far}
for name, xs in edges.items():
    out[name + "_edges"] = {"x": xs, "y": getattr(S, name)(torch.tensor(xs, dtype=torch.float64)).tolist()}
ex, eq = [1.0, 0.5, 2.0, 2.0, 2.5, 0.9, inf, inf, inf], [1.0, 1.0, 0.0, -2.0, -1.5, 2.0, 1.0, 0.5, 2.0]
out["zeta_edges"] = {"x": ex, "q": eq,
                     "y": S.zeta(torch.tensor(ex, dtype=torch.float64), torch.tensor(eq, dtype=torch.float64)).tolist()}
print_cases("gen_special_ref.py", out, lua_value)
