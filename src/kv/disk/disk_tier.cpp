#include "kv/disk/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include "core/log.h"
#include "kv/host/host_tier.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'K', 'V', 'B', 'L', 'K'};
constexpr const char* kExt = ".kvb";
constexpr int64_t kDirectReadMin = int64_t(1) << 20;  // read_many ranges at least this long use O_DIRECT
constexpr int64_t kReadPieceBytes = int64_t(16) << 20;  // read_many cuts longer runs into pieces this long

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

struct Reader {
  const std::vector<uint8_t>& buf;
  size_t pos = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T v{};
    if (pos + sizeof(T) > buf.size()) {
      ok = false;
      return v;
    }
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
};

std::string file_name(uint64_t seq) {
  char name[32];
  std::snprintf(name, sizeof(name), "g%016llx", static_cast<unsigned long long>(seq));
  return std::string(name) + kExt;
}

// Sequence number of a tier file name, 0 when the name is not one.
uint64_t parse_seq(const std::string& name) {
  if (name.size() != 17 + std::strlen(kExt) || name[0] != 'g' || !name.ends_with(kExt)) return 0;
  uint64_t v = 0;
  for (size_t i = 1; i < 17; ++i) {
    const char c = name[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return 0;
    v = v * 16 + uint64_t(d);
  }
  return v;
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

bool read_at(const fs::path& path, int64_t offset, uint8_t* out, size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, n - done, off_t(offset + int64_t(done)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += size_t(r);
  }
  ::close(fd);
  return done == n;
}

// O_DIRECT read of [offset, offset + n) (all 4 KiB aligned, `out` too); true when at least
// `need` bytes came (the file may end inside the last aligned block). False also where the
// file system refuses O_DIRECT: the caller reads through the page cache then.
bool read_direct(const fs::path& path, int64_t offset, uint8_t* out, size_t n, size_t need) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, n - done, off_t(offset + int64_t(done)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += size_t(r);
    if (done % 4096 != 0) break;  // end of file
  }
  ::close(fd);
  return done >= need;
}

}  // namespace

DiskTier::DiskTier(DiskTierOptions options) : options_(std::move(options)) {
  for (int64_t b : options_.tensor_bytes) block_bytes_ += b;
}

Result<std::unique_ptr<DiskTier>> DiskTier::open(DiskTierOptions options) {
  auto bad = [&](const std::string& m) {
    return make_error(ErrorCode::kInvalidArgument, "kv disk dir '" + options.dir.string() + "': " + m);
  };
  if (options.dir.empty()) return bad("no directory given");
  if (options.max_bytes <= 0) return bad("kv_disk_bytes must be > 0, got " + std::to_string(options.max_bytes));
  if (options.tensor_bytes.empty()) return bad("no tensors per block");
  if (options.max_group_blocks < 1) options.max_group_blocks = 1;
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec || !fs::is_directory(options.dir)) return bad("cannot create the directory: " + ec.message());
  std::unique_ptr<DiskTier> t(new DiskTier(std::move(options)));
  STRATA_RETURN_IF_ERROR(t->scan());
  t->writer_ = std::thread([p = t.get()] { p->writer_loop(); });
  return t;
}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

int64_t DiskTier::stride() const { return block_bytes_ + int64_t(options_.tensor_bytes.size()) * 8; }

