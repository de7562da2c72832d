#include "tokenizer/jinja/interpreter.h"

#include <ctime>
#include <memory>
#include <optional>
#include <unordered_map>

#include "tokenizer/jinja/args.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/operators.h"

namespace strata::tokenizer::jinja {

namespace {

// The sandbox's MAX_RANGE: range() refuses to build more items than this.
constexpr int64_t kMaxRange = 100000;

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

struct Scope {
  explicit Scope(ScopePtr p) : parent(std::move(p)) {}
  std::unordered_map<std::string, Value> vars;
  ScopePtr parent;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

ScopePtr child(const ScopePtr& parent) { return std::make_shared<Scope>(parent); }

enum class Flow { kNormal, kBreak, kContinue };

Value builtin_range(const CallArgs& c) {
  if (!c.keyword.empty()) fail("TypeError: range() takes no keyword arguments");
  if (c.positional.empty() || c.positional.size() > 3) fail("TypeError: range expected 1 to 3 arguments");
  for (const auto& v : c.positional) {
    if (!v.is_int() && !v.is_bool()) fail("TypeError: '" + v.type_name() + "' object cannot be interpreted as an integer");
  }
  int64_t start = 0, stop, step = 1;
  if (c.positional.size() == 1) {
    stop = c.positional[0].as_int();
  } else {
    start = c.positional[0].as_int();
    stop = c.positional[1].as_int();
    if (c.positional.size() == 3) step = c.positional[2].as_int();
  }
  if (step == 0) fail("ValueError: range() arg 3 must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      fail("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    out.emplace_back(i);
  }
  return Value::list(std::move(out));
}

Value builtin_namespace(const CallArgs& c) {
  auto attrs = std::make_shared<Dict>();
  for (const auto& p : c.positional) {
    if (!p.is_dict()) fail("TypeError: namespace() positional argument must be a mapping");
    for (const auto& [k, v] : p.as_dict().entries()) attrs->set(k, v);
  }
  for (const auto& [k, v] : c.keyword) attrs->set(Value(k), v);
  return Value::make_namespace(attrs);
}

Value builtin_dict(const CallArgs& c) {
  auto d = std::make_shared<Dict>();
  if (c.positional.size() > 1) fail("TypeError: dict expected at most 1 argument");
  if (!c.positional.empty()) {
    const Value& p = c.positional[0];
    if (p.is_dict()) {
      for (const auto& [k, v] : p.as_dict().entries()) d->set(k, v);
    } else {
      for (const auto& pair : iterate(p)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) fail("ValueError: dictionary update sequence element has the wrong length; 2 is required");
        d->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : c.keyword) d->set(Value(k), v);
  return Value::dict(d);
}

Value builtin_raise_exception(const CallArgs& c) {
  ArgBinder a(c, "raise_exception", {"message"});
  fail(to_str(a.get_or(0, Value(""))));
}

Value builtin_strftime_now(const CallArgs& c) {
  ArgBinder a(c, "strftime_now", {"format"});
  const Value& fmt = a.require(0, "format");
  if (!fmt.is_string()) fail("TypeError: strftime() argument 1 must be str, not " + fmt.type_name());
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  if (fmt.as_string().empty()) return Value("");
  std::vector<char> buf(256 + fmt.as_string().size() * 16);
  size_t n = std::strftime(buf.data(), buf.size(), fmt.as_string().c_str(), &tm);
  return Value(std::string(buf.data(), n));
}

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits) : limits_(limits) {}

  std::string run(const Template& tmpl, const Value& globals) {
    auto root = std::make_shared<Scope>(nullptr);
    root->vars["range"] = Value::callable("range", builtin_range);
    root->vars["namespace"] = Value::callable("namespace", builtin_namespace);
    root->vars["dict"] = Value::callable("dict", builtin_dict);
    root->vars["raise_exception"] = Value::callable("raise_exception", builtin_raise_exception);
    root->vars["strftime_now"] = Value::callable("strftime_now", builtin_strftime_now);
    if (globals.is_dict()) {
      for (const auto& [k, v] : globals.as_dict().entries()) {
        if (k.is_string()) root->vars[k.as_string()] = v;
      }
    }
    std::string out;
    try {
      exec_body(tmpl.body, root, out);
    } catch (Failure& f) {
      if (f.line == 0) f.line = line_;
      throw;
    }
    return out;
  }

