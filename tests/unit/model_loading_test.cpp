// Bad checkpoints and configs give clear Errors (naming the file, the field or the tensor),
// never a crash. Corrupt files are written into a temporary directory.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/thread_pool.h"
#include "model/model_config.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "model/single_sequence.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kModels = std::string(STRATA_TEST_DATA) + "/reference/models";

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("strata_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file from a header object and a data section.
std::string safetensors_bytes(const json& header, const std::string& data) {
  const std::string h = header.dump();
  uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

// Splits a real file into (header json, data section).
std::pair<json, std::string> split(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

// Copies a reference model into a temp dir, with its model.safetensors replaced by `weights`.
void copy_model_with_weights(const std::string& model, const TempDir& dir, const std::string& weights) {
  fs::copy_file(kModels + "/" + model + "/config.json", dir / "config.json");
  write_bytes(dir / "model.safetensors", weights);
}

Error load_error(const std::string& dir) {
  ThreadPool pool(1);
  auto m = load_model(dir, pool);
  EXPECT_FALSE(m.ok());
  return m.ok() ? Error{} : m.error();
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(ModelLoading, MissingConfig) {
  TempDir d;
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kNotFound);
  EXPECT_TRUE(contains(e.message, "config.json")) << e.message;
}

TEST(ModelLoading, MissingDirectory) {
  const Error e = load_error("/nonexistent/strata/model");
  EXPECT_EQ(e.code, ErrorCode::kNotFound);
  EXPECT_TRUE(contains(e.message, "/nonexistent/strata/model")) << e.message;
}

TEST(ModelLoading, MissingWeights) {
  TempDir d;
  fs::copy_file(kModels + "/qwen2-tiny/config.json", d / "config.json");
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kNotFound);
  EXPECT_TRUE(contains(e.message, "model.safetensors")) << e.message;
}

TEST(ModelLoading, BadConfigJson) {
  TempDir d;
  write_bytes(d / "config.json", "{\"model_type\": \"llama\", ");
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(e.message, "config.json")) << e.message;
}

TEST(ModelLoading, MissingConfigField) {
  TempDir d;
  json c = json::parse(read_bytes(kModels + "/qwen2-tiny/config.json"));
  c.erase("hidden_size");
  write_bytes(d / "config.json", c.dump());
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.message, "hidden_size")) << e.message;
}

TEST(ModelLoading, UnknownModelTypeListsSupported) {
  TempDir d;
  json c = json::parse(read_bytes(kModels + "/qwen2-tiny/config.json"));
  c["model_type"] = "no_such_family";
  write_bytes(d / "config.json", c.dump());
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message, "no_such_family")) << e.message;
  for (const auto& t : supported_model_types()) EXPECT_TRUE(contains(e.message, t)) << e.message;
}

TEST(ModelLoading, TruncatedFile) {
  TempDir d;
  const std::string good = read_bytes(kModels + "/qwen2-tiny/model.safetensors");
  copy_model_with_weights("qwen2-tiny", d, good.substr(0, good.size() / 2));
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(e.message, (d / "model.safetensors").string())) << e.message;
  EXPECT_TRUE(contains(e.message, "data_offsets")) << e.message;
}

TEST(ModelLoading, ShorterThanHeaderLength) {
  TempDir d;
  copy_model_with_weights("qwen2-tiny", d, std::string("\x10\x00\x00", 3));
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(e.message, "truncated")) << e.message;
}

TEST(ModelLoading, HeaderLengthPastTheFile) {
  TempDir d;
  std::string bytes = read_bytes(kModels + "/qwen2-tiny/model.safetensors");
  const uint64_t huge = uint64_t(bytes.size()) * 4;
  std::memcpy(bytes.data(), &huge, 8);
  copy_model_with_weights("qwen2-tiny", d, bytes);
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(e.message, "header length")) << e.message;
}

TEST(ModelLoading, HeaderNotJson) {
  TempDir d;
  const std::string junk = "{not json at all";
  uint64_t n = junk.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  copy_model_with_weights("qwen2-tiny", d, bytes + junk);
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(e.message, "JSON")) << e.message;
}

// Header lies, each detected by parse_safetensors with the tensor and field named.
class LyingHeader : public ::testing::Test {
 protected:
  void SetUp() override { std::tie(header_, data_) = split(read_bytes(kModels + "/qwen2-tiny/model.safetensors")); }
  Error parse_error() {
    write_bytes(dir_ / "x.safetensors", safetensors_bytes(header_, data_));
    auto a = SafetensorsArchive::open_file((dir_ / "x.safetensors").string());
    EXPECT_FALSE(a.ok());
    return a.ok() ? Error{} : a.error();
  }
  json header_;
  std::string data_;
  TempDir dir_;
};

TEST_F(LyingHeader, OffsetsOutOfRange) {
  header_["model.norm.weight"]["data_offsets"] = {data_.size() - 4, data_.size() + 252};
  const Error e = parse_error();
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(e.message, "model.norm.weight")) << e.message;
  EXPECT_TRUE(contains(e.message, "out of range")) << e.message;
}

