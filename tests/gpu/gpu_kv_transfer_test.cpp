// Batched KV block moves (backend/cuda/kv_transfer.h through CudaExecutor::read_blocks /
// write_blocks) against the one-block-at-a-time path: random bytes written as a batch read
// back identical block by block and the reverse, unordered and repeated block lists, lists
// longer than the staging holds (many chunks), refusals of ids outside the pool; and a
// Llama-3.1-8B-shaped pool moving a 32k-token prompt's 2,048 blocks both ways, timed against
// per-block copies; copies straight between the pool and scattered slots of registered
// (page-locked) host memory, as the KV host tier's slab, identical to the staged path and timed
// for the 8B shape. Needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include <sys/mman.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_transfer.h"
#include "gpu_test_util.h"
#include "runtime/cuda/cuda_executor.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;
using Clock = std::chrono::steady_clock;

// Bytes from a seeded splitmix64 stream (fast enough for gigabytes), split over threads.
void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  const size_t n_threads = std::max<size_t>(1, std::min<size_t>(8, n >> 26));
  const size_t step = (n / n_threads + 7) & ~size_t(7);
  std::vector<std::thread> ts;
  for (size_t t = 0; t < n_threads; ++t) {
    ts.emplace_back([=] {
      const size_t b = std::min(n, t * step), e = std::min(n, (t + 1) * step);
      uint64_t x = seed * 0x9E3779B97F4A7C15ull + t;
      for (size_t i = b; i < e; i += 8) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        std::memcpy(p + i, &z, std::min<size_t>(8, e - i));
      }
    });
  }
  for (auto& t : ts) t.join();
}

// A llama3-tiny decoder with random weights and `blocks` KV blocks, behind an executor whose
// staging holds `staging_blocks` blocks per half (four halves: two for the pool stream's
// copies, two for the demotions behind the caller).
std::unique_ptr<CudaExecutor> tiny_executor(int32_t blocks, int64_t staging_blocks) {
  auto cfg = load_model_config(model_path("llama3-tiny"));
  EXPECT_TRUE(cfg.ok());
  if (!cfg.ok()) return nullptr;
  CudaModelOptions mo;
  mo.max_tokens = 64;
  mo.max_seqs = 4;
  mo.max_logit_rows = 4;
  KvPoolLayout l{cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, mo.block_size};
  mo.kv_cache_bytes = int64_t(blocks) * l.bytes_per_block();
  auto dec = CudaDecoder::random(*cfg, mo, 7, 0.02f);
  EXPECT_TRUE(dec.ok()) << (dec.ok() ? "" : dec.error().to_string());
  if (!dec.ok()) return nullptr;
  const int64_t bb = (*dec)->kv_block_bytes();
  return std::make_unique<CudaExecutor>(std::move(dec).value(), 4 * staging_blocks * bb);
}

void check_parity(CudaExecutor& ex, uint64_t seed) {
  const int32_t n_blocks = ex.n_kv_blocks();
  const size_t bb = size_t(ex.decoder().kv_block_bytes());
  std::mt19937 rng(static_cast<uint32_t>(seed));
  // 1. A shuffled list of most blocks written as a batch reads back block by block and as a batch.
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(size_t(n_blocks) * 3 / 4);
  std::vector<uint8_t> in(ids.size() * bb), one(bb), out(ids.size() * bb);
  fill_random(in.data(), in.size(), seed);
  ex.write_blocks(ids, in.data());
  size_t bad = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    ex.read_block(ids[i], one.data());
    bad += std::memcmp(one.data(), in.data() + i * bb, bb) != 0;
  }
  EXPECT_EQ(bad, 0u) << "blocks written by write_blocks differ through read_block";
  ex.read_blocks(ids, out.data());
  EXPECT_TRUE(out == in) << "write_blocks then read_blocks differ";
  // 2. Blocks written one at a time read back through a list with repeats and any order.
  std::vector<uint8_t> single(size_t(n_blocks) * bb);
  fill_random(single.data(), single.size(), seed + 1);
  for (int32_t b = 0; b < n_blocks; ++b) ex.write_block(b, single.data() + size_t(b) * bb);
  std::vector<int32_t> mixed;
  for (int i = 0; i < 2 * n_blocks + 1; ++i) mixed.push_back(int32_t(rng() % uint32_t(n_blocks)));
  std::vector<uint8_t> got(mixed.size() * bb);
  ex.read_blocks(mixed, got.data());
  bad = 0;
  for (size_t i = 0; i < mixed.size(); ++i) bad += std::memcmp(got.data() + i * bb, single.data() + size_t(mixed[i]) * bb, bb) != 0;
  EXPECT_EQ(bad, 0u) << "read_blocks differs from what write_block wrote";
  // 3. A batch write leaves the other blocks alone; one block and an empty list work.
  const int32_t lone = ids.empty() ? 0 : ids[0];
  ex.write_blocks(std::span<const int32_t>(&lone, 1), in.data() + bb);  // block ids[1]'s bytes into ids[0]
  ex.read_block(lone, one.data());
  EXPECT_EQ(std::memcmp(one.data(), in.data() + bb, bb), 0);
  for (int32_t b = 0; b < n_blocks; ++b) {
    if (b == lone) continue;
    ex.read_block(b, one.data());
    if (std::memcmp(one.data(), single.data() + size_t(b) * bb, bb) != 0) {
      ADD_FAILURE() << "block " << b << " changed by a write to block " << lone;
      break;
    }
  }
  ex.write_blocks({}, nullptr);
  ex.read_blocks({}, nullptr);
  // 4. An id outside the pool is refused before anything moves.
  const int32_t bad_ids[2] = {0, n_blocks};
  EXPECT_THROW(ex.read_blocks(bad_ids, out.data()), std::runtime_error);
  EXPECT_THROW(ex.write_blocks(bad_ids, in.data()), std::runtime_error);
  ex.read_block(0, one.data());
  EXPECT_EQ(std::memcmp(one.data(), single.data(), bb), 0) << "a refused write moved bytes";
}

