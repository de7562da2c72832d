// The host and disk KV tiers: the disk format round-trips and survives a reopen (index rebuilt
// from the directory); a checksum mismatch, a truncated file, a foreign model identity and a
// wrong format version each get the file quarantined (moved to quarantine/), not loaded, no
// crash; the byte budget deletes the least recently used files; the writer queue drops and
// counts when full; the host tier keeps its byte budget LRU; session pins keep blocks in both
// tiers past LRU eviction until they expire.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <thread>
#include <unistd.h>

#include "kv/disk/disk_tier.h"
#include "kv/host/host_tier.h"
#include "kv/host/kv_tiers.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("strata_kv_tier_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

DiskTierOptions options(const fs::path& dir, const std::string& identity = "model=a;codec=f32") {
  DiskTierOptions o;
  o.dir = dir;
  o.identity = identity;
  o.tensor_bytes = {64, 64, 32, 32};  // K, V of two layers
  o.max_bytes = int64_t(1) << 30;
  return o;
}

std::vector<uint8_t> block(uint64_t seed, int64_t n) {
  std::mt19937_64 r(seed);
  std::vector<uint8_t> b(static_cast<size_t>(n));
  for (auto& x : b) x = uint8_t(r());
  return b;
}

std::unique_ptr<DiskTier> open_ok(DiskTierOptions o) {
  auto t = DiskTier::open(std::move(o));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
  return t.ok() ? std::move(t).value() : nullptr;
}

// Writes blocks with hashes first..first+n-1 as one file and waits for it.
void write_blocks(DiskTier& t, uint64_t first, int n) {
  for (int i = 0; i < n; ++i) ASSERT_TRUE(t.enqueue(first + uint64_t(i), block(first + uint64_t(i), t.block_bytes()).data()));
  ASSERT_TRUE(t.flush(10.0));
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> v;
  if (!fs::exists(dir)) return v;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) v.push_back(e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

TEST(KvDiskTier, RoundTripsAndRebuildsItsIndexOnReopen) {
  const fs::path dir = fresh_dir("roundtrip");
  {
    auto t = open_ok(options(dir));
    ASSERT_TRUE(t);
    EXPECT_EQ(t->block_bytes(), 192);
    write_blocks(*t, 100, 5);
    std::vector<uint8_t> out(192);
    for (uint64_t h = 100; h < 105; ++h) {
      ASSERT_TRUE(t->contains(h));
      ASSERT_TRUE(t->read(h, out.data()));
      EXPECT_EQ(out, block(h, 192)) << h;
    }
    EXPECT_FALSE(t->contains(99));
    EXPECT_FALSE(t->read(99, out.data()));
    EXPECT_EQ(t->stats().written_blocks, 5);
  }
  const size_t n_files = files_in(dir).size();  // groups of what was queued at once
  EXPECT_GE(n_files, 1u);
  for (const auto& f : files_in(dir)) EXPECT_EQ(f.extension(), ".kvb") << "no temporary left";
  auto t = open_ok(options(dir));  // a restart
  ASSERT_TRUE(t);
  EXPECT_EQ(t->stats().blocks, 5);
  std::vector<uint8_t> out(192);
  for (uint64_t h = 100; h < 105; ++h) {
    ASSERT_TRUE(t->read(h, out.data()));
    EXPECT_EQ(out, block(h, 192));
  }
  // New files continue after the old ones and both stay readable.
  write_blocks(*t, 200, 2);
  EXPECT_GT(files_in(dir).size(), n_files);
  ASSERT_TRUE(t->read(201, out.data()));
  EXPECT_EQ(out, block(201, 192));
  fs::remove_all(dir);
}

// Flips / cuts / rewrites bytes of the only file (one block) of a fresh directory, then reopens.
void expect_quarantined(const std::string& name, const std::function<void(const fs::path&)>& damage,
                        bool at_open, const std::string& identity = "model=a;codec=f32") {
  const fs::path dir = fresh_dir(name);
  {
    auto t = open_ok(options(dir));
    ASSERT_TRUE(t);
    write_blocks(*t, 10, 1);
  }
  auto files = files_in(dir);
  ASSERT_EQ(files.size(), 1u);
  damage(files[0]);
  auto t = open_ok(options(dir, identity));
  ASSERT_TRUE(t);
  std::vector<uint8_t> out(192);
  if (at_open) {
    EXPECT_FALSE(t->contains(10)) << name;
  } else {
    EXPECT_TRUE(t->contains(10)) << name;  // the header is sound: listed until read
    EXPECT_FALSE(t->read(10, out.data())) << name;
    EXPECT_FALSE(t->contains(10)) << name;
  }
  EXPECT_EQ(t->stats().quarantined_files, 1) << name;
  EXPECT_TRUE(files_in(dir).empty()) << name;
  EXPECT_EQ(files_in(dir / "quarantine").size(), 1u) << name;
  // The tier still works after it.
  write_blocks(*t, 50, 1);
  ASSERT_TRUE(t->read(50, out.data()));
  EXPECT_EQ(out, block(50, 192));
  fs::remove_all(dir);
}

void patch(const fs::path& p, int64_t offset_from_end, uint8_t xor_with) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const int64_t pos = int64_t(f.tellg()) - offset_from_end;
  f.seekg(pos);
  char c;
  f.get(c);
  f.seekp(pos);
  f.put(char(uint8_t(c) ^ xor_with));
}

