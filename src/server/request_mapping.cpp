#include "server/request_mapping.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "sampling/sampling_params.h"

namespace strata::server {

namespace {

using ojson = nlohmann::ordered_json;

// The field a sampling validation message names: its first word ("top_p must be ...").
std::string leading_field(const std::string& message) {
  const size_t sp = message.find(' ');
  return sp == std::string::npos ? message : message.substr(0, sp);
}

std::string prompt_field(const ApiRequest& r) {
  return r.kind == ApiKind::kCompletion ? "prompt" : r.kind == ApiKind::kResponses ? "input" : "messages";
}

// Mistral's templates accept only tool-call ids of 9 letters and digits (they raise on others),
// while clients send back the ids this server or another gave them: every other id becomes 9
// base-62 digits of its hash, the same for a call and the result that names it, and the same on
// every turn so the prompt prefix stays cacheable.
std::string mistral_call_id(const std::string& id) {
  const bool ok = id.size() == 9 && std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
  if (ok) return id;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out(9, '0');
  for (char& c : out) {
    c = kDigits[h % 62];
    h /= 62;
  }
  return out;
}

ojson with_mistral_call_ids(ojson messages) {
  for (auto& m : messages) {
    if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) *id = mistral_call_id(id->get<std::string>());
    if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array()) {
      for (auto& c : *calls) {
        if (auto id = c.find("id"); id != c.end() && id->is_string()) *id = mistral_call_id(id->get<std::string>());
      }
    }
  }
  return messages;
}

}  // namespace

SamplingDefaults generation_defaults(const ModelConfig& c) {
  SamplingDefaults d;
  if (c.default_do_sample == 0) d.temperature = 0.0f;
  else if (c.default_temperature >= 0.0f) d.temperature = c.default_temperature;
  if (c.default_top_k >= 0) d.top_k = c.default_top_k;
  if (c.default_top_p >= 0.0f) d.top_p = c.default_top_p;
  if (c.default_min_p >= 0.0f) d.min_p = c.default_min_p;
  if (c.default_repetition_penalty > 0.0f) d.repetition_penalty = c.default_repetition_penalty;
  return d;
}

Result<ServedModel> load_served_model(const std::string& dir, const std::string& name, const ModelConfig& config,
                                      int32_t max_model_len, const std::string& tool_parser) {
  auto tok = tokenizer::Tokenizer::load(dir);
  if (!tok.ok()) return tok.error();
  ServedModel m{name, std::move(tok).value()};
  m.model_vocab = config.vocab_size;
  m.max_model_len = max_model_len;
  m.generation = generation_defaults(config);
  auto src = m.tokenizer.chat_template_source();
  if (src.ok()) {
    auto t = tokenizer::ChatTemplate::parse(*src);
    if (!t.ok()) return make_error(t.error().code, "chat template of " + dir + ": " + t.error().message);
    m.chat_template = std::move(t).value();
    m.template_renders_tools = src->find("tools") != std::string::npos;
    m.tool_format = detect_tool_call_format(*src);
  }
  if (tool_parser != "auto" && !parse_tool_call_format(tool_parser, &m.tool_format)) {
    return make_error(ErrorCode::kInvalidArgument, "--tool-parser must be auto, hermes, llama3, deepseek, qwen3_coder, mistral, "
                                                   "gemma4 or none, got '" + tool_parser + "'");
  }
  m.reasoning = m.tokenizer.piece_to_id("<think>") >= 0 && m.tokenizer.piece_to_id("</think>") >= 0;
  if (Status st = enable_structured_output(m, m.tokenizer.stop_ids(config.eos_ids)); !st.ok()) return st.error();
  return m;
}

Status enable_structured_output(ServedModel& m, const std::vector<int32_t>& stop_ids) {
  const int32_t n = m.tokenizer.vocab_size();
  std::vector<std::string> bytes(size_t(std::max(n, 0)));
  std::vector<int32_t> special;
  for (int32_t id = 0; id < n; ++id) {
    bytes[size_t(id)] = m.tokenizer.token_bytes(id);
    if (m.tokenizer.is_special(id)) special.push_back(id);
  }
  std::vector<int32_t> stops;
  for (int32_t id : stop_ids) {
    if (id >= 0 && id < n) stops.push_back(id);
  }
  auto v = grammar::Vocabulary::create(std::move(bytes), special, stops);
  if (!v.ok()) return make_error(v.error().code, "the grammar vocabulary of model '" + m.name + "': " + v.error().message);
  m.grammar_vocab = *v;
  m.grammars = std::make_shared<grammar::GrammarCache>();
  return Status();
}