TEST(GpuKvTransfer, EngineExecutorParity) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  CudaEngineOptions o;
  o.kv_cache_bytes = int64_t(32) << 20;
  o.max_batch_tokens = 64;
  o.max_num_seqs = 4;
  o.max_model_len = 33000;  // a 32k context fits the block table
  auto parts = make_cuda_engine_parts(model_path("llama3-tiny"), o);
  ASSERT_TRUE(parts.ok()) << parts.error().to_string();
  check_parity(*parts->executor, 11);
}

TEST(GpuKvTransfer, ListsLongerThanTheStaging) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t staging : {1, 3, 7}) {
    auto ex = tiny_executor(97, staging);
    ASSERT_NE(ex, nullptr);
    SCOPED_TRACE("staging blocks per half " + std::to_string(staging));
    check_parity(*ex, 100 + uint64_t(staging));
  }
}

// Parts of 8 bytes (not a multiple of 16) take the 2-byte-word kernel.
TEST(GpuKvTransfer, NarrowParts) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const KvPoolLayout l{2, 1, 4, 1};
  auto pool = KvBlockPool::create(l, 50 * l.bytes_per_block());
  ASSERT_TRUE(pool.ok()) << pool.error().to_string();
  auto tr = KvTransfer::create(**pool, nullptr, 4 * 3 * l.bytes_per_block());
  ASSERT_TRUE(tr.ok()) << tr.error().to_string();
  const int32_t n = (*pool)->n_blocks();
  const size_t bb = size_t(l.bytes_per_block()), part = bb / 4;
  std::vector<int32_t> ids;
  for (int32_t b = n - 1; b >= 0; b -= 2) ids.push_back(b);
  std::vector<uint8_t> in(ids.size() * bb), out(ids.size() * bb);
  fill_random(in.data(), in.size(), 3);
  ASSERT_TRUE((*tr)->write(ids, in.data()).ok());
  ASSERT_TRUE((*tr)->read(ids, out.data()).ok());
  EXPECT_TRUE(out == in);
  std::vector<uint8_t> one(bb);
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_CUDA_OK(cudaMemcpy(one.data() + size_t(2 * layer) * part, (*pool)->k(layer) + size_t(ids[1]) * part / 2, part, cudaMemcpyDeviceToHost));
    ASSERT_CUDA_OK(cudaMemcpy(one.data() + size_t(2 * layer + 1) * part, (*pool)->v(layer) + size_t(ids[1]) * part / 2, part, cudaMemcpyDeviceToHost));
  }
  EXPECT_EQ(std::memcmp(one.data(), in.data() + bb, bb), 0);
}

