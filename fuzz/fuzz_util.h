// What the fuzz harnesses share: a file of their own to hand bytes to readers that take a path.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln::fuzz {

// A path under the temporary folder, unique to this process, holding `size` bytes of `data`.
inline std::filesystem::path writeScratch(const uint8_t* data, size_t size, const char* suffix) {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln-fuzz-" + std::to_string(getpid()) + suffix);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace kiln::fuzz
