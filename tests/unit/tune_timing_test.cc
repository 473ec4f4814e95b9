// The tuner's timing statistics: the sign-test confidence interval of the median checked against
// binomial order statistics computed exactly here (integer binomial coefficients, not the
// implementation's log-gamma sums), the trial summary, the significance test between two trials,
// and the paired (interleaved) comparison.
#include "kiln/tune/timing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace kiln::tune {
namespace {

using Wide = unsigned __int128;

// The 1-based order statistics (l, u) of the distribution-free interval of the median: the
// largest k with P(miss) = 2 * P(Bin(n, 1/2) <= k - 1) <= 1 - confidence, giving
// [x_(k), x_(n-k+1)]; (1, n) when even k = 1 misses too often. Exact: the binomial coefficients
// are integers summed in 128 bits, compared with (1 - confidence) * 2^n.
std::pair<int, int> exactOrderStatistics(int n, double confidence) {
  // Row n of Pascal's triangle.
  std::vector<Wide> row{1};
  for (int i = 1; i <= n; ++i) {
    std::vector<Wide> next(row.size() + 1, 0);
    for (size_t j = 0; j < row.size(); ++j) {
      next[j] += row[j];
      next[j + 1] += row[j];
    }
    row = std::move(next);
  }
  const long double allowed = static_cast<long double>(1.0 - confidence) * std::ldexp(1.0L, n);
  int best = 0;
  Wide tail = 0;  // Σ C(n, i) for i < k
  for (int k = 1; k <= (n + 1) / 2; ++k) {
    tail += row[k - 1];
    if (2.0L * static_cast<long double>(tail) <= allowed) {
      best = k;
    } else {
      break;
    }
  }
  if (best == 0) return {1, n};
  return {best, n - best + 1};
}

// Distinct, strictly increasing values, so each order statistic is identifiable.
std::vector<double> sortedDistinct(int n) {
  std::vector<double> values;
  for (int i = 1; i <= n; ++i) values.push_back(100.0 + 0.5 * i * i);
  return values;
}

// x_(i), 1-based.
double orderStat(const std::vector<double>& sorted, int i) { return sorted[i - 1]; }

TEST(TuneTiming, ExactOrderStatisticsMatchHandDerivedCases) {
  // Checks of the test's own reference before it judges anything.
  // n = 10: 2 * P(X <= 1) = 2 * 11/1024 = 0.0215 <= 0.05, 2 * P(X <= 2) = 2 * 56/1024 = 0.109.
  EXPECT_EQ(exactOrderStatistics(10, 0.95), std::make_pair(2, 9));
  // n = 5: even 2 * P(X <= 0) = 2/32 = 0.0625 > 0.05.
  EXPECT_EQ(exactOrderStatistics(5, 0.95), std::make_pair(1, 5));
  // n = 100: 2 * P(X <= 39) = 0.0352, 2 * P(X <= 40) = 0.0569.
  EXPECT_EQ(exactOrderStatistics(100, 0.95), std::make_pair(40, 61));
}

TEST(TuneTiming, MedianIntervalOfTenIsSecondToNinth) {
  const std::vector<double> x = sortedDistinct(10);
  const auto [low, high] = medianConfidenceInterval(x, 0.95);
  EXPECT_DOUBLE_EQ(low, orderStat(x, 2));
  EXPECT_DOUBLE_EQ(high, orderStat(x, 9));
}

TEST(TuneTiming, MedianIntervalOfFiveIsTheWholeRange) {
  const std::vector<double> x = sortedDistinct(5);
  const auto [low, high] = medianConfidenceInterval(x, 0.95);
  EXPECT_DOUBLE_EQ(low, x.front());
  EXPECT_DOUBLE_EQ(high, x.back());
}

TEST(TuneTiming, MedianIntervalOfNineIsTheSmallestNarrowerThanTheRange) {
  // n = 8: 2 * P(X <= 0) = 2/256 fits, 2 * P(X <= 1) = 18/256 = 0.0703 does not: (1, 8).
  // n = 9: 2 * P(X <= 1) = 20/512 = 0.039 fits: (2, 8).
  const std::vector<double> eight = sortedDistinct(8);
  auto interval = medianConfidenceInterval(eight, 0.95);
  EXPECT_DOUBLE_EQ(interval.first, orderStat(eight, 1));
  EXPECT_DOUBLE_EQ(interval.second, orderStat(eight, 8));
  const std::vector<double> nine = sortedDistinct(9);
  interval = medianConfidenceInterval(nine, 0.95);
  EXPECT_DOUBLE_EQ(interval.first, orderStat(nine, 2));
  EXPECT_DOUBLE_EQ(interval.second, orderStat(nine, 8));
}

TEST(TuneTiming, MedianIntervalOfHundredIsFortiethToSixtyFirst) {
  const std::vector<double> x = sortedDistinct(100);
  auto [low, high] = medianConfidenceInterval(x, 0.95);
  EXPECT_DOUBLE_EQ(low, orderStat(x, 40));
  EXPECT_DOUBLE_EQ(high, orderStat(x, 61));
  // At 99%: 2 * P(X <= 36) = 0.0066 fits, 2 * P(X <= 37) = 0.0120 does not: [x_(37), x_(64)].
  std::tie(low, high) = medianConfidenceInterval(x, 0.99);
  EXPECT_DOUBLE_EQ(low, orderStat(x, 37));
  EXPECT_DOUBLE_EQ(high, orderStat(x, 64));
}

TEST(TuneTiming, MedianIntervalMatchesExactBinomialForEverySize) {
  for (double confidence : {0.80, 0.90, 0.95, 0.99}) {
    for (int n = 1; n <= 120; ++n) {
      SCOPED_TRACE("n=" + std::to_string(n) + " confidence=" + std::to_string(confidence));
      const std::vector<double> x = sortedDistinct(n);
      const auto [l, u] = exactOrderStatistics(n, confidence);
      const auto [low, high] = medianConfidenceInterval(x, confidence);
      EXPECT_DOUBLE_EQ(low, orderStat(x, l));
      EXPECT_DOUBLE_EQ(high, orderStat(x, u));
    }
  }
}

// The lower order statistic for large n, by a different route than the implementation's: the
// binomial pmf by the recurrence pmf(i) = pmf(i-1) * (n-i+1)/i in log space, accumulated once.
int largeNLowerOrderStatistic(int n, double confidence) {
  const double logAllowed = std::log((1 - confidence) / 2);
  double logPmf = -n * std::log(2.0);  // log pmf(0)
  double logCdf = logPmf;              // log P(X <= 0)
  int best = 0;
  for (int k = 1; k <= (n + 1) / 2; ++k) {
    if (logCdf > logAllowed) break;  // P(X <= k-1) too large for k
    best = k;
    logPmf += std::log(static_cast<double>(n - k + 1) / k);  // pmf(k)
    const double hi = std::max(logCdf, logPmf), lo = std::min(logCdf, logPmf);
    logCdf = hi + std::log1p(std::exp(lo - hi));  // P(X <= k)
  }
  return best;
}

// Regression (found in review): the interval once recomputed P(X <= k-1) from zero for every k,
// O(n²): 5.3 s for 30,000 samples, a minute for the 100,000 a 10 µs model gives in a second.
// The CDF is now accumulated (O(n)); this checks the large-n answer stays exact. (Speed is not
// asserted here: tests do not time things.)
TEST(TuneTiming, MedianIntervalOfManySamplesIsCorrect) {
  const int n = 30000;
  std::vector<double> x(n);
  for (int i = 0; i < n; ++i) x[i] = i + 1;  // x_(i) = i
  const int k = largeNLowerOrderStatistic(n, 0.95);
  // The normal approximation with continuity correction agrees: k - 1 <= n/2 - 1/2 - 1.96√n/2.
  EXPECT_EQ(k, 14830);
  const auto [low, high] = medianConfidenceInterval(x, 0.95);
  EXPECT_DOUBLE_EQ(low, k);
  EXPECT_DOUBLE_EQ(high, n - k + 1);
}

TEST(TuneTiming, AnalyzeKeepsSamplesInOrderAndSummarises) {
  const std::vector<double> samples{5, 1, 4, 2, 3, 9, 8, 7, 6, 10};
  const TrialTiming t = analyzeTimings(samples);
  EXPECT_EQ(t.samples, samples);  // measurement order, not sorted
  EXPECT_DOUBLE_EQ(t.confidence, 0.95);
  EXPECT_EQ(t.summary.count, 10);
  EXPECT_DOUBLE_EQ(t.summary.min, 1);
  EXPECT_DOUBLE_EQ(t.summary.max, 10);
  EXPECT_DOUBLE_EQ(t.summary.median, 5.5);
  EXPECT_DOUBLE_EQ(t.summary.mean, 5.5);
  // numpy: position 0.9 * 9 = 8.1 -> 9.1; 0.99 * 9 = 8.91 -> 9.91.
  EXPECT_NEAR(t.summary.p90, 9.1, 1e-12);
  EXPECT_NEAR(t.summary.p99, 9.91, 1e-12);
  // Sample standard deviation: Σ(x - 5.5)² = 82.5, / 9, square root.
  EXPECT_NEAR(t.summary.stddev, std::sqrt(82.5 / 9), 1e-12);
  // n = 10 at 95%: [x_(2), x_(9)] of 1..10.
  EXPECT_DOUBLE_EQ(t.ciLow, 2);
  EXPECT_DOUBLE_EQ(t.ciHigh, 9);
}

TEST(TuneTiming, AnalyzeUsesTheGivenConfidence) {
  std::vector<double> samples;
  for (int i = 100; i >= 1; --i) samples.push_back(i);  // descending: the interval needs a sort
  const TrialTiming t = analyzeTimings(samples, 0.99);
  EXPECT_DOUBLE_EQ(t.confidence, 0.99);
  EXPECT_DOUBLE_EQ(t.samples.front(), 100);
  EXPECT_DOUBLE_EQ(t.ciLow, 37);
  EXPECT_DOUBLE_EQ(t.ciHigh, 64);
  EXPECT_DOUBLE_EQ(t.summary.median, 50.5);
}

TEST(TuneTiming, AnalyzeOfNothingIsEmpty) {
  const TrialTiming t = analyzeTimings({});
  EXPECT_TRUE(t.samples.empty());
  EXPECT_EQ(t.summary.count, 0);
}

std::vector<double> range(double first, int count) {
  std::vector<double> values;
  for (int i = 0; i < count; ++i) values.push_back(first + i);
  return values;
}

TEST(TuneTiming, SignificantlyFasterOnlyWhenIntervalsAreDisjointBelow) {
  const TrialTiming baseline = analyzeTimings(range(10, 10));  // 10..19: [11, 18]
  ASSERT_DOUBLE_EQ(baseline.ciLow, 11);
  ASSERT_DOUBLE_EQ(baseline.ciHigh, 18);
  const TrialTiming fast = analyzeTimings(range(0, 10));  // [1, 8]
  EXPECT_TRUE(significantlyFaster(fast, baseline));
  EXPECT_FALSE(significantlyFaster(baseline, fast));             // the wrong direction
  const TrialTiming overlapping = analyzeTimings(range(5, 10));  // [6, 13]
  EXPECT_FALSE(significantlyFaster(overlapping, baseline));
  EXPECT_FALSE(significantlyFaster(baseline, overlapping));
  // Touching at one point is not "the whole interval below".
  const TrialTiming touching = analyzeTimings(range(3, 10));  // [4, 11]
  ASSERT_DOUBLE_EQ(touching.ciHigh, baseline.ciLow);
  EXPECT_FALSE(significantlyFaster(touching, baseline));
  const TrialTiming justBelow = analyzeTimings(range(2.9, 10));  // [3.9, 10.9]
  EXPECT_TRUE(significantlyFaster(justBelow, baseline));
  // A lower median alone is not enough: wide noise hides it.
  std::vector<double> noisy{1, 2, 3, 4, 5, 30, 31, 32, 33, 34};  // median 17.5, [2, 33]
  EXPECT_FALSE(significantlyFaster(analyzeTimings(noisy), baseline));
  EXPECT_FALSE(significantlyFaster(baseline, baseline));
}

TEST(TuneTiming, EmptyTimingsAreNeverSignificant) {
  const TrialTiming empty = analyzeTimings({});
  const TrialTiming baseline = analyzeTimings(range(10, 10));
  // The empty interval [0, 0] lies below any positive one; the count must decide.
  EXPECT_FALSE(significantlyFaster(empty, baseline));
  EXPECT_FALSE(significantlyFaster(baseline, empty));
  EXPECT_FALSE(significantlyFaster(empty, empty));
}

// Regression (found in review; was a bug in src/kiln/tune/timing.cc, significantlyFaster /
// medianConfidenceInterval): with too few samples to reach the confidence the interval falls back
// to the sample range, and the range of one sample is a point, so one faster sample against one
// slower sample is "significant"
// (`kiln tune --iterations 1 --duration 0` measures exactly that). The range of n samples covers
// the median with probability only 1 - 2^(1-n) (50% for n = 2 against a claimed 95%).
// Significance needs at least enough samples to reach the confidence: 6 at 95%.
TEST(TuneTiming, TooFewSamplesToReachTheConfidenceAreNeverSignificant) {
  const TrialTiming one = analyzeTimings({8.0});
  const TrialTiming otherOne = analyzeTimings({10.0});
  EXPECT_FALSE(significantlyFaster(one, otherOne)) << "one sample each cannot be significant";
  const TrialTiming fewFast = analyzeTimings({1, 2, 3, 4, 5});  // n = 5 < 6
  const TrialTiming fewSlow = analyzeTimings({11, 12, 13, 14, 15});
  EXPECT_FALSE(significantlyFaster(fewFast, fewSlow))
      << "5 samples cannot reach 95% (the range covers the median with probability 0.9375)";
}

TEST(TuneTiming, PairedComparisonOfHandMadeRatios) {
  // Baselines of 1 and 2 ms divide exactly, so the ratios are these values bit for bit.
  const std::vector<double> ratios{0.84, 0.92, 0.80, 0.88, 0.95, 0.81, 0.90, 0.86, 0.99, 0.83};
  std::vector<double> candidate, baseline;
  for (size_t i = 0; i < ratios.size(); ++i) {
    const double base = i % 2 ? 2.0 : 1.0;
    baseline.push_back(base);
    candidate.push_back(ratios[i] * base);
  }
  const PairedComparison c = comparePaired(candidate, baseline);
  // Sorted: 0.80 0.81 0.83 0.84 0.86 0.88 0.90 0.92 0.95 0.99.
  EXPECT_EQ(c.pairs, 10);
  EXPECT_DOUBLE_EQ(c.confidence, 0.95);
  EXPECT_NEAR(c.ratioMedian, (0.86 + 0.88) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(c.ratioLow, 0.81);   // x_(2)
  EXPECT_DOUBLE_EQ(c.ratioHigh, 0.95);  // x_(9)
  EXPECT_TRUE(c.significantlyFaster());
  EXPECT_NEAR(c.speedup(), 2 / (0.86 + 0.88), 1e-12);
  EXPECT_NEAR(c.speedupLow(), 1 / 0.95, 1e-12);
  EXPECT_NEAR(c.speedupHigh(), 1 / 0.81, 1e-12);
}

TEST(TuneTiming, PairedComparisonCancelsDrift) {
  // The machine slows down fourfold over the run; the candidate is always 0.9x its neighbour.
  // Unpaired, the two sets overlap completely; paired, the ratio is exactly 0.9.
  std::vector<double> candidate, baseline;
  for (int i = 0; i < 40; ++i) {
    const double machine = 10.0 * (1.0 + 3.0 * i / 39.0) + (i % 3) * 0.7;
    baseline.push_back(machine);
    candidate.push_back(0.9 * machine);
  }
  const PairedComparison c = comparePaired(candidate, baseline);
  EXPECT_EQ(c.pairs, 40);
  EXPECT_NEAR(c.ratioMedian, 0.9, 1e-12);
  EXPECT_NEAR(c.ratioLow, 0.9, 1e-12);
  EXPECT_NEAR(c.ratioHigh, 0.9, 1e-12);
  EXPECT_TRUE(c.significantlyFaster());
  EXPECT_NEAR(c.speedup(), 1 / 0.9, 1e-12);
  EXPECT_FALSE(significantlyFaster(analyzeTimings(candidate), analyzeTimings(baseline)));
}

TEST(TuneTiming, PairedNoiseCentredOnOneIsNotSignificant) {
  // Ratios 0.95 .. 1.05 symmetric around 1, interleaved.
  std::vector<double> candidate, baseline;
  for (int i = 0; i < 21; ++i) {
    const double ratio = 1.0 + ((i * 5) % 21 - 10) * 0.005;  // a permutation of -10..10
    baseline.push_back(4.0);
    candidate.push_back(4.0 * ratio);
  }
  const PairedComparison c = comparePaired(candidate, baseline);
  EXPECT_EQ(c.pairs, 21);
  EXPECT_NEAR(c.ratioMedian, 1.0, 1e-12);
  EXPECT_LT(c.ratioLow, 1.0);
  EXPECT_GT(c.ratioHigh, 1.0);
  EXPECT_FALSE(c.significantlyFaster());
  // n = 21 at 95%: 2 * P(X <= 5) = 0.0266 fits, 2 * P(X <= 6) = 0.0784 does not: [x_(6), x_(16)]
  // of 0.95, 0.955, ..., 1.05, i.e. 0.975 and 1.025.
  EXPECT_NEAR(c.ratioLow, 0.975, 1e-12);
  EXPECT_NEAR(c.ratioHigh, 1.025, 1e-12);
}

TEST(TuneTiming, PairedSlowerCandidateIsNotSignificant) {
  std::vector<double> candidate, baseline;
  for (int i = 0; i < 20; ++i) {
    baseline.push_back(10.0 + i % 4);
    candidate.push_back(1.25 * (10.0 + i % 4));
  }
  const PairedComparison c = comparePaired(candidate, baseline);
  EXPECT_NEAR(c.ratioMedian, 1.25, 1e-12);
  EXPECT_FALSE(c.significantlyFaster());
  EXPECT_NEAR(c.speedup(), 0.8, 1e-12);
}

TEST(TuneTiming, PairedMismatchedOrEmptyIsNoComparison) {
  const PairedComparison mismatched = comparePaired({1, 1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2});
  EXPECT_EQ(mismatched.pairs, 0);
  EXPECT_FALSE(mismatched.significantlyFaster());
  EXPECT_DOUBLE_EQ(mismatched.ratioMedian, 1);
  EXPECT_DOUBLE_EQ(mismatched.speedup(), 1);
  const PairedComparison empty = comparePaired({}, {});
  EXPECT_EQ(empty.pairs, 0);
  EXPECT_FALSE(empty.significantlyFaster());
}

}  // namespace
// The drift margin: a gain must clear the baseline's own move between trials as well.
TEST(TuneTiming, DriftWidensTheMarginAGainMustClear) {
  std::vector<double> base, gain;
  for (int i = 0; i < 40; ++i) {
    base.push_back(10.0 + 0.001 * i);  // interval around 10.01-10.03
    gain.push_back(9.5 + 0.001 * i);   // 5% faster
  }
  const TrialTiming b = analyzeTimings(base);
  const TrialTiming g = analyzeTimings(gain);
  EXPECT_TRUE(significantlyFaster(g, b));
  EXPECT_TRUE(significantlyFaster(g, b, 0.02));   // 5% clears a 2% drift
  EXPECT_FALSE(significantlyFaster(g, b, 0.06));  // but not a 6% one
  EXPECT_TRUE(significantlyFaster(g, b, -0.5));   // a negative drift is no margin, not a bonus
  EXPECT_FALSE(significantlyFaster(b, g, 0.0));
}

}  // namespace kiln::tune