// A Llama-3.1-8B-shaped pool (32 layers, 8 KV heads, head_dim 128: 2 MiB a block), a 32k-token
// prompt's 2,048 blocks both ways through the default staging, timed; per-block copies (the
// layout read_kv_block copies, 64 copies a block) timed over 256 blocks for comparison.
TEST(GpuKvTransfer, Llama8bShape32kPrompt) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const KvPoolLayout l{32, 8, 128, 16};
  const int32_t n_pool = 2200, n = 2048;
  auto pool = KvBlockPool::create(l, int64_t(n_pool) * l.bytes_per_block());
  ASSERT_TRUE(pool.ok()) << pool.error().to_string();
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto tr = KvTransfer::create(**pool, stream, KvTransfer::kDefaultStagingBytes);
  ASSERT_TRUE(tr.ok()) << tr.error().to_string();
  const size_t bb = size_t(l.bytes_per_block());
  std::vector<int32_t> ids(static_cast<size_t>(n_pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  ids.resize(size_t(n));
  std::vector<uint8_t> in(size_t(n) * bb), out(size_t(n) * bb);
  fill_random(in.data(), in.size(), 21);
  std::memset(out.data(), 0, out.size());  // touched before timing
  ASSERT_TRUE((*tr)->write(std::span<const int32_t>(ids).first(16), in.data()).ok());  // warm-up
  const auto t0 = Clock::now();
  ASSERT_TRUE((*tr)->write(ids, in.data()).ok());
  const auto t1 = Clock::now();
  ASSERT_TRUE((*tr)->read(ids, out.data()).ok());
  const auto t2 = Clock::now();
  EXPECT_TRUE(out == in) << "2,048 blocks did not come back identical";
  // The layout is read_kv_block's: spot-check blocks part by part with plain copies.
  const size_t part = bb / 64;
  std::vector<uint8_t> one(bb);
  for (size_t i : {size_t(0), size_t(777), size_t(n - 1)}) {
    for (int layer = 0; layer < 32; ++layer) {
      ASSERT_CUDA_OK(cudaMemcpy(one.data() + size_t(2 * layer) * part, (*pool)->k(layer) + size_t(ids[i]) * part / 2, part, cudaMemcpyDeviceToHost));
      ASSERT_CUDA_OK(cudaMemcpy(one.data() + size_t(2 * layer + 1) * part, (*pool)->v(layer) + size_t(ids[i]) * part / 2, part, cudaMemcpyDeviceToHost));
    }
    EXPECT_EQ(std::memcmp(one.data(), in.data() + i * bb, bb), 0) << "block " << ids[i] << " not in read_kv_block's layout";
  }
  // Per-block copies over 256 blocks, as the one-block path does them.
  const int n_single = 256;
  const auto t3 = Clock::now();
  for (int i = 0; i < n_single; ++i) {
    uint8_t* dst = out.data() + size_t(i) * bb;
    for (int layer = 0; layer < 32; ++layer) {
      ASSERT_CUDA_OK(cudaMemcpyAsync(dst + size_t(2 * layer) * part, (*pool)->k(layer) + size_t(ids[size_t(i)]) * part / 2, part, cudaMemcpyDeviceToHost, stream));
      ASSERT_CUDA_OK(cudaMemcpyAsync(dst + size_t(2 * layer + 1) * part, (*pool)->v(layer) + size_t(ids[size_t(i)]) * part / 2, part, cudaMemcpyDeviceToHost, stream));
    }
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  }
  const auto t4 = Clock::now();
  auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const double gb = double(n) * double(bb) / 1e9;
  std::printf("KV transfer, %d blocks of %zu bytes (%.2f GB), chunk %d blocks: write_blocks %.1f ms (%.1f GB/s), "
              "read_blocks %.1f ms (%.1f GB/s); per-block reads: %d blocks in %.1f ms (%.1f GB/s)\n",
              n, bb, gb, (*tr)->chunk_blocks(), 1e3 * s(t0, t1), gb / s(t0, t1), 1e3 * s(t1, t2), gb / s(t1, t2), n_single,
              1e3 * s(t3, t4), double(n_single) * double(bb) / 1e9 / s(t3, t4));
  (*tr).reset();
  cudaStreamDestroy(stream);
}

// A slab of `n` slots of bb bytes, mapped and faulted in as the KV host tier's.
struct Slab {
  Slab(size_t n, size_t bb) : bytes(n * bb) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    base = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Slab() {
    if (base != nullptr) munmap(base, bytes);
  }
  size_t bytes;
  uint8_t* base;
};

// Blocks written from scattered slots of registered memory (some adjacent, merged into one
// copy) read back identical through the staged path, and read into slots identical to it; the
// same through unregistered places (staged inside the executor).
TEST(GpuKvTransfer, DirectCopiesToRegisteredHostSlots) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  auto ex = tiny_executor(97, 3);
  ASSERT_NE(ex, nullptr);
  const size_t bb = size_t(ex->decoder().kv_block_bytes());
  const size_t n_slots = 80, n = 60;
  Slab slab(n_slots, bb);
  ASSERT_NE(slab.base, nullptr);
  std::mt19937 rng(9);
  std::vector<size_t> order(n_slots);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin() + 20, order.end(), rng);  // slots 0-19 stay adjacent: runs
  std::vector<int32_t> ids(97);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  std::vector<uint8_t*> places(n);
  for (size_t i = 0; i < n; ++i) places[i] = slab.base + order[i] * bb;
  const std::vector<const uint8_t*> sources(places.begin(), places.end());
  for (int pass = 0; pass < 2; ++pass) {
    const bool registered = pass == 0;
    SCOPED_TRACE(registered ? "registered slots" : "unregistered slots");
    if (registered) {
      ASSERT_TRUE(ex->register_host_memory(slab.base, slab.bytes));
    }
    fill_random(slab.base, slab.bytes, 40 + uint64_t(pass));
    std::vector<uint8_t> want(n * bb), got(n * bb);
    for (size_t i = 0; i < n; ++i) std::memcpy(want.data() + i * bb, places[i], bb);
    ex->write_blocks_from(ids, sources);
    ex->read_blocks(ids, got.data());
    EXPECT_TRUE(got == want) << "write_blocks_from then read_blocks differ";
    // Other bytes into the pool, then out into the slots.
    fill_random(want.data(), want.size(), 50 + uint64_t(pass));
    ex->write_blocks(ids, want.data());
    std::memset(slab.base, 0, slab.bytes);
    ex->read_blocks_to(ids, places);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += std::memcmp(places[i], want.data() + i * bb, bb) != 0;
    EXPECT_EQ(bad, 0u) << "read_blocks_to differs from what write_blocks wrote";
    if (registered) ex->unregister_host_memory(slab.base);
  }
  const int32_t bad_ids[2] = {0, 97};
  uint8_t* two[2] = {places[0], places[1]};
  EXPECT_THROW(ex->read_blocks_to(bad_ids, two), std::runtime_error);
}

