#include "server/api_response.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace strata::server {

namespace {

using json = nlohmann::json;

double finite_logprob(float lp) { return std::isfinite(lp) ? double(lp) : -9999.0; }

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// A token's text for logprobs; a token that is part of a multi-byte character shows its
// bytes as "bytes:\xNN" (as vLLM does), since alone it decodes to U+FFFD.
std::string token_text(const tokenizer::Tokenizer& tok, int32_t id) {
  std::string s = tok.decode(&id, 1, false);
  if (s.find("\xEF\xBF\xBD") != std::string::npos) {
    const std::string piece = tok.id_to_piece(id);
    if (piece.size() == 6 && piece.rfind("<0x", 0) == 0) return "bytes:\\x" + piece.substr(3, 2);
  }
  return s;
}


std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

class OpenAiBase : public ResponseBuilder {
 public:
  OpenAiBase(ResponseContext c, const tokenizer::Tokenizer& t) : c_(std::move(c)), tok_(t) {}

  std::string stream_error(const ApiError& e) const override {
    return sse_data(openai_error_body(e)) + "data: [DONE]\n\n";
  }

 protected:
  // A token as logprobs name it: its text, or "token_id:N" when the request set
  // return_tokens_as_token_ids (text offsets still count the text).
  std::string token_label(int32_t id) const {
    return c_.tokens_as_ids ? "token_id:" + std::to_string(id) : token_text(tok_, id);
  }

  json chunk_base(const char* object) const {
    json j = {{"id", c_.id}, {"object", object}, {"created", c_.created}, {"model", c_.model}};
    return j;
  }
  std::string usage_chunk(const char* object, const Usage& u) const {
    if (!c_.include_usage) return "";
    json j = chunk_base(object);
    j["choices"] = json::array();
    j["usage"] = with_usage_extension(usage_json(u));
    return sse_data(j);
  }
  void add_usage_null(json& j) const {
    if (c_.include_usage) j["usage"] = nullptr;
  }

  ResponseContext c_;
  const tokenizer::Tokenizer& tok_;
};

class ChatBuilder : public OpenAiBase {
 public:
  using OpenAiBase::OpenAiBase;

  std::string start() override { return chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr); }

  std::string delta(const OutputDelta& d) override {
    content_ += d.content;
    reasoning_ += d.reasoning;
    json lp = logprob_entries(d.logprobs);
    for (auto& e : lp) logprobs_.push_back(e);
    std::string out;
    if (!d.content.empty() || !d.reasoning.empty()) {
      json delta = json::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      if (!d.content.empty()) delta["content"] = d.content;
      out = chunk(delta, c_.logprobs >= 0 ? json{{"content", lp}, {"refusal", nullptr}} : json(nullptr), nullptr);
    }
    if (!d.tool_calls.empty()) out += chunk(json{{"tool_calls", tool_call_deltas(d.tool_calls)}}, nullptr, nullptr);
    return out;
  }

