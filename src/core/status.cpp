#include "core/status.h"

namespace strata {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kCorrupt: return "corrupt";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "error";
}

}  // namespace strata
