#include "engine/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/log.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'C', 'K', 'P', 'T', '1'};
constexpr uint32_t kVersion = 2;  // 2: the state identity
constexpr size_t kMaxField = size_t(1) << 30;  // no field of a sane checkpoint is larger

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

struct Reader {
  std::string_view in;
  size_t pos = 0;
  template <typename T>
  bool get(T* v) {
    if (in.size() - pos < sizeof(T)) return false;
    std::memcpy(v, in.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }
  bool bytes(size_t n, std::string* out) {
    if (in.size() - pos < n) return false;
    out->assign(in.data() + pos, n);
    pos += n;
    return true;
  }
};

void put_ids(std::ostringstream& o, const char* name, const std::vector<int32_t>& ids) {
  o << name << '=';
  for (int32_t id : ids) o << id << ',';
  o << ';';
}

// Writes bytes to path atomically: temp file, fsync, rename, directory fsync.
bool write_atomic(const fs::path& path, const std::string& bytes, std::string* why) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = "cannot create " + tmp.string() + ": " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  bool ok = true;
  while (ok && done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += size_t(n);
  }
  ok = ok && ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    *why = "cannot write " + path.string() + ": " + (ec ? ec.message() : std::string(std::strerror(errno)));
    fs::remove(tmp, ec);
    return false;
  }
  const int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return true;
}

}  // namespace

std::string checkpoint_key(const GenerationRequest& r, const std::vector<int32_t>& eos_ids, bool seed_drawn) {
  const SamplingParams& s = r.sampling;
  std::ostringstream o;
  o.precision(9);
  put_ids(o, "prompt", r.prompt);
  o << "temp=" << s.temperature << ";top_k=" << s.top_k << ";top_p=" << s.top_p << ";min_p=" << s.min_p
    << ";rep=" << s.repetition_penalty << ";pres=" << s.presence_penalty << ";freq=" << s.frequency_penalty << ";bias=";
  for (const auto& [id, b] : s.logit_bias) o << id << ':' << b << ',';
  o << ";seed=";
  if (seed_drawn) {
    o << "drawn";
  } else {
    o << s.seed;
  }
  o << ";vocab_limit=" << s.vocab_limit << ";max_tokens=" << r.max_tokens << ';';
  put_ids(o, "stop", r.stop_ids);
  o << "ignore_eos=" << (r.ignore_eos ? 1 : 0) << ';';
  if (!r.ignore_eos) put_ids(o, "eos", eos_ids);
  if (r.grammar) o << "grammar=" << r.grammar_key.size() << ':' << r.grammar_key << ';';
  return o.str();
}

std::string encode_checkpoint(const Checkpoint& c) {
  std::string out(kMagic, sizeof(kMagic));
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, c.run);
  put<int64_t>(out, c.generation);
  put<uint32_t>(out, uint32_t(c.identity.size()));
  out += c.identity;
  put<uint32_t>(out, uint32_t(c.key.size()));
  out += c.key;
  put<uint32_t>(out, uint32_t(c.generated.size()));
  for (int32_t id : c.generated) put<int32_t>(out, id);
  put<uint32_t>(out, uint32_t(c.sampler.size()));
  out += c.sampler;
  put<uint64_t>(out, XXH3_64bits(out.data(), out.size()));
  return out;
}

