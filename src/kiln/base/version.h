// kiln's version: written into engine headers, tuning caches and manifests.
#pragma once

#include <string_view>

namespace kiln {

inline constexpr std::string_view kKilnVersion = "0.1.0";

}  // namespace kiln
