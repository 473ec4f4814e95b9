// Accuracy as eligibility: a route's outputs compared with reference outputs by a metric, per
// output, against a threshold. A route that misses the threshold on any output, or produces NaN
// or Inf where the reference is finite, is not a candidate whatever its speed.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/tensor.h"

namespace kiln::tune {

enum class Metric {
  kL0,    // fraction of elements with |x - ref| > atol + rtol * |ref|
  kL1,    // mean absolute difference
  kL2,    // mean squared difference
  kLinf,  // largest absolute difference
  kCos,   // 1 - cosine similarity of the flattened tensors
};

const char* metricName(Metric metric);
// "l0", "l1", "l2", "linf" (or "lInf"), "cos"; an error lists them.
Result<Metric> parseMetric(const std::string& text);

struct AccuracySettings {
  Metric metric = Metric::kCos;
  double atol = 1e-5, rtol = 1e-5;          // l0 only
  double threshold = 1e-5;                  // the largest acceptable loss, for every output...
  std::map<std::string, double> perOutput;  // ...unless named here

  double thresholdFor(const std::string& output) const;
};

// Parses --accuracy-threshold: "1e-3" (every output) and/or "name:1e-3" entries, comma-separated.
// Sets `settings.threshold` / `settings.perOutput`.
Status parseThresholds(const std::string& text, AccuracySettings& settings);

// The loss of one output against its reference. The tensors must have the same shape (checked
// by compareOutputs); any dtype, compared as double.
double computeLoss(Metric metric, const ir::Tensor& output, const ir::Tensor& reference,
                   double atol, double rtol);

struct OutputAccuracy {
  std::string output;
  double loss = 0;       // the worst over every reference pair
  double threshold = 0;  // what it was held to
  bool pass = false;
  std::string note;  // why it failed ("NaN where the reference is finite at element 12", ...)
};

// Compares one run's outputs with their references, output by output (names give the order of
// both vectors). A shape or dtype-class mismatch is an error (the route changed what the model
// computes); non-finite values where the reference is finite fail the output.
Result<std::vector<OutputAccuracy>> compareOutputs(const AccuracySettings& settings,
                                                   const std::vector<std::string>& names,
                                                   const std::vector<ir::Tensor>& outputs,
                                                   const std::vector<ir::Tensor>& references);

// Folds the results of several reference pairs into one per output: the worst loss, and a
// failure if any pair failed.
void mergeWorst(std::vector<OutputAccuracy>& into, const std::vector<OutputAccuracy>& more);

}  // namespace kiln::tune
