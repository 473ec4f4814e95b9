// Accuracy metrics: per-output loss against references, and the eligibility decision.
#include "kiln/tune/accuracy.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kiln/ir/dtype.h"

namespace kiln::tune {

const char* metricName(Metric metric) {
  switch (metric) {
    case Metric::kL0:
      return "l0";
    case Metric::kL1:
      return "l1";
    case Metric::kL2:
      return "l2";
    case Metric::kLinf:
      return "linf";
    case Metric::kCos:
      return "cos";
  }
  return "?";
}

Result<Metric> parseMetric(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (Metric metric : {Metric::kL0, Metric::kL1, Metric::kL2, Metric::kLinf, Metric::kCos}) {
    if (lower == metricName(metric)) return metric;
  }
  return invalidInput("unknown accuracy metric '{}' (allowed: l0, l1, l2, linf, cos)", text);
}

double AccuracySettings::thresholdFor(const std::string& output) const {
  auto it = perOutput.find(output);
  return it == perOutput.end() ? threshold : it->second;
}

namespace {

Result<double> parseNonNegative(const std::string& text, const std::string& entry) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size() && std::isfinite(value) && value >= 0) return value;
  } catch (const std::exception&) {
  }
  return invalidInput("--accuracy-threshold '{}': '{}' is not a non-negative number", entry, text);
}

}  // namespace

Status parseThresholds(const std::string& text, AccuracySettings& settings) {
  std::stringstream entries(text);
  std::string entry;
  bool any = false;
  while (std::getline(entries, entry, ',')) {
    // "1e-3, out:0.5": spaces around entries are not part of output names.
    const auto first = entry.find_first_not_of(" \t");
    const auto last = entry.find_last_not_of(" \t");
    entry = first == std::string::npos ? "" : entry.substr(first, last - first + 1);
    if (entry.empty()) continue;
    any = true;
    // An output name may itself contain ':' (exporters write "output:0"), so split at the last.
    const auto colon = entry.rfind(':');
    if (colon == std::string::npos) {
      KILN_ASSIGN_OR_RETURN(settings.threshold, parseNonNegative(entry, entry));
      continue;
    }
    const std::string name = entry.substr(0, colon);
    if (name.empty()) return invalidInput("--accuracy-threshold '{}': empty output name", entry);
    KILN_ASSIGN_OR_RETURN(double value, parseNonNegative(entry.substr(colon + 1), entry));
    if (!settings.perOutput.emplace(name, value).second) {
      return invalidInput("--accuracy-threshold gives output '{}' twice", name);
    }
  }
  if (!any) return invalidInput("--accuracy-threshold is empty");
  return Status::ok();
}

double computeLoss(Metric metric, const ir::Tensor& output, const ir::Tensor& reference,
                   double atol, double rtol) {
  const int64_t n = std::min(output.elementCount(), reference.elementCount());
  if (n == 0) return 0;
  double sum = 0, worst = 0, dot = 0, outNorm = 0, refNorm = 0;
  int64_t outside = 0;
  bool differs = false;
  for (int64_t i = 0; i < n; ++i) {
    const double x = output.elementAsDouble(i);
    const double r = reference.elementAsDouble(i);
    // Equal values (including equal infinities and NaN against NaN) contribute nothing; the
    // non-finite cases that matter are caught by compareOutputs before a loss is trusted.
    if (x == r || (std::isnan(x) && std::isnan(r))) {
      dot += std::isfinite(x) ? x * r : 0;
      outNorm += std::isfinite(x) ? x * x : 0;
      refNorm += std::isfinite(r) ? r * r : 0;
      continue;
    }
    differs = true;
    const double diff = std::abs(x - r);
    switch (metric) {
      case Metric::kL0:
        outside += !(diff <= atol + rtol * std::abs(r));
        break;
      case Metric::kL1:
        sum += diff;
        break;
      case Metric::kL2:
        sum += diff * diff;
        break;
      case Metric::kLinf:
        worst = std::max(worst, diff);
        break;
      case Metric::kCos:
        dot += x * r;
        outNorm += x * x;
        refNorm += r * r;
        break;
    }
    if (std::isnan(diff)) worst = diff;
  }
  switch (metric) {
    case Metric::kL0:
      return static_cast<double>(outside) / static_cast<double>(n);
    case Metric::kL1:
    case Metric::kL2:
      return sum / static_cast<double>(n);
    case Metric::kLinf:
      return worst;
    case Metric::kCos: {
      // Identical tensors: exactly 0, not the rounding of sqrt(a) * sqrt(a) against a.
      if (!differs || (outNorm == 0 && refNorm == 0)) return 0;
      if (outNorm == 0 || refNorm == 0) return 1;  // one of them all zeros: orthogonal
      const double cosine = dot / (std::sqrt(outNorm) * std::sqrt(refNorm));
      return std::max(0.0, 1.0 - cosine);
    }
  }
  return 0;
}

