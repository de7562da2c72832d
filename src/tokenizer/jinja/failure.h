// Failure: how the Jinja interpreter unwinds on a template error. The lexer, parser and
// evaluator throw it from any depth; ChatTemplate::parse and ::render catch it at the API
// boundary and turn it into an Error naming the template line, so it never escapes strata.
#pragma once

#include <string>
#include <utility>

namespace strata::tokenizer::jinja {

struct Failure {
  std::string message;
  int line = 0;  // 1-based template line; 0 until the evaluator attaches it
};

[[noreturn]] inline void fail(std::string message, int line = 0) {
  throw Failure{std::move(message), line};
}

}  // namespace strata::tokenizer::jinja