TEST_F(LyingHeader, SizeDisagreesWithShape) {
  header_["model.norm.weight"]["shape"] = {65};
  const Error e = parse_error();
  EXPECT_TRUE(contains(e.message, "model.norm.weight")) << e.message;
  EXPECT_TRUE(contains(e.message, "[65]")) << e.message;
}

TEST_F(LyingHeader, Overlap) {
  auto off = header_["model.embed_tokens.weight"]["data_offsets"];
  const uint64_t b = off[0].get<uint64_t>();
  header_["model.norm.weight"]["data_offsets"] = {b + 4, b + 4 + 64 * 4};
  const Error e = parse_error();
  EXPECT_TRUE(contains(e.message, "overlap")) << e.message;
  EXPECT_TRUE(contains(e.message, "model.norm.weight")) << e.message;
}

TEST_F(LyingHeader, UnknownDtype) {
  header_["model.norm.weight"]["dtype"] = "F7";
  const Error e = parse_error();
  EXPECT_TRUE(contains(e.message, "unknown dtype 'F7'")) << e.message;
  EXPECT_TRUE(contains(e.message, "model.norm.weight")) << e.message;
}

TEST_F(LyingHeader, MissingField) {
  header_["model.norm.weight"].erase("shape");
  const Error e = parse_error();
  EXPECT_TRUE(contains(e.message, "'shape'")) << e.message;
}

TEST_F(LyingHeader, NegativeDimension) {
  header_["model.norm.weight"]["shape"] = {-64};
  const Error e = parse_error();
  EXPECT_TRUE(contains(e.message, "shape")) << e.message;
}

TEST(ModelLoading, WrongShapeNamesTensorAndShapes) {
  TempDir d;
  auto [header, data] = split(read_bytes(kModels + "/qwen2-tiny/model.safetensors"));
  // Same byte size, transposed: the file is consistent, the config is not.
  header["model.layers.1.mlp.down_proj.weight"]["shape"] = {160, 64};
  copy_model_with_weights("qwen2-tiny", d, safetensors_bytes(header, data));
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.message, "model.layers.1.mlp.down_proj.weight")) << e.message;
  EXPECT_TRUE(contains(e.message, "[160, 64]")) << e.message;
  EXPECT_TRUE(contains(e.message, "[64, 160]")) << e.message;
}

TEST(ModelLoading, MissingTensorNamed) {
  TempDir d;
  auto [header, data] = split(read_bytes(kModels + "/qwen2-tiny/model.safetensors"));
  header.erase("model.layers.2.self_attn.q_proj.bias");
  copy_model_with_weights("qwen2-tiny", d, safetensors_bytes(header, data));
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kNotFound);
  EXPECT_TRUE(contains(e.message, "model.layers.2.self_attn.q_proj.bias")) << e.message;
}

TEST(ModelLoading, ShardedMissingShard) {
  TempDir d;
  for (const char* f : {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"}) {
    fs::copy_file(kModels + "/mistral-tiny/" + f, d / f);
  }
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kNotFound);
  EXPECT_TRUE(contains(e.message, "model-00002-of-00002.safetensors")) << e.message;
}

TEST(ModelLoading, ShardedIndexListsAbsentTensor) {
  TempDir d;
  for (const char* f : {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    fs::copy_file(kModels + "/mistral-tiny/" + f, d / f);
  }
  json index = json::parse(read_bytes(kModels + "/mistral-tiny/model.safetensors.index.json"));
  index["weight_map"]["model.extra.weight"] = "model-00002-of-00002.safetensors";
  write_bytes(d / "model.safetensors.index.json", index.dump());
  const Error e = load_error(d.str());
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(e.message, "model.extra.weight")) << e.message;
}

TEST(ModelLoading, ShardedLoads) {
  auto a = SafetensorsArchive::open_dir(kModels + "/mistral-tiny");
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  ASSERT_NE((*a)->find("lm_head.weight"), nullptr);
  EXPECT_EQ((*a)->find("lm_head.weight")->dtype, DType::kBF16);
  EXPECT_EQ((*a)->find("model.embed_tokens.weight")->shape, (std::vector<int64_t>{512, 64}));
}

TEST(ModelLoading, PromptOverContextNamesBothNumbers) {
  ThreadPool pool(1);
  auto m = load_model(kModels + "/qwen2-tiny", pool);
  ASSERT_TRUE(m.ok());
  SingleSequence seq(**m, 8);
  auto r = seq.prefill(std::vector<int32_t>(9, 5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kOutOfRange);
  EXPECT_TRUE(contains(r.error().message, "9 tokens")) << r.error().message;
  EXPECT_TRUE(contains(r.error().message, "context of 8")) << r.error().message;
  // The sequence is still usable after the rejection.
  ASSERT_TRUE(seq.prefill(std::vector<int32_t>(8, 5)).ok());
  auto over = seq.step(5);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(contains(over.error().message, "context of 8")) << over.error().message;
}

TEST(ModelLoading, TokenOutsideVocabulary) {
  ThreadPool pool(1);
  auto m = load_model(kModels + "/qwen2-tiny", pool);
  ASSERT_TRUE(m.ok());
  SingleSequence seq(**m, 8);
  auto r = seq.prefill({1, 512});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.error().message, "512")) << r.error().message;
  EXPECT_FALSE(seq.prefill({-1}).ok());
}

}  // namespace
}  // namespace strata
