#include "cli/speculative_args.h"

#include <filesystem>

#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

void add_speculative_flags(CLI::App* cmd, SpeculativeArgs& a) {
  cmd->add_option("--speculative", a.method,
                  "Speculative decoding: off, ngram (prompt lookup) or draft (--draft-model); outputs are unchanged")
      ->capture_default_str();
  cmd->add_option("--num-draft-tokens", a.num_draft_tokens, "Drafted tokens per verify at most, 1..16 (adaptive below it)")
      ->capture_default_str();
  cmd->add_option("--draft-model", a.draft_model, "Draft model directory for --speculative draft (the target's tokenizer)");
}

namespace {

// The same tokenizer: the same pieces under the same ids.
Status check_same_tokenizer(const std::string& target_dir, const std::string& draft_dir) {
  namespace fs = std::filesystem;
  const bool t = fs::exists(fs::path(target_dir) / "tokenizer.json");
  const bool d = fs::exists(fs::path(draft_dir) / "tokenizer.json");
  auto bad = [&](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, "--draft-model " + draft_dir + ": " + m); };
  if (t != d) return bad(std::string("has ") + (d ? "a" : "no") + " tokenizer.json and the target " + (t ? "has one" : "has none"));
  if (!t) return Status();  // id-only models: the engine compares vocabularies
  auto tt = tokenizer::Tokenizer::load(target_dir);
  if (!tt.ok()) return tt.error();
  auto dt = tokenizer::Tokenizer::load(draft_dir);
  if (!dt.ok()) return bad(dt.error().message);
  if (tt->vocab_size() != dt->vocab_size()) {
    return bad("tokenizer of " + std::to_string(dt->vocab_size()) + " tokens differs from the target's " +
               std::to_string(tt->vocab_size()));
  }
  for (int32_t id = 0; id < tt->vocab_size(); ++id) {
    if (tt->id_to_piece(id) != dt->id_to_piece(id)) {
      return bad("tokenizer differs from the target's at id " + std::to_string(id) + " ('" + dt->id_to_piece(id) +
                 "' vs '" + tt->id_to_piece(id) + "')");
    }
  }
  return Status();
}

}  // namespace

Result<SpeculativeOptions> make_speculative_options(const SpeculativeArgs& a, const std::string& target_dir, ThreadPool& pool,
                                                    bool load) {
  SpeculativeOptions o;
  auto method = parse_spec_method(a.method);
  if (!method.ok()) return method.error();
  o.method = a.method;
  if (a.num_draft_tokens < 1 || a.num_draft_tokens > kMaxDraftTokens) {
    return make_error(ErrorCode::kInvalidArgument, "--num-draft-tokens must be in [1, " + std::to_string(kMaxDraftTokens) +
                                                       "], got " + std::to_string(a.num_draft_tokens));
  }
  o.num_draft_tokens = a.num_draft_tokens;
  if (*method == SpecMethod::kDraft && a.draft_model.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "--speculative draft needs --draft-model DIR");
  }
  if (*method != SpecMethod::kDraft && !a.draft_model.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--draft-model " + a.draft_model + " needs --speculative draft (got --speculative " + a.method + ")");
  }
  if (*method == SpecMethod::kDraft) {
    if (!std::filesystem::is_directory(a.draft_model)) {
      return make_error(ErrorCode::kNotFound, "--draft-model " + a.draft_model + ": no such directory");
    }
    STRATA_RETURN_IF_ERROR(check_same_tokenizer(target_dir, a.draft_model));
    o.draft_model_dir = a.draft_model;
    if (!load) return o;
    auto m = load_model(a.draft_model, pool);
    if (!m.ok()) {
      return make_error(m.error().code, "--draft-model " + a.draft_model + ": " + m.error().message);
    }
    o.draft_model = std::shared_ptr<Model>(std::move(m).value());
  }
  return o;
}

}  // namespace strata::cli
