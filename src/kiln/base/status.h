// Status and Result<T>: kiln's errors are values, never exceptions, in the compiler core.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

// What kind of failure a Status carries. The first group is the user's to fix (bad model, bad
// flag, missing file); kInternal is a kiln bug.
enum class StatusCode {
  kOk = 0,
  kInvalidInput,  // malformed model, bad attribute, shape mismatch, bad flag value
  kUnsupported,   // well-formed input that kiln does not handle yet (op, dtype, feature)
  kIo,            // file missing, unreadable, truncated, disk full
  kInternal,      // a broken invariant inside kiln
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }

  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is prefixed with `context: `, e.g. the node a failure came from.
  Status withContext(const std::string& context) const {
    if (isOk()) return *this;
    return Status(code_, context + ": " + message_);
  }

  std::string toString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status invalidInput(fmt::format_string<Args...> format, Args&&... args) {
  return Status(StatusCode::kInvalidInput, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
Status unsupported(fmt::format_string<Args...> format, Args&&... args) {
  return Status(StatusCode::kUnsupported, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
Status ioError(fmt::format_string<Args...> format, Args&&... args) {
  return Status(StatusCode::kIo, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
Status internalError(fmt::format_string<Args...> format, Args&&... args) {
  return Status(StatusCode::kInternal, fmt::format(format, std::forward<Args>(args)...));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(state_).isOk() && "Result constructed from an ok Status");
  }

  bool isOk() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOk;
    return isOk() ? kOk : std::get<Status>(state_);
  }

  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not ok.
#define KILN_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::kiln::Status kiln_status_ = (expr);          \
    if (!kiln_status_.isOk()) return kiln_status_; \
  } while (0)

// `KILN_ASSIGN_OR_RETURN(auto x, makeX());` binds the value or returns the error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_result_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.isOk()) return tmp.status();             \
  lhs = std::move(tmp).value()

// An internal invariant: a failure here is a kiln bug, reported with the invariant's text.
#define KILN_CHECK(cond)                                                 \
  do {                                                                   \
    if (!(cond)) ::kiln::detail::checkFailed(#cond, __FILE__, __LINE__); \
  } while (0)

namespace kiln::detail {
[[noreturn]] void checkFailed(const char* condition, const char* file, int line);
}