 private:
  void emit(std::string& out, const std::string& text) {
    out += text;
    if (out.size() > limits_.max_output_bytes) fail("rendered output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  }

  void count_iteration() {
    if (++iterations_ > limits_.max_loop_iterations) {
      fail("template exceeded " + std::to_string(limits_.max_loop_iterations) + " loop iterations");
    }
  }

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec(*s, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    int saved = line_;
    line_ = s.line;
    Flow f = exec_inner(s, scope, out);
    line_ = saved;
    return f;
  }

  Flow exec_inner(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case StmtKind::kText:
        emit(out, static_cast<const TextStmt&>(s).text);
        return Flow::kNormal;
      case StmtKind::kOutput:
        emit(out, to_str(eval(*static_cast<const OutputStmt&>(s).expr, scope)));
        return Flow::kNormal;
      case StmtKind::kIf: {
        const auto& st = static_cast<const IfStmt&>(s);
        for (const auto& [cond, body] : st.branches) {
          if (eval(*cond, scope).truthy()) return exec_body(body, scope, out);
        }
        return exec_body(st.else_body, scope, out);
      }
      case StmtKind::kFor:
        exec_for(static_cast<const ForStmt&>(s), scope, out);
        return Flow::kNormal;
      case StmtKind::kSet: {
        const auto& st = static_cast<const SetStmt&>(s);
        assign(st.target, eval(*st.value, scope), scope);
        return Flow::kNormal;
      }
      case StmtKind::kBlockSet: {
        const auto& st = static_cast<const BlockSetStmt&>(s);
        std::string text;
        exec_body(st.body, child(scope), text);
        Value v(std::move(text));
        if (st.filter) v = eval_filter(static_cast<const FilterExpr&>(*st.filter), scope, &v);
        assign(st.target, std::move(v), scope);
        return Flow::kNormal;
      }
      case StmtKind::kMacro: {
        const auto& st = static_cast<const MacroStmt&>(s);
        // The macro holds its defining scope weakly (the scope holds the macro: a strong
        // reference would be a cycle); pinned_ keeps the scope alive for the render.
        pinned_.push_back(scope);
        std::weak_ptr<Scope> closure = scope;
        const MacroStmt* macro = &st;
        scope->vars[st.name] = Value::callable(st.name, [this, macro, closure](const CallArgs& args) {
          ScopePtr s = closure.lock();
          if (!s) fail("internal error: macro scope expired");
          return call_macro(*macro, s, args);
        });
        return Flow::kNormal;
      }
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kFilterBlock: {
        const auto& st = static_cast<const FilterBlockStmt&>(s);
        std::string text;
        exec_body(st.body, child(scope), text);
        Value v(std::move(text));
        emit(out, to_str(eval_filter(static_cast<const FilterExpr&>(*st.filter), scope, &v)));
        return Flow::kNormal;
      }
      case StmtKind::kWith: {
        const auto& st = static_cast<const WithStmt&>(s);
        ScopePtr inner = child(scope);
        for (const auto& [target, expr] : st.assignments) assign(target, eval(*expr, scope), inner);
        return exec_body(st.body, inner, out);
      }
      case StmtKind::kBody:
        return exec_body(static_cast<const BodyStmt&>(s).body, scope, out);
    }
    return Flow::kNormal;
  }

  void bind_targets(const std::vector<std::string>& names, bool unpack, const Value& v, Scope& scope) {
    if (!unpack) {
      scope.vars[names[0]] = v;
      return;
    }
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_list() && !v.is_string() && !v.is_dict()) fail("TypeError: cannot unpack non-iterable " + v.type_name() + " object");
    std::vector<Value> parts = iterate(v);
    if (parts.size() > names.size()) fail("ValueError: too many values to unpack (expected " + std::to_string(names.size()) + ")");
    if (parts.size() < names.size()) {
      fail("ValueError: not enough values to unpack (expected " + std::to_string(names.size()) + ", got " + std::to_string(parts.size()) + ")");
    }
    for (size_t i = 0; i < names.size(); ++i) scope.vars[names[i]] = parts[i];
  }

  void assign(const AssignTarget& t, Value v, const ScopePtr& scope) {
    if (!t.attr.empty()) {
      const Value* ns = scope->lookup(t.names[0]);
      if (!ns || !ns->is_namespace()) fail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
      ns->namespace_attrs().set(Value(t.attr), std::move(v));
      return;
    }
    bind_targets(t.names, t.unpack, v, *scope);
  }

