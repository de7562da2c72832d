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

// Directory holding tokenizer.json and tokenizer_config.json of reference tokenizer `name`.
inline std::string reference_dir(const std::string& name) {
  static std::map<std::string, std::string> dirs;
  auto it = dirs.find(name);
  if (it != dirs.end()) return it->second;
  namespace fs = std::filesystem;
  const fs::path src = fs::path(STRATA_TEST_DATA) / "reference" / "tokenizers" / name;
  char tmpl[] = "/tmp/strata_tok_XXXXXX";
  const char* made = mkdtemp(tmpl);
  EXPECT_NE(made, nullptr);
  const fs::path dst = fs::path(made) / name;
  fs::create_directories(dst);
  const std::string cmd = "xz -dc '" + (src / "tokenizer.json.xz").string() + "' > '" + (dst / "tokenizer.json").string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::copy_file(src / "tokenizer_config.json", dst / "tokenizer_config.json");
  dirs[name] = dst.string();
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
