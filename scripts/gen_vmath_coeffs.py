#!/usr/bin/python3
"""Prints the polynomial coefficients of src/cpu/vmath.h, as float32
literals, highest degree first (Horner's order), with each fit's largest
error.

    /usr/bin/python3 scripts/gen_vmath_coeffs.py

Each is mpmath's Chebyshev interpolation (chebyfit, near-minimax) of a
smooth function on an interval, at 40 digits:
  exp   q(r) = (e^r - 1 - r) / r^2 on [-ln2/2, ln2/2], degree 4
        (e^r = 1 + r + r^2 q(r))
  tanh  t(s) = (tanh(x) - x) / x^3 with s = x^2 on [0, 0.55^2], degree 4
        (tanh(x) = x + x^3 t(x^2))
  log   R(z) = (atanh(s) / s - 1) / z with z = s^2 on [0, s_max^2],
        s_max = (sqrt2 - 1) / (sqrt2 + 1), degree 2
        (log(1 + f) = 2s (1 + z R(z)) with s = f / (2 + f))
  erf   p(s) = erf(x) / x with s = x^2 on [0, 0.921875^2], degree 5
        (erf(x) = x p(x^2))
  erfc  g(t) = erfc(x) e^(x^2) with t = 1/x on [1/4, 1/0.921875], degree 9
        (erf(x) = 1 - e^(-x^2) g(1/x) for 0.921875 <= x <= 4)
vmath.h's error bounds come from tests/c/vmath_test.c, which measures
the functions as compiled, float rounding included.
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 40


def at_zero(f, limit):
    """f, with its limit at 0 where the formula divides by 0."""
    return lambda v: limit if v == 0 else f(v)


def exp_q(r):
    return (mp.exp(r) - 1 - r) / r ** 2


def tanh_t(s):
    x = mp.sqrt(s)
    return (mp.tanh(x) - x) / x ** 3


def log_r(z):
    s = mp.sqrt(z)
    return (mp.atanh(s) / s - 1) / z


def erf_p(s):
    x = mp.sqrt(s)
    return mp.erf(x) / x


def erfc_g(t):
    x = 1 / t
    return mp.erfc(x) * mp.exp(x * x)


FITS = [
    ("exp", at_zero(exp_q, mp.mpf(1) / 2), [-mp.log(2) / 2, mp.log(2) / 2], 5),
    ("tanh", at_zero(tanh_t, -mp.mpf(1) / 3), [0, mp.mpf("0.55") ** 2], 5),
    ("log", at_zero(log_r, mp.mpf(1) / 3), [0, ((mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)) ** 2], 3),
    ("erf", at_zero(erf_p, 2 / mp.sqrt(mp.pi)), [0, mp.mpf("0.921875") ** 2], 6),
    ("erfc", erfc_g, [mp.mpf(1) / 4, 1 / mp.mpf("0.921875")], 10),
]


def main():
    for name, f, interval, n in FITS:
        coeffs, err = mp.chebyfit(f, interval, n, error=True)
        lits = ", ".join("%.9ef" % float(np.float32(float(c))) for c in coeffs)
        print("%-5s largest error %.3g: %s" % (name, float(err), lits))


main()