Status DiskTier::scan() {
  std::error_code ec;
  std::vector<std::pair<uint64_t, fs::path>> found;
  for (const auto& de : fs::directory_iterator(options_.dir, ec)) {
    if (!de.is_regular_file()) continue;
    const std::string name = de.path().filename().string();
    if (name.ends_with(".tmp")) {  // a write that never finished
      fs::remove(de.path(), ec);
      continue;
    }
    const uint64_t seq = parse_seq(name);
    if (seq == 0) continue;
    found.emplace_back(seq, de.path());
  }
  if (ec) return make_error(ErrorCode::kIo, "kv disk dir '" + options_.dir.string() + "': " + ec.message());
  std::sort(found.begin(), found.end());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [seq, path] : found) {
    next_seq_ = std::max(next_seq_, seq + 1);
    FileEntry e;
    e.path = path;
    const std::string why = load_header(path, e);
    if (!why.empty()) {
      quarantine_path(path, why);
      continue;
    }
    add_file_locked(seq, std::move(e));
  }
  load_pins_locked();
  for (const fs::path& p : enforce_budget_locked()) {
    std::error_code ec;
    fs::remove(p, ec);
  }
  log::info("kv disk tier {}: {} files, {} blocks, {} bytes, {} session pins", options_.dir.string(), files_.size(),
            index_.size(), total_bytes_, pins_.size());
  return Status();
}

std::string DiskTier::load_header(const fs::path& path, FileEntry& entry) const {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return "cannot stat: " + ec.message();
  // The header is small; read what can hold it (identity and hashes included).
  std::ifstream f(path, std::ios::binary);
  if (!f) return "cannot open";
  const size_t head_max = std::min<uint64_t>(size, 1 << 20);
  std::vector<uint8_t> buf(head_max);
  f.read(reinterpret_cast<char*>(buf.data()), std::streamsize(head_max));
  if (size_t(f.gcount()) != head_max) return "short read";
  Reader r{buf};
  char magic[8];
  for (char& c : magic) c = r.get<char>();
  if (!r.ok || std::memcmp(magic, kMagic, 8) != 0) return "not a KV block file (bad magic)";
  const uint32_t version = r.get<uint32_t>();
  if (!r.ok) return "truncated header";
  if (version != kFormatVersion) {
    return "format version " + std::to_string(version) + ", expected " + std::to_string(kFormatVersion);
  }
  const uint32_t id_len = r.get<uint32_t>();
  if (!r.ok || r.pos + id_len > buf.size()) return "truncated header";
  const std::string identity(reinterpret_cast<const char*>(buf.data() + r.pos), id_len);
  r.pos += id_len;
  const uint32_t n_tensors = r.get<uint32_t>();
  if (!r.ok || n_tensors > 1u << 16) return "truncated header";
  std::vector<int64_t> tensors(n_tensors);
  for (auto& t : tensors) t = r.get<int64_t>();
  const uint32_t n_blocks = r.get<uint32_t>();
  if (!r.ok || n_blocks > 1u << 20) return "truncated header";
  entry.hashes.resize(n_blocks);
  for (auto& h : entry.hashes) h = r.get<uint64_t>();
  const size_t checked = r.pos;
  const uint64_t sum = r.get<uint64_t>();
  if (!r.ok) return "truncated header";
  if (XXH3_64bits(buf.data(), checked) != sum) return "header checksum mismatch";
  if (identity != options_.identity) return "foreign model identity '" + identity + "'";
  if (tensors != options_.tensor_bytes) return "layer layout differs from this model's";
  entry.data_offset = int64_t(r.pos);
  const uint64_t expect = uint64_t(entry.data_offset) + uint64_t(n_blocks) * uint64_t(stride());
  if (size != expect) return "size " + std::to_string(size) + " bytes, expected " + std::to_string(expect) + " (truncated)";
  entry.bytes = int64_t(size);
  return "";
}

void DiskTier::add_file_locked(uint64_t seq, FileEntry entry) {
  for (size_t i = 0; i < entry.hashes.size(); ++i) index_[entry.hashes[i]] = Loc{seq, int32_t(i)};
  total_bytes_ += entry.bytes;
  entry.last_use = ++use_tick_;
  files_[seq] = std::move(entry);
}

void DiskTier::remove_file_locked(uint64_t seq) {
  auto it = files_.find(seq);
  if (it == files_.end()) return;
  for (uint64_t h : it->second.hashes) {
    auto x = index_.find(h);
    if (x != index_.end() && x->second.seq == seq) index_.erase(x);
  }
  total_bytes_ -= it->second.bytes;
  files_.erase(it);
}

