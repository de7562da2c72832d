#include "server/embeddings.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

namespace strata::server {

using json = nlohmann::json;

namespace {

std::string base64_f32(const std::vector<float>& v) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  for (size_t i = 0; i < v.size(); ++i) {  // little-endian f32, as numpy.frombuffer(dtype="<f4") reads it
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[4 * i + size_t(b)] = char((u >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t a = uint8_t(bytes[i]);
    const uint32_t b = i + 1 < bytes.size() ? uint8_t(bytes[i + 1]) : 0;
    const uint32_t c = i + 2 < bytes.size() ? uint8_t(bytes[i + 2]) : 0;
    const uint32_t t = (a << 16) | (b << 8) | c;
    out += kAlphabet[(t >> 18) & 63];
    out += kAlphabet[(t >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(t >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[t & 63] : '=';
  }
  return out;
}

std::optional<ApiError> read_token_ids(const json& arr, const std::string& field, int32_t vocab, std::vector<int32_t>* out) {
  if (arr.empty()) return bad_field(field, field + " must not be empty");
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      return bad_field(field, field + "[" + std::to_string(i) + "] must be a token id in [0, " + std::to_string(vocab) +
                                  "), got " + json_excerpt(t));
    }
    out->push_back(t.get<int32_t>());
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_embeddings_request(const json& body, const ServedModel& model, const ParseLimits& limits,
                                                 EmbeddingsRequest* out) {
  if (!model.embedding) {
    ApiError e = bad_field("model", "model '" + model.name +
                                        "' is served for generation; serve an embedding model with --task embed for /v1/embeddings");
    return e;
  }
  if (const json* m = find_field(body, "model")) {
    if (!m->is_string()) return wrong_type("model", *m, "a string");
    const std::string name = m->get<std::string>();
    if (!limits.model_names.empty() &&
        std::find(limits.model_names.begin(), limits.model_names.end(), name) == limits.model_names.end()) {
      ApiError e = bad_field("model", "model '" + name + "' does not exist; this server serves '" + model.name + "'");
      e.status = 404;
      e.code = "model_not_found";
      return e;
    }
  }
  for (const auto& [key, v] : body.items()) {
    static const char* kKnown[] = {"model", "input", "encoding_format", "dimensions", "user", "prompt_name", "prompt"};
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return key == k; }) == std::end(kKnown)) {
      return bad_field(key, "unknown field '" + key + "' for /v1/embeddings");
    }
  }
  if (const json* u = find_field(body, "user"); u && !u->is_string()) return wrong_type("user", *u, "a string");
  if (const json* f = find_field(body, "encoding_format")) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) {
      return bad_field("encoding_format", "encoding_format must be \"float\" or \"base64\", got " + json_excerpt(*f));
    }
    out->base64 = *f == "base64";
  }
  const int32_t hidden = model.pooling.dimension;
  if (const json* d = find_field(body, "dimensions")) {
    if (!d->is_number_integer() || d->get<int64_t>() < 1 || d->get<int64_t>() > hidden) {
      return bad_field("dimensions", "dimensions must be an integer in [1, " + std::to_string(hidden) + "], got " +
                                         json_excerpt(*d));
    }
    out->dimensions = d->get<int32_t>();
  }

  // The instruction prefix: prompt (literal) or prompt_name (config_sentence_transformers.json),
  // else the checkpoint's default prompt.
  std::string prefix;
  const json* prompt = find_field(body, "prompt");
  const json* prompt_name = find_field(body, "prompt_name");
  if (prompt && prompt_name) return bad_field("prompt", "set prompt or prompt_name, not both");
  if (prompt) {
    if (!prompt->is_string()) return wrong_type("prompt", *prompt, "a string");
    prefix = prompt->get<std::string>();
  } else if (prompt_name) {
    if (!prompt_name->is_string()) return wrong_type("prompt_name", *prompt_name, "a string");
    auto it = model.pooling.prompts.find(prompt_name->get<std::string>());
    if (it == model.pooling.prompts.end()) {
      std::string names;
      for (const auto& [k, v] : model.pooling.prompts) names += (names.empty() ? "" : ", ") + k;
      return bad_field("prompt_name", "prompt_name " + json_excerpt(*prompt_name) + " is not one of the model's prompts (" +
                                          (names.empty() ? std::string("none") : names) + ")");
    }
    prefix = it->second;
  } else if (!model.pooling.default_prompt_name.empty()) {
    prefix = model.pooling.prompts.at(model.pooling.default_prompt_name);
  }