TEST(KvDiskTier, ChecksumMismatchQuarantinesAtRead) {
  // A byte inside the second tensor's data (tensors of 64, 64, 32, 32 bytes, each + 8 of checksum).
  expect_quarantined("checksum", [](const fs::path& p) { patch(p, 100, 0x5a); }, false);
}

TEST(KvDiskTier, TruncatedFileQuarantinedAtOpen) {
  expect_quarantined("truncated", [](const fs::path& p) { fs::resize_file(p, fs::file_size(p) - 17); }, true);
}

TEST(KvDiskTier, ForeignModelIdentityQuarantinedAtOpen) {
  expect_quarantined("foreign", [](const fs::path&) {}, true, "model=b;codec=f32");
}

TEST(KvDiskTier, WrongFormatVersionQuarantinedAtOpen) {
  expect_quarantined("version", [](const fs::path& p) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const uint32_t v = DiskTier::kFormatVersion + 1;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }, true);
}

TEST(KvDiskTier, GarbageFileQuarantinedAtOpen) {
  expect_quarantined("garbage", [](const fs::path& p) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << "not a block file";
  }, true);
}

TEST(KvDiskTier, BudgetEvictsOldestFiles) {
  // One block per write, so one file per write (the writer groups only what is queued at once).
  const fs::path dir = fresh_dir("budget");
  auto o = options(dir);
  auto probe = open_ok(o);
  ASSERT_TRUE(probe);
  write_blocks(*probe, 1, 1);
  const int64_t file_bytes = probe->stats().bytes;
  probe.reset();
  fs::remove_all(dir);
  o.max_bytes = 2 * file_bytes + file_bytes / 2;  // two files fit, three do not
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  write_blocks(*t, 10, 1);
  write_blocks(*t, 20, 1);
  EXPECT_TRUE(t->contains(10));
  write_blocks(*t, 30, 1);
  EXPECT_FALSE(t->contains(10));
  EXPECT_TRUE(t->contains(20));
  EXPECT_TRUE(t->contains(30));
  EXPECT_EQ(t->stats().evicted_files, 1);
  EXPECT_EQ(files_in(dir).size(), 2u);
  EXPECT_LE(t->stats().bytes, o.max_bytes);
  // The budget also holds at reopen with a smaller one: the oldest go.
  t.reset();
  o.max_bytes = file_bytes;
  t = open_ok(o);
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->contains(20));
  EXPECT_TRUE(t->contains(30));
  EXPECT_EQ(files_in(dir).size(), 1u);
  fs::remove_all(dir);
}