Result<std::vector<OutputAccuracy>> compareOutputs(const AccuracySettings& settings,
                                                   const std::vector<std::string>& names,
                                                   const std::vector<ir::Tensor>& outputs,
                                                   const std::vector<ir::Tensor>& references) {
  if (outputs.size() != names.size() || references.size() != names.size()) {
    return invalidInput("{} outputs and {} references for {} output names", outputs.size(),
                        references.size(), names.size());
  }
  std::vector<OutputAccuracy> results;
  for (size_t o = 0; o < names.size(); ++o) {
    const ir::Tensor& out = outputs[o];
    const ir::Tensor& ref = references[o];
    if (out.shape() != ref.shape()) {
      return invalidInput("output '{}' has shape {}, its reference {}", names[o],
                          out.shape().toString(), ref.shape().toString());
    }
    if (ir::isFloating(out.dtype()) != ir::isFloating(ref.dtype())) {
      return invalidInput("output '{}' is {}, its reference {}", names[o],
                          ir::dtypeName(out.dtype()), ir::dtypeName(ref.dtype()));
    }
    OutputAccuracy result;
    result.output = names[o];
    result.threshold = settings.thresholdFor(names[o]);
    for (int64_t i = 0; i < out.elementCount(); ++i) {
      const double x = out.elementAsDouble(i);
      const double r = ref.elementAsDouble(i);
      if (!std::isfinite(x) && std::isfinite(r)) {
        result.note = fmt::format("{} at element {} where the reference is finite ({})",
                                  std::isnan(x) ? "NaN" : "Inf", i, r);
        break;
      }
      if (!std::isfinite(r) && !(x == r || (std::isnan(x) && std::isnan(r)))) {
        result.note = fmt::format("{} at element {} where the reference is {}", x, i, r);
        break;
      }
    }
    result.loss = computeLoss(settings.metric, out, ref, settings.atol, settings.rtol);
    if (!result.note.empty()) {
      result.pass = false;
    } else if (!(result.loss <= result.threshold)) {
      result.pass = false;
      result.note = fmt::format("{} loss {:.3g} exceeds the threshold {:.3g}",
                                metricName(settings.metric), result.loss, result.threshold);
    } else {
      result.pass = true;
    }
    results.push_back(std::move(result));
  }
  return results;
}

void mergeWorst(std::vector<OutputAccuracy>& into, const std::vector<OutputAccuracy>& more) {
  if (into.empty()) {
    into = more;
    return;
  }
  for (size_t i = 0; i < into.size() && i < more.size(); ++i) {
    OutputAccuracy& a = into[i];
    const OutputAccuracy& b = more[i];
    if (std::isnan(b.loss) || b.loss > a.loss) a.loss = b.loss;
    if (a.pass && !b.pass) a.note = b.note;
    a.pass = a.pass && b.pass;
  }
}

}  // namespace kiln::tune