  std::string finish(const OutputDelta& last, const std::vector<ToolCall>& calls, const FinishState& f) override {
    std::string out = delta(last);
    if (!last.logprobs.empty() && last.content.empty() && last.reasoning.empty() && c_.logprobs >= 0) {
      out += chunk(json::object(), json{{"content", logprob_entries(last.logprobs)}, {"refusal", nullptr}}, nullptr);
    }
    // The stream showed the calls as deltas (last completes them); the body has them whole,
    // under the same ids.
    for (size_t i = 0; i < calls.size(); ++i) {
      calls_.push_back({{"id", call_id(int(i))},
                        {"type", "function"},
                        {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
    }
    finish_reason_ = openai_finish_reason(f, !calls.empty());
    usage_ = f.usage;
    out += chunk(json::object(), nullptr, finish_reason_);
    if (!c_.shared_stream) out += stream_end(f.usage);
    return out;
  }

  std::string stream_end(const Usage& u) const override { return usage_chunk("chat.completion.chunk", u) + "data: [DONE]\n\n"; }

  json body() const override {
    json msg = {{"role", "assistant"}};
    msg["content"] = content_.empty() && !calls_.empty() ? json(nullptr) : json(content_);
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) msg["tool_calls"] = calls_;
    msg["refusal"] = nullptr;  // strata never refuses; OpenAI's clients read the field
    json choice = {{"index", c_.choice_index}, {"message", msg}};
    choice["logprobs"] = c_.logprobs >= 0 ? json{{"content", logprobs_}, {"refusal", nullptr}} : json(nullptr);
    choice["finish_reason"] = finish_reason_;
    json j = {{"id", c_.id}, {"object", "chat.completion"}, {"created", c_.created}, {"model", c_.model}};
    j["choices"] = json::array({choice});
    j["usage"] = with_usage_extension(usage_json(usage_));
    return j;
  }

 private:
  std::string chunk(const json& delta, const json& logprobs, const json& finish_reason) const {
    json j = chunk_base("chat.completion.chunk");
    json choice = {{"index", c_.choice_index}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
    j["choices"] = json::array({choice});
    add_usage_null(j);
    return sse_data(j);
  }

  const std::string& call_id(int index) {
    while (int(call_ids_.size()) <= index) call_ids_.push_back(random_id("call_"));
    return call_ids_[size_t(index)];
  }

  // OpenAI's streamed tool calls: the first delta of a call carries its index, id, type and
  // name (arguments ""), the later ones the index and the next piece of arguments.
  json tool_call_deltas(const std::vector<ToolCallDelta>& deltas) {
    json arr = json::array();
    for (const auto& d : deltas) {
      json call = {{"index", d.index}};
      if (d.first) {
        call["id"] = call_id(d.index);
        call["type"] = "function";
        call["function"] = {{"name", d.name}, {"arguments", d.arguments}};
      } else {
        call["function"] = {{"arguments", d.arguments}};
      }
      arr.push_back(std::move(call));
    }
    return arr;
  }

  json logprob_entries(const std::vector<TokenLogprobs>& lps) const {
    json out = json::array();
    if (c_.logprobs < 0) return out;
    for (const auto& lp : lps) {
      const std::string t = token_label(lp.chosen.token);
      json top = json::array();
      for (const auto& alt : lp.top) {
        const std::string at = token_label(alt.token);
        top.push_back({{"token", at}, {"logprob", finite_logprob(alt.logprob)}, {"bytes", bytes_of(at)}});
      }
      out.push_back({{"token", t}, {"logprob", finite_logprob(lp.chosen.logprob)}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
    }
    return out;
  }

  std::string content_, reasoning_;
  json logprobs_ = json::array();
  json calls_ = json::array();
  std::vector<std::string> call_ids_;  // by call index
  std::string finish_reason_;
  Usage usage_;
};

class CompletionBuilder : public OpenAiBase {
 public:
  using OpenAiBase::OpenAiBase;

  std::string start() override {
    if (!c_.echo) return "";
    pending_echo_ = true;
    return "";
  }

  void prompt_logprobs(const std::vector<TokenLogprobs>& lps) override { prompt_lps_ = lps; }

  std::string delta(const OutputDelta& d) override {
    std::string text;
    json lp = nullptr;
    if (pending_echo_) {
      pending_echo_ = false;
      text = c_.prompt_text;
      if (c_.logprobs >= 0) lp = echo_logprobs();
    }
    text += d.content;
    if (c_.logprobs >= 0) {
      if (lp.is_null()) lp = empty_logprobs();
      append_logprobs(lp, d.logprobs);
    }
    text_ += text;
    if (c_.logprobs >= 0) merge(lp);
    if (text.empty() && (lp.is_null() || lp["tokens"].empty())) return "";
    return chunk(text, lp, nullptr);
  }

  std::string finish(const OutputDelta& last, const std::vector<ToolCall>&, const FinishState& f) override {
    std::string out = delta(last);
    finish_reason_ = openai_finish_reason(f, false);
    usage_ = f.usage;
    out += chunk("", nullptr, finish_reason_);
    if (!c_.shared_stream) out += stream_end(f.usage);
    return out;
  }

  std::string stream_end(const Usage& u) const override { return usage_chunk("text_completion", u) + "data: [DONE]\n\n"; }

  json body() const override {
    json choice = {{"index", c_.choice_index}, {"text", text_}};
    choice["logprobs"] = c_.logprobs >= 0 ? all_lp_ : json(nullptr);
    choice["finish_reason"] = finish_reason_;
    json j = {{"id", c_.id}, {"object", "text_completion"}, {"created", c_.created}, {"model", c_.model}};
    j["choices"] = json::array({choice});
    j["usage"] = with_usage_extension(usage_json(usage_));
    return j;
  }

 private:
  static json empty_logprobs() {
    return {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
  }

  void push_token(json& lp, int32_t id, const json& logprob, const json& top) {
    const std::string t = token_text(tok_, id);
    lp["tokens"].push_back(token_label(id));
    lp["token_logprobs"].push_back(logprob);
    lp["top_logprobs"].push_back(top);
    lp["text_offset"].push_back(offset_);
    offset_ += int64_t(t.size());
  }

  json top_map(const TokenLogprobs& lp) const {
    json top = json::object();
    for (const auto& alt : lp.top) top[token_label(alt.token)] = finite_logprob(alt.logprob);
    return top;
  }

  json echo_logprobs() {
    json lp = empty_logprobs();
    for (size_t i = 0; i < c_.prompt_ids.size(); ++i) {
      if (i == 0 || i - 1 >= prompt_lps_.size()) {
        push_token(lp, c_.prompt_ids[i], nullptr, nullptr);
      } else {
        const auto& e = prompt_lps_[i - 1];
        push_token(lp, c_.prompt_ids[i], finite_logprob(e.chosen.logprob), top_map(e));
      }
    }
    return lp;
  }

  void append_logprobs(json& lp, const std::vector<TokenLogprobs>& lps) {
    for (const auto& e : lps) push_token(lp, e.chosen.token, finite_logprob(e.chosen.logprob), top_map(e));
  }

  void merge(const json& lp) {
    if (all_lp_.is_null()) all_lp_ = empty_logprobs();
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const auto& v : lp[k]) all_lp_[k].push_back(v);
    }
  }

  std::string chunk(const std::string& text, const json& logprobs, const json& finish_reason) const {
    json j = chunk_base("text_completion");
    json choice = {{"index", c_.choice_index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
    j["choices"] = json::array({choice});
    add_usage_null(j);
    return sse_data(j);
  }

  bool pending_echo_ = false;
  std::vector<TokenLogprobs> prompt_lps_;
  std::string text_;
  json all_lp_ = nullptr;
  int64_t offset_ = 0;
  std::string finish_reason_;
  Usage usage_;
};

class MessagesBuilder : public ResponseBuilder {
 public:
  MessagesBuilder(ResponseContext c) : c_(std::move(c)) {}

  std::string start() override {
    json msg = message_shell();
    msg["usage"] = {{"input_tokens", int(c_.prompt_ids.size())}, {"output_tokens", 0}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", msg}}) + sse_event("ping", {{"type", "ping"}});
  }

  std::string delta(const OutputDelta& d) override {
    std::string out;
    if (!d.reasoning.empty()) {
      out += open_block("thinking");
      thinking_ += d.reasoning;
      out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                               {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
    }
    if (!d.content.empty()) {
      out += open_block("text");
      text_ += d.content;
      out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                               {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
    }
    // Tool calls stream as tool_use blocks: the block starts once the name is known, its input
    // follows as input_json_delta pieces.
    for (const auto& t : d.tool_calls) {
      if (t.first) {
        out += close_block();
        ++index_;
        open_ = "tool_use";
        open_call_ = t.index;
        if (tool_ids_.size() <= size_t(t.index)) tool_ids_.resize(size_t(t.index) + 1);
        tool_ids_[size_t(t.index)] = random_id("toolu_");
        const json block = {{"type", "tool_use"}, {"id", tool_ids_[size_t(t.index)]}, {"name", t.name}, {"input", json::object()}};
        out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
      }
      if (t.arguments.empty() || open_ != "tool_use" || open_call_ != t.index) continue;
      out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                               {"delta", {{"type", "input_json_delta"}, {"partial_json", t.arguments}}}});
    }
    return out;
  }

  std::string finish(const OutputDelta& last, const std::vector<ToolCall>& calls, const FinishState& f) override {
    std::string out = delta(last);
    out += close_block();
    for (size_t i = 0; i < calls.size(); ++i) {
      const ToolCall& call = calls[i];
      json input = json::object();
      try {
        input = json::parse(call.arguments);
      } catch (const std::exception&) {
      }
      const bool streamed = i < tool_ids_.size() && !tool_ids_[i].empty();
      json block = {{"type", "tool_use"}, {"id", streamed ? tool_ids_[i] : random_id("toolu_")}, {"name", call.name}, {"input", input}};
      tool_blocks_.push_back(block);
      if (streamed) continue;
      // A call the stream did not show (no deltas for it): its block whole.
      ++index_;
      json start_block = block;
      start_block["input"] = json::object();
      out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", start_block}});
      out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                               {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}});
      out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    }
    stop_reason_ = anthropic_stop_reason(f, !calls.empty());
    stop_sequence_ = f.stop_string ? json(f.stop_sequence) : json(nullptr);
    usage_ = f.usage;
    out += sse_event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence_}}},
                                       {"usage", with_usage_extension({{"output_tokens", f.usage.completion_tokens}})}});
    out += sse_event("message_stop", {{"type", "message_stop"}});
    return out;
  }