TEST(KvDiskTier, BudgetEvictsLeastRecentlyUsedFiles) {
  const fs::path dir = fresh_dir("budget_lru");
  auto o = options(dir);
  auto probe = open_ok(o);
  ASSERT_TRUE(probe);
  write_blocks(*probe, 1, 1);
  const int64_t file_bytes = probe->stats().bytes;
  probe.reset();
  fs::remove_all(dir);
  o.max_bytes = 2 * file_bytes + file_bytes / 2;  // two files fit, three do not
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  write_blocks(*t, 10, 1);
  write_blocks(*t, 20, 1);
  std::vector<uint8_t> out(static_cast<size_t>(t->block_bytes()));
  ASSERT_TRUE(t->read(10, out.data()));  // 10 is now the most recently used: 20 goes first
  write_blocks(*t, 30, 1);
  EXPECT_TRUE(t->contains(10));
  EXPECT_FALSE(t->contains(20));
  EXPECT_TRUE(t->contains(30));
  // A repeated demotion of a block on disk uses its file too: 10 again, so 30 goes.
  ASSERT_TRUE(t->enqueue(10, block(10, t->block_bytes()).data()));
  write_blocks(*t, 40, 1);
  EXPECT_TRUE(t->contains(10));
  EXPECT_FALSE(t->contains(30));
  EXPECT_TRUE(t->contains(40));
  EXPECT_EQ(t->stats().evicted_files, 2);
  EXPECT_EQ(files_in(dir).size(), 2u);
  fs::remove_all(dir);
}

TEST(KvDiskTier, SessionPinKeepsFilesPastTheBudgetUntilItExpires) {
  const fs::path dir = fresh_dir("pin");
  auto o = options(dir);
  auto probe = open_ok(o);
  ASSERT_TRUE(probe);
  write_blocks(*probe, 1, 1);
  const int64_t file_bytes = probe->stats().bytes;
  probe.reset();
  fs::remove_all(dir);
  o.max_bytes = 2 * file_bytes + file_bytes / 2;
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  const double now = tier_clock_s();
  t->pin(10, now + 600.0);  // before the block is written: the pin waits for it
  write_blocks(*t, 10, 1);
  t->pin(20, now + 3.0);
  write_blocks(*t, 20, 1);
  write_blocks(*t, 30, 1);  // over budget: 10 and 20 are pinned, so the unpinned newcomer goes
  EXPECT_TRUE(t->contains(10));
  EXPECT_TRUE(t->contains(20));
  EXPECT_FALSE(t->contains(30));
  std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(now + 3.1))));  // 20's pin expires
  write_blocks(*t, 40, 1);
  EXPECT_TRUE(t->contains(10));  // least recently used, but pinned
  EXPECT_FALSE(t->contains(20));
  EXPECT_TRUE(t->contains(40));
  EXPECT_EQ(t->stats().pinned_evicted_files, 0);
  // Only pinned files left over the budget: the budget still holds, least recently used first.
  t->pin(40, now + 600.0);
  t->pin(50, now + 600.0);
  write_blocks(*t, 50, 1);
  EXPECT_FALSE(t->contains(10));
  EXPECT_TRUE(t->contains(40));
  EXPECT_TRUE(t->contains(50));
  EXPECT_EQ(t->stats().pinned_evicted_files, 1);
  EXPECT_LE(t->stats().bytes, o.max_bytes);
  fs::remove_all(dir);
}

TEST(KvDiskTier, SessionPinsSurviveARestart) {
  const fs::path dir = fresh_dir("pin_restart");
  auto o = options(dir);
  auto probe = open_ok(o);
  ASSERT_TRUE(probe);
  write_blocks(*probe, 1, 1);
  const int64_t file_bytes = probe->stats().bytes;
  probe.reset();
  fs::remove_all(dir);
  o.max_bytes = 2 * file_bytes + file_bytes / 2;
  {
    auto t = open_ok(o);
    ASSERT_TRUE(t);
    t->pin(10, tier_clock_s() + 600.0);
    t->pin(20, tier_clock_s() - 1.0);  // already expired: not kept
    write_blocks(*t, 10, 1);
    write_blocks(*t, 20, 1);
  }  // the process ends
  ASSERT_TRUE(fs::exists(dir / "session_pins.bin"));
  {
    // 10 is the least recently used file, but its pin came back from disk: the unpinned 20 goes.
    auto t = open_ok(o);
    ASSERT_TRUE(t);
    write_blocks(*t, 30, 1);
    EXPECT_TRUE(t->contains(10));
    EXPECT_FALSE(t->contains(20));
    EXPECT_TRUE(t->contains(30));
    EXPECT_EQ(t->stats().quarantined_files, 0);
  }
  // A damaged pins file is quarantined at open; the blocks stay and the pins are gone.
  {
    std::fstream io(dir / "session_pins.bin", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(17);
    io.put(char(0x5a));
  }
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->stats().quarantined_files, 1);
  EXPECT_TRUE(t->contains(10));
  write_blocks(*t, 40, 1);  // over budget: 10, no longer pinned and least recently used, goes
  EXPECT_FALSE(t->contains(10));
  EXPECT_TRUE(t->contains(40));
  fs::remove_all(dir);
}

