// Expected failures are values: Status (ok or an error message) and Result<T> (a value or a
// Status). Programming errors use MR_CHECK, which stays on in release builds.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace mr {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // bad input from a user or a file
  kNotFound,
  kIo,
  kUnsupported,
  kOutOfRange,
  kInternal,
  kUnavailable,  // the service cannot take or finish the work now (shutting down)
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return Status(ErrorCode::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) {
  return Status(ErrorCode::kNotFound, std::move(m));
}
inline Status IoError(std::string m) {
  return Status(ErrorCode::kIo, std::move(m));
}
inline Status Unsupported(std::string m) {
  return Status(ErrorCode::kUnsupported, std::move(m));
}
inline Status OutOfRange(std::string m) {
  return Status(ErrorCode::kOutOfRange, std::move(m));
}
inline Status Internal(std::string m) {
  return Status(ErrorCode::kInternal, std::move(m));
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: must not be ok
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "%s:%d: check failed: %s %s\n", file, line, expr, msg ? msg : "");
  std::abort();
}

}  // namespace mr

#define MR_CHECK(cond)                                                  \
  do {                                                                  \
    if (!(cond)) ::mr::CheckFailed(__FILE__, __LINE__, #cond, nullptr); \
  } while (0)
#define MR_CHECK_MSG(cond, msg)                                       \
  do {                                                                \
    if (!(cond)) ::mr::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// Propagate an error Status from an expression returning Status.
#define MR_RETURN_IF_ERROR(expr) \
  do {                           \
    ::mr::Status _st = (expr);   \
    if (!_st.ok()) return _st;   \
  } while (0)

#define MR_CONCAT_INNER(a, b) a##b
#define MR_CONCAT(a, b) MR_CONCAT_INNER(a, b)
// Assign the value of a Result<T> expression or return its error Status.
#define MR_ASSIGN_OR_RETURN(lhs, expr) MR_ASSIGN_OR_RETURN_IMPL(MR_CONCAT(_res_, __LINE__), lhs, expr)
#define MR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