void DiskTier::quarantine_path(const fs::path& path, const std::string& reason) {
  std::error_code ec;
  const fs::path qdir = options_.dir / "quarantine";
  fs::create_directories(qdir, ec);
  fs::rename(path, qdir / path.filename(), ec);
  if (ec) {
    log::warn("kv disk tier: {} is bad ({}) and could not be quarantined ({}); removing it", path.string(), reason,
              ec.message());
    fs::remove(path, ec);
  } else {
    log::warn("kv disk tier: quarantined {}: {}", path.string(), reason);
  }
  ++counters_.quarantined_files;
}

void DiskTier::quarantine_locked(uint64_t seq, const std::string& reason) {
  auto it = files_.find(seq);
  if (it == files_.end()) return;
  const fs::path path = it->second.path;
  remove_file_locked(seq);
  quarantine_path(path, reason);
}

bool DiskTier::file_pinned_locked(const FileEntry& f, double now) const {
  if (pins_.empty()) return false;
  for (uint64_t h : f.hashes) {
    auto it = pins_.find(h);
    if (it != pins_.end() && it->second > now) return true;
  }
  return false;
}

std::vector<fs::path> DiskTier::enforce_budget_locked() {
  std::vector<fs::path> evicted;
  const double now = tier_clock_s();
  while (total_bytes_ > options_.max_bytes && !files_.empty()) {
    // Least recently used unpinned file; a pinned one only when all are pinned.
    auto victim = files_.end(), pinned_victim = files_.end();
    for (auto it = files_.begin(); it != files_.end(); ++it) {
      auto& best = file_pinned_locked(it->second, now) ? pinned_victim : victim;
      if (best == files_.end() || it->second.last_use < best->second.last_use) best = it;
    }
    if (victim == files_.end()) {
      victim = pinned_victim;
      ++counters_.pinned_evicted_files;
    }
    evicted.push_back(victim->second.path);
    remove_file_locked(victim->first);
    ++counters_.evicted_files;
  }
  return evicted;
}

void DiskTier::pin(uint64_t hash, double until) {
  std::lock_guard<std::mutex> lock(mu_);
  double& u = pins_[hash];
  if (until > u) {
    u = until;
    pins_dirty_ = true;
    cv_.notify_all();
  }
  if (pins_.size() > 2 * pins_pruned_at_ + 1024) {  // amortized sweep of expired pins
    const double now = tier_clock_s();
    std::erase_if(pins_, [now](const auto& p) { return p.second <= now; });
    pins_pruned_at_ = pins_.size();
  }
}

bool DiskTier::contains(uint64_t hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(hash) > 0;
}

bool DiskTier::enqueue(uint64_t hash, const uint8_t* data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(hash); it != index_.end()) {
      files_.at(it->second.seq).last_use = ++use_tick_;  // demoted again: still in use
      return true;
    }
    if (queued_.count(hash)) return true;
    if (queued_bytes_ + block_bytes_ > options_.queue_bytes) {
      ++counters_.dropped_blocks;
      return false;
    }
    Pending p;
    p.hash = hash;
    p.data.assign(data, data + block_bytes_);
    queue_.push_back(std::move(p));
    queued_.insert(hash);
    queued_bytes_ += block_bytes_;
  }
  cv_.notify_one();
  return true;
}

bool DiskTier::enqueue_ref(uint64_t hash, const uint8_t* data, std::function<void()> done) {
  bool kept = false, ok = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(hash); it != index_.end()) {
      files_.at(it->second.seq).last_use = ++use_tick_;
    } else if (queued_.count(hash) == 0) {
      if (queued_ref_bytes_ + block_bytes_ > options_.ref_queue_bytes) {
        ++counters_.dropped_blocks;
        ok = false;
      } else {
        Pending p;
        p.hash = hash;
        p.ref = data;
        p.done = std::move(done);
        queue_.push_back(std::move(p));
        queued_.insert(hash);
        queued_ref_bytes_ += block_bytes_;
        kept = true;
      }
    }
  }
  if (kept) {
    cv_.notify_one();
  } else if (done) {
    done();
  }
  return ok;
}

