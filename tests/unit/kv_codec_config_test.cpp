// KvCodecConfig: flag and --kv-config parsing, MLX's bits form, per-layer resolution against a
// model's layers, errors that name the field and the value, and the prefix-cache namespace.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "kv/codec/kv_codec_config.h"

namespace strata {
namespace {

std::vector<KvCodecLayerDims> dims(int n, int32_t hd = 64) {
  return std::vector<KvCodecLayerDims>(size_t(n), KvCodecLayerDims{true, -1, hd, hd});
}

void expect_error(const Error& e, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(e.message.find(p), std::string::npos) << "'" << p << "' not in: " << e.message;
}

TEST(KvCodecConfig, ParsesEveryCodecName) {
  for (const char* n : {"auto", "bf16", "fp8", "int8", "int4", "turbo"}) {
    auto c = parse_kv_codec(n);
    ASSERT_TRUE(c.ok()) << n;
    EXPECT_STREQ(kv_codec_name(*c), n);
  }
  auto bad = parse_kv_codec("int3");
  ASSERT_FALSE(bad.ok());
  expect_error(bad.error(), {"--kv-cache-dtype", "int3"});
}

TEST(KvCodecConfig, JsonEntriesBothForms) {
  auto l = parse_kv_config_json(
      R"([{"layer_idx": 3, "codec": "turbo"}, {"layer_idx": 0, "bits": 4, "group_size": 32},
          {"layer_idx": 1, "bits": 8}, {"layer_idx": 2, "codec": "fp8"}])",
      "cfg.json");
  ASSERT_TRUE(l.ok()) << l.error().to_string();
  ASSERT_EQ(l->size(), 4u);
  EXPECT_EQ((*l)[0].layer_idx, 0);  // sorted by layer
  EXPECT_EQ((*l)[0].spec, (KvCodecSpec{KvCodec::kInt4, 32}));
  EXPECT_EQ((*l)[1].spec, (KvCodecSpec{KvCodec::kInt8, 0}));
  EXPECT_EQ((*l)[2].spec, (KvCodecSpec{KvCodec::kFp8, 0}));
  EXPECT_EQ((*l)[3].spec, (KvCodecSpec{KvCodec::kTurbo, 0}));
}

TEST(KvCodecConfig, JsonErrorsNameFieldAndValue) {
  struct Bad {
    const char* text;
    std::vector<std::string> parts;
  };
  const Bad cases[] = {
      {"{", {"cfg.json", "not valid JSON"}},
      {R"({"layer_idx": 0})", {"cfg.json", "list"}},
      {R"([{"layer_idx": 0, "bits": 3}])", {"entry 0", "\"bits\" is 3", "4 or 8"}},
      {R"([{"layer_idx": 0, "codec": "int5"}])", {"entry 0", "codec", "int5"}},
      {R"([{"codec": "int8"}])", {"entry 0", "missing \"layer_idx\""}},
      {R"([{"layer_idx": -1, "codec": "int8"}])", {"\"layer_idx\" is -1"}},
      {R"([{"layer_idx": 0}])", {"needs \"codec\" or \"bits\""}},
      {R"([{"layer_idx": 0, "codec": "int8"}, {"layer_idx": 0, "bits": 4}])", {"entry 1", "appears twice"}},
      {R"([{"layer_idx": 0, "codec": "fp8", "group_size": 32}])", {"group_size", "fp8"}},
      {R"([{"layer_idx": 0, "codec": "int8", "group_size": 0}])", {"\"group_size\" is 0"}},
      {R"([{"layer_idx": 0, "codec": "int4", "bits": 8}])", {"contradicts"}},
      {R"([{"layer_idx": 0, "codec": "int8", "grup_size": 32}])", {"unknown field \"grup_size\""}},
  };
  for (const auto& c : cases) {
    auto l = parse_kv_config_json(c.text, "cfg.json");
    ASSERT_FALSE(l.ok()) << c.text;
    expect_error(l.error(), c.parts);
  }
}

