// Timing summaries.
#include "kiln/base/statistics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kiln {

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double position = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lower = static_cast<size_t>(std::floor(position));
  const size_t upper = std::min(lower + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(lower);
  return sorted[lower] + (sorted[upper] - sorted[lower]) * fraction;
}

TimingSummary summarize(std::vector<double> samples) {
  TimingSummary summary;
  if (samples.empty()) return summary;
  std::sort(samples.begin(), samples.end());
  summary.count = static_cast<int>(samples.size());
  summary.min = samples.front();
  summary.max = samples.back();
  summary.median = percentile(samples, 50);
  summary.p90 = percentile(samples, 90);
  summary.p99 = percentile(samples, 99);
  summary.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / samples.size();
  double squares = 0;
  for (double s : samples) squares += (s - summary.mean) * (s - summary.mean);
  summary.stddev = samples.size() > 1 ? std::sqrt(squares / (samples.size() - 1)) : 0.0;
  return summary;
}

}  // namespace kiln
