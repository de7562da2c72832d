#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/unicode.h"

namespace strata::tokenizer {

using json = nlohmann::json;

struct Tokenizer::State {
  BpeModel model;
  AddedVocab added;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  PostProcessor post;
  bool byte_level = false;
  bool has_normalized_added = false;
  int32_t vocab_size = 0;
  TokenizerConfig config;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
};

namespace {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(ErrorCode::kNotFound, "cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (!f && !f.eof()) return make_error(ErrorCode::kIo, "cannot read " + path);
  return ss.str();
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

Result<std::vector<AddedToken>> parse_added_tokens(const json& list) {
  std::vector<AddedToken> tokens;
  if (list.is_null()) return tokens;
  if (!list.is_array()) return make_error(ErrorCode::kCorrupt, "tokenizer.json added_tokens: expected a list");
  for (const auto& t : list) {
    AddedToken a;
    if (!t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") || !t["content"].is_string()) {
      return make_error(ErrorCode::kCorrupt, "tokenizer.json added_tokens entry " + t.dump() + ": needs id and content");
    }
    a.id = t["id"].get<int32_t>();
    if (a.id < 0) return make_error(ErrorCode::kCorrupt, "tokenizer.json added_tokens: negative id " + std::to_string(a.id));
    a.content = t["content"].get<std::string>();
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.normalized = t.value("normalized", !t.value("special", false));
    a.special = t.value("special", false);
    tokens.push_back(std::move(a));
  }
  return tokens;
}

// tokenizer.json parsed into a tree, except model.vocab and model.merges (most of the file),
// which are pulled out into flat lists while parsing.
struct ParsedTokenizerJson {
  json tree;
  BpeModel::VocabEntries vocab;
  BpeModel::MergeEntries merges;
  bool has_vocab = false;
  std::string merge_error;
};

ParsedTokenizerJson parse_tokenizer_json(const std::string& text) {
  ParsedTokenizerJson out;
  std::vector<bool> is_array;     // open containers, outermost first
  std::vector<std::string> keys;  // the current key of each open object
  std::vector<std::string> pair;  // strings of the ["a", "b"] merge being read
  auto at = [&](size_t depth, const char* k0, const char* k1) {
    return is_array.size() == depth && keys[0] == k0 && keys[1] == k1;
  };
  auto cb = [&](int, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        is_array.push_back(event == json::parse_event_t::array_start);
        keys.emplace_back();
        if (at(3, "model", "vocab") && !is_array[2]) out.has_vocab = true;
        return true;
      case json::parse_event_t::key:
        keys.back() = parsed.get_ref<const std::string&>();
        return true;
      case json::parse_event_t::value:
        if (at(3, "model", "vocab") && !is_array[2] && parsed.is_number_integer()) {
          out.vocab.emplace_back(keys.back(), parsed.get<int64_t>());
          return false;
        }
        if (at(3, "model", "merges") && is_array[2] && parsed.is_string()) {
          const std::string& m = parsed.get_ref<const std::string&>();
          const size_t space = m.find(' ');
          if (space == std::string::npos) {
            if (out.merge_error.empty()) out.merge_error = "model.merges entry '" + m + "': expected 'a b'";
          } else {
            out.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
          }
          return false;
        }
        if (at(4, "model", "merges") && is_array[2] && is_array[3] && parsed.is_string()) {
          pair.push_back(parsed.get<std::string>());
          return false;
        }
        return true;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end: {
        const bool merge_pair = at(4, "model", "merges") && is_array[2] && is_array[3];
        is_array.pop_back();
        keys.pop_back();
        if (merge_pair) {
          if (pair.size() == 2) {
            out.merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
          } else if (out.merge_error.empty()) {
            out.merge_error = "model.merges entry: expected [a, b]";
          }
          pair.clear();
          return false;
        }
        return true;
      }
    }
    return true;
  };
  out.tree = json::parse(text, cb);
  return out;
}

Result<std::shared_ptr<Tokenizer::State>> build_state(ParsedTokenizerJson parsed, const TokenizerConfig& config,
                                                      const LoadOptions& options) {
  auto state = std::make_shared<Tokenizer::State>();
  state->config = config;
  const json& tj = parsed.tree;
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object()) {
    return make_error(ErrorCode::kCorrupt, "no model object");
  }
  if (!parsed.has_vocab) return make_error(ErrorCode::kCorrupt, "model.vocab: expected an object");
  if (!parsed.merge_error.empty()) return make_error(ErrorCode::kCorrupt, parsed.merge_error);
  auto model = BpeModel::build(tj["model"], std::move(parsed.vocab), std::move(parsed.merges));
  if (!model.ok()) return model.error();
  state->model = std::move(*model);

