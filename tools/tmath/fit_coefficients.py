#!/usr/bin/env python3
"""Regenerates the polynomial coefficients of runtime/tmath.h.

Not part of the build (needs `pip install mpmath numpy`). Each kernel is a
weighted minimax fit: Lawson's iteratively reweighted least squares on
Chebyshev nodes, with the target function evaluated by mpmath at 40 digits.
The coefficients are then rounded to float one at a time, lowest order first,
refitting the remaining ones after each rounding, so later coefficients absorb
the rounding of earlier ones.

  python3 tools/tmath/fit_coefficients.py [kernel ...]

prints, per kernel, the float coefficients (C hex literals, lowest order
first) and the weighted max error of the rounded polynomial. The weight makes
the error relative to the quantity the kernel finally contributes to (e.g.
relative to expm1(r) for Q in r + r^2*Q(r)).
"""
import sys

import mpmath as mp
import numpy as np

mp.mp.dps = 40


def f32(v):
    return float(np.float32(float(v)))


def nodes(a, b, n):
    k = np.arange(n)
    return np.sort(0.5 * (a + b) + 0.5 * (b - a) * np.cos(np.pi * (k + 0.5) / n))


def lawson(X, g, w, powers, iters=300):
    """min over c of max_i |w_i (sum_k c_k X_i^p_k - g_i)|."""
    A = np.stack([X**p for p in powers], axis=1) * w[:, None]
    gw = g * w
    u = np.ones(len(X)) / len(X)
    best = None
    for _ in range(iters):
        sq = np.sqrt(u)
        c, *_ = np.linalg.lstsq(A * sq[:, None], gw * sq, rcond=None)
        e = np.abs(A @ c - gw)
        if best is None or e.max() < best[0]:
            best = (e.max(), c)
        u = u * e
        u /= u.sum()
    return best[1]


def fit(g, w, a, b, degree, n=3000):
    X = nodes(a, b, n)
    G = np.array([float(g(mp.mpf(float(x)))) for x in X])
    W = np.array([float(w(mp.mpf(float(x)))) for x in X])
    powers = list(range(degree + 1))
    coeffs = []
    rest = G.copy()
    for i, p in enumerate(powers):
        c = lawson(X, rest, W, powers[i:])
        coeffs.append(f32(c[0]))
        rest = rest - coeffs[-1] * X**p
    P = sum(c * X**p for c, p in zip(coeffs, powers))
    return coeffs, float(np.abs((P - G) * W).max())


def sq(s):
    return mp.sqrt(s)


C_ERF_MID = 1.125
C_ERF_LARGE = 2.7
C_ERFINV_TAIL = 3.125


def erfinv_y(w):  # y with -log(1 - y^2) = w
    return mp.sqrt(-mp.expm1(-w))


def erfinv_ratio(w):  # erfinv(y)/y as a function of w
    if w == 0:
        return mp.sqrt(mp.pi) / 2
    y = erfinv_y(w)
    return mp.erfinv(y) / y


