// Interpreter: renders a parsed template against global variables, with jinja2's scoping
// (a for-loop iteration, macro call or with block opens a scope; if does not), loop
// controls, macros, namespace() and the globals transformers provides (raise_exception,
// strftime_now) plus range/dict/namespace. Bounded: loop iterations, macro call depth and
// output size have limits, so a hostile template ends in a Failure, never a hang or crash.
#pragma once

#include <cstddef>
#include <string>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace strata::tokenizer::jinja {

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;
  int64_t max_loop_iterations = 1'000'000;  // summed over all loops of one render
  int max_call_depth = 200;                  // macro calls in flight
};

// Renders `tmpl` with `globals` (a dict of variable name to value). Throws Failure, with the
// template line attached, on any template error.
std::string render_template(const Template& tmpl, const Value& globals, const RenderLimits& limits = {});

}  // namespace strata::tokenizer::jinja
