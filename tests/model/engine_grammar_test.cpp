// Constrained decoding through the engine on strata-demo: seeded samples at temperature 1 under
// JSON schemas parse and validate (python3-jsonschema, Draft 2020-12 with its format checker,
// is the oracle), regex outputs full-match (std::regex), choice outputs are one of the choices;
// a grammar that completes ends the request with finish reason stop; n-gram speculation gives
// the same tokens as plain decoding; a request resumed from its checkpoint continues exactly as
// the uninterrupted run. Prints the engine's mask time per token (median, p99).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../support/engine_test_support.h"
#include "../support/test_dir.h"
#include "sampling/grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

using namespace strata::test;
using grammar::GrammarKind;
using grammar::GrammarSpec;

struct Demo {
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  std::shared_ptr<const grammar::Vocabulary> vocab;
  std::vector<int32_t> stop_ids;
};

const Demo& demo() {
  static const Demo d = [] {
    Demo out;
    auto t = tokenizer::Tokenizer::load(model_dir("strata-demo"));
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
    if (!t.ok()) return out;
    out.tok = std::make_shared<const tokenizer::Tokenizer>(std::move(t).value());
    std::vector<std::string> bytes;
    std::vector<int32_t> special;
    for (int32_t id = 0; id < out.tok->vocab_size(); ++id) {
      bytes.push_back(out.tok->token_bytes(id));
      if (out.tok->is_special(id)) special.push_back(id);
    }
    out.stop_ids = out.tok->stop_ids();
    auto v = grammar::Vocabulary::create(std::move(bytes), special, out.stop_ids);
    EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.error().to_string());
    if (v.ok()) out.vocab = *v;
    return out;
  }();
  return d;
}

grammar::GrammarCache& cache() {
  static grammar::GrammarCache c;
  return c;
}

std::unique_ptr<Engine> demo_engine(ThreadPool& pool, EngineOptions o = {}) {
  o.eos_ids = demo().stop_ids;
  if (o.max_model_len == 0) o.max_model_len = 1024;
  return make_engine("strata-demo", pool, o);
}

GenerationRequest constrained(const GrammarSpec& spec, const std::string& prompt, uint64_t seed, int32_t max_tokens = 256) {
  GenerationRequest r;
  r.id = "g-" + std::to_string(seed);
  auto ids = demo().tok->encode(prompt, false);
  EXPECT_TRUE(ids.ok());
  r.prompt = *ids;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.sampling.has_seed = true;
  auto masks = cache().get_masks(spec, demo().vocab);
  EXPECT_TRUE(masks.ok()) << (masks.ok() ? "" : masks.error().to_string());
  if (masks.ok()) r.grammar = *masks;
  r.grammar_key = grammar::GrammarCache::key_of(spec);
  return r;
}

std::string text_of(const Outcome& o) { return demo().tok->decode(o.tokens, false); }

std::string chat_prompt(const std::string& user) {
  return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
}

// python3-jsonschema over (schema, instance text) pairs: "" for each valid one, else why not.
// draft: 2020 (Draft202012Validator) or 7 (Draft7Validator), both with the format checker.
std::vector<std::string> validate_all(const std::vector<std::pair<std::string, std::string>>& cases, int draft = 2020) {
  const auto dir = fresh_test_dir("strata_grammar_oracle");
  std::filesystem::create_directories(dir);
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [schema, text] : cases) {
    j.push_back({{"schema", nlohmann::json::parse(schema)}, {"text", text}, {"draft", draft}});
  }
  std::ofstream(dir / "cases.json") << j.dump();
  // The draft's own format checker, with RFC 3339 "time" where the installed jsonschema has no
  // checker for it (its time check needs the optional rfc3339-validator); OpenAPI's `nullable`
  // (which strata honours) as "null" added to the type.
  std::ofstream(dir / "check.py") << R"PY(import json, re, sys
import jsonschema
TIME = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
def nullable(s):
    if isinstance(s, dict):
        s = {k: nullable(v) for k, v in s.items()}
        if s.pop("nullable", False) is True and "type" in s:
            t = s["type"] if isinstance(s["type"], list) else [s["type"]]
            s["type"] = t + ["null"]
    elif isinstance(s, list):
        s = [nullable(v) for v in s]
    return s