void DiskTier::prefetch(std::span<const uint64_t> hashes) {
  std::map<uint64_t, std::pair<int64_t, int64_t>> ranges;  // file seq -> [first, end) bytes
  std::map<uint64_t, fs::path> paths;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t h : hashes) {
      auto it = index_.find(h);
      if (it == index_.end()) continue;
      const FileEntry& f = files_.at(it->second.seq);
      const int64_t b = f.data_offset + int64_t(it->second.index) * stride();
      auto [r, fresh] = ranges.try_emplace(it->second.seq, b, b + stride());
      if (!fresh) r->second = {std::min(r->second.first, b), std::max(r->second.second, b + stride())};
      paths[it->second.seq] = f.path;
    }
  }
  for (const auto& [seq, range] : ranges) {
    if (range.second - range.first >= kDirectReadMin) continue;  // read_many reads it with O_DIRECT
    const int fd = ::open(paths[seq].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // read() reports it
    ::posix_fadvise(fd, range.first, range.second - range.first, POSIX_FADV_WILLNEED);
    ::close(fd);
  }
}

std::string DiskTier::unpack_block(const uint8_t* in, uint8_t* out, uint64_t hash) const {
  size_t pos = 0, o = 0;
  for (size_t t = 0; t < options_.tensor_bytes.size(); ++t) {
    const size_t n = size_t(options_.tensor_bytes[t]);
    uint64_t sum;
    std::memcpy(&sum, in + pos + n, 8);
    if (XXH3_64bits(in + pos, n) != sum) {
      return "checksum mismatch in tensor " + std::to_string(t) + " of block " + std::to_string(hash);
    }
    std::memcpy(out + o, in + pos, n);
    pos += n + 8;
    o += n;
  }
  return "";
}

bool DiskTier::read(uint64_t hash, uint8_t* out) {
  std::vector<uint8_t> ok;
  read_many(std::span<const uint64_t>(&hash, 1), std::span<uint8_t* const>(&out, 1), ok);
  return ok[0] != 0;
}

