// Engine file writing and loading: a binary prefix, a JSON header, and a checksummed body of
// JSON metadata (graph, route, steps) followed by 64-byte aligned weights.
#include "kiln/engine/engine_file.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kiln/base/file.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/knobs/route.h"

namespace kiln {

namespace {

using nlohmann::json;

// Fixed prefix: magic[8], u32 format version, u32 header bytes, u64 body bytes, u64 checksum
// (FNV-1a 64 of header and body).
constexpr size_t kPrefixBytes = 32;
constexpr size_t kAlignment = 64;

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// Little-endian is assumed throughout: kiln's CPU backend targets x86-64 and AArch64 Linux.
template <typename T>
void appendRaw(std::string& out, T value) {
  char buffer[sizeof(T)];
  std::memcpy(buffer, &value, sizeof(T));
  out.append(buffer, sizeof(T));
}

template <typename T>
T readRaw(std::string_view bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

void padTo(std::string& out, size_t alignment, char fill) {
  while (out.size() % alignment != 0) out.push_back(fill);
}

json targetToJson(const EngineTarget& target) {
  return {{"cpu_model", target.cpuModel},
          {"avx2", target.avx2},
          {"avx512f", target.avx512f},
          {"fma", target.fma},
          {"avx512_bf16", target.avx512bf16}};
}

EngineTarget targetFromJson(const json& j) {
  return {j.at("cpu_model").get<std::string>(), j.at("avx2").get<bool>(),
          j.at("avx512f").get<bool>(), j.at("fma").get<bool>(), j.at("avx512_bf16").get<bool>()};
}

// Collects constants into the weight section, each at a 64-byte boundary so kernels can read
// them in place (SIMD loads, a future mmap loader).
class WeightWriter {
 public:
  json add(const ir::Tensor& tensor) {
    padTo(bytes_, kAlignment, '\0');
    json entry = {{"dtype", std::string(ir::dtypeName(tensor.dtype()))},
                  {"shape", tensor.shape().dims()},
                  {"offset", bytes_.size()},
                  {"bytes", tensor.byteSize()}};
    if (tensor.byteSize() > 0) {
      bytes_.append(reinterpret_cast<const char*>(tensor.rawData()), tensor.byteSize());
    }
    return entry;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

Result<ir::Tensor> tensorFromJson(const json& entry, std::string_view weights) {
  const std::string dtypeText = entry.at("dtype").get<std::string>();
  const auto dtype = ir::dtypeFromName(dtypeText);
  if (!dtype) return invalidInput("unknown dtype '{}'", dtypeText);
  ir::Shape shape(entry.at("shape").get<std::vector<int64_t>>());
  const uint64_t offset = entry.at("offset").get<uint64_t>();
  const uint64_t bytes = entry.at("bytes").get<uint64_t>();
  KILN_ASSIGN_OR_RETURN(int64_t count, shape.checkedElementCount());
  // Checked before allocating, so a crafted shape cannot make the loader allocate without bound.
  if (static_cast<uint64_t>(count) * ir::dtypeSize(*dtype) != bytes || offset > weights.size() ||
      bytes > weights.size() - offset) {
    return invalidInput("tensor of {} {} at offset {} ({} bytes) does not fit the {}-byte weights",
                        dtypeText, shape.toString(), offset, bytes, weights.size());
  }
  ir::Tensor tensor(*dtype, shape);
  // Copied out of the file buffer so the graph owns its constants however the engine is kept.
  if (bytes > 0) std::memcpy(tensor.mutableRawData(), weights.data() + offset, bytes);
  return tensor;
}

uint32_t floatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float floatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Floats travel as their bit patterns: JSON has no NaN or infinity, and bits round-trip exactly.
json attributeToJson(const ir::Attribute& attribute, WeightWriter& weights) {
  return std::visit(
      [&](const auto& v) -> json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          return {{"kind", "int"}, {"value", v}};
        } else if constexpr (std::is_same_v<T, float>) {
          return {{"kind", "float"}, {"bits", floatBits(v)}};
        } else if constexpr (std::is_same_v<T, std::string>) {
          return {{"kind", "string"}, {"value", v}};
        } else if constexpr (std::is_same_v<T, ir::Tensor>) {
          json entry = weights.add(v);
          entry["kind"] = "tensor";
          return entry;
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          return {{"kind", "ints"}, {"value", v}};
        } else if constexpr (std::is_same_v<T, std::vector<float>>) {
          std::vector<uint32_t> bits;
          for (float f : v) bits.push_back(floatBits(f));
          return {{"kind", "floats"}, {"bits", bits}};
        } else {
          return {{"kind", "strings"}, {"value", v}};
        }
      },
      attribute.value);
}

Result<ir::Attribute> attributeFromJson(const json& j, std::string_view weights) {
  const std::string kind = j.at("kind").get<std::string>();
  ir::Attribute attribute;
  if (kind == "int") {
    attribute.value = j.at("value").get<int64_t>();
  } else if (kind == "float") {
    attribute.value = floatFromBits(j.at("bits").get<uint32_t>());
  } else if (kind == "string") {
    attribute.value = j.at("value").get<std::string>();
  } else if (kind == "tensor") {
    KILN_ASSIGN_OR_RETURN(ir::Tensor tensor, tensorFromJson(j, weights));
    attribute.value = std::move(tensor);
  } else if (kind == "ints") {
    attribute.value = j.at("value").get<std::vector<int64_t>>();
  } else if (kind == "floats") {
    std::vector<float> values;
    for (uint32_t bits : j.at("bits").get<std::vector<uint32_t>>()) {
      values.push_back(floatFromBits(bits));
    }
    attribute.value = std::move(values);
  } else if (kind == "strings") {
    attribute.value = j.at("value").get<std::vector<std::string>>();
  } else {
    return invalidInput("unknown attribute kind '{}'", kind);
  }
  return attribute;
}

json namesOf(const std::vector<ir::Value*>& values) {
  json names = json::array();
  for (const ir::Value* value : values) {
    names.push_back(value ? json(value->name) : json(nullptr));
  }
  return names;
}

json graphToJson(const ir::Graph& graph, WeightWriter& weights) {
  json values = json::array();
  for (const auto& value : graph.values()) {
    json entry = {{"name", value->name},
                  {"dtype", std::string(ir::dtypeName(value->dtype))},
                  {"shape", value->shape.dims()},
                  {"has_type", value->hasType},
                  {"initializer", value->isInitializer}};
    if (value->constant) entry["constant"] = weights.add(*value->constant);
    values.push_back(std::move(entry));
  }
  json nodes = json::array();
  for (const auto& node : graph.nodes()) {
    json attributes = json::object();
    for (const auto& [name, attribute] : node->attributes) {
      attributes[name] = attributeToJson(attribute, weights);
    }
    nodes.push_back({{"name", node->name},
                     {"op", node->opType},
                     {"domain", node->domain},
                     {"opset", node->opsetVersion},
                     {"inputs", namesOf(node->inputs)},
                     {"outputs", namesOf(node->outputs)},
                     {"attributes", std::move(attributes)}});
  }
  return {{"name", graph.name},
          {"opset_imports", graph.opsetImports},
          {"values", std::move(values)},
          {"nodes", std::move(nodes)},
          {"inputs", namesOf(graph.inputs)},
          {"outputs", namesOf(graph.outputs)}};
}

Result<std::vector<ir::Value*>> valuesFromNames(const ir::Graph& graph, const json& names,
                                                bool allowNull) {
  std::vector<ir::Value*> values;
  for (const json& name : names) {
    if (name.is_null() && allowNull) {
      values.push_back(nullptr);
      continue;
    }
    ir::Value* value = graph.findValue(name.get<std::string>());
    if (!value) return invalidInput("value '{}' is not defined", name.get<std::string>());
    values.push_back(value);
  }
  return values;
}

// Rebuilds the stored (already optimised) graph as is: no import checks, so kiln's own domain
// is accepted, and no passes, so the plan is lowered from exactly what was saved.
Result<ir::Graph> graphFromJson(const json& j, std::string_view weights) {
  ir::Graph graph;
  graph.name = j.at("name").get<std::string>();
  graph.opsetImports = j.at("opset_imports").get<std::map<std::string, int>>();
  for (const json& entry : j.at("values")) {
    const std::string name = entry.at("name").get<std::string>();
    if (graph.findValue(name)) return invalidInput("value '{}' is stored twice", name);
    ir::Value* value = graph.addValue(name);
    const std::string dtypeText = entry.at("dtype").get<std::string>();
    const auto dtype = ir::dtypeFromName(dtypeText);
    if (!dtype) return invalidInput("value '{}' has unknown dtype '{}'", name, dtypeText);
    value->dtype = *dtype;
    value->shape = ir::Shape(entry.at("shape").get<std::vector<int64_t>>());
    KILN_RETURN_IF_ERROR(value->shape.checkedElementCount().status());
    value->hasType = entry.at("has_type").get<bool>();
    value->isInitializer = entry.at("initializer").get<bool>();
    if (entry.contains("constant")) {
      auto tensor = tensorFromJson(entry.at("constant"), weights);
      if (!tensor.isOk()) return tensor.status().withContext(fmt::format("value '{}'", name));
      value->constant = std::move(tensor).value();
    }
  }
  for (const json& entry : j.at("nodes")) {
    ir::Node* node = graph.addNode(entry.at("op").get<std::string>());
    node->name = entry.at("name").get<std::string>();
    node->domain = entry.at("domain").get<std::string>();
    node->opsetVersion = entry.at("opset").get<int>();
    KILN_ASSIGN_OR_RETURN(node->inputs, valuesFromNames(graph, entry.at("inputs"), true));
    KILN_ASSIGN_OR_RETURN(node->outputs, valuesFromNames(graph, entry.at("outputs"), true));
    for (ir::Value* output : node->outputs) {
      if (output) output->producer = node;
    }
    for (const auto& [name, attribute] : entry.at("attributes").items()) {
      auto parsed = attributeFromJson(attribute, weights);
      if (!parsed.isOk()) {
        return parsed.status().withContext(
            fmt::format("{} attribute '{}'", node->describe(), name));
      }
      node->attributes[name] = std::move(parsed).value();
    }
  }
  KILN_ASSIGN_OR_RETURN(graph.inputs, valuesFromNames(graph, j.at("inputs"), false));
  KILN_ASSIGN_OR_RETURN(graph.outputs, valuesFromNames(graph, j.at("outputs"), false));
  KILN_RETURN_IF_ERROR(graph.verify());
  return graph;
}

std::string yesNo(bool value) { return value ? "yes" : "no"; }

// Names every fingerprint field that differs, so the user knows why the engine cannot run here.
std::string targetDifferences(const EngineTarget& engine, const EngineTarget& here) {
  std::vector<std::string> differences;
  if (engine.cpuModel != here.cpuModel) {
    differences.push_back(
        fmt::format("cpu model (engine '{}', this machine '{}')", engine.cpuModel, here.cpuModel));
  }
  auto flag = [&](const char* name, bool a, bool b) {
    if (a != b) {
      differences.push_back(
          fmt::format("{} (engine {}, this machine {})", name, yesNo(a), yesNo(b)));
    }
  };
  flag("avx2", engine.avx2, here.avx2);
  flag("avx512f", engine.avx512f, here.avx512f);
  flag("fma", engine.fma, here.fma);
  flag("avx512_bf16", engine.avx512bf16, here.avx512bf16);
  std::string text;
  for (const auto& d : differences) text += (text.empty() ? "" : ", ") + d;
  return text;
}

// The stored graph skipped the importer's checks, and a checksum is no proof of who wrote it:
// before lowering (whose kernels trust shapes), the graph must be well formed, every constant
// must have its value's type, and shape inference must give every node's outputs the types
// stored for them.
Status checkStoredGraph(ir::Graph& graph) {
  Status verified = graph.verify();
  if (!verified.isOk()) return invalidInput("corrupt or tampered: {}", verified.message());
  std::map<const ir::Value*, std::pair<ir::DType, ir::Shape>> stored;
  for (const auto& value : graph.values()) {
    if (value->constant &&
        (value->constant->dtype() != value->dtype || value->constant->shape() != value->shape)) {
      return invalidInput(
          "corrupt or tampered: value '{}' is stored as {}{} but its constant is {}{}", value->name,
          ir::dtypeName(value->dtype), value->shape.toString(),
          ir::dtypeName(value->constant->dtype()), value->constant->shape().toString());
    }
    if (value->producer) stored.emplace(value.get(), std::make_pair(value->dtype, value->shape));
  }
  Status inferred = ir::inferShapes(graph, nullptr);
  if (!inferred.isOk()) {
    return invalidInput("corrupt or tampered: its graph does not check: {}", inferred.message());
  }
  for (const auto& [value, type] : stored) {
    if (value->dtype != type.first || value->shape != type.second) {
      return invalidInput("corrupt or tampered: value '{}' is stored as {}{} but {} gives {}{}",
                          value->name, ir::dtypeName(type.first), type.second.toString(),
                          value->producer->describe(), ir::dtypeName(value->dtype),
                          value->shape.toString());
    }
  }
  return Status::ok();
}

Result<LoadedEngine> parseEngine(std::string_view file) {
  if (file.size() < kEngineMagic.size() && file == kEngineMagic.substr(0, file.size())) {
    return ioError("truncated: {} bytes, shorter than the magic", file.size());
  }
  if (file.substr(0, kEngineMagic.size()) != kEngineMagic) {
    return invalidInput("not a kiln engine (wrong magic)");
  }
  if (file.size() < kPrefixBytes) {
    return ioError("truncated: {} bytes, shorter than the {}-byte prefix", file.size(),
                   kPrefixBytes);
  }
  LoadedEngine engine;
  engine.header.formatVersion = readRaw<uint32_t>(file, 8);
  if (engine.header.formatVersion > kEngineFormatVersion) {
    return unsupported("format version {} is newer than this kiln reads ({}); rebuild the engine",
                       engine.header.formatVersion, kEngineFormatVersion);
  }
  if (engine.header.formatVersion == 0) return invalidInput("format version 0 is not valid");
  const uint64_t headerBytes = readRaw<uint32_t>(file, 12);
  const uint64_t bodyBytes = readRaw<uint64_t>(file, 16);
  const uint64_t checksum = readRaw<uint64_t>(file, 24);
  const uint64_t available = file.size() - kPrefixBytes;
  if (headerBytes > available || bodyBytes > available - headerBytes) {
    return ioError("truncated: {} bytes, the prefix promises {}", file.size(),
                   kPrefixBytes + headerBytes + bodyBytes);
  }
  if (bodyBytes != available - headerBytes) {
    return invalidInput("corrupt or tampered: {} bytes after the body",
                        available - headerBytes - bodyBytes);
  }
  const std::string_view body = file.substr(kPrefixBytes + headerBytes);
  const uint64_t computed = fnv1a64(file.substr(kPrefixBytes));
  if (computed != checksum) {
    return invalidInput("corrupt or tampered: checksum mismatch (stored {:016x}, computed {:016x})",
                        checksum, computed);
  }

  json header = json::parse(file.substr(kPrefixBytes, headerBytes));
  engine.header.kilnVersion = header.at("kiln_version").get<std::string>();
  engine.header.backend = header.at("backend").get<std::string>();
  engine.header.target = targetFromJson(header.at("target"));
  if (engine.header.backend != "cpu") {
    return unsupported("built for backend '{}'; this kiln loads cpu engines",
                       engine.header.backend);
  }
  const EngineTarget here = currentTarget();
  if (engine.header.target != here) {
    return invalidInput("built for another target: {}; rebuild it on this machine",
                        targetDifferences(engine.header.target, here));
  }

  if (body.size() < sizeof(uint64_t)) return invalidInput("corrupt or tampered: empty body");
  const uint64_t metadataBytes = readRaw<uint64_t>(body, 0);
  if (metadataBytes > body.size() - sizeof(uint64_t)) {
    return invalidInput("corrupt or tampered: metadata runs past the body");
  }
  const json metadata = json::parse(body.substr(sizeof(uint64_t), metadataBytes));
  const uint64_t weightsOffset = metadata.at("weights_offset").get<uint64_t>();
  if (weightsOffset > body.size()) {
    return invalidInput("corrupt or tampered: weights start past the body");
  }
  const std::string_view weights = body.substr(weightsOffset);

  engine.modelHash = metadata.at("model_hash").get<std::string>();
  engine.inputShapes =
      metadata.at("input_shapes").get<std::map<std::string, std::vector<int64_t>>>();
  engine.route = metadata.at("route").get<std::string>();
  for (const json& step : metadata.at("steps")) {
    engine.steps.push_back({step.at("node").get<std::string>(), step.at("op").get<std::string>(),
                            step.at("tactic").get<std::string>(),
                            step.at("layout").get<std::string>(),
                            step.at("precision").get<std::string>()});
  }
  auto route = knobs::Route::parse(engine.route);
  if (!route.isOk()) {
    return route.status().withContext(
        "the stored route does not parse here (the engine was built by another kiln)");
  }
  KILN_ASSIGN_OR_RETURN(ir::Graph graph, graphFromJson(metadata.at("graph"), weights));
  KILN_RETURN_IF_ERROR(checkStoredGraph(graph));
  auto shared = std::make_shared<const ir::Graph>(std::move(graph));
  KILN_ASSIGN_OR_RETURN(engine.plan, cpu::lowerToCpu(shared, *route));

  // The same graph and route must give the same decisions; if not, this kiln's kernels or knobs
  // differ from the builder's and the engine's recorded choices would be silently ignored.
  const auto& steps = engine.plan.steps();
  for (size_t i = 0; i < std::max(steps.size(), engine.steps.size()); ++i) {
    if (i >= steps.size() || i >= engine.steps.size()) {
      return invalidInput(
          "the engine stores {} steps but this kiln lowers its graph to {} (the engine was built "
          "by another kiln; rebuild it)",
          engine.steps.size(), steps.size());
    }
    const cpu::Step& step = *steps[i];
    const EngineStep& stored = engine.steps[i];
    if (step.node->name != stored.node || step.tactic != stored.tactic) {
      return invalidInput(
          "node '{}': the engine stores tactic '{}' but this kiln chooses '{}' for node '{}' "
          "(the engine was built by another kiln; rebuild it)",
          stored.node, stored.tactic, step.tactic, step.node->name);
    }
  }
  return engine;
}

}  // namespace

EngineTarget currentTarget() {
  EngineTarget target;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool haveModel = false, haveFlags = false;
  auto valueOf = [](const std::string& text) {
    const auto colon = text.find(':');
    if (colon == std::string::npos) return std::string();
    const auto start = text.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : text.substr(start);
  };
  // The first processor's entry describes the machine; later ones repeat it.
  while (std::getline(cpuinfo, line) && !(haveModel && haveFlags)) {
    if (!haveModel && line.rfind("model name", 0) == 0) {
      target.cpuModel = valueOf(line);
      haveModel = true;
    } else if (!haveFlags && line.rfind("flags", 0) == 0) {
      std::istringstream words(valueOf(line));
      std::set<std::string> flags;
      for (std::string word; words >> word;) flags.insert(word);
      target.avx2 = flags.count("avx2") > 0;
      target.avx512f = flags.count("avx512f") > 0;
      target.fma = flags.count("fma") > 0;
      target.avx512bf16 = flags.count("avx512_bf16") > 0;
      haveFlags = true;
    }
  }
  return target;
}

uint64_t engineChecksum(std::string_view headerAndBody) { return fnv1a64(headerAndBody); }

std::string modelHashOf(std::string_view onnxBytes) {
  return "fnv1a64:" + knobs::stableHash(onnxBytes);
}

Status saveEngine(const std::filesystem::path& path, const EngineContents& contents) {
  if (!contents.plan) return internalError("saveEngine: no plan given");
  const cpu::Plan& plan = *contents.plan;
  std::string file;
  try {
    WeightWriter weights;
    json steps = json::array();
    for (const auto& step : plan.steps()) {
      steps.push_back({{"node", step->node->name},
                       {"op", step->node->opType},
                       {"tactic", step->tactic},
                       {"layout", step->layout},
                       {"precision", step->precision}});
    }
    json metadata = {{"model_hash", contents.modelHash},
                     {"input_shapes", contents.inputShapes},
                     {"route", contents.route},
                     {"graph", graphToJson(plan.graph(), weights)},
                     {"steps", std::move(steps)}};
    // The metadata's length decides where the weights start, and the start is part of the
    // metadata: reserve a fixed-width field and pad to the next alignment boundary.
    metadata["weights_offset"] = uint64_t{0};
    std::string metadataText = metadata.dump();
    uint64_t weightsOffset = 0;
    for (int attempt = 0; attempt < 4; ++attempt) {
      weightsOffset =
          (sizeof(uint64_t) + metadataText.size() + kAlignment - 1) / kAlignment * kAlignment;
      metadata["weights_offset"] = weightsOffset;
      metadataText = metadata.dump();
      if (sizeof(uint64_t) + metadataText.size() <= weightsOffset) break;
    }
    std::string body;
    appendRaw<uint64_t>(body, metadataText.size());
    body += metadataText;
    if (body.size() > weightsOffset) return internalError("engine metadata outgrew its slot");
    body.resize(weightsOffset, '\0');
    body += weights.bytes();

    const json header = {{"kiln_version", contents.kilnVersion},
                         {"backend", "cpu"},
                         {"target", targetToJson(contents.target)}};
    std::string headerText = header.dump();
    // Spaces (JSON whitespace) pad the header so the body, and so every weight, starts on a
    // 64-byte boundary of the file.
    while ((kPrefixBytes + headerText.size()) % kAlignment != 0) headerText.push_back(' ');

    file.append(kEngineMagic);
    appendRaw<uint32_t>(file, kEngineFormatVersion);
    appendRaw<uint32_t>(file, static_cast<uint32_t>(headerText.size()));
    appendRaw<uint64_t>(file, body.size());
    // The checksum covers the header too: a hand-edited fingerprint or version is tampering.
    appendRaw<uint64_t>(file, fnv1a64(headerText + body));
    file += headerText;
    file += body;
  } catch (const json::exception& e) {
    // Non-UTF-8 names or strings are the only way nlohmann's dump fails here.
    return invalidInput("cannot write engine '{}': {}", path.string(), e.what());
  }
  return writeFileAtomically(path, file);
}

Result<LoadedEngine> loadEngine(const std::filesystem::path& path) {
  auto bytes = readFileBytes(path);
  if (!bytes.isOk()) return bytes.status();
  const std::string context = fmt::format("engine '{}'", path.string());
  try {
    auto engine = parseEngine(*bytes);
    if (!engine.isOk()) return engine.status().withContext(context);
    return engine;
  } catch (const json::exception& e) {
    // Past the checksum, malformed JSON means a writer bug or a crafted file.
    return invalidInput("{}: corrupt or tampered: malformed metadata ({})", context, e.what());
  }
}

bool isEngineFile(const std::filesystem::path& path) {
  if (path.extension() == ".kiln") return true;
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  if (!in.read(magic, sizeof magic)) return false;
  return std::string_view(magic, sizeof magic) == kEngineMagic;
}

}  // namespace kiln