cases = json.load(open(sys.argv[1]))
for c in cases:
    try:
        inst = json.loads(c["text"])
        cls = jsonschema.Draft7Validator if c["draft"] == 7 else jsonschema.Draft202012Validator
        fc = jsonschema.FormatChecker(formats=())
        fc.checkers = dict(cls.FORMAT_CHECKER.checkers)
        if "time" not in fc.checkers:
            fc.checkers["time"] = (lambda x: not isinstance(x, str) or TIME.fullmatch(x) is not None, ())
        v = cls(nullable(c["schema"]), format_checker=fc)
        errs = sorted(e.message for e in v.iter_errors(inst))
        print(json.dumps("; ".join(errs)))
    except Exception as e:
        print(json.dumps("does not parse: " + str(e)))
)PY";
  const std::string cmd = "python3 '" + (dir / "check.py").string() + "' '" + (dir / "cases.json").string() + "'";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = p ? pclose(p) : -1;
  EXPECT_EQ(rc, 0) << "the python3-jsonschema oracle failed to run (install python3-jsonschema): " << out;
  std::vector<std::string> res;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) res.push_back(nlohmann::json::parse(line).get<std::string>());
  EXPECT_EQ(res.size(), cases.size());
  res.resize(cases.size(), "no oracle verdict");
  return res;
}

double bucket_quantile(const LatencyHistogram& h, double q) {
  const int64_t want = int64_t(std::ceil(q * double(h.count)));
  int64_t cum = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cum += h.counts[i];
    if (cum >= want) return i < h.bounds_ms.size() ? h.bounds_ms[i] : INFINITY;
  }
  return INFINITY;
}

const char* kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120},"tribe":{"enum":["Judah","Levi","Dan"]}},"required":["name","age","tribe"],"additionalProperties":false})",
    R"({"type":"array","items":{"type":"string","maxLength":8},"minItems":1,"maxItems":4})",
    R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"day":{"type":"string","format":"date"},"ok":{"type":"boolean"},"score":{"type":"number"}},"required":["id","day","ok"],"additionalProperties":false})",
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v","kids"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
    R"({"type":"array","prefixItems":[{"type":"integer","multipleOf":3},{"const":"amen"}],"items":false,"minItems":2})",
};

TEST(EngineGrammar, JsonSchemaSamplesValidate) {
  ThreadPool pool(2);
  auto e = demo_engine(pool);
  ASSERT_NE(e, nullptr);
  std::vector<std::pair<std::string, std::string>> cases;
  int finished = 0, cut = 0;
  for (const char* schema : kSchemas) {
    int schema_finished = 0;
    GrammarSpec spec{GrammarKind::kJsonSchema, schema, {}};
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      auto s = e->submit(constrained(spec, chat_prompt("Write JSON."), seed));
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      streams.push_back(*s);
    }
    for (auto& s : streams) {
      const Outcome o = drain(*s);
      ASSERT_NE(o.final.finish_reason, FinishReason::kError) << o.final.message;
      if (o.final.finish_reason == FinishReason::kLength) {
        ++cut;
        continue;
      }
      ASSERT_EQ(o.final.finish_reason, FinishReason::kStop);
      ++finished;
      ++schema_finished;
      cases.emplace_back(schema, text_of(o));
    }
    std::printf("%2d of 20 finished: %s\n", schema_finished, schema);
    EXPECT_GE(schema_finished, 1) << schema;  // cut samples are counted; some of each must end and validate
  }
  const auto verdicts = validate_all(cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(verdicts[i], "") << "schema " << cases[i].first << "\noutput " << cases[i].second;
  }
  std::printf("json schema samples: %d finished and valid, %d cut by max_tokens\n", finished, cut);
  EXPECT_GE(finished, 60);  // of 100 (recursive schemas nest past max_tokens more often)
  const EngineStats st = e->stats();
  EXPECT_GT(st.grammar_mask.count, 0);
  std::printf("engine mask time per token (strata-demo, 4,096 ids): %lld tokens, mean %.4f ms, median <= %.3f ms, p99 <= %.3f ms\n",
              (long long)st.grammar_mask.count, st.grammar_mask.sum_ms / double(std::max<int64_t>(1, st.grammar_mask.count)),
              bucket_quantile(st.grammar_mask, 0.5), bucket_quantile(st.grammar_mask, 0.99));
}

