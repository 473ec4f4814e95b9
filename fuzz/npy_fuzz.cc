// libFuzzer harness: the .npy parser on arbitrary bytes, and the .npz reader (a zip archive of
// .npy members) on the same bytes written to a file. A tensor that parses must serialise back
// to bytes that parse to the same shape and type.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "fuzz_util.h"
#include "kiln/ir/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto tensor = kiln::ir::parseNpy(bytes, "fuzz.npy");
  if (tensor.isOk()) {
    auto again = kiln::ir::serializeNpy(*tensor);
    if (again.isOk()) {
      auto back = kiln::ir::parseNpy(*again, "round trip");
      if (!back.isOk() || back->shape() != tensor->shape() || back->dtype() != tensor->dtype()) {
        std::abort();  // what kiln writes, kiln must read back as it was
      }
    }
  }
  std::filesystem::path path = kiln::fuzz::writeScratch(data, size, ".npz");
  (void)kiln::ir::readNpz(path);
  std::filesystem::remove(path);
  return 0;
}
