// ArgBinder: binds the positional and keyword arguments of a call to the named parameters
// of a built-in filter, test, method or global, the way Python binds a def's signature.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/value.h"

namespace strata::tokenizer::jinja {

class ArgBinder {
 public:
  // `params` in declaration order; `skip` positional arguments were consumed already
  // (a filter's operand is not part of CallArgs, so skip is normally 0).
  ArgBinder(const CallArgs& args, std::string fn, std::vector<std::string> params)
      : fn_(std::move(fn)), bound_(params.size()), given_(params.size(), false) {
    if (args.positional.size() > params.size()) {
      fail(fn_ + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
           std::to_string(args.positional.size()) + " given)");
    }
    for (size_t i = 0; i < args.positional.size(); ++i) {
      bound_[i] = args.positional[i];
      given_[i] = true;
    }
    for (const auto& [name, value] : args.keyword) {
      size_t i = 0;
      while (i < params.size() && params[i] != name) ++i;
      if (i == params.size()) fail(fn_ + "() got an unexpected keyword argument '" + name + "'");
      if (given_[i]) fail(fn_ + "() got multiple values for argument '" + name + "'");
      bound_[i] = value;
      given_[i] = true;
    }
  }

  bool has(size_t i) const { return given_[i]; }
  const Value& get(size_t i) const { return bound_[i]; }
  Value get_or(size_t i, Value fallback) const { return given_[i] ? bound_[i] : std::move(fallback); }
  const Value& require(size_t i, const char* name) const {
    if (!given_[i]) fail(fn_ + "() missing required argument '" + name + "'");
    return bound_[i];
  }

 private:
  std::string fn_;
  std::vector<Value> bound_;
  std::vector<bool> given_;
};

}  // namespace strata::tokenizer::jinja