// The 8B shape: a 32k-token prompt's 2,048 blocks between the pool and shuffled slots of a
// registered slab (one 2 MiB copy per block), both ways, timed; bytes compared.
TEST(GpuKvTransfer, Llama8bShapeDirectToPinnedSlots) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const KvPoolLayout l{32, 8, 128, 16};
  const int32_t n_pool = 2200, n = 2048;
  auto pool = KvBlockPool::create(l, int64_t(n_pool) * l.bytes_per_block());
  ASSERT_TRUE(pool.ok()) << pool.error().to_string();
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto tr = KvTransfer::create(**pool, stream, KvTransfer::kDefaultStagingBytes);
  ASSERT_TRUE(tr.ok()) << tr.error().to_string();
  const size_t bb = size_t(l.bytes_per_block());
  Slab slab(size_t(n) + 64, bb);
  ASSERT_NE(slab.base, nullptr);
  const auto r0 = Clock::now();
  ASSERT_CUDA_OK(cudaHostRegister(slab.base, slab.bytes, cudaHostRegisterDefault));
  const double register_s = std::chrono::duration<double>(Clock::now() - r0).count();
  std::mt19937 rng(6);
  std::vector<int32_t> ids(static_cast<size_t>(n_pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(size_t(n));
  std::vector<size_t> order(size_t(n) + 64);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t*> places(static_cast<size_t>(n));
  for (size_t i = 0; i < places.size(); ++i) places[i] = slab.base + order[i] * bb;
  const std::vector<const uint8_t*> sources(places.begin(), places.end());
  fill_random(slab.base, slab.bytes, 77);
  std::vector<uint8_t> want(size_t(n) * bb);
  for (size_t i = 0; i < places.size(); ++i) std::memcpy(want.data() + i * bb, places[i], bb);
  ASSERT_TRUE((*tr)->write_direct(std::span<const int32_t>(ids).first(16), std::span<const uint8_t* const>(sources).first(16)).ok());
  const auto t0 = Clock::now();
  ASSERT_TRUE((*tr)->write_direct(ids, sources).ok());
  const auto t1 = Clock::now();
  std::memset(slab.base, 0, slab.bytes);
  const auto t2 = Clock::now();
  ASSERT_TRUE((*tr)->read_direct(ids, places).ok());
  const auto t3 = Clock::now();
  size_t bad = 0;
  for (size_t i = 0; i < places.size(); ++i) bad += std::memcmp(places[i], want.data() + i * bb, bb) != 0;
  EXPECT_EQ(bad, 0u) << "blocks did not come back identical through pinned slots";
  auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const double gb = double(n) * double(bb) / 1e9;
  std::printf("KV transfer direct, %d blocks of %zu bytes (%.2f GB) to / from shuffled pinned slots: write_direct %.1f ms "
              "(%.1f GB/s), read_direct %.1f ms (%.1f GB/s); cudaHostRegister of %.2f GB: %.0f ms\n",
              n, bb, gb, 1e3 * s(t0, t1), gb / s(t0, t1), 1e3 * s(t2, t3), gb / s(t2, t3), double(slab.bytes) / 1e9,
              1e3 * register_s);
  ASSERT_CUDA_OK(cudaHostUnregister(slab.base));
  (*tr).reset();
  cudaStreamDestroy(stream);
}

// Demotions copied out behind the caller (read_blocks_to_async) while the same pool blocks are
// written again at once, three ways (write_blocks_from, write_block, a staged write_blocks):
// every demoted slot holds the blocks' old bytes once reads_landed() says so, and the pool
// holds the new ones. Staging of 3 blocks per half: many chunks in flight.
TEST(GpuKvTransfer, DemotionsBehindTheCallerKeepTheOldBytes) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  auto ex = tiny_executor(97, 3);
  ASSERT_NE(ex, nullptr);
  const size_t bb = size_t(ex->decoder().kv_block_bytes());
  const size_t n = 40;
  Slab slab(3 * n + 8, bb);
  ASSERT_NE(slab.base, nullptr);
  ASSERT_TRUE(ex->register_host_memory(slab.base, slab.bytes));
  std::mt19937 rng(31);
  std::vector<int32_t> ids(97);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  std::vector<size_t> order(3 * n + 8);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t*> down(n);
  std::vector<const uint8_t*> up(n);
  for (size_t i = 0; i < n; ++i) {
    down[i] = slab.base + order[i] * bb;
    up[i] = slab.base + order[n + i] * bb;
  }
  for (int way = 0; way < 3; ++way) {
    SCOPED_TRACE("rewritten through " + std::string(way == 0 ? "write_blocks_from" : way == 1 ? "write_block" : "write_blocks"));
    std::vector<uint8_t> old_bytes(n * bb), new_bytes(n * bb), got(n * bb);
    fill_random(old_bytes.data(), old_bytes.size(), 60 + uint64_t(way));
    fill_random(new_bytes.data(), new_bytes.size(), 70 + uint64_t(way));
    ex->write_blocks(ids, old_bytes.data());
    for (size_t i = 0; i < n; ++i) {
      std::memset(down[i], 0, bb);
      std::memcpy(const_cast<uint8_t*>(up[i]), new_bytes.data() + i * bb, bb);
    }
    const uint64_t ticket = ex->read_blocks_to_async(ids, down);
    if (way == 0) {
      ex->write_blocks_from(ids, up);
    } else if (way == 1) {
      for (size_t i = 0; i < n; ++i) ex->write_block(ids[i], up[i]);
    } else {
      ex->write_blocks(ids, new_bytes.data());
    }
    EXPECT_TRUE(ex->reads_landed(ticket, true));
    EXPECT_TRUE(ex->reads_landed(ticket, false));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += std::memcmp(down[i], old_bytes.data() + i * bb, bb) != 0;
    EXPECT_EQ(bad, 0u) << "demoted slots do not hold the blocks' old bytes";
    ex->read_blocks(ids, got.data());
    EXPECT_TRUE(got == new_bytes) << "the pool does not hold the bytes written after the demotion";
  }
  // Several demotions queued before any install, landed in order; an empty list needs no ticket.
  std::vector<uint8_t> bytes(n * bb);
  fill_random(bytes.data(), bytes.size(), 80);
  ex->write_blocks(ids, bytes.data());
  const size_t h = n / 2;
  const uint64_t t1 = ex->read_blocks_to_async(std::span<const int32_t>(ids).first(h), std::span<uint8_t* const>(down).first(h));
  const uint64_t t2 = ex->read_blocks_to_async(std::span<const int32_t>(ids).subspan(h), std::span<uint8_t* const>(down).subspan(h));
  EXPECT_GT(t2, t1);
  EXPECT_EQ(ex->read_blocks_to_async({}, {}), 0u);
  EXPECT_TRUE(ex->reads_landed(t2, true));
  EXPECT_TRUE(ex->reads_landed(t1, false));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::memcmp(down[i], bytes.data() + i * bb, bb) != 0;
  EXPECT_EQ(bad, 0u);
  ex->unregister_host_memory(slab.base);
}