SamplingParams resolve_sampling(const ApiRequest& r, const SamplingDefaults& cli, const SamplingDefaults& gen) {
  SamplingParams p;
  auto pick = [](auto req, auto c, auto g, auto fallback) { return req ? *req : c ? *c : g ? *g : fallback; };
  p.temperature = pick(r.temperature, cli.temperature, gen.temperature, 1.0f);
  p.top_p = pick(r.top_p, cli.top_p, gen.top_p, 1.0f);
  p.top_k = pick(r.top_k, cli.top_k, gen.top_k, 0);
  p.min_p = pick(r.min_p, cli.min_p, gen.min_p, 0.0f);
  p.repetition_penalty = pick(r.repetition_penalty, cli.repetition_penalty, gen.repetition_penalty, 1.0f);
  p.presence_penalty = r.presence_penalty;
  p.frequency_penalty = r.frequency_penalty;
  p.logit_bias = r.logit_bias;
  if (r.seed) {
    p.seed = *r.seed;
    p.has_seed = true;
  }
  return p;
}

std::optional<ApiError> render_chat_prompt(const ApiRequest& r, const ServedModel& m, std::string* prompt) {
  if (!m.chat_template) {
    return bad_field("messages", "model '" + m.name + "' has no chat template; use /v1/completions with a prompt");
  }
  ojson ctx = ojson::object();
  for (auto it = r.chat_template_kwargs.begin(); it != r.chat_template_kwargs.end(); ++it) ctx[it.key()] = it.value();
  if (!r.reasoning_effort.empty()) {
    // gpt-oss templates print reasoning_effort into the system message; Qwen3's and Gemma 4's
    // switch thinking with enable_thinking, which "none"/"minimal" turn off unless the request's
    // chat_template_kwargs say otherwise.
    ctx["reasoning_effort"] = r.reasoning_effort;
    if ((r.reasoning_effort == "none" || r.reasoning_effort == "minimal") && !ctx.contains("enable_thinking")) {
      ctx["enable_thinking"] = false;
    }
  }
  ctx["messages"] = m.tool_format == ToolCallFormat::kMistral ? with_mistral_call_ids(r.messages) : r.messages;
  const bool tools = !r.tools.is_null() && r.tool_choice != "none";
  if (tools) ctx["tools"] = r.tools;
  ctx["add_generation_prompt"] = true;
  ctx["bos_token"] = m.tokenizer.bos_token();
  ctx["eos_token"] = m.tokenizer.eos_token();
  auto text = m.chat_template->render_ordered(ctx);
  if (!text.ok()) return bad_field("messages", "the chat template refused the messages: " + text.error().message);
  *prompt = std::move(text).value();
  return std::nullopt;
}

