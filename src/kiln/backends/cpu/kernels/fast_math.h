// exp and tanh for the float32 elementwise kernels (eltwise, fused_eltwise, softmax, layernorm),
// written as plain arithmetic so that a loop calling them vectorises (a libm call per element
// keeps a loop scalar). Both are within a few float ulps of the correctly rounded result over the
// whole float range, with IEEE behaviour at the edges (overflow to inf, underflow to 0, NaN in
// NaN out).
//
// Those files start, before their includes, with
//
//   #pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math", "no-math-errno",
//                        "fp-contract=off")
//
// kiln builds at -O2, where GCC 12 vectorises only loops whose trip count it knows, so they ask
// for the dynamic cost model; without FP traps and errno (kiln reads neither) selects and sqrt
// vectorise too. No reassociation, and no contraction into FMAs (which GCC does by default in
// C++ wherever the target has FMA), so every element gets the same arithmetic whichever version
// and whichever part of a loop (vector body or remainder) computes it. The pragma comes before
// the includes because GCC does not inline a function compiled with other options (the inline
// functions of the headers included after it get the same ones).
//
// Their hottest loops are also compiled for AVX-512 and AVX2 besides the baseline (SSE2), the
// version chosen when the program loads by what the CPU has (GCC's target_clones): mark a free
// function with KILN_ELTWISE_CLONES. The versions compute the same bits: the lanes a loop keeps
// are the same whatever the vector width, and nothing is contracted.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KILN_ELTWISE_CLONES [[gnu::target_clones("avx512f", "avx2", "default")]]
#else
#define KILN_ELTWISE_CLONES
#endif

namespace kiln::cpu {

// e^x = 2^n e^r with n = round(x / ln 2) and |r| <= ln 2 / 2: returns the polynomial for e^r and
// sets n. The caller keeps x where 2^n can be built (fastExp clamps; expOfSmallNegative's range
// needs no clamping).
inline float expReduced(float x, float& n) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 rounded to 16 bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723e-6f;
  // Round to nearest by adding and subtracting 1.5 * 2^23.
  const float shifter = 12582912.0f;
  n = (x * kLog2e + shifter) - shifter;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p;
}

// e^x: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two parts so n ln2 is exact enough), e^r
// by its Taylor series to r^7 (truncation below 1e-8 relative on that interval), then 2^n
// applied through the exponent bits, in two halves so that n down to -149 (subnormal results)
// and up to 128 do not overflow the exponent field.
inline float fastExp(float x) {
  // Beyond these bounds the result is inf or 0; clamping keeps n in range. NaN fails both
  // comparisons and is clamped too (converting a NaN n to an integer is undefined behaviour);
  // the last line returns it.
  const float clamped = x > 88.8f ? 88.8f : (x >= -104.0f ? x : -104.0f);
  float n;
  const float p = expReduced(clamped, n);
  // 2^n as 2^(n/2) * 2^(n - n/2): each factor's exponent stays within float's normal range.
  const auto ni = static_cast<int32_t>(n);
  const int32_t half = ni / 2;
  const float scaleA = std::bit_cast<float>((half + 127) << 23);
  const float scaleB = std::bit_cast<float>((ni - half + 127) << 23);
  const float result = p * scaleA * scaleB;
  return x != x ? x : result;
}

// 1 / (1 + e^-x); saturates to 0 and 1 as the exact function does in float.
inline float fastSigmoid(float x) { return 1.0f / (1.0f + fastExp(-x)); }

// tanh x: an odd Taylor polynomial near 0, where 1 - 2 / (e^2x + 1) would cancel; that form
// elsewhere (it saturates to +-1 for large |x|).
inline float fastTanh(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float x2 = x * x;
  // x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835: below 2e-8 relative for |x| < 0.25.
  float p = 62.0f / 2835.0f;
  p = p * x2 - 17.0f / 315.0f;
  p = p * x2 + 2.0f / 15.0f;
  p = p * x2 - 1.0f / 3.0f;
  const float small = x + x * x2 * p;
  const float large = 1.0f - 2.0f / (fastExp(2.0f * ax) + 1.0f);
  const float signedLarge = x < 0.0f ? -large : large;
  return ax < 0.25f ? small : (x != x ? x : signedLarge);
}