// The 8B shape, as a host-tier hit of half a 32k prompt: 1,024 blocks demoted to pinned slots
// and 1,024 other host blocks installed into the same pool blocks, (a) one after the other
// (read_direct then write_direct) and (b) the demotion behind the caller, overlapped with the
// install; both timed, bytes compared.
TEST(GpuKvTransfer, Llama8bShapeDemotionOverlapsInstall) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const KvPoolLayout l{32, 8, 128, 16};
  const int32_t n_pool = 2200, n = 1024;
  auto pool = KvBlockPool::create(l, int64_t(n_pool) * l.bytes_per_block());
  ASSERT_TRUE(pool.ok()) << pool.error().to_string();
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto tr = KvTransfer::create(**pool, stream, KvTransfer::kDefaultStagingBytes);
  ASSERT_TRUE(tr.ok()) << tr.error().to_string();
  const size_t bb = size_t(l.bytes_per_block());
  Slab slab(size_t(3 * n), bb);
  ASSERT_NE(slab.base, nullptr);
  ASSERT_CUDA_OK(cudaHostRegister(slab.base, slab.bytes, cudaHostRegisterDefault));
  std::mt19937 rng(8);
  std::vector<int32_t> ids(static_cast<size_t>(n_pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(size_t(n));
  std::vector<size_t> order(size_t(3 * n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const size_t nn = static_cast<size_t>(n);
  std::vector<uint8_t*> old_slots(nn), down(nn);
  std::vector<const uint8_t*> up(nn), old_src(nn);
  for (size_t i = 0; i < size_t(n); ++i) {
    old_slots[i] = slab.base + order[i] * bb;
    old_src[i] = old_slots[i];
    up[i] = slab.base + order[size_t(n) + i] * bb;
    down[i] = slab.base + order[size_t(2 * n) + i] * bb;
  }
  fill_random(slab.base, slab.bytes, 90);
  auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  double took[2] = {0, 0};
  for (int overlapped = 0; overlapped < 2; ++overlapped) {
    SCOPED_TRACE(overlapped ? "overlapped" : "one after the other");
    ASSERT_TRUE((*tr)->write_direct(ids, old_src).ok());  // the blocks' old bytes
    for (uint8_t* d : down) std::memset(d, 0, bb);
    const auto t0 = Clock::now();
    if (overlapped) {
      auto ticket = (*tr)->read_direct_async(ids, down);
      ASSERT_TRUE(ticket.ok()) << ticket.error().to_string();
      ASSERT_TRUE((*tr)->write_direct(ids, up).ok());
      auto done = (*tr)->reads_done(*ticket, true);
      ASSERT_TRUE(done.ok() && *done);
    } else {
      ASSERT_TRUE((*tr)->read_direct(ids, down).ok());
      ASSERT_TRUE((*tr)->write_direct(ids, up).ok());
    }
    took[overlapped] = s(t0, Clock::now());
    size_t bad = 0;
    for (size_t i = 0; i < size_t(n); ++i) bad += std::memcmp(down[i], old_slots[i], bb) != 0;
    EXPECT_EQ(bad, 0u) << "demoted slots differ from the blocks' old bytes";
    std::vector<uint8_t*> back(nn);
    for (size_t i = 0; i < size_t(n); ++i) back[i] = down[i];
    ASSERT_TRUE((*tr)->read_direct(ids, back).ok());
    bad = 0;
    for (size_t i = 0; i < size_t(n); ++i) bad += std::memcmp(down[i], up[i], bb) != 0;
    EXPECT_EQ(bad, 0u) << "installed blocks differ from their sources";
  }
  const double gb = double(n) * double(bb) / 1e9;
  std::printf("KV transfer swap, %d blocks of %zu bytes (%.2f GB) down and as many up: one after the other %.1f ms, "
              "demotion behind the install %.1f ms (%.1f GB/s each way)\n",
              n, bb, gb, 1e3 * took[0], 1e3 * took[1], gb / took[1]);
  ASSERT_CUDA_OK(cudaHostUnregister(slab.base));
  (*tr).reset();
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace strata::cuda