TEST(KvCodecConfig, ResolveAgainstTheModel) {
  KvCodecConfig c;
  c.default_spec = {KvCodec::kInt8, 0};
  c.layers = {{1, {KvCodec::kInt4, 32}}, {2, {KvCodec::kTurbo, 0}}, {3, {KvCodec::kAuto, 0}}};
  auto r = resolve_kv_codecs(c, dims(4));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ((*r)[0], (KvCodecSpec{KvCodec::kInt8, 64}));  // group filled in: min(64, head dim)
  EXPECT_EQ((*r)[1], (KvCodecSpec{KvCodec::kInt4, 32}));
  EXPECT_EQ((*r)[2], (KvCodecSpec{KvCodec::kTurbo, 32}));
  EXPECT_EQ((*r)[3], (KvCodecSpec{KvCodec::kAuto, 0}));

  // A layer that does not exist.
  c.layers = {{9, {KvCodec::kInt4, 0}}};
  auto e1 = resolve_kv_codecs(c, dims(4));
  ASSERT_FALSE(e1.ok());
  expect_error(e1.error(), {"layer_idx 9", "does not exist", "4 layers"});
  // A group size that does not divide the head dim.
  c.layers = {{1, {KvCodec::kInt4, 48}}};
  auto e2 = resolve_kv_codecs(c, dims(4));
  ASSERT_FALSE(e2.ok());
  expect_error(e2.error(), {"int4/48", "layer 1", "head dim 64", "divide"});
  // Turbo on a head dim that is not a power of two, from the flag.
  KvCodecConfig t;
  t.default_spec = {KvCodec::kTurbo, 0};
  auto e3 = resolve_kv_codecs(t, dims(2, 96));
  ASSERT_FALSE(e3.ok());
  expect_error(e3.error(), {"--kv-cache-dtype", "turbo", "head dim 96"});
  // Layers without KV of their own.
  std::vector<KvCodecLayerDims> d = dims(3);
  d[1].has_kv = false;
  d[2].shares_with = 0;
  c.layers = {{1, {KvCodec::kInt8, 0}}};
  auto e4 = resolve_kv_codecs(c, d);
  ASSERT_FALSE(e4.ok());
  expect_error(e4.error(), {"layer_idx 1", "no attention KV"});
  c.layers = {{2, {KvCodec::kInt8, 0}}};
  auto e5 = resolve_kv_codecs(c, d);
  ASSERT_FALSE(e5.ok());
  expect_error(e5.error(), {"layer_idx 2", "layer 0"});
  c.layers.clear();
  auto ok = resolve_kv_codecs(c, d);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)[2], KvCodecSpec{});  // follows its owner
}

TEST(KvCodecConfig, FlagsAndFile) {
  const std::string path = ::testing::TempDir() + "/kv_codec_config_test.json";
  {
    std::ofstream f(path);
    f << R"([{"layer_idx": 0, "bits": 4, "group_size": 64}])";
  }
  auto c = make_kv_codec_config("fp8", path, 256);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->default_spec.codec, KvCodec::kFp8);
  ASSERT_EQ(c->layers.size(), 1u);
  EXPECT_EQ(c->quant_start, 256);
  EXPECT_FALSE(make_kv_codec_config("fp16", "", 0).ok());
  auto missing = make_kv_codec_config("", path + ".missing", 0);
  ASSERT_FALSE(missing.ok());
  expect_error(missing.error(), {"--kv-config", ".missing"});
  EXPECT_FALSE(make_kv_codec_config("", "", -2).ok());
  auto autos = make_kv_codec_config("int4", "", KvCodecConfig::kQuantStartAuto);
  ASSERT_TRUE(autos.ok());
  EXPECT_EQ(autos->quant_start, KvCodecConfig::kQuantStartAuto);
  // --kv-quant-start's text: auto or a count.
  EXPECT_EQ(*parse_kv_quant_start("auto"), KvCodecConfig::kQuantStartAuto);
  EXPECT_EQ(*parse_kv_quant_start("0"), 0);
  EXPECT_EQ(*parse_kv_quant_start("512"), 512);
  for (const char* text : {"-1", "", "12x", "Auto", "9999999999"}) {
    auto q = parse_kv_quant_start(text);
    ASSERT_FALSE(q.ok()) << text;
    expect_error(q.error(), {"--kv-quant-start", std::string("'") + text + "'"});
  }
  auto def = make_kv_codec_config("", "", 0);
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->default_spec, KvCodecSpec{});
  std::remove(path.c_str());
}

TEST(KvCodecConfig, NamespaceSeparatesCodecs) {
  KvCodecConfig a, b, c;
  b.default_spec = {KvCodec::kInt8, 0};
  c.default_spec = {KvCodec::kInt8, 0};
  c.layers = {{2, {KvCodec::kInt4, 32}}};
  EXPECT_EQ(codec_namespace(a), "kv:auto");
  EXPECT_EQ(codec_namespace(b), "kv:int8");
  EXPECT_EQ(codec_namespace(c), "kv:int8;2=int4/32");
  // An entry equal to the default changes nothing.
  KvCodecConfig d = b;
  d.layers = {{1, {KvCodec::kInt8, 0}}};
  EXPECT_EQ(codec_namespace(d), codec_namespace(b));
}

}  // namespace
}  // namespace strata