  json body() const override {
    json msg = message_shell();
    json content = json::array();
    if (!thinking_.empty()) content.push_back({{"type", "thinking"}, {"thinking", thinking_}, {"signature", ""}});
    if (!text_.empty() || tool_blocks_.empty()) content.push_back({{"type", "text"}, {"text", text_}});
    for (const auto& b : tool_blocks_) content.push_back(b);
    msg["content"] = content;
    msg["stop_reason"] = stop_reason_;
    msg["stop_sequence"] = stop_sequence_;
    msg["usage"] = with_usage_extension({{"input_tokens", usage_.prompt_tokens - usage_.cached_tokens},
                                         {"output_tokens", usage_.completion_tokens},
                                         {"cache_read_input_tokens", usage_.cached_tokens},
                                         {"cache_creation_input_tokens", 0}});
    if (usage_.speculative) msg["usage"]["speculation"] = speculation_json(usage_);
    if (usage_.fill_spans > 0) msg["usage"]["fill"] = fill_json(usage_);
    return msg;
  }

  std::string stream_error(const ApiError& e) const override { return sse_event("error", anthropic_error_body(e)); }

 private:
  json message_shell() const {
    return {{"id", c_.id}, {"type", "message"}, {"role", "assistant"}, {"model", c_.model}, {"content", json::array()},
            {"stop_reason", nullptr}, {"stop_sequence", nullptr}};
  }

