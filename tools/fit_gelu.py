#!/usr/bin/env python3
"""Coefficients of kiln's fastGelu (src/kiln/backends/cpu/kernels/fast_math.h) and their error.

GELU(x) = x Phi(x), and Phi(-|x|) = erfc(a) / 2 with a = |x| / sqrt 2, written as
e^(-a^2) erfcx(a) / 2: one Chebyshev interpolant of erfcx on [0, A] and one exponential, so that
no branch of the formula is evaluated only to be thrown away, and the negative tail is not
1 + erf(u), which cancels. erfcx is interpolated in t = 1 / (1 + a / 2), which makes it nearly a
polynomial (8 coefficients where one in a itself needs 14), mapped to s = (2t - 1 - t0) / (1 - t0)
over [t0, 1], t0 = 1 / (1 + A / 2); beyond A, its value at A. The exponential's argument is
held above -36 (a <= 6). Phi(x) is that for x < 0 and 1
minus it for x >= 0.

Evaluates the float32 formula (each operation rounded to float; exp exact, as fastExp is within
a few ulps) on a grid over [-10, 10] against math.erf in double, and prints the worst error
|fast - exact| / max(1, |x|) (the criterion of tests/unit/cpu_fast_math_test.cc) and the worst
relative error where |GELU(x)| >= 1e-3.

  tools/fit_gelu.py [N [A]]     (fast_math.h uses 8 and 4: s = 3t - 2)
"""
import math
import sys

from chebyshev import chebyshev_monomials, f32, horner32


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    top = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    t0 = 1 / (1 + top / 2)

    def erfcx(s):  # at t = t0 + (s + 1) (1 - t0) / 2, a = 2 (1 / t - 1)
        t = t0 + (s + 1) * (1 - t0) / 2
        a = 2 * (1 / t - 1)
        return math.erfc(a) * math.exp(a * a)

    p = chebyshev_monomials(erfcx, n)
    scale, offset = f32(2 / (1 - t0)), f32((1 + t0) / (1 - t0))
    print(f"s = {scale!r} t - {offset!r}")

    def gelu32(x):
        x = f32(x)
        a = f32(abs(x) * f32(1 / math.sqrt(2)))
        clamped = min(a, f32(top))
        t = f32(1 / f32(1 + f32(0.5 * clamped)))
        s = f32(f32(scale * t) - offset)
        tail = min(a, f32(6))
        half = f32(f32(0.5 * f32(math.exp(-f32(tail * tail)))) * horner32(p, s))
        phi = half if x < 0 else f32(1 - half)
        return f32(x * phi)

    def exact(x):
        return 0.5 * x * math.erfc(-x / math.sqrt(2))

    worst = worst_rel = 0.0
    at = at_rel = 0.0
    for i in range(0, 200001):
        x = f32(-10 + 20 * i / 200000)
        e = exact(x)
        g = gelu32(x)
        err = abs(g - e) / max(1.0, abs(x))
        if err > worst:
            worst, at = err, x
        if abs(e) >= 1e-3 and abs(g - e) / abs(e) > worst_rel:
            worst_rel, at_rel = abs(g - e) / abs(e), x
    print(f"N {n} A {top}: worst |fast - exact| / max(1, |x|) {worst:.3g} at {at}, "
          f"worst relative error where |GELU| >= 1e-3 {worst_rel:.3g} at {at_rel}")
    print("erfcx polynomial, highest degree first:", ", ".join(repr(f32(c)) for c in reversed(p)))


if __name__ == "__main__":
    main()