  const json* input = find_field(body, "input");
  if (input == nullptr) return bad_field("input", "input is required");
  const int32_t vocab = model.model_vocab;
  auto add_text = [&](const json& t, const std::string& field) -> std::optional<ApiError> {
    const std::string text = t.get<std::string>();
    if (text.empty()) return bad_field(field, field + " must not be an empty string");
    auto enc = model.tokenizer.encode(prefix + text, true);
    if (!enc.ok()) return bad_field(field, enc.error().message);
    out->inputs.push_back(std::move(enc).value());
    return std::nullopt;
  };
  const bool ids_input = input->is_array() && !input->empty() && ((*input)[0].is_number() || (*input)[0].is_array());
  if (ids_input && (prompt || prompt_name)) {
    return bad_field(prompt ? "prompt" : "prompt_name", "an instruction prompt applies to text input, not token ids");
  }
  if (input->is_string()) {
    if (auto e = add_text(*input, "input")) return e;
  } else if (input->is_array()) {
    if (input->empty()) return bad_field("input", "input must not be an empty array");
    if ((*input)[0].is_number()) {
      std::vector<int32_t> ids;
      if (auto e = read_token_ids(*input, "input", vocab, &ids)) return e;
      out->inputs.push_back(std::move(ids));
    } else {
      if (input->size() > kMaxEmbeddingInputs) {
        return bad_field("input", "input holds " + std::to_string(input->size()) + " items; at most " +
                                      std::to_string(kMaxEmbeddingInputs));
      }
      const bool text = (*input)[0].is_string();
      for (size_t i = 0; i < input->size(); ++i) {
        const json& item = (*input)[i];
        const std::string field = "input[" + std::to_string(i) + "]";
        if (text && item.is_string()) {
          if (auto e = add_text(item, field)) return e;
        } else if (!text && item.is_array()) {
          std::vector<int32_t> ids;
          if (auto e = read_token_ids(item, field, vocab, &ids)) return e;
          out->inputs.push_back(std::move(ids));
        } else {
          return wrong_type(field, item, text ? "a string (every item as the first)" : "an array of token ids (every item as the first)");
        }
      }
    }
  } else {
    return wrong_type("input", *input, "a string, an array of strings, an array of token ids or an array of those");
  }
  // The engine reserves one position past an embed request's prompt.
  const int32_t max_len = model.max_model_len - 1;
  for (size_t i = 0; i < out->inputs.size(); ++i) {
    const auto n = int64_t(out->inputs[i].size());
    if (n > max_len) {
      const std::string field = input->is_array() && !ids_input ? "input[" + std::to_string(i) + "]"
                                : input->is_array() && (*input)[0].is_array() ? "input[" + std::to_string(i) + "]"
                                                                              : "input";
      return bad_field(field, field + " has " + std::to_string(n) + " tokens; at most " + std::to_string(max_len) +
                                  " (max_model_len " + std::to_string(model.max_model_len) + " - 1)");
    }
    out->prompt_tokens += int32_t(n);
  }
  return std::nullopt;
}

std::vector<float> pool_embedding(const std::vector<float>& hidden, int32_t dimensions, bool normalize) {
  const size_t n = dimensions > 0 ? std::min(size_t(dimensions), hidden.size()) : hidden.size();
  std::vector<float> v(hidden.begin(), hidden.begin() + ptrdiff_t(n));
  if (normalize) {
    double ss = 0.0;
    for (float x : v) ss += double(x) * double(x);
    // sentence-transformers' Normalize: x / max(||x||, 1e-12).
    const double inv = 1.0 / std::max(std::sqrt(ss), 1e-12);
    for (float& x : v) x = float(double(x) * inv);
  }
  return v;
}

json embeddings_response(const EmbeddingsRequest& r, const std::vector<std::vector<float>>& vectors,
                         const std::string& model_name) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (r.base64) item["embedding"] = base64_f32(vectors[i]);
    else item["embedding"] = vectors[i];
    data.push_back(std::move(item));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model_name},
          {"usage", {{"prompt_tokens", r.prompt_tokens}, {"total_tokens", r.prompt_tokens}}}};
}

std::optional<ApiError> run_embeddings(Engine& engine, const ServedModel& model, const EmbeddingsRequest& r,
                                       const std::string& id_prefix, const std::function<bool()>& client_gone,
                                       std::vector<std::vector<float>>* vectors, Usage* usage) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  auto cancel_all = [&] {
    for (auto& s : streams) {
      if (!s->done()) s->cancel();
    }
    for (auto& s : streams) {
      while (!s->done()) s->next(std::chrono::milliseconds(100));
    }
  };
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    GenerationRequest g;
    g.id = id_prefix + "-" + std::to_string(i);
    g.prompt = r.inputs[i];
    g.max_tokens = 1;
    g.embed = true;
    g.speculative = false;
    g.sampling.temperature = 0.0f;
    auto s = engine.submit(std::move(g));
    if (!s.ok()) {
      cancel_all();
      ApiError e = api_error_from(s.error(), r.inputs.size() > 1 ? "input[" + std::to_string(i) + "]" : "input");
      return e;
    }
    streams.push_back(std::move(s).value());
  }
  vectors->assign(r.inputs.size(), {});
  auto checked = std::chrono::steady_clock::now();
  for (size_t i = 0; i < streams.size(); ++i) {
    while (!streams[i]->done()) {
      auto ev = streams[i]->next(std::chrono::milliseconds(100));
      if (std::chrono::steady_clock::now() - checked >= std::chrono::milliseconds(100)) {
        checked = std::chrono::steady_clock::now();
        if (client_gone && client_gone()) {
          cancel_all();
          ApiError e;
          e.status = 499;
          e.message = "the client closed the connection";
          return e;
        }
      }
      if (!ev || !ev->final) continue;
      if (ev->finish_reason != FinishReason::kStop || ev->embedding.empty()) {
        cancel_all();
        ApiError e;
        e.status = ev->finish_reason == FinishReason::kCancelled ? 503 : 500;
        e.message = "embedding of input " + std::to_string(i) + " failed: " +
                    (ev->message.empty() ? std::string(finish_reason_name(ev->finish_reason)) : ev->message);
        return e;
      }
      (*vectors)[i] = pool_embedding(ev->embedding, r.dimensions, model.pooling.normalize);
      usage->prompt_tokens += ev->usage.prompt_tokens;
      usage->cached_tokens += ev->usage.cached_tokens;
    }
  }
  return std::nullopt;
}

}  // namespace strata::server
