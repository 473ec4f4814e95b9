// Timing statistics: order-statistic confidence intervals of the median and paired comparisons.
#include "kiln/tune/timing.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace kiln::tune {

namespace {

// log P(X = i) for X ~ Binomial(n, 1/2).
double logBinomialHalfPmf(int n, int i) {
  return std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0);
}

}  // namespace

bool intervalReachesConfidence(int n, double confidence) {
  return n > 0 && 2 * std::exp(n * std::log(0.5)) <= 1 - confidence;
}

bool TrialTiming::reachesConfidence() const {
  return intervalReachesConfidence(summary.count, confidence);
}

bool PairedComparison::reachesConfidence() const {
  return intervalReachesConfidence(pairs, confidence);
}

std::pair<double, double> medianConfidenceInterval(const std::vector<double>& sorted,
                                                   double confidence) {
  const int n = static_cast<int>(sorted.size());
  if (n == 0) return {0, 0};
  const double alpha = 1 - confidence;
  // The interval [x_(k), x_(n-k+1)] (1-based) misses the median with probability
  // 2 * P(X <= k-1); take the largest k that keeps that within alpha. The CDF is accumulated
  // as k grows, so this is linear in n.
  int best = 0;
  double cdf = 0;  // P(X <= k-1)
  for (int k = 1; k <= (n + 1) / 2; ++k) {
    cdf += std::exp(logBinomialHalfPmf(n, k - 1));
    if (2 * cdf > alpha) break;
    best = k;
  }
  if (best == 0) return {sorted.front(), sorted.back()};
  return {sorted[best - 1], sorted[n - best]};
}

TrialTiming analyzeTimings(std::vector<double> samples, double confidence) {
  TrialTiming timing;
  timing.confidence = confidence;
  timing.summary = summarize(samples);
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  std::tie(timing.ciLow, timing.ciHigh) = medianConfidenceInterval(sorted, confidence);
  timing.samples = std::move(samples);
  return timing;
}

bool significantlyFaster(const TrialTiming& candidate, const TrialTiming& baseline, double drift) {
  if (!candidate.reachesConfidence() || !baseline.reachesConfidence()) return false;
  return candidate.ciHigh < baseline.ciLow * (1.0 - std::max(0.0, drift));
}

PairedComparison comparePaired(const std::vector<double>& candidate,
                               const std::vector<double>& baseline, double confidence) {
  PairedComparison result;
  result.confidence = confidence;
  if (candidate.size() != baseline.size() || candidate.empty()) return result;
  std::vector<double> ratios;
  ratios.reserve(candidate.size());
  for (size_t i = 0; i < candidate.size(); ++i) {
    if (baseline[i] > 0) ratios.push_back(candidate[i] / baseline[i]);
  }
  if (ratios.empty()) return result;
  std::sort(ratios.begin(), ratios.end());
  result.pairs = static_cast<int>(ratios.size());
  result.ratioMedian = percentile(ratios, 50);
  std::tie(result.ratioLow, result.ratioHigh) = medianConfidenceInterval(ratios, confidence);
  return result;
}

}  // namespace kiln::tune
