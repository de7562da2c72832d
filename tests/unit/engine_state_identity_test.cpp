// The state identity's inputs one by one: the weights' content (hashed only when state outlives
// the process), the backend's arithmetic (CPU f32; CUDA's KV row type and --deterministic),
// --load-format dummy (its own identity, never a real checkpoint's), the quantization and
// adapter field, and an identity that cannot be computed (unique, so nothing persisted is
// trusted).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/state_identity.h"
#include "../support/test_dir.h"
#include "model/weight_identity.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

KvCodecConfig rows(KvCodec codec) {
  KvCodecConfig c;
  c.default_spec.codec = codec;
  return c;
}

class StateIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = strata::test::fresh_test_dir("strata_state_identity");
    fs::create_directories(root_ / "model");
    write("config.json", R"({"model_type": "qwen3"})");
    write("model.safetensors", std::string(1000, 'a'));
    src_.model_dir = (root_ / "model").string();
    src_.backend = backend_numeric_identity("cpu", KvCodecConfig{}, false);
    src_.persistent = true;
    src_.hash_cache_dir = (root_ / "kv").string();
  }
  void TearDown() override { fs::remove_all(root_); }
  // Waits past the kernel's coarse timestamp tick first, so a rewrite gets a new mtime/ctime.
  void write(const std::string& name, const std::string& bytes) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::ofstream(root_ / "model" / name, std::ios::binary | std::ios::trunc) << bytes;
  }

  fs::path root_;
  StateIdentitySource src_;
};

TEST_F(StateIdentityTest, PersistentStateIsKeyedByTheWeightsContent) {
  const std::string a = state_identity(src_);
  EXPECT_EQ(a, state_identity(src_));
  EXPECT_NE(a.find("weights="), std::string::npos) << a;
  EXPECT_NE(a.find(";quant=none;adapters="), std::string::npos) << a;
  EXPECT_NE(a.find(";backend=cpu:f32"), std::string::npos) << a;
  EXPECT_TRUE(fs::exists(root_ / "kv" / kWeightHashCacheFile));
  write("model.safetensors", std::string(1000, 'b'));  // same path, same size, other weights
  const std::string b = state_identity(src_);
  EXPECT_NE(b, a);
  write("model.safetensors", std::string(1000, 'a'));
  EXPECT_EQ(state_identity(src_), a);
  write("config.json", R"({"model_type": "qwen3", "rms_norm_eps": 1e-5})");
  EXPECT_NE(state_identity(src_), a);
}

TEST_F(StateIdentityTest, InMemoryStateIsKeyedByThePathWithoutHashing) {
  src_.persistent = false;
  src_.hash_cache_dir.clear();
  fs::remove(root_ / "model" / "model.safetensors");  // not read: nothing to hash
  const std::string id = state_identity(src_);
  EXPECT_EQ(id.rfind("path=" + fs::absolute(root_ / "model").lexically_normal().string() + ";", 0), 0u) << id;
  EXPECT_FALSE(fs::exists(root_ / "kv"));
}

TEST_F(StateIdentityTest, BackendNumericIdentity) {
  const std::string cpu = backend_numeric_identity("cpu", KvCodecConfig{}, false);
  // The CPU kernels are batch-invariant always: --deterministic changes no number there.
  EXPECT_EQ(backend_numeric_identity("cpu", KvCodecConfig{}, true), cpu);
  const std::string bf16 = backend_numeric_identity("cuda", rows(KvCodec::kBf16), false);
  // f32/f16 checkpoints keep f32 rows on the device: their codec stays auto, as on the CPU.
  const std::string f32 = backend_numeric_identity("cuda", rows(KvCodec::kAuto), false);
  const std::string bf16_det = backend_numeric_identity("cuda", rows(KvCodec::kBf16), true);
  EXPECT_NE(bf16, cpu);
  EXPECT_NE(f32, cpu);
  EXPECT_NE(bf16, f32);
  EXPECT_NE(bf16_det, bf16);
  // And it reaches the identity.
  const std::string on_cpu = state_identity(src_);
  src_.backend = bf16;
  const std::string on_cuda = state_identity(src_);
  EXPECT_NE(on_cuda, on_cpu);
  src_.backend = bf16_det;
  EXPECT_NE(state_identity(src_), on_cuda);
}

TEST_F(StateIdentityTest, DummyWeightsHaveTheirOwnIdentity) {
  const std::string real = state_identity(src_);
  src_.dummy_weights = true;
  src_.dummy_seed = 1;
  src_.dummy_scale = 0.02f;
  const std::string dummy = state_identity(src_);
  EXPECT_EQ(dummy.rfind("dummy:", 0), 0u) << dummy;
  EXPECT_NE(dummy, real);
  src_.persistent = false;
  EXPECT_EQ(state_identity(src_), dummy);  // no path in it, and never a real checkpoint's
  src_.dummy_seed = 2;
  EXPECT_NE(state_identity(src_), dummy);
  src_.dummy_seed = 1;
  src_.dummy_scale = 0.03f;
  EXPECT_NE(state_identity(src_), dummy);
  // Another shape (config.json) with the same seed is another model.
  src_.dummy_scale = 0.02f;
  write("config.json", R"({"model_type": "qwen3", "hidden_size": 128})");
  EXPECT_NE(state_identity(src_), dummy);
}

TEST_F(StateIdentityTest, UnhashableWeightsGetAnIdentityNobodyElseHas) {
  fs::remove(root_ / "model" / "model.safetensors");
  const std::string a = state_identity(src_);
  const std::string b = state_identity(src_);
  EXPECT_EQ(a.rfind("unhashed:", 0), 0u) << a;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace strata
