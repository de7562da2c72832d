#include "tokenizer/jinja/parser.h"

#include <set>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/lexer.h"

namespace strata::tokenizer::jinja {

namespace {

// Guards the recursive descent against templates such as "((((((...": each nesting
// level costs a few stack frames.
constexpr int kMaxNesting = 200;

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kData: return "template data";
    case TokenKind::kVarBegin: return "begin of print statement";
    case TokenKind::kVarEnd: return "end of print statement";
    case TokenKind::kBlockBegin: return "begin of statement block";
    case TokenKind::kBlockEnd: return "end of statement block";
    case TokenKind::kEof: return "end of template";
    case TokenKind::kString: return "string";
    case TokenKind::kInteger: return "integer";
    case TokenKind::kFloat: return "float";
    default: return "'" + t.text + "'";
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Template run() {
    Template t;
    t.body = parse_body({});
    if (cur().kind != TokenKind::kEof) fail("unexpected " + describe(cur()), cur().line);
    return t;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) fail("template nests too deeply", p_.cur().line);
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  Token next() {
    Token t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op) const { return cur().kind == TokenKind::kOperator && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == TokenKind::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected token '") + op + "', got " + describe(cur()), cur().line);
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::kName) fail("expected a name, got " + describe(cur()), cur().line);
    return next().text;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::kBlockEnd) fail("expected end of statement block, got " + describe(cur()), cur().line);
    next();
  }

  // Parses statements until a `{% name %}` with name in `ends`; leaves the tokens at that
  // name (just after `{%`).
  Body parse_body(const std::set<std::string>& ends) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.kind) {
        case TokenKind::kData:
          body.push_back(std::make_unique<TextStmt>(t.text, t.line));
          next();
          break;
        case TokenKind::kVarBegin: {
          int line = t.line;
          next();
          ExprPtr e = parse_tuple(true, false, {});
          if (cur().kind != TokenKind::kVarEnd) fail("expected end of print statement, got " + describe(cur()), cur().line);
          next();
          body.push_back(std::make_unique<OutputStmt>(std::move(e), line));
          break;
        }
        case TokenKind::kBlockBegin: {
          const Token& name = peek();
          if (name.kind == TokenKind::kName && ends.count(name.text)) {
            next();
            return body;
          }
          next();
          body.push_back(parse_statement());
          break;
        }
        case TokenKind::kEof:
          if (!ends.empty()) {
            std::string want;
            for (const auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
            fail("unexpected end of template, expected " + want, t.line);
          }
          return body;
        default:
          fail("unexpected " + describe(t), t.line);
      }
    }
  }

  StmtPtr parse_statement() {
    if (cur().kind != TokenKind::kName) fail("tag name expected, got " + describe(cur()), cur().line);
    const std::string tag = cur().text;
    int line = cur().line;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "break" || tag == "continue") {
      next();
      if (loop_depth_ == 0) fail("'" + tag + "' is not allowed outside a loop", line);
      expect_block_end();
      return std::make_unique<Stmt>(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
    }
    if (tag == "filter") {
      next();
      auto s = std::make_unique<FilterBlockStmt>(line);
      s->filter = parse_filter_chain(nullptr);
      expect_block_end();
      s->body = parse_body({"endfilter"});
      end_tag("endfilter");
      return s;
    }
    if (tag == "with") return parse_with();
    if (tag == "generation") {
      next();
      expect_block_end();
      auto s = std::make_unique<BodyStmt>(line);
      s->body = parse_body({"endgeneration"});
      end_tag("endgeneration");
      return s;
    }
    fail("encountered unknown tag '" + tag + "'", line);
  }

  void end_tag(const char* name) {
    next();  // the end tag's name
    (void)name;
    expect_block_end();
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>(cur().line);
    next();
    while (true) {
      ExprPtr cond = parse_tuple(false, false, {});
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      std::string tag = next().text;
      if (tag == "elif") continue;
      if (tag == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"});
        next();
      }
      expect_block_end();
      return s;
    }
  }

  AssignTarget parse_assign_target(bool allow_attr) {
    AssignTarget t;
    bool parens = skip_op("(");
    t.names.push_back(expect_name());
    if (allow_attr && !parens && is_op(".")) {
      next();
      t.attr = expect_name();
      return t;
    }
    while (skip_op(",")) {
      t.unpack = true;
      if (cur().kind != TokenKind::kName) break;  // trailing comma
      t.names.push_back(expect_name());
    }
    if (parens) {
      expect_op(")");
    }
    return t;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>(cur().line);
    next();
    AssignTarget target = parse_assign_target(false);
    s->targets = target.names;
    s->unpack = target.unpack;
    if (!skip_name("in")) fail("expected 'in', got " + describe(cur()), cur().line);
    s->iter = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->filter = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported", cur().line);
    expect_block_end();
    ++loop_depth_;
    int loop_names_before = loop_names_;
    s->body = parse_body({"endfor", "else"});
    s->uses_loop = loop_names_ != loop_names_before;
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"});
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    int line = cur().line;
    next();
    AssignTarget target = parse_assign_target(true);
    if (skip_op("=")) {
      auto s = std::make_unique<SetStmt>(line);
      s->target = std::move(target);
      s->value = parse_tuple(true, false, {});
      expect_block_end();
      return s;
    }
    auto s = std::make_unique<BlockSetStmt>(line);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter_chain(nullptr);
    expect_block_end();
    s->body = parse_body({"endset"});
    end_tag("endset");
    return s;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<MacroStmt>(cur().line);
    next();
    s->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string name = expect_name();
      ExprPtr def;
      if (skip_op("=")) def = parse_expression(true);
      s->params.emplace_back(std::move(name), std::move(def));
    }
    next();
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_tag("endmacro");
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<WithStmt>(cur().line);
    next();
    while (cur().kind != TokenKind::kBlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      AssignTarget target = parse_assign_target(false);
      expect_op("=");
      s->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    expect_block_end();
    s->body = parse_body({"endwith"});
    end_tag("endwith");
    return s;
  }

  bool is_tuple_end(const std::set<std::string>& extra_end) const {
    const Token& t = cur();
    if (t.kind == TokenKind::kVarEnd || t.kind == TokenKind::kBlockEnd || t.kind == TokenKind::kEof) return true;
    if (t.kind == TokenKind::kOperator && t.text == ")") return true;
    return t.kind == TokenKind::kName && extra_end.count(t.text);
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, const std::set<std::string>& extra_end) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()), cur().line);
    }
    auto t = std::make_unique<SeqExpr>(ExprKind::kTuple, line);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int line = cur().line;
      next();
      auto c = std::make_unique<ConditionExpr>(line);
      c->then_expr = std::move(e);
      c->test = parse_or();
      if (skip_name("else")) c->else_expr = parse_expression(true);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = next().line;
      e = std::make_unique<BinaryExpr>(BinaryOp::kOr, std::move(e), parse_and(), line);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = next().line;
      e = std::make_unique<BinaryExpr>(BinaryOp::kAnd, std::move(e), parse_not(), line);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      int line = next().line;
      return std::make_unique<UnaryExpr>(UnaryOp::kNot, parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr e = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      CompareOp op;
      const Token& t = cur();
      if (t.kind == TokenKind::kOperator && t.text == "==") op = CompareOp::kEq;
      else if (t.kind == TokenKind::kOperator && t.text == "!=") op = CompareOp::kNe;
      else if (t.kind == TokenKind::kOperator && t.text == "<") op = CompareOp::kLt;
      else if (t.kind == TokenKind::kOperator && t.text == "<=") op = CompareOp::kLe;
      else if (t.kind == TokenKind::kOperator && t.text == ">") op = CompareOp::kGt;
      else if (t.kind == TokenKind::kOperator && t.text == ">=") op = CompareOp::kGe;
      else if (is_name("in")) op = CompareOp::kIn;
      else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
        next();
        op = CompareOp::kNotIn;
      } else {
        break;
      }
      next();
      if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(e), line);
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      Token t = next();
      e = std::make_unique<BinaryExpr>(t.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub, std::move(e), parse_concat(), t.line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = next().line;
      e = std::make_unique<BinaryExpr>(BinaryOp::kConcat, std::move(e), parse_math2(), line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token t = next();
      BinaryOp op = t.text == "*" ? BinaryOp::kMul : t.text == "/" ? BinaryOp::kDiv
                  : t.text == "//" ? BinaryOp::kFloorDiv : BinaryOp::kMod;
      e = std::make_unique<BinaryExpr>(op, std::move(e), parse_pow(), t.line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      int line = next().line;
      e = std::make_unique<BinaryExpr>(BinaryOp::kPow, std::move(e), parse_unary(true), line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    int line = cur().line;
    if (skip_op("-")) e = std::make_unique<UnaryExpr>(UnaryOp::kNeg, parse_unary(false), line);
    else if (skip_op("+")) e = std::make_unique<UnaryExpr>(UnaryOp::kPos, parse_unary(false), line);
    else e = parse_primary();
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    switch (t.kind) {
      case TokenKind::kName: {
        std::string n = next().text;
        if (n == "true" || n == "True") return std::make_unique<LiteralExpr>(Value(true), line);
        if (n == "false" || n == "False") return std::make_unique<LiteralExpr>(Value(false), line);
        if (n == "none" || n == "None") return std::make_unique<LiteralExpr>(Value::none(), line);
        if (n == "loop") ++loop_names_;
        return std::make_unique<NameExpr>(n, line);
      }
      case TokenKind::kString: {
        std::string s = next().text;
        while (cur().kind == TokenKind::kString) s += next().text;
        return std::make_unique<LiteralExpr>(Value(std::move(s)), line);
      }
      case TokenKind::kInteger: return std::make_unique<LiteralExpr>(Value(next().int_value), line);
      case TokenKind::kFloat: return std::make_unique<LiteralExpr>(Value(next().float_value), line);
      case TokenKind::kOperator:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, true, {});
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          next();
          auto l = std::make_unique<SeqExpr>(ExprKind::kList, line);
          while (!is_op("]")) {
            if (!l->items.empty()) expect_op(",");
            if (is_op("]")) break;
            l->items.push_back(parse_expression(true));
          }
          next();
          return l;
        }
        if (t.text == "{") {
          next();
          auto d = std::make_unique<DictExpr>(line);
          while (!is_op("}")) {
            if (!d->items.empty()) expect_op(",");
            if (is_op("}")) break;
            ExprPtr k = parse_expression(true);
            expect_op(":");
            d->items.emplace_back(std::move(k), parse_expression(true));
          }
          next();
          return d;
        }
        break;
      default:
        break;
    }
    fail("unexpected " + describe(t), line);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (is_op(".")) {
        next();
        if (cur().kind == TokenKind::kName) {
          e = std::make_unique<GetAttrExpr>(std::move(e), next().text, line);
        } else if (cur().kind == TokenKind::kInteger) {
          e = std::make_unique<GetItemExpr>(std::move(e), std::make_unique<LiteralExpr>(Value(next().int_value), line), line);
        } else {
          fail("expected name or number after '.', got " + describe(cur()), line);
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        next();
        auto c = std::make_unique<CallExpr>(std::move(e), line);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object, int line) {
    ExprPtr first;
    if (!is_op(":")) {
      first = parse_expression(true);
      if (skip_op("]")) return std::make_unique<GetItemExpr>(std::move(object), std::move(first), line);
    }
    auto s = std::make_unique<SliceExpr>(line);
    s->object = std::move(object);
    s->start = std::move(first);
    expect_op(":");
    if (!is_op("]") && !is_op(":")) s->stop = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]")) s->step = parse_expression(true);
    }
    expect_op("]");
    return s;
  }

  // After `(`: positional and keyword arguments up to and including `)`.
  CallArgExprs parse_call_args() {
    CallArgExprs args;
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported", cur().line);
      if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == "=") {
        std::string name = next().text;
        next();
        args.keyword.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!args.keyword.empty()) fail("positional argument follows keyword argument", cur().line);
        args.positional.push_back(parse_expression(true));
      }
    }
    next();
    return args;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        int line = next().line;
        auto c = std::make_unique<CallExpr>(std::move(e), line);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // One or more `| name(args)` applied to `operand` (null: the body of a filter block).
  ExprPtr parse_filter_chain(ExprPtr operand) {
    ExprPtr e = std::move(operand);
    bool first = true;
    while (is_op("|") || (first && !e)) {
      if (is_op("|")) next();
      first = false;
      int line = cur().line;
      std::string name = expect_name();
      while (is_op(".")) {
        next();
        name += "." + expect_name();
      }
      if (!is_known_filter(name)) fail("no filter named '" + name + "'", line);
      auto f = std::make_unique<FilterExpr>(std::move(e), std::move(name), line);
      if (skip_op("(")) f->args = parse_call_args();
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr operand) {
    int line = next().line;  // `is`
    bool negated = skip_name("not");
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    if (!is_known_test(name)) fail("no test named '" + name + "'", line);
    auto t = std::make_unique<TestExpr>(std::move(operand), std::move(name), line);
    t->negated = negated;
    const Token& c = cur();
    if (skip_op("(")) {
      t->args = parse_call_args();
    } else if ((c.kind == TokenKind::kName || c.kind == TokenKind::kString || c.kind == TokenKind::kInteger ||
                c.kind == TokenKind::kFloat || (c.kind == TokenKind::kOperator && (c.text == "[" || c.text == "{"))) &&
               !(c.kind == TokenKind::kName && (c.text == "else" || c.text == "or" || c.text == "and"))) {
      if (is_name("is")) fail("you cannot chain multiple tests with is", c.line);
      t->args.positional.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int loop_names_ = 0;  // NameExprs of `loop` parsed so far
};

}  // namespace

Template parse_template(const std::string& source) { return Parser(tokenize(source)).run(); }

}  // namespace strata::tokenizer::jinja
