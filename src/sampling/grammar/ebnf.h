// GBNF grammars (llama.cpp syntax): `name ::= ...` rules, "literals", [classes] and [^...],
// `.`, ( ), |, * + ? {m} {m,} {m,n}, rule references, # comments. The start rule is `root`.
// A rule may span lines; the next `name ::=` starts the next rule.
#pragma once

#include <memory>
#include <string_view>

#include "core/status.h"
#include "sampling/grammar/ir.h"

namespace strata::grammar {

Result<std::shared_ptr<const Grammar>> compile_ebnf(std::string_view text, const Limits& limits = {});

}  // namespace strata::grammar
