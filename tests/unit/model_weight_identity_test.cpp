// The weights' content identity and its hash cache: the identity follows the bytes of the weight
// files and of config.json (not their names, times or paths); the cache answers only while a
// file's size, mtime, ctime, device and inode are those it was hashed with, so a `cp -p` of
// other weights over a file (same size and mtime, new ctime) or a rename over it (new inode) is
// hashed again; a damaged cache entry is never believed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "model/weight_identity.h"
#include "../support/test_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class WeightIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = strata::test::fresh_test_dir("strata_weight_identity");
    model_ = root_ / "model";
    cache_ = root_ / "kv";
    fs::create_directories(model_);
    write(model_ / "config.json", R"({"model_type": "qwen3", "hidden_size": 64})");
    write(model_ / "model.safetensors", std::string(4096, 'a'));
  }
  void TearDown() override { fs::remove_all(root_); }

  static void write(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  // The coarse kernel clock stamps ctime: wait past its tick so a change gets a new ctime.
  static void next_tick() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }
  static void set_mtime(const fs::path& p, int64_t mtime_ns) {
    struct timespec ts[2];
    ts[0].tv_sec = mtime_ns / 1000000000;
    ts[0].tv_nsec = mtime_ns % 1000000000;
    ts[1] = ts[0];
    ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), ts, 0), 0);
  }

  std::string identity(WeightHashStats* st) {
    auto id = weight_identity(model_.string(), cache_.string(), st);
    EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.error().to_string());
    return id.ok() ? *id : std::string();
  }

  fs::path root_, model_, cache_;
};

TEST_F(WeightIdentityTest, CacheHitsWhileUnchangedAndTheIdentityFollowsTheBytes) {
  WeightHashStats st;
  const std::string first = identity(&st);
  EXPECT_EQ(first.rfind("weights=", 0), 0u) << first;
  EXPECT_NE(first.find(";config="), std::string::npos) << first;
  EXPECT_EQ(st.hashed_files, 2);  // config.json and model.safetensors
  EXPECT_EQ(st.cached_files, 0);
  EXPECT_TRUE(fs::exists(cache_ / kWeightHashCacheFile));

  EXPECT_EQ(identity(&st), first);
  EXPECT_EQ(st.hashed_files, 0);
  EXPECT_EQ(st.cached_files, 2);

  // Without a cache directory every call hashes, with the same result.
  auto uncached = weight_identity(model_.string(), "", &st);
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ(*uncached, first);
  EXPECT_EQ(st.hashed_files, 2);

  // The same bytes elsewhere (another path, other times) are the same identity.
  const fs::path copy = root_ / "copy";
  fs::copy(model_, copy);
  auto elsewhere = weight_identity(copy.string(), cache_.string(), &st);
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ(*elsewhere, first);
  EXPECT_EQ(st.hashed_files, 2);
}

TEST_F(WeightIdentityTest, OtherWeightsOfTheSameSizeAreAnotherIdentity) {
  WeightHashStats st;
  const std::string a = identity(&st);
  next_tick();
  write(model_ / "model.safetensors", std::string(4096, 'b'));
  const std::string b = identity(&st);
  EXPECT_NE(b, a);
  EXPECT_EQ(st.hashed_files, 1);
  EXPECT_EQ(st.cached_files, 1);  // config.json did not change
  // Only the weights part moved.
  EXPECT_EQ(a.substr(a.find(";config=")), b.substr(b.find(";config=")));
}

TEST_F(WeightIdentityTest, ConfigContentIsPartOfTheIdentity) {
  WeightHashStats st;
  const std::string a = identity(&st);
  next_tick();
  write(model_ / "config.json", R"({"model_type": "qwen3", "hidden_size": 65})");
  const std::string b = identity(&st);
  EXPECT_NE(b, a);
  EXPECT_NE(a.substr(a.find(";config=")), b.substr(b.find(";config=")));
  EXPECT_EQ(st.hashed_files, 1);
}

TEST_F(WeightIdentityTest, SizeChangeRehashes) {
  WeightHashStats st;
  const std::string a = identity(&st);
  write(model_ / "model.safetensors", std::string(4097, 'a'));
  EXPECT_NE(identity(&st), a);
  EXPECT_EQ(st.hashed_files, 1);
}

TEST_F(WeightIdentityTest, MtimeChangeRehashesToTheSameIdentity) {
  WeightHashStats st;
  const std::string a = identity(&st);
  auto s0 = stat_file((model_ / "model.safetensors").string());
  ASSERT_TRUE(s0.ok());
  set_mtime(model_ / "model.safetensors", s0->mtime_ns - 5000000000);
  EXPECT_EQ(identity(&st), a);  // same bytes
  EXPECT_EQ(st.hashed_files, 1);
  EXPECT_EQ(identity(&st), a);
  EXPECT_EQ(st.hashed_files, 0);
}