TEST(KvDiskTier, PrefetchedBlocksReadBackExactly) {
  const fs::path dir = fresh_dir("prefetch");
  auto t = open_ok(options(dir));
  ASSERT_TRUE(t);
  write_blocks(*t, 1, 8);
  write_blocks(*t, 100, 4);
  const std::vector<uint64_t> want = {3, 101, 999, 1, 8};  // two files and a miss
  t->prefetch(want);
  std::vector<uint8_t> out(static_cast<size_t>(t->block_bytes()));
  for (uint64_t h : want) {
    if (h == 999) {
      EXPECT_FALSE(t->read(h, out.data()));
      continue;
    }
    ASSERT_TRUE(t->read(h, out.data())) << h;
    EXPECT_EQ(out, block(h, t->block_bytes())) << h;
  }
  EXPECT_EQ(t->stats().quarantined_files, 0);
  fs::remove_all(dir);
}

TEST(KvDiskTier, ReadManyOfLargeRangesReadsBackExactly) {
  // 1 MiB+ blocks: read_many takes the O_DIRECT path (aligned, the file's end inside the last
  // aligned block), and a damaged block fails alone.
  const fs::path dir = fresh_dir("read_many");
  auto o = options(dir);
  o.tensor_bytes = {(1 << 19) + 24, 1 << 19};
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  for (uint64_t h = 1; h <= 4; ++h) write_blocks(*t, h, 1);  // a file each
  std::vector<uint64_t> want = {3, 1, 4, 77, 2};
  std::vector<std::vector<uint8_t>> out(want.size(), std::vector<uint8_t>(size_t(t->block_bytes())));
  std::vector<uint8_t*> ptrs;
  for (auto& b : out) ptrs.push_back(b.data());
  std::vector<uint8_t> ok;
  t->read_many(want, ptrs, ok);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(ok[i] != 0, want[i] != 77) << want[i];
    if (ok[i]) EXPECT_EQ(out[i], block(want[i], t->block_bytes())) << want[i];
  }
  // Flip a byte of block 2's data: it fails, the blocks around it still read, its file is
  // quarantined.
  const auto files = files_in(dir);
  ASSERT_EQ(files.size(), 4u);
  const int64_t stride = t->block_bytes() + 16;
  const int64_t pos = int64_t(fs::file_size(files[1])) - stride + 100;
  {
    std::fstream io(files[1], std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(pos);
    char c;
    io.get(c);
    io.seekp(pos);
    io.put(char(c ^ 0x5a));
  }
  want = {1, 2, 3};
  t->read_many(want, std::span<uint8_t* const>(ptrs).first(3), ok);
  EXPECT_TRUE(ok[0] && !ok[1] && ok[2]);
  EXPECT_EQ(out[0], block(1, t->block_bytes()));
  EXPECT_EQ(t->stats().quarantined_files, 1);
  EXPECT_FALSE(t->contains(2));
  EXPECT_TRUE(t->contains(3));
  fs::remove_all(dir);
}

