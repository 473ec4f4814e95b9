// Engine files: a built CPU plan saved with its optimised graph, route and weights, so that
// `kiln run` can skip import and the pass pipeline (docs/engine-format.md gives the layout).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backends/cpu/plan.h"
#include "kiln/base/status.h"

namespace kiln {

inline constexpr std::string_view kEngineMagic{"KILNENG\0", 8};
inline constexpr uint32_t kEngineFormatVersion = 1;

// The machine an engine was built for. Tactics and kernels may depend on these, so an engine
// only loads where all of them are equal.
struct EngineTarget {
  std::string cpuModel;
  bool avx2 = false;
  bool avx512f = false;
  bool fma = false;
  bool avx512bf16 = false;

  bool operator==(const EngineTarget&) const = default;
};

// This machine's fingerprint, from /proc/cpuinfo (empty model and no flags where it is absent).
EngineTarget currentTarget();

// The unchecksummed header: readable (and shown by `kiln inspect`) before anything is verified.
struct EngineHeader {
  uint32_t formatVersion = kEngineFormatVersion;
  std::string kilnVersion;
  std::string backend = "cpu";
  EngineTarget target;
};

// One step's recorded decisions, as `kiln inspect` shows them per layer.
struct EngineStep {
  std::string node;
  std::string opType;
  std::string tactic;
  std::string layout;
  std::string precision;
};

// What saveEngine writes. `plan` supplies the optimised graph and the tactics; it must outlive
// the call.
struct EngineContents {
  std::string kilnVersion;
  EngineTarget target = currentTarget();
  std::string modelHash;  // of the ONNX file's bytes: modelHashOf
  std::map<std::string, std::vector<int64_t>> inputShapes;
  std::string route;  // canonical text
  const cpu::Plan* plan = nullptr;
};

struct LoadedEngine {
  EngineHeader header;
  std::string modelHash;
  std::map<std::string, std::vector<int64_t>> inputShapes;
  std::string route;
  std::vector<EngineStep> steps;  // as stored (and re-checked against `plan`)
  cpu::Plan plan;
};

// The checksum an engine file stores at offset 24: FNV-1a 64 of everything after the prefix. It
// detects damage, not forgery (anyone can compute it), which is why loading also checks the graph.
uint64_t engineChecksum(std::string_view headerAndBody);

// "fnv1a64:<16 hex digits>" of a model file's bytes.
std::string modelHashOf(std::string_view onnxBytes);

// Serialises `contents` and writes it atomically.
Status saveEngine(const std::filesystem::path& path, const EngineContents& contents);

// Reads, verifies (magic, version, size, checksum, target) and re-lowers an engine; the lowered
// plan must choose the stored tactic for every step. Errors name the file.
Result<LoadedEngine> loadEngine(const std::filesystem::path& path);

// True for a path ending in ".kiln" or a file starting with the engine magic.
bool isEngineFile(const std::filesystem::path& path);

}  // namespace kiln
