// Whole-file reads and atomic writes: a reader never sees a half-written file, and a failed
// write (disk full, no permission) leaves the old file as it was.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "kiln/base/status.h"

namespace kiln {

Result<std::string> readFileBytes(const std::filesystem::path& path);

// Writes `bytes` to a temporary file beside `path`, syncs it, and renames it over `path`.
Status writeFileAtomically(const std::filesystem::path& path, std::string_view bytes);

// A temporary path beside `path` for writers that need a file name of their own (e.g. libzip);
// the caller renames it with `commitTemporary` or removes it.
std::filesystem::path temporaryPathFor(const std::filesystem::path& path);
Status commitTemporary(const std::filesystem::path& temporary, const std::filesystem::path& path);

}  // namespace kiln