  auto normalizer = parse_normalizer(tj.value("normalizer", json()));
  if (!normalizer.ok()) return normalizer.error();
  state->normalizer = std::move(*normalizer);
  auto pre = parse_pre_tokenizer(tj.value("pre_tokenizer", json()));
  if (!pre.ok()) return pre.error();
  state->pre_tokenizer = std::move(*pre);
  auto decoder = parse_decoder(tj.value("decoder", json()));
  if (!decoder.ok()) return decoder.error();
  state->decoder = std::move(*decoder);
  auto post = parse_post_processor(tj.value("post_processor", json()));
  if (!post.ok()) return post.error();
  state->post = std::move(*post);

  if (options.transformers5_llama_rebuild &&
      (config.tokenizer_class == "LlamaTokenizer" || config.tokenizer_class == "LlamaTokenizerFast")) {
    const PrependScheme scheme =
        !config.add_prefix_space ? PrependScheme::kNever : (config.legacy ? PrependScheme::kAlways : PrependScheme::kFirst);
    state->normalizer.reset();
    state->pre_tokenizer = make_metaspace("\xE2\x96\x81", scheme, /*split=*/false);
    state->decoder = make_llama_decoder();
    state->model.set_byte_fallback(true);
    state->model.set_fuse_unk(true);
  }
  state->byte_level = state->pre_tokenizer && state->pre_tokenizer->byte_level();

  auto added = parse_added_tokens(tj.value("added_tokens", json()));
  if (!added.ok()) return added.error();
  std::vector<std::string> patterns;
  int32_t max_id = state->model.max_id();
  for (const auto& t : *added) {
    std::string p = t.content;
    if (t.normalized) {
      state->has_normalized_added = true;
      if (state->normalizer) state->normalizer->normalize(p);
    }
    patterns.push_back(std::move(p));
    max_id = std::max(max_id, t.id);
  }
  state->added.build(std::move(*added), patterns);
  state->vocab_size = max_id + 1;

  auto resolve = [&](const std::string& token) -> int32_t {
    if (token.empty()) return -1;
    const int32_t a = state->added.find_content(token);
    return a >= 0 ? a : state->model.token_to_id(token);
  };
  state->bos_id = resolve(config.bos_token);
  state->eos_id = resolve(config.eos_token);
  return state;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json, const std::string& tokenizer_config_json,
                                       const LoadOptions& options) {
  TokenizerConfig config;
  if (!tokenizer_config_json.empty()) {
    auto c = parse_tokenizer_config(tokenizer_config_json);
    if (!c.ok()) return c.error();
    config = std::move(*c);
  }
  try {
    auto state = build_state(parse_tokenizer_json(tokenizer_json), config, options);
    if (!state.ok()) return state.error();
    return Tokenizer(std::move(*state));
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, std::string("tokenizer.json: ") + e.what());
  }
}

