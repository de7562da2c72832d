#include "core/check.h"

namespace strata {

void invariant_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::string what = std::string(file) + ":" + std::to_string(line) + ": check failed: " + expr;
  if (!msg.empty()) what += " (" + msg + ")";
  throw InvariantError(what);
}

}  // namespace strata
