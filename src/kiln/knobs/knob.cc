// The knob registry and value validation.
#include "kiln/knobs/knob.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace kiln::knobs {

namespace {

Result<int64_t> parseInt(const std::string& text) {
  if (text.empty() || text.size() > 18) return invalidInput("'{}' is not an integer", text);
  size_t start = text[0] == '-' ? 1 : 0;
  if (start == text.size()) return invalidInput("'{}' is not an integer", text);
  for (size_t i = start; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      return invalidInput("'{}' is not an integer", text);
    }
  }
  return std::stoll(text);
}

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

Result<std::string> KnobSpec::canonicalValue(const std::string& value) const {
  switch (kind) {
    case KnobKind::kBool:
      if (value == "on" || value == "true" || value == "1") return std::string("on");
      if (value == "off" || value == "false" || value == "0") return std::string("off");
      break;
    case KnobKind::kEnum:
      if (std::find(choices.begin(), choices.end(), value) != choices.end()) return value;
      break;
    case KnobKind::kInt: {
      auto parsed = parseInt(value);
      if (parsed.isOk() && *parsed >= minValue && *parsed <= maxValue) {
        return std::to_string(*parsed);
      }
      break;
    }
  }
  return invalidInput("knob '{}' does not allow the value '{}' (allowed: {})", name, value,
                      allowedText());
}

std::vector<std::string> KnobSpec::allowedValues() const {
  switch (kind) {
    case KnobKind::kBool:
      return {"off", "on"};
    case KnobKind::kEnum:
      return choices;
    case KnobKind::kInt: {
      std::vector<std::string> values;
      for (int64_t v = minValue; v <= maxValue; ++v) values.push_back(std::to_string(v));
      return values;
    }
  }
  return {};
}

std::string KnobSpec::allowedText() const {
  if (kind == KnobKind::kInt) return fmt::format("{}..{}", minValue, maxValue);
  return fmt::format("{}", fmt::join(allowedValues(), "|"));
}

KnobRegistry& KnobRegistry::global() {
  static KnobRegistry registry;
  return registry;
}

Status KnobRegistry::add(KnobSpec spec) {
  const auto validName = [](const std::string& name) {
    if (name.empty() || name.find('.') == std::string::npos) return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
      return std::islower(static_cast<unsigned char>(c)) ||
             std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '_';
    });
  };
  if (!validName(spec.name)) {
    return internalError("knob name '{}' must be dotted lower_case (area.key)", spec.name);
  }
  if (knobs_.count(spec.name)) return internalError("knob '{}' is declared twice", spec.name);
  if (spec.help.empty()) return internalError("knob '{}' has no help text", spec.name);
  if (spec.kind == KnobKind::kEnum && spec.choices.size() < 2) {
    return internalError("enum knob '{}' needs at least two choices", spec.name);
  }
  if (spec.kind == KnobKind::kInt && spec.minValue > spec.maxValue) {
    return internalError("int knob '{}' has an empty range", spec.name);
  }
  auto canonical = spec.canonicalValue(spec.defaultValue);
  if (!canonical.isOk()) {
    return internalError("knob '{}': default is not allowed: {}", spec.name,
                         canonical.status().message());
  }
  spec.defaultValue = *canonical;
  knobs_.emplace(spec.name, std::move(spec));
  return Status::ok();
}

const KnobSpec* KnobRegistry::find(const std::string& name) const {
  auto it = knobs_.find(name);
  return it == knobs_.end() ? nullptr : &it->second;
}

std::vector<std::string> KnobRegistry::suggestions(const std::string& name) const {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& [candidate, spec] : knobs_) {
    const size_t distance = editDistance(name, candidate);
    // Close spellings, or the same last component in another area (cpu.threads vs threads).
    const std::string leaf = candidate.substr(candidate.rfind('.') + 1);
    if (distance <= std::max<size_t>(2, name.size() / 4) || leaf == name ||
        name.find(leaf) != std::string::npos) {
      scored.emplace_back(distance, candidate);
    }
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> names;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) names.push_back(scored[i].second);
  return names;
}

Knob declareKnob(KnobSpec spec) {
  const std::string name = spec.name;
  Status status = KnobRegistry::global().add(std::move(spec));
  if (!status.isOk()) {
    std::fprintf(stderr, "kiln internal error: %s\n", status.message().c_str());
    std::abort();
  }
  return Knob(name);
}

}  // namespace kiln::knobs
