// CheckpointStore and the checkpoint file format: round trip, atomic files, checksums and
// quarantine, the key covering every output-determining field, and the write/delete orderings
// (a retired run cannot write again; a deletion never removes a newer write of another run);
// a checkpoint carries the state identity it was written under, and a store of another
// identity skips it (counted) instead of resuming it; the calls the engine's thread makes
// never wait for a write's I/O.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "engine/checkpoint.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("strata_ckpt_unit_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

Checkpoint sample(const std::string& key, uint64_t run, int32_t n) {
  Checkpoint c;
  c.key = key;
  c.run = run;
  for (int32_t i = 0; i < n; ++i) c.generated.push_back(100 + i);
  c.generation = n;
  c.sampler = std::string("sampler-state-") + std::to_string(n);
  return c;
}

TEST(EngineCheckpointFormat, RoundTripsAndRejectsDamage) {
  Checkpoint c = sample("k", 42, 8);
  c.identity = "model=a;weights=1234";
  const std::string bytes = encode_checkpoint(c);
  auto d = decode_checkpoint(bytes);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d->key, c.key);
  EXPECT_EQ(d->identity, c.identity);
  EXPECT_EQ(d->run, c.run);
  EXPECT_EQ(d->generation, c.generation);
  EXPECT_EQ(d->generated, c.generated);
  EXPECT_EQ(d->sampler, c.sampler);
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string bad = bytes;
    bad[i] = char(bad[i] ^ 0x01);
    EXPECT_FALSE(decode_checkpoint(bad).ok()) << "flipped byte " << i;
  }
  EXPECT_FALSE(decode_checkpoint(bytes.substr(0, bytes.size() - 1)).ok());
  EXPECT_FALSE(decode_checkpoint("").ok());
}

TEST(EngineCheckpointKey, CoversEveryOutputField) {
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.sampling.temperature = 0.7f;
  r.sampling.seed = 5;
  r.sampling.has_seed = true;
  const std::vector<int32_t> eos = {2};
  const std::string base = checkpoint_key(r, eos, false);
  EXPECT_EQ(base, checkpoint_key(r, eos, false));
  auto differs = [&](GenerationRequest x, bool drawn = false) { return checkpoint_key(x, eos, drawn) != base; };
  EXPECT_TRUE(differs(r, true));
  { auto x = r; x.prompt.push_back(4); EXPECT_TRUE(differs(x)); }
  { auto x = r; x.sampling.seed = 6; EXPECT_TRUE(differs(x)); }
  { auto x = r; x.sampling.temperature = 0.8f; EXPECT_TRUE(differs(x)); }
  { auto x = r; x.sampling.top_p = 0.5f; EXPECT_TRUE(differs(x)); }
  { auto x = r; x.sampling.top_k = 3; EXPECT_TRUE(differs(x)); }
  { auto x = r; x.sampling.logit_bias = {{7, 1.0f}}; EXPECT_TRUE(differs(x)); }
  { auto x = r; x.max_tokens = 17; EXPECT_TRUE(differs(x)); }
  { auto x = r; x.stop_ids = {9}; EXPECT_TRUE(differs(x)); }
  { auto x = r; x.ignore_eos = true; EXPECT_TRUE(differs(x)); }
  EXPECT_NE(checkpoint_key(r, {3}, false), base);
  // A drawn seed is not part of the key: the identical unseeded request finds it.
  { auto x = r; x.sampling.seed = 77; EXPECT_EQ(checkpoint_key(x, eos, true), checkpoint_key(r, eos, true)); }
}

TEST(EngineCheckpointStore, WritesLoadsAndQuarantines) {
  const fs::path dir = fresh_dir("store");
  auto store = CheckpointStore::open(dir.string(), "ns");
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  CheckpointStore& s = **store;
  EXPECT_FALSE(s.load("a").has_value());
  const uint64_t run = s.new_run();
  EXPECT_NE(run, s.new_run());
  auto w = s.write(sample("a", run, 8));
  ASSERT_TRUE(w.ok() && *w);
  auto got = s.load("a");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->generated.size(), 8u);
  EXPECT_FALSE(s.load("b").has_value());
  // No temporary file is left behind.
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().extension(), ".tmp") << e.path();

  const fs::path p = s.path_of("a");
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  EXPECT_FALSE(s.load("a").has_value());
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::exists(dir / "quarantine" / p.filename()));
  fs::remove_all(dir);
}