void DiskTier::read_many(std::span<const uint64_t> hashes, std::span<uint8_t* const> outs, std::vector<uint8_t>& ok) {
  ok.assign(hashes.size(), 0);
  std::lock_guard<std::mutex> reading(read_mu_);
  struct Want {
    size_t i;        // index into hashes
    int64_t offset;  // in the file
  };
  std::map<uint64_t, std::pair<fs::path, std::vector<Want>>> by_file;  // file seq -> its blocks
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto it = index_.find(hashes[i]);
      if (it == index_.end()) continue;
      FileEntry& f = files_.at(it->second.seq);
      f.last_use = ++use_tick_;
      auto& e = by_file[it->second.seq];
      e.first = f.path;
      e.second.push_back({i, f.data_offset + int64_t(it->second.index) * stride()});
    }
  }
  // One read per run of wanted blocks of a file: a gap of more than one unwanted block starts a
  // new run (a file written while other sequences were evicted holds their blocks between
  // ours, and reading those would cost bandwidth for nothing).
  struct Run {
    uint64_t seq;
    const fs::path* path;
    std::vector<Want> wants;  // ascending offsets
    int64_t first, end;       // bytes [first, end) of the file
  };
  std::vector<Run> runs;
  const int64_t st = stride();
  for (auto& [seq, entry] : by_file) {
    auto& [path, wants] = entry;
    std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) { return a.offset < b.offset; });
    for (const Want& w : wants) {
      if (runs.empty() || runs.back().seq != seq || w.offset > runs.back().end + st) {
        runs.push_back(Run{seq, &path, {}, w.offset, w.offset});
      }
      runs.back().wants.push_back(w);
      runs.back().end = w.offset + st;
    }
  }
  // Long runs are cut into pieces of kReadPieceBytes, so that several reads are in flight.
  {
    const int64_t piece_blocks = std::max<int64_t>(1, kReadPieceBytes / st);
    std::vector<Run> cut;
    for (Run& r : runs) {
      for (size_t i = 0; i < r.wants.size(); i += size_t(piece_blocks)) {
        const size_t j = std::min(r.wants.size(), i + size_t(piece_blocks));
        Run p{r.seq, r.path, std::vector<Want>(r.wants.begin() + i, r.wants.begin() + j), r.wants[i].offset, 0};
        p.end = p.wants.back().offset + st;
        cut.push_back(std::move(p));
      }
    }
    runs.swap(cut);
  }
  // Reads a run into buf: large ones bypass the page cache (O_DIRECT: one request the device
  // serves at full bandwidth instead of a chain of readahead windows; the range is widened to
  // 4 KiB alignment), small ones, or a file system without O_DIRECT, read through the cache.
  // Returns the byte at `first`, or null on a short read.
  std::atomic<int64_t> file_bytes{0};
  auto read_run = [this, &file_bytes](const Run& r, std::vector<uint8_t>& buf) -> const uint8_t* {
    if (options_.read_delay_s > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.read_delay_s * double(r.wants.size())));
    }
    constexpr int64_t kAlign = 4096;
    const int64_t n = r.end - r.first;
    if (n >= kDirectReadMin) {
      const int64_t a0 = r.first / kAlign * kAlign, a1 = (r.end + kAlign - 1) / kAlign * kAlign;
      if (buf.size() < size_t(a1 - a0 + kAlign)) buf.resize(size_t(a1 - a0 + kAlign));
      uint8_t* aligned = buf.data() + (kAlign - int64_t(reinterpret_cast<uintptr_t>(buf.data()) % kAlign)) % kAlign;
      if (read_direct(*r.path, a0, aligned, size_t(a1 - a0), size_t(r.end - a0))) {
        file_bytes += a1 - a0;
        return aligned + (r.first - a0);
      }
    }
    if (buf.size() < size_t(n)) buf.resize(size_t(n));
    if (!read_at(*r.path, r.first, buf.data(), size_t(n))) return nullptr;
    file_bytes += n;
    return buf.data();
  };
  // kReadsInFlight pieces are read at once on their own threads (a virtual or NVMe disk serves
  // several requests faster than one), and piece k is checked and copied out while the
  // following ones read, so the checksums and copies hide behind the disk. Piece k uses
  // buffer k % kReadsInFlight; piece k + kReadsInFlight starts once piece k is copied out.
  std::vector<std::future<const uint8_t*>> in_flight(runs.size());
  auto launch = [&](size_t k) {
    in_flight[k] = std::async(std::launch::async, read_run, std::cref(runs[k]), std::ref(read_buf_[k % kReadsInFlight]));
  };
  for (size_t k = 0; k < std::min(runs.size(), kReadsInFlight); ++k) launch(k);
  for (size_t k = 0; k < runs.size(); ++k) {
    const Run& r = runs[k];
    const uint8_t* data = in_flight[k].get();
    std::string why;
    int64_t n_ok = 0;
    if (data == nullptr) {
      why = "short read of " + std::to_string(r.end - r.first) + " bytes at offset " + std::to_string(r.first);
    } else {
      // Each block carries its own checksums: the ones that pass are good even when another
      // block of the file is damaged (the file is quarantined all the same).
      for (const Want& w : r.wants) {
        const std::string bad = unpack_block(data + (w.offset - r.first), outs[w.i], hashes[w.i]);
        if (!bad.empty()) {
          if (why.empty()) why = bad;
          continue;
        }
        ok[w.i] = 1;
        ++n_ok;
      }
    }
    if (k + kReadsInFlight < runs.size()) launch(k + kReadsInFlight);
    std::lock_guard<std::mutex> lock(mu_);
    counters_.read_blocks += n_ok;
    if (!why.empty() && files_.count(r.seq) != 0) quarantine_locked(r.seq, why);
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_.read_file_bytes += file_bytes.load();
}

