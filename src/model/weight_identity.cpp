#include "model/weight_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/log.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = size_t(16) << 20;  // bytes per read()

std::string hex128(XXH128_hash_t h) {
  char b[33];
  std::snprintf(b, sizeof(b), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return b;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

struct CacheEntry {
  FileStamp stamp;
  std::string hash;
};

// One line per file: hash, size, mtime, ctime, dev, inode, absolute path, then the XXH3-64 of
// everything before it on the line (a damaged line is dropped, never believed).
std::string cache_line(const std::string& path, const CacheEntry& e) {
  std::ostringstream o;
  o << e.hash << '\t' << e.stamp.size << '\t' << e.stamp.mtime_ns << '\t' << e.stamp.ctime_ns << '\t' << e.stamp.dev << '\t'
    << e.stamp.inode << '\t' << path;
  const std::string body = o.str();
  return body + '\t' + hex64(XXH3_64bits(body.data(), body.size()));
}

bool parse_cache_line(const std::string& line, std::string* path, CacheEntry* e) {
  const size_t last = line.rfind('\t');
  if (last == std::string::npos) return false;
  const std::string body = line.substr(0, last);
  if (line.substr(last + 1) != hex64(XXH3_64bits(body.data(), body.size()))) return false;
  std::istringstream in(body);
  std::string hash;
  if (!std::getline(in, hash, '\t') || hash.size() != 32) return false;
  FileStamp s;
  char tab = 0;
  if (!(in >> s.size) || !in.get(tab) || !(in >> s.mtime_ns) || !in.get(tab) || !(in >> s.ctime_ns) || !in.get(tab) ||
      !(in >> s.dev) || !in.get(tab) || !(in >> s.inode) || !in.get(tab)) {
    return false;
  }
  std::getline(in, *path);
  if (path->empty()) return false;
  e->stamp = s;
  e->hash = hash;
  return true;
}

std::map<std::string, CacheEntry> load_cache(const fs::path& file) {
  std::map<std::string, CacheEntry> out;
  std::ifstream in(file);
  if (!in) return out;
  std::string line;
  if (!std::getline(in, line) || line != kWeightHashCacheHeader) {
    log::warn("weight hash cache {} has an unknown header; rehashing", file.string());
    return out;
  }
  int32_t bad = 0;
  while (std::getline(in, line)) {
    std::string path;
    CacheEntry e;
    if (parse_cache_line(line, &path, &e)) {
      out[path] = e;
    } else {
      ++bad;
    }
  }
  if (bad > 0) log::warn("weight hash cache {}: {} damaged entries dropped", file.string(), bad);
  return out;
}

// Temporary file, then rename: a reader sees the old cache or the new one, never half of one.
void save_cache(const fs::path& file, const std::map<std::string, CacheEntry>& entries) {
  const fs::path tmp = file.string() + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kWeightHashCacheHeader << '\n';
    for (const auto& [path, e] : entries) out << cache_line(path, e) << '\n';
    if (!out) {
      log::warn("cannot write the weight hash cache {}; the next start hashes the weights again", tmp.string());
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) {
    log::warn("cannot write the weight hash cache {}: {}", file.string(), ec.message());
    fs::remove(tmp, ec);
  }
}

}  // namespace

std::string weight_hash_cache_line(const std::string& path, const FileStamp& stamp, const std::string& hash) {
  return cache_line(path, CacheEntry{stamp, hash});
}

Result<FileStamp> stat_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return make_error(ErrorCode::kIo, "cannot stat " + path + ": " + std::strerror(errno));
  }
  FileStamp s;
  s.size = uint64_t(st.st_size);
  s.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  s.dev = uint64_t(st.st_dev);
  s.inode = uint64_t(st.st_ino);
  return s;
}

Result<std::string> hash_file_content(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorCode::kIo, "cannot open " + path + ": " + std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  std::vector<char> buf(kChunk);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      XXH3_freeState(state);
      ::close(fd);
      return make_error(ErrorCode::kIo, "cannot read " + path + ": " + why);
    }
    if (n == 0) break;
    XXH3_128bits_update(state, buf.data(), size_t(n));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  ::close(fd);
  return hex128(h);
}

Result<std::vector<std::string>> weight_files(const std::string& dir) {
  const fs::path d(dir);
  std::vector<std::string> out{(d / "config.json").string()};
  const fs::path index = d / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(index, ec)) {
    const fs::path single = d / "model.safetensors";
    if (!fs::exists(single, ec)) {
      return make_error(ErrorCode::kNotFound, "no weights in " + dir + ": neither model.safetensors nor " +
                                                  "model.safetensors.index.json exists");
    }
    out.push_back(single.string());
    return out;
  }
  std::ifstream in(index);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return make_error(ErrorCode::kCorrupt, index.string() + ": field 'weight_map' missing or not an object");
  }
  std::set<std::string> shards;
  for (const auto& [name, f] : j["weight_map"].items()) {
    if (f.is_string()) shards.insert(f.get<std::string>());
  }
  out.push_back(index.string());
  for (const auto& s : shards) out.push_back((d / s).string());
  return out;
}

std::string config_content_hash(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  auto h = hash_file_content(path);
  return h.ok() ? *h : hex128(XXH3_128bits(nullptr, 0));
}

Result<std::string> weight_identity(const std::string& dir, const std::string& cache_dir, WeightHashStats* stats) {
  auto files = weight_files(dir);
  if (!files.ok()) return files.error();
  WeightHashStats local;
  const fs::path cache_file = cache_dir.empty() ? fs::path() : fs::path(cache_dir) / kWeightHashCacheFile;
  std::map<std::string, CacheEntry> cache;
  if (!cache_dir.empty()) cache = load_cache(cache_file);
  bool cache_changed = false;
  std::string all;    // file name and content hash of every file, in order
  std::string config;
  for (const std::string& f : *files) {
    std::error_code ec;
    const std::string abs = fs::absolute(f, ec).lexically_normal().string();
    auto before = stat_file(abs);
    if (!before.ok()) return before.error();
    std::string hash;
    auto it = cache.find(abs);
    if (it != cache.end() && it->second.stamp == *before) {
      hash = it->second.hash;
      ++local.cached_files;
    } else {
      auto h = hash_file_content(abs);
      if (!h.ok()) return h.error();
      hash = *h;
      ++local.hashed_files;
      // A file that changed while it was read is not cached: its hash may be of neither version.
      auto after = stat_file(abs);
      if (after.ok() && *after == *before) {
        cache[abs] = CacheEntry{*before, hash};
        cache_changed = true;
      } else if (it != cache.end()) {
        cache.erase(it);
        cache_changed = true;
      }
    }
    if (fs::path(f).filename() == "config.json") config = hash;
    all += fs::path(f).filename().string() + '=' + hash + ';';
  }
  if (!cache_dir.empty()) {
    // Entries of files that are gone are dropped; those of other models stay (switching models
    // back and forth does not rehash).
    for (auto it = cache.begin(); it != cache.end();) {
      std::error_code ec;
      if (!fs::exists(it->first, ec)) {
        it = cache.erase(it);
        cache_changed = true;
      } else {
        ++it;
      }
    }
    if (cache_changed) {
      std::error_code ec;
      fs::create_directories(cache_dir, ec);
      save_cache(cache_file, cache);
    }
  }
  if (stats != nullptr) *stats = local;
  return "weights=" + hex128(XXH3_128bits(all.data(), all.size())) + ";config=" + config;
}

}  // namespace strata