// cp -p over the weights: size and mtime as before, inode kept (cp truncates and writes), only
// ctime tells.
TEST_F(WeightIdentityTest, CpPreservingTimesOverTheWeightsRehashes) {
  WeightHashStats st;
  const fs::path w = model_ / "model.safetensors";
  const std::string a = identity(&st);
  auto before = stat_file(w.string());
  ASSERT_TRUE(before.ok());
  const fs::path other = root_ / "other.safetensors";
  write(other, std::string(4096, 'c'));
  set_mtime(other, before->mtime_ns);
  next_tick();
  ASSERT_EQ(std::system(("cp -p '" + other.string() + "' '" + w.string() + "'").c_str()), 0);
  auto after = stat_file(w.string());
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size, before->size);
  ASSERT_EQ(after->mtime_ns, before->mtime_ns);
  ASSERT_NE(after->ctime_ns, before->ctime_ns);
  const std::string b = identity(&st);
  EXPECT_NE(b, a);
  EXPECT_EQ(st.hashed_files, 1);
}

TEST_F(WeightIdentityTest, RenameOverTheWeightsRehashes) {
  WeightHashStats st;
  const fs::path w = model_ / "model.safetensors";
  const std::string a = identity(&st);
  auto before = stat_file(w.string());
  ASSERT_TRUE(before.ok());
  const fs::path other = model_ / "incoming.tmp";
  write(other, std::string(4096, 'd'));
  set_mtime(other, before->mtime_ns);
  fs::rename(other, w);
  auto after = stat_file(w.string());
  ASSERT_TRUE(after.ok());
  ASSERT_NE(after->inode, before->inode);
  EXPECT_NE(identity(&st), a);
  EXPECT_EQ(st.hashed_files, 1);
}

// Each stamp field on its own: a cache entry that matches in every field but one is not used.
// The entries carry a made-up hash, so an entry that is used shows in the identity.
TEST_F(WeightIdentityTest, EveryStampFieldKeysTheCache) {
  WeightHashStats st;
  const std::string real = identity(&st);
  const std::string weights = fs::absolute(model_ / "model.safetensors").lexically_normal().string();
  const std::string config = fs::absolute(model_ / "config.json").lexically_normal().string();
  auto ws = stat_file(weights);
  auto cs = stat_file(config);
  ASSERT_TRUE(ws.ok() && cs.ok());
  auto config_hash = hash_file_content(config);
  ASSERT_TRUE(config_hash.ok());
  const std::string fake(32, 'f');
  auto write_cache = [&](const FileStamp& stamp, bool damage) {
    std::string line = weight_hash_cache_line(weights, stamp, fake);
    if (damage) line[0] = 'e';
    write(cache_ / kWeightHashCacheFile, std::string(kWeightHashCacheHeader) + "\n" +
                                             weight_hash_cache_line(config, *cs, *config_hash) + "\n" + line + "\n");
  };
  // Every field right: the cache is believed (the made-up hash changes the identity).
  write_cache(*ws, false);
  const std::string believed = identity(&st);
  EXPECT_NE(believed, real);
  EXPECT_EQ(st.cached_files, 2);
  const auto variants = std::vector<std::pair<const char*, void (*)(FileStamp&)>>{
      {"size", [](FileStamp& s) { s.size += 1; }},
      {"mtime", [](FileStamp& s) { s.mtime_ns += 1; }},
      {"ctime", [](FileStamp& s) { s.ctime_ns += 1; }},
      {"dev", [](FileStamp& s) { s.dev += 1; }},
      {"inode", [](FileStamp& s) { s.inode += 1; }},
  };
  for (const auto& [name, change] : variants) {
    FileStamp s = *ws;
    change(s);
    write_cache(s, false);
    EXPECT_EQ(identity(&st), real) << name;
    EXPECT_EQ(st.hashed_files, 1) << name;
  }
  // A damaged line is dropped, not believed.
  write_cache(*ws, true);
  EXPECT_EQ(identity(&st), real);
  EXPECT_EQ(st.hashed_files, 1);
  // A cache file of another format is ignored.
  write(cache_ / kWeightHashCacheFile, "something else\n" + weight_hash_cache_line(weights, *ws, fake) + "\n");
  EXPECT_EQ(identity(&st), real);
  EXPECT_EQ(st.hashed_files, 2);
}

TEST_F(WeightIdentityTest, ShardedCheckpointHashesTheIndexAndEveryShard) {
  fs::remove(model_ / "model.safetensors");
  write(model_ / "model.safetensors.index.json",
        R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  write(model_ / "model-00001-of-00002.safetensors", std::string(100, '1'));
  write(model_ / "model-00002-of-00002.safetensors", std::string(100, '2'));
  write(model_ / "unrelated.safetensors", std::string(100, 'u'));  // not named by the index
  auto files = weight_files(model_.string());
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 4u);
  EXPECT_EQ(fs::path((*files)[1]).filename(), "model.safetensors.index.json");
  WeightHashStats st;
  const std::string a = identity(&st);
  EXPECT_EQ(st.hashed_files, 4);
  write(model_ / "unrelated.safetensors", std::string(100, 'v'));
  EXPECT_EQ(identity(&st), a);
  next_tick();
  write(model_ / "model-00002-of-00002.safetensors", std::string(100, '3'));
  EXPECT_NE(identity(&st), a);
  EXPECT_EQ(st.hashed_files, 1);
}

TEST_F(WeightIdentityTest, MissingWeightsNameTheDirectory) {
  fs::remove(model_ / "model.safetensors");
  auto id = weight_identity(model_.string(), cache_.string());
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.error().message.find(model_.string()), std::string::npos) << id.error().message;
}

}  // namespace
}  // namespace strata
