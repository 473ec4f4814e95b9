// libFuzzer harness: the ONNX importer on arbitrary bytes (protobuf parsing, the checks on
// dimensions, initializers and external data, and shape inference). The model's folder is an
// empty one of its own, so external data can only name missing files or escape it.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "kiln/ir/printer.h"
#include "kiln/onnx/import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path baseDir = [] {
    std::filesystem::path dir = std::filesystem::temp_directory_path() / "kiln-fuzz-model-dir";
    std::filesystem::create_directories(dir);
    return dir;
  }();
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto model = kiln::onnx::importModelFromBytes(bytes, baseDir);
  if (model.isOk()) {
    // A model that imports must print without trouble too (every value and attribute).
    (void)kiln::ir::printGraph(model->graph);
  }
  return 0;
}
