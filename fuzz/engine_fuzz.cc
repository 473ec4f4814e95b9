// libFuzzer harness: the engine loader on arbitrary bytes written to a file.
//
// An engine carries a checksum and the fingerprint of the machine that built it, so mutated
// bytes almost never get past those two checks. Each input is therefore loaded twice: as it is
// (the checks before the checksum: magic, version, lengths), and sealed, that is with the
// header's target set to this machine's, the lengths made consistent and the checksum
// recomputed, which takes the mutations through to the metadata and graph parsers, the weights'
// bounds and the re-lowering of the plan. The seeds are engines `kiln build` wrote.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "kiln/engine/engine_file.h"

namespace {

constexpr size_t kPrefix = 32;

template <typename T>
void put(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// The input with this machine's target, consistent lengths and a valid checksum; empty when it
// does not start like an engine.
std::string seal(std::string_view input) {
  if (input.size() < kPrefix || input.substr(0, 8) != kiln::kEngineMagic) return {};
  uint32_t headerBytes = 0;
  std::memcpy(&headerBytes, input.data() + 12, sizeof headerBytes);
  headerBytes = static_cast<uint32_t>(std::min<size_t>(headerBytes, input.size() - kPrefix));
  nlohmann::json header = nlohmann::json::parse(input.substr(kPrefix, headerBytes), nullptr,
                                                /*allow_exceptions=*/false);
  std::string headerText(input.substr(kPrefix, headerBytes));
  if (header.is_object()) {
    const kiln::EngineTarget here = kiln::currentTarget();
    header["target"] = {{"cpu_model", here.cpuModel},
                        {"avx2", here.avx2},
                        {"avx512f", here.avx512f},
                        {"fma", here.fma},
                        {"avx512_bf16", here.avx512bf16}};
    headerText = header.dump();
    while ((kPrefix + headerText.size()) % 64 != 0) headerText.push_back(' ');
  }
  std::string_view body = input.substr(kPrefix + headerBytes);
  std::string file(input.substr(0, kPrefix));
  file += headerText;
  file += body;
  put<uint32_t>(file, 12, static_cast<uint32_t>(headerText.size()));
  put<uint64_t>(file, 16, body.size());
  put<uint64_t>(file, 24, kiln::engineChecksum(std::string_view(file).substr(kPrefix)));
  return file;
}

void load(std::string_view bytes) {
  std::filesystem::path path = kiln::fuzz::writeScratch(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), ".kiln");
  (void)kiln::isEngineFile(path);
  (void)kiln::loadEngine(path);
  std::filesystem::remove(path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  load(input);
  std::string sealed = seal(input);
  if (!sealed.empty()) load(sealed);
  return 0;
}
