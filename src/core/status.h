// Result<T>: the value of an operation that can fail on input a user controls.
// A bad request, a missing file or a corrupt checkpoint is an Error value, never an abort;
// broken internal invariants use STRATA_CHECK (check.h) instead.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace strata {

enum class ErrorCode {
  kInvalidArgument,  // a field or flag has a value strata cannot use
  kNotFound,         // a file, tensor, model or id that does not exist
  kCorrupt,          // data that contradicts itself (truncated file, lying header)
  kUnsupported,      // a valid request for something strata does not do
  kOutOfRange,       // a length or index past a limit (context, vocabulary)
  kResourceExhausted,// a queue or pool is full
  kIo,               // the operating system refused
  kInternal,         // a bug: an invariant broke
};

const char* error_code_name(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;  // names the field / file and the value at fault

  std::string to_string() const { return std::string(error_code_name(code)) + ": " + message; }
};

inline Error make_error(ErrorCode code, std::string message) { return Error{code, std::move(message)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}               // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}           // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Status: a Result with no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status ok_status() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace strata

// Propagate an error from an expression returning Status or Result<T>.
#define STRATA_RETURN_IF_ERROR(expr)            \
  do {                                          \
    auto&& strata_status_ = (expr);             \
    if (!strata_status_.ok()) return strata_status_.error(); \
  } while (0)