  void exec_for(const ForStmt& st, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*st.iter, scope));
    if (st.filter) {
      std::vector<Value> kept;
      for (auto& item : items) {
        count_iteration();
        ScopePtr probe = child(scope);
        bind_targets(st.targets, st.unpack, item, *probe);
        if (eval(*st.filter, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(st.else_body, child(scope), out);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    auto last_changed = std::make_shared<std::optional<Value>>();
    for (int64_t i = 0; i < n; ++i) {
      count_iteration();
      ScopePtr iter_scope = child(scope);
      bind_targets(st.targets, st.unpack, items[static_cast<size_t>(i)], *iter_scope);
      if (st.uses_loop) iter_scope->vars["loop"] = make_loop(items, i, last_changed);
      Flow f = exec_body(st.body, iter_scope, out);
      if (f == Flow::kBreak) break;
    }
  }

  static Value make_loop(const std::vector<Value>& items, int64_t i, const std::shared_ptr<std::optional<Value>>& last_changed) {
    const int64_t n = static_cast<int64_t>(items.size());
    auto d = std::make_shared<Dict>();
    d->set(Value("index"), Value(i + 1));
    d->set(Value("index0"), Value(i));
    d->set(Value("revindex"), Value(n - i));
    d->set(Value("revindex0"), Value(n - i - 1));
    d->set(Value("first"), Value(i == 0));
    d->set(Value("last"), Value(i == n - 1));
    d->set(Value("length"), Value(n));
    d->set(Value("depth"), Value(int64_t{1}));
    d->set(Value("depth0"), Value(int64_t{0}));
    if (i > 0) d->set(Value("previtem"), items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) d->set(Value("nextitem"), items[static_cast<size_t>(i + 1)]);
    d->set(Value("cycle"), Value::callable("loop.cycle", [i](const CallArgs& c) {
      if (c.positional.empty()) fail("TypeError: no items for cycling given");
      return c.positional[static_cast<size_t>(i) % c.positional.size()];
    }));
    d->set(Value("changed"), Value::callable("loop.changed", [last_changed](const CallArgs& c) {
      Value now = Value::list(c.positional, SeqKind::kTuple);
      if (*last_changed && values_equal(**last_changed, now)) return Value(false);
      *last_changed = now;
      return Value(true);
    }));
    return Value::dict(d);
  }

  Value call_macro(const MacroStmt& m, const ScopePtr& closure, const CallArgs& args) {
    if (++call_depth_ > limits_.max_call_depth) fail("RecursionError: macro calls nest deeper than " + std::to_string(limits_.max_call_depth));
    if (args.positional.size() > m.params.size()) {
      fail("TypeError: macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)");
    }
    ScopePtr s = child(closure);
    for (const auto& [k, _] : args.keyword) {
      bool known = false;
      for (const auto& p : m.params) known = known || p.first == k;
      if (!known) fail("TypeError: macro '" + m.name + "' takes no keyword argument '" + k + "'");
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      if (i < args.positional.size()) {
        s->vars[name] = args.positional[i];
        continue;
      }
      const Value* kw = nullptr;
      for (const auto& [k, v] : args.keyword) {
        if (k == name) kw = &v;
      }
      if (kw) s->vars[name] = *kw;
      else if (def) s->vars[name] = eval(*def, s);
      else s->vars[name] = Value::undefined("parameter '" + name + "' was not provided");
    }
    std::string out;
    int saved = line_;
    exec_body(m.body, s, out);
    line_ = saved;
    --call_depth_;
    return Value(std::move(out));
  }

  CallArgs eval_args(const CallArgExprs& a, const ScopePtr& scope) {
    CallArgs c;
    for (const auto& e : a.positional) c.positional.push_back(eval(*e, scope));
    for (const auto& [k, e] : a.keyword) c.keyword.emplace_back(k, eval(*e, scope));
    return c;
  }

  // `block_input` stands for the innermost operand of a filter block or block set.
  Value eval_filter(const FilterExpr& f, const ScopePtr& scope, const Value* block_input) {
    Value operand;
    if (f.operand) {
      operand = f.operand->kind == ExprKind::kFilter
                    ? eval_filter(static_cast<const FilterExpr&>(*f.operand), scope, block_input)
                    : eval(*f.operand, scope);
    } else if (block_input) {
      operand = *block_input;
    }
    CallArgs args = eval_args(f.args, scope);
    int saved = line_;
    line_ = f.line;
    Value v = apply_filter(f.name, operand, args);
    line_ = saved;
    return v;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    int saved = line_;
    line_ = e.line;
    Value v = eval_inner(e, scope);
    line_ = saved;
    return v;
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::kLiteral: return static_cast<const LiteralExpr&>(e).value;
      case ExprKind::kName: {
        const auto& n = static_cast<const NameExpr&>(e);
        const Value* v = scope->lookup(n.name);
        return v ? *v : Value::undefined("'" + n.name + "' is undefined");
      }
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const auto& item : static_cast<const SeqExpr&>(e).items) items.push_back(eval(*item, scope));
        return Value::list(std::move(items), e.kind == ExprKind::kTuple ? SeqKind::kTuple : SeqKind::kList);
      }
      case ExprKind::kDict: {
        auto d = std::make_shared<Dict>();
        for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
          Value key = eval(*k, scope);
          d->set(key, eval(*v, scope));
        }
        return Value::dict(d);
      }
      case ExprKind::kGetAttr: {
        const auto& g = static_cast<const GetAttrExpr&>(e);
        return get_attr(eval(*g.object, scope), g.attr);
      }
      case ExprKind::kGetItem: {
        const auto& g = static_cast<const GetItemExpr&>(e);
        Value obj = eval(*g.object, scope);
        return get_item(obj, eval(*g.index, scope));
      }
      case ExprKind::kSlice: {
        const auto& s = static_cast<const SliceExpr&>(e);
        Value obj = eval(*s.object, scope);
        Value start = s.start ? eval(*s.start, scope) : Value::none();
        Value stop = s.stop ? eval(*s.stop, scope) : Value::none();
        Value step = s.step ? eval(*s.step, scope) : Value::none();
        return slice_value(obj, start, stop, step);
      }
      case ExprKind::kUnary: {
        const auto& u = static_cast<const UnaryExpr&>(e);
        Value v = eval(*u.operand, scope);
        if (u.op == UnaryOp::kNot) return Value(!v.truthy());
        return negate(v, u.op == UnaryOp::kNeg);
      }
      case ExprKind::kBinary: {
        const auto& b = static_cast<const BinaryExpr&>(e);
        Value left = eval(*b.left, scope);
        if (b.op == BinaryOp::kAnd) return left.truthy() ? eval(*b.right, scope) : left;
        if (b.op == BinaryOp::kOr) return left.truthy() ? left : eval(*b.right, scope);
        Value right = eval(*b.right, scope);
        return binary_op(b.op, left, right);
      }
      case ExprKind::kCompare: {
        const auto& c = static_cast<const CompareExpr&>(e);
        Value left = eval(*c.left, scope);
        for (const auto& [op, expr] : c.rest) {
          Value right = eval(*expr, scope);
          if (!compare_op(op, left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::kCondition: {
        const auto& c = static_cast<const ConditionExpr&>(e);
        if (eval(*c.test, scope).truthy()) return eval(*c.then_expr, scope);
        if (c.else_expr) return eval(*c.else_expr, scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      }
      case ExprKind::kCall: {
        const auto& c = static_cast<const CallExpr&>(e);
        Value callee = eval(*c.callee, scope);
        CallArgs args = eval_args(c.args, scope);
        if (callee.is_undefined()) fail_undefined(callee);
        if (!callee.is_callable()) fail("TypeError: '" + callee.type_name() + "' object is not callable");
        return callee.as_callable().fn(args);
      }
      case ExprKind::kFilter: return eval_filter(static_cast<const FilterExpr&>(e), scope, nullptr);
      case ExprKind::kTest: {
        const auto& t = static_cast<const TestExpr&>(e);
        Value v = eval(*t.operand, scope);
        bool r = apply_test(t.name, v, eval_args(t.args, scope));
        return Value(t.negated ? !r : r);
      }
    }
    fail("internal error: unknown expression");
  }

  RenderLimits limits_;
  std::vector<ScopePtr> pinned_;
  int line_ = 0;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::string render_template(const Template& tmpl, const Value& globals, const RenderLimits& limits) {
  return Interpreter(limits).run(tmpl, globals);
}

}  // namespace strata::tokenizer::jinja
