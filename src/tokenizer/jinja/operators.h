// Operators: Python semantics of jinja2's expression operators on Values (arithmetic,
// comparison, membership, attribute and item lookup through the immutable sandbox,
// slicing, iteration). Every misuse throws Failure with Python's wording.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace strata::tokenizer::jinja {

// Largest string or list an operator may build (`'x' * n`, list repetition, range()).
constexpr size_t kMaxBuiltSize = 64u << 20;

[[noreturn]] void fail_undefined(const Value& v);

Value binary_op(BinaryOp op, const Value& a, const Value& b);
Value negate(const Value& v, bool negative);
bool compare_op(CompareOp op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
// Python `a < b`, throwing TypeError for unorderable operands.
bool value_less(const Value& a, const Value& b);

Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The items a for loop or filter walks: list items, dict keys, string code points; an
// undefined value is empty.
std::vector<Value> iterate(const Value& v);
// Python len(); undefined has length 0.
int64_t length_of(const Value& v);

}  // namespace strata::tokenizer::jinja