// erf x, within 3 float ulps over the whole range (2 measured). Two Chebyshev interpolants,
// each written as a polynomial in a variable scaled to [-1, 1] and evaluated by Horner's rule
// (tools/fit_erf.py computes the coefficients and checks the error in float arithmetic):
//   |x| <= 1:      erf x = x * P(s), s = 2x^2 - 1, P of degree 6, fitted to erf(x) / x;
//   1 < |x| < 4:   erf x = 1 - e^(-x^2) * Q(s), s = (2|x| - 5) / 3, Q of degree 10, fitted to
//                  erfc(x) e^(x^2), which is smooth there (0.43 down to 0.14);
//   |x| >= 4:      +-1 (erfc 4 = 1.5e-8 is below half a float ulp of 1).
// Both branches are computed and one selected, so a loop over it vectorises.
inline float fastErf(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float x2 = x * x;
  const float s = 2.0f * x2 - 1.0f;
  float p = 1.2306054486543871e-06f;
  p = p * s - 1.766906825650949e-05f;
  p = p * s + 0.00021751354506704956f;
  p = p * s - 0.002285419497638941f;
  p = p * s + 0.019852496683597565f;
  p = p * s - 0.1405360996723175f;
  p = p * s + 0.9654687643051147f;
  const float small = x * p;
  const float clamped = ax > 4.0f ? 4.0f : ax;
  const float t = clamped * (2.0f / 3.0f) - 5.0f / 3.0f;
  float q = 9.294974006479606e-05f;
  q = q * t - 0.00024518644204363227f;
  q = q * t + 0.00037647728458978236f;
  q = q * t - 0.0009162725764326751f;
  q = q * t + 0.002418384188786149f;
  q = q * t - 0.005611233413219452f;
  q = q * t + 0.012486699968576431f;
  q = q * t - 0.026997936889529228f;
  q = q * t + 0.056110627949237823f;
  q = q * t - 0.1115213930606842f;
  q = q * t + 0.21080636978149414f;
  const float tail = ax >= 4.0f ? 1.0f : 1.0f - fastExp(-clamped * clamped) * q;
  const float large = x < 0.0f ? -tail : tail;
  return ax <= 1.0f ? small : (x != x ? x : large);
}

// e^x for x in [-36, 0], never NaN (converting a NaN n to an integer is undefined behaviour;
// fastGelu clamps its NaN to the range): fastExp's reduction and polynomial without the
// clamping and the split scaling that its whole range needs (2^n stays a normal float here).
inline float expOfSmallNegative(float x) {
  float n;
  const float p = expReduced(x, n);
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// GELU, x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, as x Phi(x) with Phi(-|x|) = erfc(a) / 2 =
// e^(-a^2) erfcx(a) / 2, a = |x| / sqrt 2: one polynomial (erfcx in t = 1 / (1 + a / 2), mapped
// to s = 3t - 2 over a in [0, 4]; beyond 4, erfcx(4)) and one exponential (its argument held
// above -36, where Phi(-|x|) is below 1e-16 already), where fastErf's two branches and full-range
// exponential cost half as much again in ConvNeXt's, ViT's and BERT's GELU epilogues. The
// negative tail does not cancel (1 + erf(u) lost its relative precision there).
// tools/fit_gelu.py recomputes the coefficients and checks the error: |fast - exact| <= 1.2e-7
// max(1, |x|) everywhere, and within 1.4e-6 relative where |GELU(x)| >= 1e-3.
inline float fastGelu(float x) {
  const float a = (x < 0.0f ? -x : x) * 0.70710678118654752f;
  const float clamped = a > 4.0f ? 4.0f : a;
  const float t = 1.0f / (1.0f + 0.5f * clamped);
  const float s = 3.0f * t - 2.0f;
  float p = 3.3354175684507936e-05f;
  p = p * s + 8.246862125815824e-05f;
  p = p * s - 0.000860445958096534f;
  p = p * s - 0.0015911838272586465f;
  p = p * s + 0.022509342059493065f;
  p = p * s + 0.14242486655712128f;
  p = p * s + 0.40981802344322205f;
  p = p * s + 0.42758363485336304f;
  const float tail = a <= 6.0f ? a : 6.0f;  // NaN to 6: the exponential's n stays defined
  const float half = 0.5f * expOfSmallNegative(-tail * tail) * p;  // Phi(-|x|)
  return x * (x < 0.0f ? half : 1.0f - half);
}

}  // namespace kiln::cpu