KERNELS = {
    # expm1(r) = r + r^2 Q(r), |r| <= ln2/2 (+ margin); shared by exp/expm1.
    "expm1_q": lambda: fit(
        lambda r: (mp.expm1(r) - r) / r**2 if r != 0 else mp.mpf(1) / 2,
        lambda r: r**2 / abs(mp.expm1(r)) if r != 0 else 0,
        -float(mp.log(2) / 2) - 1e-4, float(mp.log(2) / 2) + 1e-4, 5),
    # log1p(f) = f + f^2 P(f), f in [sqrt(1/2)-1, sqrt(2)-1].
    "log1p_tail": lambda: fit(
        lambda f: (mp.log1p(f) - f) / f**2 if f != 0 else -mp.mpf(1) / 2,
        lambda f: f**2 / abs(mp.log1p(f)) if f != 0 else 0,
        float(mp.sqrt(0.5) - 1) - 1e-7, float(mp.sqrt(2) - 1) + 1e-7, 8),
    # tanh(a) = a + a^3 P(a^2), a in [0, 1]; variable s = a^2.
    "tanh": lambda: fit(
        lambda s: (mp.tanh(sq(s)) - sq(s)) / sq(s)**3 if s != 0 else -mp.mpf(1) / 3,
        lambda s: sq(s)**3 / mp.tanh(sq(s)) if s != 0 else 0, 0, 1.0, 7),
    # erf(a) = a + a P(a^2), a in [0, 0.75].
    "erf_small": lambda: fit(
        lambda s: mp.erf(sq(s)) / sq(s) - 1 if s != 0 else 2 / mp.sqrt(mp.pi) - 1,
        lambda s: sq(s) / mp.erf(sq(s)) if s != 0 else mp.sqrt(mp.pi) / 2, 0, 0.75**2, 5),
    # erf(1.125 + t) = erf(1.125) + t M(t), |t| <= 0.375.
    "erf_mid": lambda: fit(
        lambda t: (mp.erf(C_ERF_MID + t) - mp.erf(C_ERF_MID)) / t if t != 0
        else 2 / mp.sqrt(mp.pi) * mp.exp(-C_ERF_MID**2),
        lambda t: t / mp.erf(C_ERF_MID + t), -0.375, 0.375, 7),
    # log(erfc(2.7 + u)), a in [1.5, 3.925]; weight erfc = error in erf.
    "erf_large": lambda: fit(
        lambda u: mp.log(mp.erfc(u + C_ERF_LARGE)), lambda u: mp.erfc(u + C_ERF_LARGE),
        1.5 - C_ERF_LARGE, 3.925 - C_ERF_LARGE, 6),
    # erfinv(y)/y = sqrt(pi)/2 + w P(w), w = -log(1-y^2) in [0, 5].
    "erfinv_central": lambda: fit(
        lambda w: (erfinv_ratio(w) - mp.sqrt(mp.pi) / 2) / w if w > 1e-12
        else mp.sqrt(mp.pi) / 2 * mp.pi / 12,
        lambda w: w / erfinv_ratio(w), 0, 5.0, 8, n=1500),
    # erfinv(y) = Q(sqrt(w) - 3.125), w in [5, 15.97] (|y| up to 1 - 2^-24).
    "erfinv_tail": lambda: fit(
        lambda u: mp.erfinv(erfinv_y((u + C_ERFINV_TAIL)**2)),
        lambda u: 1 / mp.erfinv(erfinv_y((u + C_ERFINV_TAIL)**2)),
        float(mp.sqrt(5)) - C_ERFINV_TAIL, float(mp.sqrt(15.97)) - C_ERFINV_TAIL, 7, n=1500),
    # sin(pi r) = r (pi + s P(s)), cos(pi r) = 1 + s Q(s), s = r^2 <= 1/16.
    "sinpi": lambda: fit(
        lambda s: (mp.sin(mp.pi * sq(s)) / sq(s) - mp.pi) / s if s != 0 else -mp.pi**3 / 6,
        lambda s: s * sq(s) / mp.sin(mp.pi * sq(s)) if s != 0 else 0, 0, 1 / 16, 3),
    "cospi": lambda: fit(
        lambda s: (mp.cos(mp.pi * sq(s)) - 1) / s if s != 0 else -mp.pi**2 / 2,
        lambda s: s / mp.cos(mp.pi * sq(s)), 0, 1 / 16, 3),
    # sin(r) = r + r^3 P(s), cos(r) = 1 - s/2 + s^2 Q(s), |r| <= 1.06.
    "sin": lambda: fit(
        lambda s: (mp.sin(sq(s)) - sq(s)) / sq(s)**3 if s != 0 else -mp.mpf(1) / 6,
        lambda s: s * sq(s) / mp.sin(sq(s)) if s != 0 else 0, 0, 1.06**2, 4),
    "cos": lambda: fit(
        lambda s: (mp.cos(sq(s)) - 1 + s / 2) / s**2 if s != 0 else mp.mpf(1) / 24,
        lambda s: s * s / mp.cos(sq(s)), 0, 1.06**2, 3),
}


def split(v):
    hi = f32(v)
    return hi, f32(v - hi)


def main():
    names = sys.argv[1:] or list(KERNELS)
    for name in names:
        coeffs, err = KERNELS[name]()
        print("%s: weighted max error %.3g (2^%.1f)" % (name, err, np.log2(err)))
        print("  " + ", ".join("%sf" % c.hex().replace("0000000p", "p")
                               for c in coeffs))
    print("constants:")
    for label, v in [("ln2 (16-bit hi, lo)", None), ("pi", mp.pi), ("pi/2", mp.pi / 2),
                     ("sqrt(pi)/2", mp.sqrt(mp.pi) / 2), ("erf(1.125)", mp.erf(C_ERF_MID))]:
        if v is None:
            hi = mp.mpf("0.693145751953125")
            print("  %s: %s %s" % (label, f32(hi).hex(), f32(mp.log(2) - hi).hex()))
            continue
        hi, lo = split(v)
        print("  %s: %s %s" % (label, hi.hex(), lo.hex()))
    a, b = split(mp.pi / 2)
    print("  pi/2 third part: %s" % f32(mp.pi / 2 - a - b).hex())


if __name__ == "__main__":
    main()