// Every schema of the conformance cases: the JSON-Schema-Test-Suite's draft 7 files (Debian
// json-schema-test-suite) and tests/data/grammar/schema_2020_12.json. Each one strata compiles
// gets 20 seeded samples at temperature 1 (max_tokens 256); every sample that finished must
// validate under python3-jsonschema (Draft 7 or 2020-12 with the format checker), except where
// a oneOf's branches both match (strata does not enforce oneOf's exclusivity: counted and
// printed). Refused and unsatisfiable schemas (errors at compile time, a 400 in the server) and
// cut samples are counted and printed.
TEST(EngineGrammar, EveryConformanceSchemaSamplesValid) {
  struct Source {
    int draft;
    std::vector<nlohmann::ordered_json> schemas;
  };
  std::vector<Source> sources(2);
  sources[0].draft = 7;
  sources[1].draft = 2020;
  const std::filesystem::path suite = "/usr/share/json-schema-test-suite/tests/draft7";
  ASSERT_TRUE(std::filesystem::is_directory(suite)) << "install json-schema-test-suite";
  std::vector<std::filesystem::path> files;
  for (const auto& f : std::filesystem::directory_iterator(suite)) {
    if (f.path().extension() == ".json") files.push_back(f.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    for (const auto& c : nlohmann::ordered_json::parse(std::ifstream(f))) sources[0].schemas.push_back(c.at("schema"));
  }
  for (const auto& c : nlohmann::ordered_json::parse(std::ifstream(std::string(STRATA_SOURCE_DIR) + "/tests/data/grammar/schema_2020_12.json"))) {
    sources[1].schemas.push_back(c.at("schema"));
  }
  ThreadPool pool(2);
  auto e = demo_engine(pool);
  ASSERT_NE(e, nullptr);
  for (const Source& src : sources) {
    std::vector<std::pair<std::string, std::string>> cases;
    std::set<std::string> seen;
    int schemas = 0, compiled = 0, refused = 0, unsatisfiable = 0, finished = 0, cut = 0;
    for (const auto& schema : src.schemas) {
      const std::string text = schema.dump();
      if (!seen.insert(text).second) continue;  // files repeat a few schemas
      ++schemas;
      GrammarSpec spec{GrammarKind::kJsonSchema, text, {}};
      auto masks = cache().get_masks(spec, demo().vocab);
      if (!masks.ok()) {
        (masks.error().code == ErrorCode::kUnsupported ? refused : unsatisfiable) += 1;
        continue;
      }
      ++compiled;
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (uint64_t seed = 1; seed <= 20; ++seed) {
        auto s = e->submit(constrained(spec, chat_prompt("Write JSON."), seed));
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        streams.push_back(*s);
      }
      for (auto& s : streams) {
        const Outcome o = drain(*s);
        ASSERT_NE(o.final.finish_reason, FinishReason::kError) << o.final.message << " schema " << text;
        if (o.final.finish_reason == FinishReason::kLength) {
          ++cut;
          continue;
        }
        ++finished;
        cases.emplace_back(text, text_of(o));
      }
    }
    const auto verdicts = validate_all(cases, src.draft);
    int valid = 0, one_of_both = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (verdicts[i].empty()) {
        ++valid;
      } else if (verdicts[i].find("is valid under each of") != std::string::npos) {
        ++one_of_both;  // oneOf acts as anyOf
      } else {
        ADD_FAILURE() << "draft " << src.draft << " schema " << cases[i].first << "\noutput " << cases[i].second << "\n"
                      << verdicts[i];
      }
    }
    std::printf("draft %d: %d schemas, %d compiled, %d refused (unsupported keyword), %d refused as unsatisfiable or "
                "invalid; %d samples finished (%d valid, %d matching two oneOf branches), %d cut by max_tokens\n",
                src.draft, schemas, compiled, refused, unsatisfiable, finished, valid, one_of_both, cut);
    EXPECT_GT(compiled, 10);
    EXPECT_GT(valid, finished / 2);
  }
}