TEST(EngineCheckpointStore, DeletionAndLateWritesOrder) {
  const fs::path dir = fresh_dir("order");
  auto store = CheckpointStore::open(dir.string(), "ns");
  ASSERT_TRUE(store.ok());
  CheckpointStore& s = **store;
  const uint64_t a = s.new_run(), b = s.new_run();
  ASSERT_TRUE(*s.write(sample("k", a, 8)));
  s.remove("k", a, 20);  // run a finished
  EXPECT_FALSE(s.load("k").has_value());
  // A late write of the finished run does not resurrect it.
  auto late = s.write(sample("k", a, 16));
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(*late);
  EXPECT_FALSE(s.load("k").has_value());

  // Run b's newer write is not deleted by a deletion of an older generation of another run.
  const uint64_t c = s.new_run();
  ASSERT_TRUE(*s.write(sample("k", b, 24)));
  s.remove("k", c, 16);
  ASSERT_TRUE(s.load("k").has_value());
  EXPECT_EQ(s.load("k")->run, b);
  // A run that finished past it deletes it (it resumed from it, or got further).
  s.remove("k", c, 24);
  EXPECT_FALSE(s.load("k").has_value());
  fs::remove_all(dir);
}

TEST(EngineCheckpointStore, AnotherIdentitysCheckpointIsSkippedAndCounted) {
  const fs::path dir = fresh_dir("identity");
  auto old_store = CheckpointStore::open(dir.string(), "weights=old");
  ASSERT_TRUE(old_store.ok());
  const uint64_t run = (*old_store)->new_run();
  Checkpoint c = sample("k", run, 8);
  c.identity = "weights=new";  // the store writes its own identity, whatever the caller says
  ASSERT_TRUE(*(*old_store)->write(c));
  ASSERT_TRUE((*old_store)->load("k").has_value());
  EXPECT_EQ((*old_store)->load("k")->identity, "weights=old");
  EXPECT_EQ((*old_store)->foreign_skipped(), 0);

  // Other weights over the same directory: the same request's file is found and refused.
  auto store = CheckpointStore::open(dir.string(), "weights=new");
  ASSERT_TRUE(store.ok());
  CheckpointStore& s = **store;
  const fs::path p = s.path_of("k");
  EXPECT_FALSE(s.load("k").has_value());
  EXPECT_EQ(s.foreign_skipped(), 1);
  EXPECT_TRUE(fs::exists(p));  // skipped, not quarantined: it is not damaged
  EXPECT_FALSE(fs::exists(dir / "quarantine" / p.filename()));
  // This identity's own write replaces it and loads.
  const uint64_t mine = s.new_run();
  ASSERT_TRUE(*s.write(sample("k", mine, 16)));
  ASSERT_TRUE(s.load("k").has_value());
  EXPECT_EQ(s.load("k")->generation, 16);
  EXPECT_EQ(s.foreign_skipped(), 1);
  // Now the old identity refuses it.
  EXPECT_FALSE((*old_store)->load("k").has_value());
  EXPECT_EQ((*old_store)->foreign_skipped(), 1);

  // A finished request of this identity removes a foreign file even of a later generation.
  auto stale = CheckpointStore::open(dir.string(), "weights=old");
  ASSERT_TRUE(*(*stale)->write(sample("k", (*stale)->new_run(), 400)));
  s.remove("k", s.new_run(), 8);
  EXPECT_FALSE(fs::exists(p));
  fs::remove_all(dir);
}

TEST(EngineCheckpointStore, OpenNamesTheDirectory) {
  const fs::path file = fresh_dir("notadir");
  { std::ofstream(file) << "x"; }
  auto store = CheckpointStore::open(file.string(), "ns");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.error().message.find(file.string()), std::string::npos);
  fs::remove(file);
}

// A write whose I/O does not finish (its temp file a FIFO nobody reads yet: open() waits) holds
// up none of the calls the engine's thread makes on every step or admission: the foreign count
// (read when stats are published), retiring a run, a new run id, loading another key.
TEST(EngineCheckpointStore, EngineThreadCallsDoNotWaitForAWriteInProgress) {
  const fs::path dir = fresh_dir("stuck_write");
  auto store = CheckpointStore::open(dir.string(), "id");
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  CheckpointStore& st = **store;
  ASSERT_TRUE(st.write(sample("other", st.new_run(), 4)).ok());
  const fs::path fifo = st.path_of("stuck").string() + ".tmp";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << fifo;
  std::thread writer([&] { (void)st.write(sample("stuck", st.new_run(), 4)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the writer waits in open()
  auto calls = std::async(std::launch::async, [&] {
    (void)st.foreign_skipped();
    st.retire(12345);
    (void)st.new_run();
    return st.load("other").has_value();
  });
  const bool quick = calls.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  // Let the writer go: read its bytes (its fsync on a FIFO fails; the write reports an error).
  const int fd = ::open(fifo.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[4096];
  while (::read(fd, buf, sizeof(buf)) > 0) {
  }
  ::close(fd);
  writer.join();
  EXPECT_TRUE(quick) << "a call waited for the stuck write";
  EXPECT_TRUE(calls.get()) << "the other key's checkpoint loads";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
