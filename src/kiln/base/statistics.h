// Summaries of repeated timings: what `kiln run` prints and the tuner compares.
#pragma once

#include <vector>

namespace kiln {

struct TimingSummary {
  int count = 0;
  double min = 0, median = 0, mean = 0, p90 = 0, p99 = 0, max = 0, stddev = 0;
};

// Percentiles by linear interpolation between order statistics (numpy's default).
TimingSummary summarize(std::vector<double> samples);
double percentile(const std::vector<double>& sorted, double q);

}  // namespace kiln
