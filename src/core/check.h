// STRATA_CHECK: an internal invariant. A failure throws InvariantError with file:line; the
// engine catches it at the step boundary and fails only the requests it touches. Never use it
// for input a user can send: that is an Error value (status.h).
#pragma once

#include <stdexcept>
#include <string>

namespace strata {

class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void invariant_failed(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace strata

#define STRATA_CHECK(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) ::strata::invariant_failed(__FILE__, __LINE__, #cond, std::string{__VA_ARGS__}); \
  } while (0)
