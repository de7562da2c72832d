// Parser: builds the syntax tree from lexer tokens following jinja2's grammar and operator
// precedence (condition < or < and < not < comparison < + - < ~ < * / // % < ** < unary <
// filters and tests < postfix). Throws Failure naming the line on a syntax error.
#pragma once

#include <string>

#include "tokenizer/jinja/ast.h"

namespace strata::tokenizer::jinja {

Template parse_template(const std::string& source);

}  // namespace strata::tokenizer::jinja
