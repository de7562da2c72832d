// Shared by the tokenizer tests: the reference tokenizers live xz-compressed under
// tests/data/reference/tokenizers/<name>/; they are unpacked once per process into a
// temporary directory next to their tokenizer_config.json.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace strata::tokenizer::testing {

inline const char* const kReferenceTokenizers[] = {"qwen3", "llama3", "gemma3", "llama2", "deepseek_v3", "gptoss"};

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Directory holding tokenizer.json and tokenizer_config.json of reference tokenizer `name`,
// unpacked once into a per-user cache (keyed by the archive size) shared by the test
// processes; a finished file is renamed into place, so concurrent tests never see half.
inline std::string reference_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(STRATA_TEST_DATA) / "reference" / "tokenizers" / name;
  const auto xz_size = fs::file_size(src / "tokenizer.json.xz");
  const fs::path dst = fs::temp_directory_path() / ("strata_tokenizers_" + std::to_string(getuid())) /
                       (name + "_" + std::to_string(xz_size));
  if (fs::exists(dst / "tokenizer.json") && fs::exists(dst / "tokenizer_config.json")) return dst.string();
  fs::create_directories(dst);
  const std::string tmp = (dst / ("tokenizer.json.tmp" + std::to_string(getpid()))).string();
  const std::string cmd = "xz -dc '" + (src / "tokenizer.json.xz").string() + "' > '" + tmp + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string config_tmp = (dst / ("tokenizer_config.json.tmp" + std::to_string(getpid()))).string();
  fs::copy_file(src / "tokenizer_config.json", config_tmp, fs::copy_options::overwrite_existing);
  fs::rename(config_tmp, dst / "tokenizer_config.json");
  fs::rename(tmp, dst / "tokenizer.json");
  return dst.string();
}

inline const Tokenizer& reference_tokenizer(const std::string& name, bool transformers5 = false) {
  static std::map<std::pair<std::string, bool>, Tokenizer> cache;
  const auto key = std::make_pair(name, transformers5);
  auto it = cache.find(key);
  if (it == cache.end()) {
    LoadOptions options;
    options.transformers5_llama_rebuild = transformers5;
    auto t = Tokenizer::load(reference_dir(name), options);
    if (!t.ok()) {
      ADD_FAILURE() << t.error().to_string();
      std::abort();
    }
    it = cache.emplace(key, std::move(*t)).first;
  }
  return it->second;
}

inline const nlohmann::json& reference_cases() {
  static const nlohmann::json cases =
      nlohmann::json::parse(read_file(std::string(STRATA_TEST_DATA) + "/reference/tokenizer_cases.json"));
  return cases;
}

}  // namespace strata::tokenizer::testing

#include <random>
#include <vector>

#include "tokenizer/unicode.h"

namespace strata::tokenizer::testing {

struct CorpusOptions {
  // SentencePiece-style tokenizers strip or merge spaces at the start; keep texts free of
  // leading, doubled and `▁` spaces for them.
  bool single_spaces_only = false;
};

// A random string of mixed scripts, emoji (with ZWJ sequences and skin tones), digits,
// punctuation and whitespace runs. Deterministic for a given generator state.
inline std::string random_text(std::mt19937& rng, const CorpusOptions& options = {}) {
  static const std::vector<std::pair<uint32_t, uint32_t>> kRanges = {
      {'a', 'z'},         {'A', 'Z'},         {'0', '9'},         {'!', '/'},         {0xC0, 0xFF},
      {0x100, 0x17F},     {0x391, 0x3C9},     {0x410, 0x44F},     {0x5D0, 0x5EA},     {0x627, 0x64A},
      {0x905, 0x939},     {0xE01, 0xE2E},     {0x3041, 0x3093},   {0x30A1, 0x30F6},   {0x4E00, 0x4FFF},
      {0xAC00, 0xAD00},   {0x1F600, 0x1F64F}, {0x1F300, 0x1F5FF}, {0x2000, 0x206F},   {0xFF01, 0xFF5E},
      {0x1D400, 0x1D4FF}, {0x20000, 0x2004F},
  };
  static const char* const kWhitespace[] = {" ", "  ", "\n", "\t", "\r\n", "   ", "\n\n", " \n "};
  static const char* const kSpecial[] = {"\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
                                         "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "don't", "I'M", "e\xCC\x81", "12,345.67"};
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<size_t> range_pick(0, kRanges.size() - 1);
  std::uniform_int_distribution<int> word_len(1, 8);
  std::uniform_int_distribution<int> n_words(1, 12);
  std::string out;
  const int words = n_words(rng);
  for (int w = 0; w < words; ++w) {
    const int k = kind(rng);
    if (k == 0) {
      out += kSpecial[std::uniform_int_distribution<size_t>(0, std::size(kSpecial) - 1)(rng)];
    } else {
      const auto& [lo, hi] = kRanges[range_pick(rng)];
      std::uniform_int_distribution<uint32_t> cp(lo, hi);
      const int len = word_len(rng);
      for (int i = 0; i < len; ++i) append_utf8(out, cp(rng));
    }
    if (w + 1 == words) break;
    if (options.single_spaces_only) {
      out += (kind(rng) < 8) ? " " : "\n";
    } else {
      out += kWhitespace[std::uniform_int_distribution<size_t>(0, std::size(kWhitespace) - 1)(rng)];
    }
  }
  return out;
}

}  // namespace strata::tokenizer::testing
