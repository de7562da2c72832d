// Safetensors checkpoints, memory-mapped: one file or a sharded set named by
// model.safetensors.index.json. Every tensor's header entry is validated against the file it
// lives in (dtype known, offsets inside the data section, no overlaps, size == shape x dtype),
// so a tensor handed out is always readable in full.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "tensor/dtype.h"

namespace strata {

// A read-only mapping of one file; unmapped when the last owner goes.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping of `file`
  size_t n_bytes = 0;
  std::string file;            // path of the file holding it (for error messages)

  int64_t numel() const;
  std::string shape_string() const;  // e.g. "[512, 64]"
};

// All tensors of a checkpoint directory (or of one file). Keeps its mappings alive; weights
// that alias the mapping must not outlive the archive (models hold a shared_ptr to it).
class SafetensorsArchive {
 public:
  // `dir`/model.safetensors.index.json when present, else `dir`/model.safetensors.
  static Result<std::shared_ptr<SafetensorsArchive>> open_dir(const std::string& dir);
  // One .safetensors file.
  static Result<std::shared_ptr<SafetensorsArchive>> open_file(const std::string& path);

  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  bool has(const std::string& name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

  // Tensors the loader derives from stored ones (a quantized weight dequantized to f32 for a
  // family that slices it), owned here so that weights aliasing them live as long as the
  // archive. The first one added under a name wins; find_derived returns null when absent.
  const TensorInfo* add_derived(TensorInfo info, std::shared_ptr<void> storage) const;
  const TensorInfo* find_derived(const std::string& name) const;

 private:
  Status add_file(const std::string& path, const std::vector<std::string>* expected_names);

  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
  mutable std::mutex derived_mu_;
  mutable std::map<std::string, std::pair<TensorInfo, std::shared_ptr<void>>> derived_;  // guarded by derived_mu_
};

// Parses and validates one file's header against its mapping; appends its tensors to `out`.
// Exposed for tests of the validation rules.
Status parse_safetensors(const MappedFile& file, std::vector<TensorInfo>* out);

}  // namespace strata