Result<Checkpoint> decode_checkpoint(std::string_view bytes) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kCorrupt, m); };
  if (bytes.size() < sizeof(kMagic) + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("not a checkpoint (bad magic)");
  }
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  if (XXH3_64bits(bytes.data(), bytes.size() - 8) != sum) return bad("checksum mismatch");
  Reader r{bytes.substr(0, bytes.size() - 8), sizeof(kMagic)};
  Checkpoint c;
  uint32_t version = 0, n_identity = 0, n_key = 0, n_ids = 0, n_sampler = 0;
  if (!r.get(&version) || version != kVersion) return bad("unsupported version " + std::to_string(version));
  if (!r.get(&c.run) || !r.get(&c.generation) || !r.get(&n_identity) || n_identity > kMaxField ||
      !r.bytes(n_identity, &c.identity) || !r.get(&n_key) || n_key > kMaxField || !r.bytes(n_key, &c.key)) {
    return bad("truncated header");
  }
  if (!r.get(&n_ids) || n_ids > kMaxField / 4) return bad("truncated generated ids");
  c.generated.resize(n_ids);
  for (auto& id : c.generated) {
    if (!r.get(&id) || id < 0) return bad("truncated or negative generated id");
  }
  if (!r.get(&n_sampler) || n_sampler > kMaxField || !r.bytes(n_sampler, &c.sampler)) return bad("truncated sampler state");
  if (r.pos != r.in.size()) return bad("trailing bytes");
  if (c.generated.empty() || c.generation != int64_t(c.generated.size())) {
    return bad("generation " + std::to_string(c.generation) + " does not match " + std::to_string(c.generated.size()) +
               " generated ids");
  }
  return c;
}

CheckpointStore::CheckpointStore(fs::path dir, std::string identity) : dir_(std::move(dir)), identity_(std::move(identity)) {
  std::random_device rd;
  run_base_ = ((uint64_t(rd()) << 32) ^ uint64_t(rd())) & ~uint64_t(0xFFFFFFFF);
}

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::open(const std::string& dir, const std::string& identity) {
  if (dir.empty()) return make_error(ErrorCode::kInvalidArgument, "checkpoint dir must not be empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return make_error(ErrorCode::kIo, "checkpoint dir '" + dir + "': " + (ec ? ec.message() : "not a directory"));
  }
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    if (de.is_regular_file() && de.path().filename().string().ends_with(".tmp")) fs::remove(de.path(), ec);
  }
  return std::unique_ptr<CheckpointStore>(new CheckpointStore(dir, identity));
}

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::open_redis(const RedisUrl& url, const std::string& identity) {
  auto client = std::make_unique<RedisClient>(url, 1.0);
  if (auto st = client->connect(); !st.ok()) return st.error();
  std::unique_ptr<CheckpointStore> s(new CheckpointStore(fs::path(), identity));
  s->redis_ = std::move(client);
  return s;
}

std::string CheckpointStore::redis_key(const std::string& key) const {
  char name[40];
  std::snprintf(name, sizeof(name), "strata:ckpt:%016llx", static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return name;
}

std::optional<Checkpoint> CheckpointStore::redis_read_io_locked(const std::string& key) {
  const std::string k = redis_key(key);
  auto r = redis_->pipeline({{"GET", k}});
  if (!r.ok()) {
    log::warn("checkpoints: Redis read of {} failed ({}); the request runs from the start", k, r.error().message);
    return std::nullopt;
  }
  if ((*r)[0].kind != RedisReply::kString) return std::nullopt;
  auto c = decode_checkpoint((*r)[0].str);
  if (!c.ok()) {
    log::warn("checkpoint {} in Redis is bad ({}); deleted, the request runs from the start", k, c.error().message);
    (void)redis_->pipeline({{"DEL", k}});
    return std::nullopt;
  }
  return std::move(c).value();
}

uint64_t CheckpointStore::new_run() {
  std::lock_guard<std::mutex> lock(mu_);
  return run_base_ + ++next_run_;
}

fs::path CheckpointStore::path_of(const std::string& key) const {
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.ckpt", static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return dir_ / name;
}

void CheckpointStore::quarantine_io_locked(const fs::path& path, const std::string& why) {
  std::error_code ec;
  const fs::path qdir = dir_ / "quarantine";
  fs::create_directories(qdir, ec);
  fs::rename(path, qdir / path.filename(), ec);
  if (ec) {
    log::warn("checkpoint {} is bad ({}) and could not be quarantined ({}); removing it", path.string(), why, ec.message());
    fs::remove(path, ec);
    return;
  }
  log::warn("checkpoint {} is bad ({}); quarantined, the request runs from the start", path.string(), why);
}

namespace {

// The file's bytes decoded; nullopt: no file; an error: why it is bad.
std::optional<Result<Checkpoint>> read_checkpoint_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Result<Checkpoint>(make_error(ErrorCode::kIo, "unreadable"));
  return decode_checkpoint(bytes);
}

}  // namespace

