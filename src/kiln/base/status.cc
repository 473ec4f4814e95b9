// Status formatting and the invariant-failure handler.
#include "kiln/base/status.h"

#include <cstdio>
#include <cstdlib>

namespace kiln {

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidInput:
      return "invalid input";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kIo:
      return "I/O error";
    case StatusCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::toString() const {
  if (isOk()) return "ok";
  return fmt::format("{}: {}", statusCodeName(code_), message_);
}

namespace detail {
void checkFailed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "kiln internal error: invariant '%s' failed at %s:%d\n", condition, file,
               line);
  std::abort();
}
}  // namespace detail

}  // namespace kiln