TEST(KvDiskTier, ReadManySkipsUnwantedBlocksBetweenWantedOnes) {
  // One file of 12 blocks; the wanted ones sit in three runs with gaps of two and three blocks
  // between them (a file written while other sequences were evicted): every wanted block reads
  // back exactly, and the bytes read from the file are those of the runs, not the whole span.
  const fs::path dir = fresh_dir("read_runs");
  auto o = options(dir);
  o.tensor_bytes = {4096, 4096};
  o.max_group_blocks = 12;
  o.group_wait_s = 5.0;  // the group fills well within it even on a loaded machine
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  std::vector<std::vector<uint8_t>> blocks;
  for (uint64_t h = 100; h < 112; ++h) blocks.push_back(block(h, t->block_bytes()));
  for (uint64_t h = 100; h < 112; ++h) ASSERT_TRUE(t->enqueue(h, blocks[h - 100].data()));
  ASSERT_TRUE(t->flush(10.0));
  ASSERT_EQ(files_in(dir).size(), 1u) << "the writer split the group";
  std::vector<uint64_t> want = {111, 100, 104, 105, 106, 110, 101};  // runs 100-101, 104-106, 110-111
  std::vector<std::vector<uint8_t>> out(want.size(), std::vector<uint8_t>(size_t(t->block_bytes())));
  std::vector<uint8_t*> ptrs;
  for (auto& b : out) ptrs.push_back(b.data());
  std::vector<uint8_t> ok;
  const int64_t before = t->stats().read_file_bytes;
  t->read_many(want, ptrs, ok);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(ok[i]) << want[i];
    EXPECT_EQ(out[i], block(want[i], t->block_bytes())) << want[i];
  }
  const int64_t stride = t->block_bytes() + 16, read = t->stats().read_file_bytes - before;
  EXPECT_EQ(read, 7 * stride) << "the gaps between the runs were read";
  EXPECT_EQ(t->stats().read_blocks, 7);
  fs::remove_all(dir);
}

TEST(KvDiskTier, ReadManyOfALongRunReadsItInPiecesExactly) {
  // One file of 40 blocks of 1 MiB: read_many cuts the run into 16 MiB pieces read several at
  // a time (O_DIRECT); every block, asked for in a shuffled order, reads back exactly, and the
  // bytes read are the run's (each piece widened at most to 4 KiB alignment at both ends).
  const fs::path dir = fresh_dir("read_pieces");
  auto o = options(dir);
  o.tensor_bytes = {(1 << 19) + 24, 1 << 19};
  o.max_group_blocks = 40;
  o.group_wait_s = 5.0;  // 40 MiB are queued well within it even on a loaded machine
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  std::vector<std::vector<uint8_t>> blocks;
  for (uint64_t h = 200; h < 240; ++h) blocks.push_back(block(h, t->block_bytes()));
  for (uint64_t h = 200; h < 240; ++h) ASSERT_TRUE(t->enqueue(h, blocks[h - 200].data()));
  ASSERT_TRUE(t->flush(30.0));
  ASSERT_EQ(files_in(dir).size(), 1u) << "the writer split the group";
  std::vector<uint64_t> want;
  for (uint64_t h = 200; h < 240; ++h) want.push_back(h);
  std::shuffle(want.begin(), want.end(), std::mt19937(5));
  std::vector<std::vector<uint8_t>> out(want.size(), std::vector<uint8_t>(size_t(t->block_bytes())));
  std::vector<uint8_t*> ptrs;
  for (auto& b : out) ptrs.push_back(b.data());
  std::vector<uint8_t> ok;
  t->read_many(want, ptrs, ok);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(ok[i]) << want[i];
    EXPECT_EQ(out[i], blocks[want[i] - 200]) << want[i];
  }
  const int64_t stride = t->block_bytes() + 16, read = t->stats().read_file_bytes;
  EXPECT_GE(read, 40 * stride);
  EXPECT_LE(read, 40 * stride + 3 * 8192);
  fs::remove_all(dir);
}

TEST(KvDiskTier, FullQueueDropsAndCounts) {
  const fs::path dir = fresh_dir("queue");
  auto o = options(dir);
  o.queue_bytes = 192 * 3;  // three blocks
  auto t = open_ok(o);
  ASSERT_TRUE(t);
  // Enqueue many blocks faster than files are written; whatever does not fit is dropped.
  int accepted = 0, dropped = 0;
  for (uint64_t h = 1; h <= 2000; ++h) {
    if (t->enqueue(h, block(h, 192).data())) ++accepted; else ++dropped;
  }
  ASSERT_TRUE(t->flush(30.0));
  const auto s = t->stats();
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(s.dropped_blocks, dropped);
  EXPECT_EQ(s.written_blocks, accepted);
  EXPECT_EQ(s.blocks, accepted);
  EXPECT_EQ(s.queued_bytes, 0);
  fs::remove_all(dir);
}

