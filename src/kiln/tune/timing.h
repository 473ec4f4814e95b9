// Timing statistics for the tuner: a trial's latency samples summarised with a distribution-free
// confidence interval of the median, and the tests that decide whether one route is faster than
// another by more than the measured noise.
#pragma once

#include <utility>
#include <vector>

#include "kiln/base/statistics.h"

namespace kiln::tune {

// One trial's measurement: every sample (ms, in the order measured), its summary, and the
// confidence interval of the median.
struct TrialTiming {
  std::vector<double> samples;
  TimingSummary summary;
  double ciLow = 0, ciHigh = 0;  // of the median, at `confidence`
  double confidence = 0.95;
  // Enough samples for an interval at `confidence` (6 at 95%): with fewer, [ciLow, ciHigh] is
  // the whole range and proves nothing, so no comparison involving it is significant. Derived,
  // so that a timing read back from the result store answers the same.
  bool reachesConfidence() const;
};

TrialTiming analyzeTimings(std::vector<double> samples, double confidence = 0.95);

// The interval [x_(l), x_(u)] between two order statistics of `sorted` that contains the
// population median with probability at least `confidence` (the binomial / sign-test interval:
// no assumption about the shape of the distribution). With too few samples to reach
// `confidence` (see intervalReachesConfidence), the whole range.
std::pair<double, double> medianConfidenceInterval(const std::vector<double>& sorted,
                                                   double confidence);

// Whether n samples are enough for the order-statistic interval to reach `confidence`: the
// widest interval, [min, max], misses the median with probability 2 * 0.5^n.
bool intervalReachesConfidence(int n, double confidence);

// A significant gain: the candidate's whole median interval lies below the baseline's, so the
// difference is larger than the noise both trials measured. Never significant when either
// interval does not reach its confidence. `drift` (>= 0) widens the margin by the relative
// change the baseline's own median showed when measured again in a later trial: trials run in
// separate processes at separate times, and a gain smaller than that drift is not evidence.
bool significantlyFaster(const TrialTiming& candidate, const TrialTiming& baseline,
                         double drift = 0.0);

// Interleaved A/B measurement in one process: sample i of the candidate and of the baseline were
// taken back to back, so their ratio cancels slow drifts of the machine (clock, load, heat).
struct PairedComparison {
  int pairs = 0;
  double ratioMedian = 1;              // candidate / baseline; below 1 is faster
  double ratioLow = 1, ratioHigh = 1;  // confidence interval of the median ratio
  double confidence = 0.95;
  // Enough pairs for the interval (6 at 95%), and the whole interval of the ratio below 1.
  bool reachesConfidence() const;
  bool significantlyFaster() const { return reachesConfidence() && ratioHigh < 1.0; }
  // Speedup of the candidate over the baseline (baseline / candidate) and its interval.
  double speedup() const { return 1.0 / ratioMedian; }
  double speedupLow() const { return 1.0 / ratioHigh; }
  double speedupHigh() const { return 1.0 / ratioLow; }
};

// `candidate` and `baseline` must be the same length (the pairs); an empty comparison otherwise.
PairedComparison comparePaired(const std::vector<double>& candidate,
                               const std::vector<double>& baseline, double confidence = 0.95);

}  // namespace kiln::tune