TEST(EngineGrammar, RegexAndChoiceOutputs) {
  ThreadPool pool(2);
  auto e = demo_engine(pool);
  ASSERT_NE(e, nullptr);
  const std::vector<std::string> patterns = {R"([A-Z][a-z]{2,7} [0-9]{1,3}:[0-9]{1,3})", R"((yea|nay|amen)(, (yea|nay|amen)){0,3}\.)",
                                             R"([a-z]{3,8}@[a-z]{2,6}\.(com|org))"};
  for (const auto& pat : patterns) {
    const std::regex re(pat, std::regex::ECMAScript);
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      const Outcome o = run(*e, constrained({GrammarKind::kRegex, pat, {}}, chat_prompt("Quote."), seed, 64));
      ASSERT_EQ(o.final.finish_reason, FinishReason::kStop) << o.final.message << " pattern " << pat;
      EXPECT_TRUE(std::regex_match(text_of(o), re)) << "pattern " << pat << " output '" << text_of(o) << "'";
    }
  }
  const std::vector<std::string> choices = {"Moses", "Aaron", "Miriam", "Joshua the son of Nun"};
  const std::string text = nlohmann::json(choices).dump();
  std::set<std::string> seen;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Outcome o = run(*e, constrained({GrammarKind::kChoice, text, {}}, chat_prompt("Who led Israel?"), seed, 32));
    ASSERT_EQ(o.final.finish_reason, FinishReason::kStop);
    EXPECT_NE(std::find(choices.begin(), choices.end(), text_of(o)), choices.end()) << text_of(o);
    seen.insert(text_of(o));
  }
  EXPECT_GE(seen.size(), 2u);  // temperature 1 does sample between them
}

TEST(EngineGrammar, CompleteGrammarStopsWithoutEos) {
  ThreadPool pool(2);
  auto e = demo_engine(pool);
  ASSERT_NE(e, nullptr);
  GenerationRequest r = constrained({GrammarKind::kRegex, "[a-z]{5}", {}}, chat_prompt("A word."), 7, 64);
  r.ignore_eos = true;  // the grammar's end stops it, not an EOS
  const Outcome o = run(*e, r);
  EXPECT_EQ(o.final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(o.final.stop_token, -1);
  EXPECT_EQ(text_of(o).size(), 5u) << text_of(o);
  // Unconstrained, the same request runs to max_tokens.
  r.grammar = nullptr;
  EXPECT_EQ(run(*e, r).final.finish_reason, FinishReason::kLength);
}

TEST(EngineGrammar, SpeculationGivesPlainTokens) {
  ThreadPool pool(2);
  auto plain = demo_engine(pool);
  EngineOptions so;
  so.speculative.method = "ngram";
  so.speculative.num_draft_tokens = 4;
  so.speculative.adaptive = false;
  auto spec = demo_engine(pool, so);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  int drafted = 0;
  for (int i = 0; i < 3; ++i) {
    const GrammarSpec g{GrammarKind::kJsonSchema, kSchemas[i], {}};
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      // The prompt repeats JSON so n-gram lookup drafts from it.
      GenerationRequest r = constrained(g, chat_prompt(R"({"name":"Aaron","age":83,"tribe":"Levi"} ["amen","amen"] again:)"), seed, 128);
      if (seed % 2 == 0) r.sampling.temperature = 0.0f;
      const Outcome a = run(*plain, r);
      const Outcome b = run(*spec, r);
      EXPECT_EQ(a.tokens, b.tokens) << "schema " << i << " seed " << seed << ": " << text_of(a) << " vs " << text_of(b);
      EXPECT_EQ(a.final.finish_reason, b.final.finish_reason);
      EXPECT_TRUE(b.final.usage.speculative);
      drafted += b.final.usage.draft_tokens;
    }
  }
  EXPECT_GT(drafted, 0);
}

TEST(EngineGrammar, CheckpointResumeContinuesIdentically) {
  ThreadPool pool(2);
  const auto dir = fresh_test_dir("strata_grammar_ckpt");
  const GrammarSpec g{GrammarKind::kJsonSchema, R"({"type":"array","items":{"type":"string","maxLength":6},"minItems":12})", {}};
  GenerationRequest r = constrained(g, chat_prompt("List."), 99, 200);
  Outcome whole;
  {
    auto e = demo_engine(pool);
    ASSERT_NE(e, nullptr);
    whole = run(*e, r);
    ASSERT_GT(whole.tokens.size(), 24u) << text_of(whole);
  }
  EngineOptions co;
  co.checkpoint_every = 8;
  co.checkpoint_dir = dir.string();
  {
    // Cancelled after its second checkpoint: the checkpoint stays.
    auto e = demo_engine(pool, co);
    ASSERT_NE(e, nullptr);
    auto s = e->submit(r);
    ASSERT_TRUE(s.ok());
    size_t n = 0;
    while (n < 17) {
      auto ev = (*s)->next(std::chrono::seconds(60));
      ASSERT_TRUE(ev.has_value());
      ASSERT_FALSE(ev->final) << "finished before the cancel";
      n += ev->tokens.size();
    }
    e->cancel(r.id);
    drain(**s);
  }
  auto e = demo_engine(pool, co);
  ASSERT_NE(e, nullptr);
  auto s = e->submit(r);
  ASSERT_TRUE(s.ok());
  auto first = (*s)->next(std::chrono::seconds(60));
  ASSERT_TRUE(first.has_value());
  EXPECT_GE(first->tokens.size(), 16u) << "the request did not resume from its checkpoint";
  Outcome rest = drain(**s);
  std::vector<int32_t> tokens = first->tokens;
  tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
  EXPECT_EQ(tokens, whole.tokens);
  EXPECT_EQ(rest.final.finish_reason, whole.final.finish_reason);
  e.reset();  // the writer thread removes the finished request's checkpoint: done before the directory goes
  std::filesystem::remove_all(dir);
}