TEST(KvHostTier, KeepsItsByteBudgetLeastRecentlyUsedFirst) {
  HostTier h(300, 100);
  const auto a = block(1, 100), b = block(2, 100), c = block(3, 100), d = block(4, 100);
  h.put(1, a.data());
  h.put(2, b.data());
  h.put(3, c.data());
  ASSERT_NE(h.get(1), nullptr);  // 1 becomes most recent: 2 goes first
  h.put(4, d.data());
  EXPECT_TRUE(h.contains(1));
  EXPECT_FALSE(h.contains(2));
  EXPECT_TRUE(h.contains(4));
  EXPECT_EQ(h.bytes(), 300);
  EXPECT_EQ(std::vector<uint8_t>(h.get(4), h.get(4) + 100), d);
  EXPECT_EQ(h.evictions(), 1);
}

TEST(KvHostTier, SessionPinExemptsFromLruUntilItExpires) {
  HostTier h(300, 100);
  const auto a = block(1, 100), b = block(2, 100), c = block(3, 100);
  const double now = tier_clock_s();
  h.pin(1, now + 600.0);
  h.put(1, a.data());
  h.put(2, b.data());
  h.pin(3, now + 0.3);
  h.put(3, c.data());
  h.put(4, block(4, 100).data());  // 1 is least recent but pinned: 2 goes
  EXPECT_TRUE(h.contains(1));
  EXPECT_FALSE(h.contains(2));
  EXPECT_TRUE(h.contains(3));
  h.put(5, block(5, 100).data());  // 1 and 3 pinned: 4 goes
  EXPECT_TRUE(h.contains(1));
  EXPECT_TRUE(h.contains(3));
  EXPECT_FALSE(h.contains(4));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // 3's pin expires
  h.put(6, block(6, 100).data());
  EXPECT_TRUE(h.contains(1));
  EXPECT_FALSE(h.contains(3));
  EXPECT_TRUE(h.contains(5));
  EXPECT_TRUE(h.contains(6));
  EXPECT_EQ(std::vector<uint8_t>(h.get(1), h.get(1) + 100), a);
  EXPECT_EQ(h.pinned_evictions(), 0);
  // Everything pinned: an unpinned newcomer is not kept, a pinned one takes the LRU pinned place.
  h.pin(5, now + 600.0);
  h.pin(6, now + 600.0);
  h.put(7, block(7, 100).data());
  EXPECT_FALSE(h.contains(7));
  EXPECT_TRUE(h.contains(1) && h.contains(5) && h.contains(6));
  h.pin(8, now + 600.0);
  h.put(8, block(8, 100).data());
  EXPECT_TRUE(h.contains(8));
  EXPECT_FALSE(h.contains(5));  // 1 was read above, so 5 is the least recently used
  EXPECT_EQ(h.pinned_evictions(), 1);
  EXPECT_EQ(h.bytes(), 300);
}

TEST(KvTiers, PinReachesBothTiers) {
  const fs::path dir = fresh_dir("tiers_pin");
  auto o = options(dir);
  auto probe = open_ok(o);
  ASSERT_TRUE(probe);
  write_blocks(*probe, 1, 1);
  const int64_t file_bytes = probe->stats().bytes;
  probe.reset();
  fs::remove_all(dir);
  o.max_bytes = file_bytes + file_bytes / 2;  // one file fits
  auto disk = open_ok(o);
  ASSERT_TRUE(disk);
  KvTiers tiers(192, 192 * 2, std::move(disk));
  const uint64_t pinned[] = {1};
  tiers.pin(pinned, tier_clock_s() + 600.0);
  for (uint64_t h = 1; h <= 4; ++h) {
    tiers.demote(h, block(h, 192).data());
    ASSERT_TRUE(tiers.flush(10.0));
  }
  EXPECT_TRUE(tiers.contains_host(1));
  EXPECT_FALSE(tiers.contains_host(2));
  EXPECT_TRUE(tiers.disk()->contains(1));
  EXPECT_FALSE(tiers.disk()->contains(2));
  std::vector<uint8_t> out(192);
  ASSERT_TRUE(tiers.fetch(1, out.data()));
  EXPECT_EQ(out, block(1, 192));
  EXPECT_EQ(tiers.stats().pinned_blocks, 1);
  fs::remove_all(dir);
}