Result<Tokenizer> Tokenizer::load(const std::string& dir, const LoadOptions& options) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  auto tj = read_text_file(base + "tokenizer.json");
  if (!tj.ok()) return tj.error();
  std::string config_text;
  if (file_exists(base + "tokenizer_config.json")) {
    auto c = read_text_file(base + "tokenizer_config.json");
    if (!c.ok()) return c.error();
    config_text = std::move(*c);
  }
  TokenizerConfig config;
  if (!config_text.empty()) {
    auto c = parse_tokenizer_config(config_text);
    if (!c.ok()) return make_error(c.error().code, base + "tokenizer_config.json: " + c.error().message);
    config = std::move(*c);
  }
  if (file_exists(base + "chat_template.jinja")) {
    auto t = read_text_file(base + "chat_template.jinja");
    if (!t.ok()) return t.error();
    config.set_template("default", std::move(*t));
  }
  if (file_exists(base + "generation_config.json")) {
    auto g = read_text_file(base + "generation_config.json");
    if (!g.ok()) return g.error();
    auto st = parse_generation_config(*g, config);
    if (!st.ok()) return make_error(st.error().code, base + "generation_config.json: " + st.error().message);
  }
  try {
    auto state = build_state(parse_tokenizer_json(*tj), config, options);
    if (!state.ok()) return make_error(state.error().code, base + "tokenizer.json: " + state.error().message);
    return Tokenizer(std::move(*state));
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, base + "tokenizer.json: " + e.what());
  }
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special) const {
  if (auto bad = find_invalid_utf8(text)) {
    return make_error(ErrorCode::kInvalidArgument, "text: invalid UTF-8 at byte offset " + std::to_string(*bad));
  }
  const State& s = *state_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<TextPiece> raw_pieces, norm_pieces;
  std::vector<std::string> words;
  std::string segment;
  s.added.split(text, /*normalized_set=*/false, raw_pieces);
  for (const TextPiece& rp : raw_pieces) {
    if (rp.id >= 0) {
      ids.push_back(rp.id);
      continue;
    }
    segment.assign(text.substr(rp.start, rp.end - rp.start));
    if (s.normalizer) s.normalizer->normalize(segment);
    norm_pieces.clear();
    if (s.has_normalized_added) {
      s.added.split(segment, /*normalized_set=*/true, norm_pieces);
    } else if (!segment.empty()) {
      norm_pieces.push_back(TextPiece{0, segment.size(), -1});
    }
    for (const TextPiece& np : norm_pieces) {
      if (np.id >= 0) {
        ids.push_back(np.id);
        continue;
      }
      words.clear();
      words.emplace_back(segment, np.start, np.end - np.start);
      if (s.pre_tokenizer) s.pre_tokenizer->pre_tokenize(words, rp.start == 0 && np.start == 0);
      for (const auto& w : words) s.model.encode_word(w, s.byte_level, ids);
    }
  }
  if (add_special) s.post.apply(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return decode(ids.data(), ids.size(), skip_special);
}

std::string Tokenizer::decode(const int32_t* ids, size_t n, bool skip_special) const {
  const State& s = *state_;
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (const AddedToken* a = s.added.find_id(ids[i])) {
      if (skip_special && a->special) continue;
      tokens.push_back(a->content);
    } else if (const std::string* p = s.model.id_to_token(ids[i])) {
      tokens.push_back(*p);
    }
  }
  std::string out;
  if (s.decoder) {
    s.decoder->decode_chain(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
  }
  return out;
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  if (const AddedToken* a = state_->added.find_id(id)) return a->content;
  if (const std::string* p = state_->model.id_to_token(id)) return *p;
  return std::string();
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (const AddedToken* a = state_->added.find_id(id)) return a->content;
  const std::string* p = state_->model.id_to_token(id);
  if (p == nullptr) return std::string();
  const std::string_view piece = *p;
  std::string out;
  if (state_->byte_level) {
    for (size_t i = 0; i < piece.size();) {
      const int b = unicode_to_byte(next_code_point(piece, i));
      if (b < 0) return std::string(piece);  // not a byte-level piece: its text as is
      out.push_back(static_cast<char>(b));
    }
    return out;
  }
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' && hex(piece[3]) >= 0 && hex(piece[4]) >= 0)
    return std::string(1, static_cast<char>(hex(piece[3]) * 16 + hex(piece[4])));
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  for (size_t i = 0; i < piece.size();) {
    if (piece.substr(i, 3) == kSpace) {
      out.push_back(' ');
      i += 3;
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

int32_t Tokenizer::piece_to_id(std::string_view piece) const {
  const int32_t a = state_->added.find_content(piece);
  return a >= 0 ? a : state_->model.token_to_id(piece);
}

int32_t Tokenizer::vocab_size() const { return state_->vocab_size; }

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* a = state_->added.find_id(id);
  return a != nullptr && a->special;
}

int32_t Tokenizer::bos_id() const { return state_->bos_id; }
int32_t Tokenizer::eos_id() const { return state_->eos_id; }
const std::string& Tokenizer::bos_token() const { return state_->config.bos_token; }
const std::string& Tokenizer::eos_token() const { return state_->config.eos_token; }

Result<std::string> Tokenizer::chat_template_source(const std::string& name) const {
  if (const std::string* t = state_->config.find_template(name)) return *t;
  return make_error(ErrorCode::kNotFound, "chat template '" + name + "': the tokenizer has none by that name");
}

std::vector<std::string> Tokenizer::chat_template_names() const {
  std::vector<std::string> names;
  for (const auto& [name, source] : state_->config.chat_templates) names.push_back(name);
  return names;
}

const std::vector<int32_t>& Tokenizer::generation_eos_ids() const { return state_->config.generation_eos_ids; }

std::vector<int32_t> Tokenizer::stop_ids(const std::vector<int32_t>& generation_config_eos) const {
  std::vector<int32_t> out;
  auto add = [&](int32_t id) {
    if (id >= 0 && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  for (int32_t id : generation_config_eos) add(id);
  add(state_->eos_id);
  static const char* const kEndOfTurn[] = {
      "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|return|>", "<|call|>",
      "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek: <｜end▁of▁sentence｜>
      "<|EOT|>", "<|endoftext|>"};
  for (const char* token : kEndOfTurn) {
    const int32_t id = state_->added.find_content(token);
    if (id < 0 || !is_special(id)) continue;
    bool mentioned = false;
    for (const auto& [name, source] : state_->config.chat_templates) {
      mentioned = mentioned || source.find(token) != std::string::npos;
    }
    if (mentioned) add(id);
  }
  return out;
}

}  // namespace strata::tokenizer