std::optional<ApiError> prepare_request(const ApiRequest& r, const ServedModel& m, PreparedRequest* out) {
  *out = PreparedRequest{};
  GenerationRequest& g = out->generation;
  const bool tools = !r.tools.is_null() && r.tool_choice != "none";
  if (tools && !m.template_renders_tools) {
    return bad_field("tools", "tools were given, but the chat template of model '" + m.name + "' does not render tools");
  }
  std::optional<OutputConstraint> constraint = r.constraint;
  if (r.tool_choice == "required" || r.tool_choice == "function") {
    if (constraint) {
      return bad_field(constraint->field, constraint->field + " cannot go with tool_choice '" + r.tool_choice +
                                              "': a forced tool call has its own output format");
    }
    OutputConstraint call;
    if (auto e = forced_tool_call_constraint(r, m.tool_format, &call)) return e;
    constraint = std::move(call);
  }
  if (r.kind == ApiKind::kCompletion) {
    if (r.prompt_is_ids) {
      for (size_t i = 0; i < r.prompt_ids.size(); ++i) {
        if (r.prompt_ids[i] >= m.model_vocab) {
          return bad_field("prompt", "prompt token " + std::to_string(r.prompt_ids[i]) + " at index " + std::to_string(i) +
                                         " is outside the vocabulary [0, " + std::to_string(m.model_vocab) + ")");
        }
      }
      g.prompt = r.prompt_ids;
      if (r.echo) out->prompt_text = m.tokenizer.decode(r.prompt_ids, r.skip_special_tokens);
    } else {
      auto ids = m.tokenizer.encode(r.prompt_text, true);
      if (!ids.ok()) return bad_field("prompt", "prompt: " + ids.error().message);
      g.prompt = std::move(ids).value();
      out->prompt_text = r.prompt_text;
    }
  } else {
    std::string text;
    if (auto e = render_chat_prompt(r, m, &text)) return e;
    auto ids = m.tokenizer.encode(text, false);  // the template wrote the special tokens already
    if (!ids.ok()) return bad_field("messages", "messages: " + ids.error().message);
    g.prompt = std::move(ids).value();
    out->output.reasoning_starts_inside = m.reasoning && prompt_opens_reasoning(text);
    if (constraint && m.reasoning) {
      // The constraint starts after the reasoning: the prompt opened it, or the first token
      // may open it.
      g.grammar_think_end = m.tokenizer.piece_to_id("</think>");
      g.grammar_in_think = out->output.reasoning_starts_inside;
      if (!g.grammar_in_think) g.grammar_think_open = m.tokenizer.piece_to_id("<think>");
    }
    out->prompt_text = std::move(text);
  }
  const int64_t n_prompt = int64_t(g.prompt.size());
  if (n_prompt == 0) return bad_field(prompt_field(r), prompt_field(r) + " encodes to no tokens");
  if (n_prompt >= m.max_model_len) {
    return bad_field(prompt_field(r), "the prompt has " + std::to_string(n_prompt) + " tokens, which leaves no room to generate within the context length " +
                                          std::to_string(m.max_model_len));
  }
  const char* mt_field = "max_tokens";
  if (r.max_tokens) {
    if (n_prompt + *r.max_tokens > m.max_model_len) {
      ApiError e = bad_field(mt_field, "prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                                           std::to_string(*r.max_tokens) + ") = " + std::to_string(n_prompt + *r.max_tokens) +
                                           " exceeds the context length " + std::to_string(m.max_model_len));
      e.code = "context_length_exceeded";
      return e;
    }
    g.max_tokens = *r.max_tokens;
  } else {
    const int64_t room = m.max_model_len - n_prompt;
    g.max_tokens = int32_t(m.cli.max_tokens ? std::min<int64_t>(*m.cli.max_tokens, room) : room);
  }
  g.sampling = resolve_sampling(r, m.cli, m.generation);
  const int32_t tok_vocab = m.tokenizer.vocab_size();
  if (tok_vocab > 0 && tok_vocab < m.model_vocab) g.vocab_limit = tok_vocab;
  g.sampling.vocab_limit = g.vocab_limit;
  if (Status s = validate_sampling_params(g.sampling, m.model_vocab); !s.ok()) {
    return bad_field(leading_field(s.error().message), s.error().message);
  }
  for (int32_t id : r.stop_token_ids) {
    if (id >= m.model_vocab) {
      return bad_field("stop_token_ids", "stop_token_ids holds " + std::to_string(id) + ", outside the vocabulary [0, " +
                                             std::to_string(m.model_vocab) + ")");
    }
  }
  if (constraint) {
    if (auto e = attach_constraint(*constraint, m, &g)) return e;
  }
  g.stop_ids = r.stop_token_ids;
  g.ignore_eos = r.ignore_eos;
  g.speculative = r.speculative;
  g.logprobs = r.logprobs;
  g.prompt_logprobs = r.kind == ApiKind::kCompletion && r.echo && r.logprobs >= 0;
  g.priority = r.priority;
  g.session_id = r.session_id;

  OutputOptions& o = out->output;
  o.stop = r.stop;
  o.reasoning = m.reasoning && r.kind != ApiKind::kCompletion;
  o.tools = tools ? m.tool_format : ToolCallFormat::kNone;
  if (o.tools == ToolCallFormat::kQwen3Coder) o.tool_types = std::make_shared<const ToolParamTypes>(tool_param_types(r.tools));
  // DeepSeek, Mistral and Gemma 4 write their call markers as special tokens; they must survive decoding.
  o.skip_special = r.skip_special_tokens && !tool_markers_are_special(o.tools);
  return std::nullopt;
}

}  // namespace strata::server