TEST(KvTiers, FetchManyServesHostAndDiskInOrderUpToTheFirstMiss) {
  const fs::path dir = fresh_dir("tiers_many");
  auto disk = open_ok(options(dir));
  ASSERT_TRUE(disk);
  KvTiers tiers(192, 192 * 2, std::move(disk));
  for (uint64_t h = 1; h <= 6; ++h) tiers.demote(h, block(h, 192).data());  // host keeps 5 and 6
  ASSERT_TRUE(tiers.flush(10.0));
  const std::vector<uint64_t> chain = {5, 1, 6, 3, 2, 42, 4};
  std::vector<uint8_t> out(chain.size() * 192);
  ASSERT_EQ(tiers.fetch_many(chain, out.data()), 5);  // 42 is nowhere: the chain ends there
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + long(i * 192), out.begin() + long((i + 1) * 192)), block(chain[i], 192))
        << chain[i];
  }
  const auto s = tiers.stats();
  EXPECT_EQ(s.host_hit_blocks, 2);
  EXPECT_EQ(s.disk_hit_blocks, 3);
  fs::remove_all(dir);
}

TEST(KvTiers, DiskHitAfterHostEvictionAndCounts) {
  const fs::path dir = fresh_dir("tiers");
  auto disk = open_ok(options(dir));
  ASSERT_TRUE(disk);
  KvTiers tiers(192, 192 * 2, std::move(disk));
  for (uint64_t h = 1; h <= 4; ++h) tiers.demote(h, block(h, 192).data());
  ASSERT_TRUE(tiers.flush(10.0));
  std::vector<uint8_t> out(192);
  ASSERT_TRUE(tiers.fetch(4, out.data()));  // host
  EXPECT_EQ(out, block(4, 192));
  ASSERT_TRUE(tiers.fetch(1, out.data()));  // evicted from host, on disk
  EXPECT_EQ(out, block(1, 192));
  EXPECT_FALSE(tiers.fetch(9, out.data()));
  const auto s = tiers.stats();
  EXPECT_EQ(s.host_hit_blocks, 1);
  EXPECT_EQ(s.disk_hit_blocks, 1);
  EXPECT_EQ(s.demoted_blocks, 4);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Copies made outside the tier: a reserved slot is invisible until committed and reusable after
// a cancel; a leased slot keeps its bytes when its block is evicted or replaced, and is reused
// only after the last release.
TEST(KvHostTier, ReservedAndLeasedSlotsKeepTheirBytes) {
  HostTier h(300, 100);
  const auto a = block(1, 100), b = block(2, 100), c = block(3, 100);
  uint8_t* s1 = h.reserve(1);
  ASSERT_NE(s1, nullptr);
  EXPECT_FALSE(h.contains(1));  // not visible before commit
  std::memcpy(s1, a.data(), 100);
  h.commit(1, s1);
  ASSERT_TRUE(h.contains(1));
  EXPECT_EQ(std::vector<uint8_t>(h.get(1), h.get(1) + 100), a);
  uint8_t* s2 = h.reserve(2);
  ASSERT_NE(s2, nullptr);
  h.cancel(s2);
  EXPECT_FALSE(h.contains(2));
  h.put(2, b.data());
  h.put(3, c.data());
  // 1 is leased, then evicted by two newcomers: its bytes stay until released.
  const uint8_t* l1 = h.lease(1);
  ASSERT_NE(l1, nullptr);
  EXPECT_EQ(h.leased_slots(), 1);
  h.put(4, block(4, 100).data());  // evicts 2 (1 was just used)
  EXPECT_TRUE(h.contains(1));
  EXPECT_FALSE(h.contains(2));
  // 1 replaced: the lease still reads the old bytes, whose slot is not free, so 3 goes.
  h.put(1, block(11, 100).data());
  EXPECT_EQ(std::vector<uint8_t>(l1, l1 + 100), a);
  EXPECT_EQ(std::vector<uint8_t>(h.get(1), h.get(1) + 100), block(11, 100));
  EXPECT_NE(h.get(1), l1);
  EXPECT_FALSE(h.contains(3));
  // While the old slot is leased only two of the three slots hold blocks.
  h.put(5, block(5, 100).data());
  EXPECT_EQ(h.n_blocks(), 2);
  EXPECT_FALSE(h.contains(4));
  EXPECT_EQ(std::vector<uint8_t>(l1, l1 + 100), a);
  h.release(l1);
  EXPECT_EQ(h.leased_slots(), 0);
  h.put(6, block(6, 100).data());  // the released slot takes it: nothing evicted
  EXPECT_EQ(h.n_blocks(), 3);
  EXPECT_TRUE(h.contains(1) && h.contains(5) && h.contains(6));
  EXPECT_EQ(std::vector<uint8_t>(h.get(6), h.get(6) + 100), block(6, 100));
  EXPECT_EQ(h.bytes(), 300);
}

// Direct demotion: blocks host memory holds are reported present and not copied again; reserved
// slots become visible on commit and reach the disk by reference with their bytes intact;
// fetch_batch leases host blocks in place, reads disk blocks into the buffer and stops before
// the disk block past its limit or at the first miss.
TEST(KvTiers, DirectDemotionSkipsPresentBlocksAndFetchBatchLeases) {
  const fs::path dir = fresh_dir("tiers_direct");
  auto disk = open_ok(options(dir));
  ASSERT_TRUE(disk);
  KvTiers tiers(192, 192 * 16, std::move(disk));
  tiers.demote(1, block(1, 192).data());
  const std::vector<uint64_t> hashes = {1, 2, 3};
  std::vector<uint8_t*> slots;
  std::vector<uint8_t> present;
  tiers.reserve_demotions(hashes, slots, present);
  EXPECT_EQ(present, (std::vector<uint8_t>{1, 0, 0}));
  ASSERT_EQ(slots[0], nullptr);
  ASSERT_NE(slots[1], nullptr);
  ASSERT_NE(slots[2], nullptr);
  EXPECT_FALSE(tiers.contains_host(2));
  std::memcpy(slots[1], block(2, 192).data(), 192);
  std::memcpy(slots[2], block(3, 192).data(), 192);
  tiers.commit_demotions(hashes, slots);
  EXPECT_TRUE(tiers.contains_host(2) && tiers.contains_host(3));
  ASSERT_TRUE(tiers.flush(10.0));
  auto s = tiers.stats();
  EXPECT_EQ(s.demoted_blocks, 4);  // 1 twice
  EXPECT_EQ(s.demote_copies_skipped, 1);
  EXPECT_EQ(s.disk.written_blocks, 3);
  std::vector<uint8_t> out(192);
  for (uint64_t h : hashes) {
    ASSERT_TRUE(tiers.disk()->read(h, out.data())) << h;
    EXPECT_EQ(out, block(h, 192)) << "disk copy of " << h << " (queued by reference)";
  }
  // A cancelled reservation leaves nothing behind.
  const uint64_t seven = 7;
  tiers.reserve_demotions(std::span<const uint64_t>(&seven, 1), slots, present);
  ASSERT_NE(slots[0], nullptr);
  tiers.cancel_demotions(slots);
  EXPECT_FALSE(tiers.contains(7));
  // Disk-only blocks 4, 5, 6 next to host blocks 1, 2, 3.
  for (uint64_t h = 4; h <= 6; ++h) ASSERT_TRUE(tiers.disk()->enqueue(h, block(h, 192).data()));
  ASSERT_TRUE(tiers.flush(10.0));
  const std::vector<uint64_t> chain = {2, 4, 1, 5, 3, 6, 42};
  std::vector<uint8_t> buf(2 * 192);
  std::vector<const uint8_t*> srcs;
  std::vector<uint8_t> leased;
  ASSERT_EQ(tiers.fetch_batch(chain, 2, buf.data(), srcs, leased), 5);  // stops before the third disk block (6)
  EXPECT_EQ(leased, (std::vector<uint8_t>{1, 0, 1, 0, 1}));
  EXPECT_EQ(srcs[1], buf.data());
  EXPECT_EQ(srcs[3], buf.data() + 192);
  for (size_t i = 0; i < srcs.size(); ++i) {
    EXPECT_EQ(std::vector<uint8_t>(srcs[i], srcs[i] + 192), block(chain[i], 192)) << chain[i];
  }
  tiers.release(std::vector<const uint8_t*>{srcs[0], srcs[2], srcs[4]});
  ASSERT_EQ(tiers.fetch_batch(std::span<const uint64_t>(chain).subspan(5), 2, buf.data(), srcs, leased), 1);  // 42: miss
  EXPECT_EQ(std::vector<uint8_t>(srcs[0], srcs[0] + 192), block(6, 192));
  s = tiers.stats();
  EXPECT_EQ(s.host_hit_blocks, 3);
  EXPECT_EQ(s.disk_hit_blocks, 3);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