bool DiskTier::write_group(uint64_t seq, const std::vector<Pending>& group, FileEntry& entry) {
  std::vector<uint8_t> head;
  head.insert(head.end(), kMagic, kMagic + 8);
  put<uint32_t>(head, kFormatVersion);
  put<uint32_t>(head, uint32_t(options_.identity.size()));
  head.insert(head.end(), options_.identity.begin(), options_.identity.end());
  put<uint32_t>(head, uint32_t(options_.tensor_bytes.size()));
  for (int64_t b : options_.tensor_bytes) put<int64_t>(head, b);
  put<uint32_t>(head, uint32_t(group.size()));
  for (const auto& p : group) put<uint64_t>(head, p.hash);
  put<uint64_t>(head, XXH3_64bits(head.data(), head.size()));

  const fs::path final_path = options_.dir / file_name(seq);
  const fs::path tmp = options_.dir / (file_name(seq) + ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, head.data(), head.size());
  for (const auto& p : group) {
    size_t o = 0;
    for (int64_t n : options_.tensor_bytes) {
      if (!ok) break;
      const uint64_t sum = XXH3_64bits(p.bytes() + o, size_t(n));
      ok = write_all(fd, p.bytes() + o, size_t(n)) &&
           write_all(fd, reinterpret_cast<const uint8_t*>(&sum), sizeof(sum));
      o += size_t(n);
    }
  }
  ok = ok && ::fsync(fd) == 0;
  ok = ::close(fd) == 0 && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, final_path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    return false;
  }
  const int dfd = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  entry.path = final_path;
  entry.data_offset = int64_t(head.size());
  entry.bytes = entry.data_offset + int64_t(group.size()) * stride();
  for (const auto& p : group) entry.hashes.push_back(p.hash);
  return true;
}

void DiskTier::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty() || pins_dirty_; });
    if (pins_dirty_) {  // before blocks: a pin is small, and a restart should find it
      const double now = tier_clock_s();
      std::erase_if(pins_, [now](const auto& p) { return p.second <= now; });
      std::vector<std::pair<uint64_t, double>> pins(pins_.begin(), pins_.end());
      pins_dirty_ = false;
      writing_ = true;
      lock.unlock();
      const bool ok = write_pins(pins);
      lock.lock();
      writing_ = false;
      if (!ok) {
        ++counters_.write_errors;
        if (int64_t held = 0; failure_log_.take(&held)) {
          log::warn("kv disk tier: writing {} session pins to {} failed{}", pins.size(), options_.dir.string(),
                    log::Throttle::held_note(held));
        }
      }
      idle_cv_.notify_all();
      continue;
    }
    if (queue_.empty() && stop_) break;
    cv_.wait_for(lock, std::chrono::duration<double>(options_.group_wait_s), [&] { return stop_ || int32_t(queue_.size()) >= options_.max_group_blocks; });
    // A file is pinned while any of its blocks is: session blocks go to files of their own, so
    // a pin never keeps other blocks past the budget.
    const double now = tier_clock_s();
    auto is_pinned = [&](uint64_t h) {
      auto p = pins_.find(h);
      return p != pins_.end() && p->second > now;
    };
    const bool pinned = is_pinned(queue_.front().hash);
    std::vector<Pending> group;
    for (auto it = queue_.begin(); it != queue_.end() && int32_t(group.size()) < options_.max_group_blocks;) {
      if (is_pinned(it->hash) != pinned) {
        ++it;
        continue;
      }
      group.push_back(std::move(*it));
      it = queue_.erase(it);
    }
    const uint64_t seq = next_seq_++;
    writing_ = true;
    lock.unlock();
    FileEntry entry;
    const bool ok = write_group(seq, group, entry);
    for (auto& p : group) {
      if (p.done) p.done();  // the referenced bytes are not read again
    }
    lock.lock();
    for (const auto& p : group) {
      queued_.erase(p.hash);
      (p.ref != nullptr ? queued_ref_bytes_ : queued_bytes_) -= block_bytes_;
    }
    std::vector<fs::path> evicted;
    if (ok) {
      counters_.written_blocks += int64_t(group.size());
      add_file_locked(seq, std::move(entry));
      evicted = enforce_budget_locked();
    } else {
      ++counters_.write_errors;
      if (int64_t held = 0; failure_log_.take(&held)) {
        log::warn("kv disk tier: writing {} blocks to {} failed{}", group.size(), options_.dir.string(),
                  log::Throttle::held_note(held));
      }
    }
    if (!evicted.empty()) {
      lock.unlock();
      std::error_code ec;
      for (const fs::path& p : evicted) fs::remove(p, ec);
      lock.lock();
    }
    writing_ = false;
    idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