std::optional<Checkpoint> CheckpointStore::read_file_io_locked(const fs::path& path) {
  auto r = read_checkpoint_file(path);
  if (!r) return std::nullopt;
  if (!r->ok()) {
    quarantine_io_locked(path, r->error().message);
    return std::nullopt;
  }
  return std::move(*r).value();
}

std::optional<Checkpoint> CheckpointStore::read_file(const fs::path& path) {
  auto r = read_checkpoint_file(path);
  if (!r) return std::nullopt;
  if (r->ok()) return std::move(*r).value();
  std::lock_guard<std::mutex> io(io_mu_);
  return read_file_io_locked(path);
}

bool CheckpointStore::retired(uint64_t run) const {
  std::lock_guard<std::mutex> lock(mu_);
  return retired_.count(run) != 0;
}

std::optional<Checkpoint> CheckpointStore::load(const std::string& key) {
  const fs::path path = redis_ ? fs::path(redis_key(key)) : path_of(key);
  std::optional<Checkpoint> c;
  if (redis_) {
    std::lock_guard<std::mutex> io(io_mu_);
    c = redis_read_io_locked(key);
  } else {
    c = read_file(path);
  }
  if (!c || c->key != key) return std::nullopt;
  if (c->identity != identity_) {
    foreign_skipped_.fetch_add(1, std::memory_order_relaxed);
    log::warn("checkpoint {} was written under another state identity (other weights, backend or KV layout); "
              "the request runs from the start",
              path.string());
    return std::nullopt;
  }
  if (retired(c->run)) return std::nullopt;  // a finished run whose removal is queued
  return c;
}

void CheckpointStore::retire(uint64_t run) {
  std::lock_guard<std::mutex> lock(mu_);
  retired_.insert(run);
}

int64_t CheckpointStore::foreign_skipped() const { return foreign_skipped_.load(std::memory_order_relaxed); }

Result<bool> CheckpointStore::write(Checkpoint c) {
  c.identity = identity_;
  const std::string bytes = encode_checkpoint(c);
  // A run retired from here on is retired by CheckpointWriter::remove, whose removal the one
  // writer thread runs after this write.
  if (retired(c.run)) return false;
  std::lock_guard<std::mutex> io(io_mu_);
  if (redis_) {
    const std::string k = redis_key(c.key);
    auto r = redis_->pipeline({{"SET", k, bytes}});
    if (!r.ok()) return make_error(ErrorCode::kIo, "checkpoint " + k + ": " + r.error().message);
    if ((*r)[0].kind == RedisReply::kError) return make_error(ErrorCode::kIo, "checkpoint " + k + ": " + (*r)[0].str);
    return true;
  }
  std::string why;
  if (!write_atomic(path_of(c.key), bytes, &why)) return make_error(ErrorCode::kIo, why);
  return true;
}

void CheckpointStore::remove(const std::string& key, uint64_t run, int64_t generation) {
  retire(run);
  std::lock_guard<std::mutex> io(io_mu_);
  if (redis_) {
    auto c = redis_read_io_locked(key);
    if (!c || c->key != key) return;
    if (c->identity == identity_ && c->run != run && c->generation > generation) return;  // a newer write of another run
    (void)redis_->pipeline({{"DEL", redis_key(key)}});
    return;
  }
  const fs::path path = path_of(key);
  auto c = read_file_io_locked(path);
  if (!c || c->key != key) return;
  if (c->identity == identity_ && c->run != run && c->generation > generation) return;  // a newer write of another run
  std::error_code ec;
  fs::remove(path, ec);
}

}  // namespace strata
