// The content identity of a checkpoint directory: an XXH3-128 of every file that decides the
// numbers (config.json, the safetensors index when sharded, every weight file it names),
// cached by each file's stamp so a restart of a large model does not read it all again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata {

// What says a file is unchanged since it was hashed. A `cp -p` of other bytes over the file
// keeps size and mtime but moves ctime; a rename over it moves the inode.
struct FileStamp {
  uint64_t size = 0;      // bytes
  int64_t mtime_ns = 0;   // st_mtim, ns since the epoch
  int64_t ctime_ns = 0;   // st_ctim, ns since the epoch
  uint64_t dev = 0;
  uint64_t inode = 0;
  bool operator==(const FileStamp&) const = default;
};

Result<FileStamp> stat_file(const std::string& path);

// XXH3-128 of the file's bytes, 32 hex digits; read in large sequential chunks.
Result<std::string> hash_file_content(const std::string& path);

// The files of `dir` whose bytes decide the model's numbers, in a fixed order: config.json,
// then model.safetensors.index.json and the shards it names (sorted), or model.safetensors.
Result<std::vector<std::string>> weight_files(const std::string& dir);

// Files hashed in full and files whose hash came from the cache, of one weight_identity() call.
struct WeightHashStats {
  int32_t hashed_files = 0;
  int32_t cached_files = 0;
};

// The hash cache: a file of this name inside its directory, this first line, then one
// weight_hash_cache_line() per file.
inline constexpr const char* kWeightHashCacheFile = "weight_hashes.txt";
inline constexpr const char* kWeightHashCacheHeader = "strata-weight-hashes 1";

// One line of the hash cache: `hash` is the content hash of the file at absolute path `path`
// as it was when stat_file() gave `stamp`. Lines carry their own checksum; a damaged one is
// dropped when the cache is read.
std::string weight_hash_cache_line(const std::string& path, const FileStamp& stamp, const std::string& hash);

// "weights=<hex>;config=<hex>": the XXH3-128 over the content hashes of weight_files(dir)
// (each with its file name), and of config.json alone. cache_dir non-empty: hashes are looked
// up in and stored to cache_dir/kWeightHashCacheFile, keyed by absolute path and FileStamp;
// an unreadable or damaged cache (or entry) only means rehashing. Errors name the file.
Result<std::string> weight_identity(const std::string& dir, const std::string& cache_dir,
                                    WeightHashStats* stats = nullptr);

// XXH3-128 of config.json's bytes (32 hex digits); a missing file hashes as empty.
std::string config_content_hash(const std::string& dir);

}  // namespace strata
