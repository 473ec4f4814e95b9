// The vectorisable transcendental functions of the CPU kernels (fast_math.h) against libm in
// double precision: error in float ulps over dense grids, and IEEE behaviour at the edges.
#include "kiln/backends/cpu/kernels/fast_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace kiln::cpu {
namespace {

// |got - want| in units of the last place of float at `want`.
double ulps(float got, double want) {
  if (std::isinf(want)) return got == want ? 0 : std::numeric_limits<double>::infinity();
  const double unit = want == 0 ? std::ldexp(1.0, -149)
                                : std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(static_cast<double>(got) - want) / std::max(unit, std::ldexp(1.0, -149));
}

struct Worst {
  double ulps = 0;
  float at = 0;
};

Worst worstOver(float lo, float hi, int steps, const std::function<float(float)>& fast,
                const std::function<double(double)>& exact) {
  Worst worst;
  for (int i = 0; i <= steps; ++i) {
    const float x = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(steps);
    const double e = ulps(fast(x), exact(x));
    if (e > worst.ulps) worst = {e, x};
  }
  return worst;
}

TEST(FastMath, ErfIsWithinThreeUlpsEverywhere) {
  const Worst worst = worstOver(-6.0f, 6.0f, 600001, fastErf, [](double x) { return std::erf(x); });
  EXPECT_LE(worst.ulps, 3.0) << "at x = " << worst.at;
  // Tiny arguments: erf x = 2x / sqrt(pi) to float precision.
  const Worst tiny = worstOver(-1e-6f, 1e-6f, 2001, fastErf, [](double x) { return std::erf(x); });
  EXPECT_LE(tiny.ulps, 3.0) << "at x = " << tiny.at;
}

TEST(FastMath, ErfEdges) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fastErf(0.0f), 0.0f);
  EXPECT_EQ(fastErf(kInf), 1.0f);
  EXPECT_EQ(fastErf(-kInf), -1.0f);
  EXPECT_EQ(fastErf(4.0f), 1.0f);
  EXPECT_EQ(fastErf(-100.0f), -1.0f);
  EXPECT_TRUE(std::isnan(fastErf(std::numeric_limits<float>::quiet_NaN())));
  // Odd.
  for (float x : {0.3f, 0.999f, 1.0f, 1.001f, 2.5f, 3.99f}) EXPECT_EQ(fastErf(-x), -fastErf(x));
}

TEST(FastMath, GeluIsCloseToTheExactFunction) {
  const auto exact = [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); };
  // Relative error is loose only where GELU crosses zero at large negative x (it underflows
  // towards -0 there); compare absolutely against the output's scale instead.
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -10.0f + 20.0f * static_cast<float>(i) / 200000.0f;
    worst = std::max(worst, std::fabs(fastGelu(x) - exact(x)) /
                                std::max(1.0, std::fabs(static_cast<double>(x))));
  }
  EXPECT_LE(worst, 2e-7);
}

// Where GELU's output is not negligible (|GELU(x)| >= 1e-3, so down to x = -3.4), its relative
// error stays small in the negative tail too: Phi(-|x|) comes from erfc's own formula, not from
// 1 + erf(u), which cancels there.
TEST(FastMath, GeluKeepsItsRelativePrecisionInTheNegativeTail) {
  const auto exact = [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); };
  double worst = 0;
  float at = 0;
  for (int i = 0; i <= 100000; ++i) {
    const float x = -6.0f + 12.0f * static_cast<float>(i) / 100000.0f;
    const double e = exact(x);
    if (std::fabs(e) < 1e-3) continue;
    const double relative = std::fabs(fastGelu(x) - e) / std::fabs(e);
    if (relative > worst) {
      worst = relative;
      at = x;
    }
  }
  EXPECT_LE(worst, 2e-6) << "at x = " << at;
  EXPECT_EQ(fastGelu(0.0f), 0.0f);
  EXPECT_EQ(fastGelu(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(fastGelu(100.0f), 100.0f);
  EXPECT_LE(std::fabs(fastGelu(-100.0f)), 1e-12f);
  EXPECT_TRUE(std::isnan(fastGelu(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastMath, ExpAndTanhAreWithinFewUlps) {
  const Worst exp =
      worstOver(-100.0f, 88.0f, 400001, fastExp, [](double x) { return std::exp(x); });
  EXPECT_LE(exp.ulps, 3.0) << "at x = " << exp.at;
  const Worst tanh =
      worstOver(-12.0f, 12.0f, 400001, fastTanh, [](double x) { return std::tanh(x); });
  // Just above |x| = 0.25, where fastTanh leaves its polynomial, 1 - 2 / (e^2x + 1) loses about
  // two bits to cancellation: 4.3 ulps measured there, 2 elsewhere.
  EXPECT_LE(tanh.ulps, 5.0) << "at x = " << tanh.at;
  EXPECT_EQ(fastExp(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fastExp(-200.0f), 0.0f);
  EXPECT_EQ(fastTanh(30.0f), 1.0f);
  EXPECT_EQ(fastTanh(-30.0f), -1.0f);
}

}  // namespace
}  // namespace kiln::cpu
