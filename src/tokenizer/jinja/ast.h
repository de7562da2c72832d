// The syntax tree of a Jinja template: expressions and statements, each node tagged with
// its kind and the template line it starts on (error messages name that line).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace strata::tokenizer::jinja {

enum class ExprKind {
  kLiteral, kName, kList, kTuple, kDict, kGetAttr, kGetItem, kSlice, kUnary, kBinary,
  kCompare, kCondition, kCall, kFilter, kTest,
};

struct Expr {
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  ExprKind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct LiteralExpr : Expr {
  LiteralExpr(Value v, int l) : Expr(ExprKind::kLiteral, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(ExprKind::kName, l), name(std::move(n)) {}
  std::string name;
};

struct SeqExpr : Expr {  // kList or kTuple
  SeqExpr(ExprKind k, int l) : Expr(k, l) {}
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(ExprKind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(ExprPtr o, std::string a, int l) : Expr(ExprKind::kGetAttr, l), object(std::move(o)), attr(std::move(a)) {}
  ExprPtr object;
  std::string attr;
};

struct GetItemExpr : Expr {
  GetItemExpr(ExprPtr o, ExprPtr i, int l) : Expr(ExprKind::kGetItem, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};

struct SliceExpr : Expr {  // object[start:stop:step]; absent bounds are null
  explicit SliceExpr(int l) : Expr(ExprKind::kSlice, l) {}
  ExprPtr object, start, stop, step;
};

enum class UnaryOp { kNot, kNeg, kPos };
struct UnaryExpr : Expr {
  UnaryExpr(UnaryOp o, ExprPtr e, int l) : Expr(ExprKind::kUnary, l), op(o), operand(std::move(e)) {}
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat, kAnd, kOr };
struct BinaryExpr : Expr {
  BinaryExpr(BinaryOp o, ExprPtr a, ExprPtr b, int l)
      : Expr(ExprKind::kBinary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinaryOp op;
  ExprPtr left, right;
};

enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };
struct CompareExpr : Expr {  // chained like Python: a < b < c
  CompareExpr(ExprPtr first, int l) : Expr(ExprKind::kCompare, l), left(std::move(first)) {}
  ExprPtr left;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

struct ConditionExpr : Expr {  // then_expr if test else else_expr (else may be absent)
  explicit ConditionExpr(int l) : Expr(ExprKind::kCondition, l) {}
  ExprPtr test, then_expr, else_expr;
};

struct CallArgExprs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct CallExpr : Expr {
  CallExpr(ExprPtr c, int l) : Expr(ExprKind::kCall, l), callee(std::move(c)) {}
  ExprPtr callee;
  CallArgExprs args;
};

struct FilterExpr : Expr {  // operand | name(args); operand is null inside a filter block
  FilterExpr(ExprPtr o, std::string n, int l) : Expr(ExprKind::kFilter, l), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  CallArgExprs args;
};

struct TestExpr : Expr {  // operand is [not] name(args)
  TestExpr(ExprPtr o, std::string n, int l) : Expr(ExprKind::kTest, l), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  CallArgExprs args;
  bool negated = false;
};

enum class StmtKind { kText, kOutput, kIf, kFor, kSet, kBlockSet, kMacro, kBreak, kContinue, kFilterBlock, kWith, kBody };

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(StmtKind::kText, l), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(ExprPtr e, int l) : Stmt(StmtKind::kOutput, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(StmtKind::kIf, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(StmtKind::kFor, l) {}
  std::vector<std::string> targets;  // one name, or several to unpack
  bool unpack = false;
  ExprPtr iter;
  ExprPtr filter;  // `for x in xs if cond`; may be null
  Body body;
  Body else_body;
  bool uses_loop = true;  // false when the body never names `loop`: no loop object is built
};

// Assignment target: a name, several names to unpack, or `ns.attr`.
struct AssignTarget {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attr;  // non-empty: names[0].attr
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(StmtKind::kSet, l) {}
  AssignTarget target;
  ExprPtr value;
};

struct BlockSetStmt : Stmt {  // {% set x | filters %}body{% endset %}
  explicit BlockSetStmt(int l) : Stmt(StmtKind::kBlockSet, l) {}
  AssignTarget target;
  ExprPtr filter;  // a FilterExpr chain whose innermost operand is null; may be null
  Body body;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(StmtKind::kMacro, l) {}
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(StmtKind::kFilterBlock, l) {}
  ExprPtr filter;
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(StmtKind::kWith, l) {}
  std::vector<std::pair<AssignTarget, ExprPtr>> assignments;
  Body body;
};

// A body rendered in place: the `{% generation %}` block of transformers' templates.
struct BodyStmt : Stmt {
  explicit BodyStmt(int l) : Stmt(StmtKind::kBody, l) {}
  Body body;
};

struct Template {
  Body body;
};

}  // namespace strata::tokenizer::jinja