  std::string open_block(const std::string& type) {
    if (open_ == type) return "";
    std::string out = close_block();
    ++index_;
    open_ = type;
    json block = type == "text" ? json{{"type", "text"}, {"text", ""}} : json{{"type", "thinking"}, {"thinking", ""}};
    return out + sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
  }

  std::string close_block() {
    if (open_.empty()) return "";
    open_.clear();
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  }

  ResponseContext c_;
  int index_ = -1;
  std::string open_;
  std::string text_, thinking_;
  json tool_blocks_ = json::array();
  std::vector<std::string> tool_ids_;  // by call index: the streamed tool_use block's id
  int open_call_ = -1;                 // the call whose tool_use block is open
  std::string stop_reason_;
  json stop_sequence_ = nullptr;
  Usage usage_;
};

}  // namespace

std::string openai_finish_reason(const FinishState& f, bool has_tool_calls) {
  if (has_tool_calls) return "tool_calls";
  if (f.stop_string) return "stop";
  switch (f.reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "abort";
    default: return "error";
  }
}

std::string anthropic_stop_reason(const FinishState& f, bool has_tool_calls) {
  if (has_tool_calls) return "tool_use";
  if (f.stop_string) return "stop_sequence";
  if (f.reason == FinishReason::kLength) return "max_tokens";
  return "end_turn";
}

Usage sum_choice_usage(const std::vector<Usage>& choices) {
  Usage total;
  if (choices.empty()) return total;
  total = choices[0];
  for (size_t i = 1; i < choices.size(); ++i) {
    const Usage& u = choices[i];
    total.completion_tokens += u.completion_tokens;
    total.speculative = total.speculative || u.speculative;
    total.draft_tokens += u.draft_tokens;
    total.accepted_tokens += u.accepted_tokens;
    total.fill_tokens += u.fill_tokens;
    total.fill_spans += u.fill_spans;
  }
  return total;
}

json merge_choice_bodies(const std::vector<json>& bodies, const Usage& usage) {
  if (bodies.empty()) return json::object();
  json out = bodies[0];
  json choices = json::array();
  for (const json& b : bodies) {
    for (const json& c : b.value("choices", json::array())) {
      json choice = c;
      choice["index"] = int(choices.size());
      choices.push_back(std::move(choice));
    }
  }
  out["choices"] = std::move(choices);
  // The first body's usage keeps its extensions (the strata trace); its counts become the sum's.
  json u = usage_json(usage);
  if (out.contains("usage") && out["usage"].is_object()) {
    for (auto it = u.begin(); it != u.end(); ++it) out["usage"][it.key()] = it.value();
  } else {
    out["usage"] = std::move(u);
  }
  return out;
}

std::vector<size_t> best_candidates(const std::vector<double>& cumulative_logprobs, size_t n) {
  std::vector<size_t> order(cumulative_logprobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cumulative_logprobs[a] > cumulative_logprobs[b]; });
  order.resize(std::min(n, order.size()));
  return order;
}

json usage_json(const Usage& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.speculative) j["speculation"] = speculation_json(u);
  if (u.fill_spans > 0) j["fill"] = fill_json(u);
  return j;
}

json fill_json(const Usage& u) { return {{"tokens", u.fill_tokens}, {"spans", u.fill_spans}}; }

json speculation_json(const Usage& u) {
  return {{"draft_tokens", u.draft_tokens}, {"accepted_tokens", u.accepted_tokens}};
}

std::string sse_data(const json& j) { return "data: " + dump(j) + "\n\n"; }

std::string sse_event(const std::string& name, const json& j) { return "event: " + name + "\ndata: " + dump(j) + "\n\n"; }

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
  return s;
}

std::unique_ptr<ResponseBuilder> make_response_builder(ApiKind kind, ResponseContext c, const tokenizer::Tokenizer& t) {
  switch (kind) {
    case ApiKind::kChat: return std::make_unique<ChatBuilder>(std::move(c), t);
    case ApiKind::kCompletion: return std::make_unique<CompletionBuilder>(std::move(c), t);
    default: return std::make_unique<MessagesBuilder>(std::move(c));
  }
}

}  // namespace strata::server
