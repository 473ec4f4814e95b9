// Knobs: every scheduling decision kiln makes is a named knob, declared once beside the code that
// reads it, and collected in one registry (for `kiln knobs`, route validation and the docs).
//
//   // in src/kiln/passes/fold_batchnorm.cc
//   const knobs::Knob kFoldBatchNorm = knobs::declareKnob({
//       .name = "graph.fold_batchnorm", .kind = knobs::KnobKind::kBool, .defaultValue = "on",
//       .help = "fold BatchNormalization into the preceding Conv or Gemm"});
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/base/status.h"

namespace kiln::knobs {

enum class KnobKind { kBool, kEnum, kInt };

struct KnobSpec {
  std::string name;  // dotted: area.subarea.key ("fusion.conv_act", "cpu.conv.algo")
  KnobKind kind = KnobKind::kBool;
  std::vector<std::string> choices;  // kEnum: the allowed values
  int64_t minValue = 0;              // kInt: inclusive range
  int64_t maxValue = 0;
  std::string defaultValue;           // canonical spelling ("on"/"off" for bools)
  std::string help;                   // one line
  std::vector<std::string> backends;  // empty: every backend (graph passes)
  bool perNode = false;               // may be set per node with -knob@glob=value
  bool changesNumerics = false;       // a value other than the default may change outputs

  // Canonical spelling of `value` if allowed ("true"/"1" become "on" for bools), else an error
  // that lists what is allowed.
  Result<std::string> canonicalValue(const std::string& value) const;
  // Every allowed value in order (for -knob=* and the JSON listing); int ranges list each value.
  std::vector<std::string> allowedValues() const;
  std::string allowedText() const;  // "on|off", "auto|im2col|direct", "1..16"
};

// A handle to a declared knob: what code holds to read the knob's value from a route.
class Knob {
 public:
  explicit Knob(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

class KnobRegistry {
 public:
  // The registry every declareKnob() adds to.
  static KnobRegistry& global();

  // Adds a knob; an invalid or duplicate declaration is a kiln bug (the message says which).
  Status add(KnobSpec spec);
  const KnobSpec* find(const std::string& name) const;
  const std::map<std::string, KnobSpec>& all() const { return knobs_; }
  // Names close to `name` (edit distance), best first, for "did you mean".
  std::vector<std::string> suggestions(const std::string& name) const;

 private:
  std::map<std::string, KnobSpec> knobs_;
};

// Declares a knob in the global registry at static-initialisation time. A malformed
// declaration aborts with the reason: it is a programming error caught by any test run.
Knob declareKnob(KnobSpec spec);

}  // namespace kiln::knobs