TEST(EngineGrammar, TokenFillGivesPlainTokensInFewerSteps) {
  ThreadPool pool(2);
  EngineOptions off;
  off.token_fill = false;
  auto plain = demo_engine(pool, off);
  auto fill = demo_engine(pool);
  EngineOptions so;
  so.speculative.method = "ngram";
  so.speculative.num_draft_tokens = 4;
  so.speculative.adaptive = false;
  auto fill_spec = demo_engine(pool, so);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(fill, nullptr);
  ASSERT_NE(fill_spec, nullptr);
  // Long keys and a fixed tool-call frame: spans the grammar forces.
  const std::string call =
      R"({"type":"object","properties":{"name":{"const":"lookup_scripture"},"arguments":{"type":"object","properties":{"book_of_the_bible":{"enum":["Genesis","Exodus"]},"chapter_number":{"type":"integer","minimum":1,"maximum":50},"include_cross_references":{"type":"boolean"}},"required":["book_of_the_bible","chapter_number","include_cross_references"],"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false})";
  GrammarSpec g{GrammarKind::kJsonSchema, call, {}};
  g.json.strict = true;
  g.json.prefix = "<tool_call>\n";
  g.json.suffix = "\n</tool_call>";
  int64_t filled = 0, spans = 0;
  const int64_t steps_plain0 = plain->stats().steps, steps_fill0 = fill->stats().steps;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    GenerationRequest r = constrained(g, chat_prompt("Look it up."), seed, 160);
    if (seed % 3 == 0) r.sampling.temperature = 0.0f;
    if (seed % 4 == 1) r.sampling.repetition_penalty = 1.2f;  // the history sees filled tokens
    const Outcome a = run(*plain, r);
    const Outcome b = run(*fill, r);
    const Outcome c = run(*fill_spec, r);
    ASSERT_EQ(a.final.finish_reason, FinishReason::kStop) << text_of(a);
    EXPECT_EQ(a.tokens, b.tokens) << "seed " << seed << ": " << text_of(a) << " vs " << text_of(b);
    EXPECT_EQ(a.tokens, c.tokens) << "seed " << seed << " with speculation";
    EXPECT_EQ(b.final.finish_reason, FinishReason::kStop);
    EXPECT_EQ(a.final.usage.fill_tokens, 0);
    EXPECT_EQ(b.final.usage.completion_tokens, a.final.usage.completion_tokens);
    filled += b.final.usage.fill_tokens;
    spans += b.final.usage.fill_spans;
    EXPECT_GT(b.final.usage.fill_tokens, 5) << text_of(b);
  }
  const int64_t steps_plain = plain->stats().steps - steps_plain0, steps_fill = fill->stats().steps - steps_fill0;
  std::printf("token fill: %lld tokens in %lld spans; engine steps %lld without fill, %lld with\n", (long long)filled,
              (long long)spans, (long long)steps_plain, (long long)steps_fill);
  EXPECT_LT(steps_fill, steps_plain);
}

TEST(EngineGrammar, RefusesAGrammarWiderThanTheModel) {
  ThreadPool pool(2);
  auto e = demo_engine(pool);
  ASSERT_NE(e, nullptr);
  std::vector<std::string> bytes(e->model_config().vocab_size + 10, "a");
  auto v = grammar::Vocabulary::create(bytes, {}, {});
  ASSERT_TRUE(v.ok());
  GenerationRequest r = constrained({GrammarKind::kRegex, "a+", {}}, chat_prompt("x"), 1);
  r.grammar = *cache().get_masks({GrammarKind::kRegex, "a+", {}}, *v);
  auto s = e->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("grammar vocabulary"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace strata
