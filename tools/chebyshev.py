"""Helpers shared by kiln's polynomial fits (tools/fit_erf.py, tools/fit_gelu.py): float32
rounding, Chebyshev interpolation written as monomials, and Horner's rule in float32."""
import math
import struct


def f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def chebyshev_monomials(f, n):
    """Interpolates f at n Chebyshev nodes of [-1, 1]; returns the polynomial's coefficients."""
    nodes = [math.cos(math.pi * (k + 0.5) / n) for k in range(n)]
    values = [f(x) for x in nodes]
    c = [2.0 / n * sum(values[k] * math.cos(math.pi * j * (k + 0.5) / n) for k in range(n))
         for j in range(n)]
    c[0] /= 2
    basis = [[1.0], [0.0, 1.0]]  # T_j in monomials
    for j in range(2, n):
        twice = [0.0] + [2 * v for v in basis[j - 1]]
        prev = basis[j - 2] + [0.0] * (len(twice) - len(basis[j - 2]))
        basis.append([a - b for a, b in zip(twice, prev)])
    mono = [0.0] * n
    for j in range(n):
        for i, v in enumerate(basis[j]):
            mono[i] += c[j] * v
    return mono


def horner32(coefficients, s):
    p = f32(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        p = f32(f32(p * s) + f32(c))
    return p