bool DiskTier::flush(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                           [&] { return queue_.empty() && !writing_ && !pins_dirty_; });
}

namespace {
constexpr char kPinsMagic[8] = {'S', 'T', 'R', 'P', 'I', 'N', 'S', '1'};
constexpr const char* kPinsFile = "session_pins.bin";

double wall_clock_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

bool DiskTier::write_pins(const std::vector<std::pair<uint64_t, double>>& pins) const {
  // Expiries go to disk in wall-clock seconds: tier_clock_s() restarts with the machine.
  const double steady = tier_clock_s(), wall = wall_clock_s();
  std::vector<uint8_t> buf(kPinsMagic, kPinsMagic + 8);
  put<uint64_t>(buf, uint64_t(pins.size()));
  for (const auto& [hash, until] : pins) {
    put<uint64_t>(buf, hash);
    put<double>(buf, wall + (until - steady));
  }
  put<uint64_t>(buf, XXH3_64bits(buf.data(), buf.size()));
  const fs::path path = options_.dir / kPinsFile, tmp = options_.dir / (std::string(kPinsFile) + ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, buf.data(), buf.size()) && ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

void DiskTier::load_pins_locked() {
  const fs::path path = options_.dir / kPinsFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string why;
  if (buf.size() < 24 || std::memcmp(buf.data(), kPinsMagic, 8) != 0) {
    why = "not a session pins file (bad magic or too short)";
  } else {
    uint64_t n = 0, sum = 0;
    std::memcpy(&n, buf.data() + 8, 8);
    std::memcpy(&sum, buf.data() + buf.size() - 8, 8);
    if (n > (buf.size() - 24) / 16 || buf.size() != 24 + n * 16) {
      why = "pin count " + std::to_string(n) + " does not match the size " + std::to_string(buf.size());
    } else if (XXH3_64bits(buf.data(), buf.size() - 8) != sum) {
      why = "checksum mismatch";
    } else {
      const double steady = tier_clock_s(), wall = wall_clock_s();
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t hash;
        double until;
        std::memcpy(&hash, buf.data() + 16 + i * 16, 8);
        std::memcpy(&until, buf.data() + 24 + i * 16, 8);
        if (until > wall) {
          double& u = pins_[hash];
          u = std::max(u, steady + (until - wall));
        }
      }
    }
  }
  if (!why.empty()) quarantine_path(path, why);
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskTierStats s = counters_;
  s.files = int64_t(files_.size());
  s.bytes = total_bytes_;
  s.blocks = int64_t(index_.size());
  s.queued_bytes = queued_bytes_ + queued_ref_bytes_;
  return s;
}

}  // namespace strata
