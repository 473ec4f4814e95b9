#!/usr/bin/env python3
"""Coefficients of kiln's fastErf (src/kiln/backends/cpu/kernels/fast_math.h) and their error.

Two Chebyshev interpolants, computed in double and written as polynomials in a variable scaled
to [-1, 1]:
  |x| <= 1:     erf(x) / x as a function of y = x^2, s = 2y - 1       (NA coefficients)
  1 < |x| < 4:  erfc(x) e^(x^2), s = (2|x| - 5) / 3                   (NB coefficients)
Then evaluates the float32 formula (Horner's rule, each operation rounded to float) on a fine
grid over [0, 5] against math.erf and prints the worst absolute and ulp error.

  tools/fit_erf.py [NA NB]     (fast_math.h uses 7 and 11: at most 2.1 ulp)
"""
import math
import sys

from chebyshev import chebyshev_monomials, f32, horner32

LO, HI = 1.0, 4.0


def main():
    na = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    nb = int(sys.argv[2]) if len(sys.argv) > 2 else 11

    def small(s):  # erf(x) / x at y = x^2 = (s + 1) / 2
        y = (s + 1) / 2
        return math.erf(math.sqrt(y)) / math.sqrt(y) if y > 0 else 2 / math.sqrt(math.pi)

    def large(s):  # erfc(x) e^(x^2) at x = (3s + 5) / 2
        x = (s * (HI - LO) + (LO + HI)) / 2
        return math.erfc(x) * math.exp(x * x)

    pa = chebyshev_monomials(small, na)
    pb = chebyshev_monomials(large, nb)

    def erf32(x):
        x = f32(x)
        ax = abs(x)
        if ax <= LO:
            return f32(x * horner32(pa, f32(f32(2 * f32(x * x)) - 1)))
        if ax >= HI:
            return math.copysign(1.0, x)
        t = f32(f32(ax * f32(2 / 3)) - f32(5 / 3))
        tail = f32(1 - f32(f32(math.exp(-f32(ax * ax))) * horner32(pb, t)))
        return math.copysign(tail, x)

    worst_abs = worst_ulp = 0.0
    for i in range(0, 5 * 4096):
        x = i / 4096
        ref = math.erf(x)
        err = abs(erf32(x) - ref)
        ulp = 2.0 ** (math.frexp(ref)[1] - 24) if ref else 2.0 ** -149
        worst_abs = max(worst_abs, err)
        worst_ulp = max(worst_ulp, err / ulp)
    print(f"NA {na} NB {nb}: worst abs error {worst_abs:.3g}, worst {worst_ulp:.2f} ulp")
    print("P (|x| <= 1), highest degree first:", ", ".join(repr(f32(c)) for c in reversed(pa)))
    print("Q (1 < |x| < 4), highest degree first:", ", ".join(repr(f32(c)) for c in reversed(pb)))


if __name__ == "__main__":
    main()
