// Value: the dynamic value of the Jinja interpreter, modelled on the Python objects jinja2
// hands a chat template (str, int, float, bool, None, list, tuple, dict, Undefined,
// namespace, callables). Lists and dicts are shared and immutable once built (the sandbox
// transformers uses refuses mutating methods); only a namespace changes after creation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::tokenizer::jinja {

class Value;

// How deep values may nest before printing, comparing or converting them fails.
constexpr int kMaxDepth = 512;

// How a sequence prints: Python distinguishes a list, a tuple and the dict views.
enum class SeqKind : uint8_t { kList, kTuple, kDictItems, kDictKeys, kDictValues };

struct List {
  std::vector<Value> items;
  SeqKind kind = SeqKind::kList;
};

// An insertion-ordered dict (Python dicts keep insertion order). Keys are hashed through
// dict_key(), so 1, 1.0 and True collide as they do in Python.
class Dict {
 public:
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(const Value& key, Value value);
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A built-in function, bound method or macro. Errors are thrown as Failure (see failure.h).
struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable
  };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  Value(bool b);                 // NOLINT: implicit, values are built everywhere
  Value(int64_t i);              // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double f);               // NOLINT
  Value(std::string s);          // NOLINT
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT
  static Value list(std::vector<Value> items, SeqKind kind = SeqKind::kList);
  static Value dict(std::shared_ptr<Dict> d);
  static Value make_namespace(std::shared_ptr<Dict> attrs);
  static Value callable(std::string name, std::function<Value(const CallArgs&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_float() const;  // any number
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& namespace_attrs() const { return *dict_; }
  const Callable& as_callable() const { return *fn_; }
  const std::string& undefined_hint() const;  // the name that was missing, for messages

  // Python truthiness.
  bool truthy() const;
  // Python type name, for error messages ("str", "int", "NoneType", ...).
  std::string type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0.0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> fn_;
};

// The key under which Dict indexes a value: equal Python keys map to equal strings.
std::string dict_key(const Value& v);

// Python str() and repr() of a value; undefined prints as the empty string.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
std::string python_float_repr(double f);
std::string python_string_repr(const std::string& s);

// Python ==.
bool values_equal(const Value& a, const Value& b);

}  // namespace strata::tokenizer::jinja
