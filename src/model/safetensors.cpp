#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const ErrorCode code = errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo;
    return make_error(code, "cannot open " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string msg = std::strerror(errno);
    ::close(fd);
    return make_error(ErrorCode::kIo, "cannot stat " + path + ": " + msg);
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = size_t(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string msg = std::strerror(errno);
      ::close(fd);
      return make_error(ErrorCode::kIo, "cannot map " + path + ": " + msg);
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

Error corrupt(const std::string& path, const std::string& what) {
  return make_error(ErrorCode::kCorrupt, path + ": " + what);
}

}  // namespace

Status parse_safetensors(const MappedFile& file, std::vector<TensorInfo>* out) {
  const std::string& path = file.path();
  if (file.size() < 8) {
    return corrupt(path, "truncated: " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);  // little-endian on every supported host
  if (header_len > file.size() - 8) {
    return corrupt(path, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                             std::to_string(file.size()) + " bytes)");
  }
  const char* hdr = reinterpret_cast<const char*>(file.data() + 8);
  json j = json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(path, "header is not valid JSON");
  if (!j.is_object()) return corrupt(path, "header is not a JSON object");

  const size_t data_begin = 8 + size_t(header_len);
  const size_t data_size = file.size() - data_begin;
  std::vector<TensorInfo> infos;
  std::vector<std::pair<size_t, size_t>> ranges;  // [begin, end) per tensor, same order as infos
  for (const auto& [name, e] : j.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "tensor '" + name + "'";
    if (!e.is_object()) return corrupt(path, where + ": entry is not an object");
    if (!e.contains("dtype") || !e["dtype"].is_string()) return corrupt(path, where + ": field 'dtype' missing or not a string");
    if (!e.contains("shape") || !e["shape"].is_array()) return corrupt(path, where + ": field 'shape' missing or not an array");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      return corrupt(path, where + ": field 'data_offsets' missing or not a pair");
    }
    TensorInfo t;
    t.name = name;
    t.file = path;
    const std::string dtype = e["dtype"].get<std::string>();
    if (!dtype_from_safetensors(dtype, &t.dtype)) return corrupt(path, where + ": unknown dtype '" + dtype + "'");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) return corrupt(path, where + ": field 'shape' holds a non-integer or negative dimension");
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return corrupt(path, where + ": field 'data_offsets' holds a non-integer or negative offset");
    }
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size) {
      return corrupt(path, where + ": field 'data_offsets' [" + std::to_string(b) + ", " + std::to_string(en) +
                               "] out of range of the data section (" + std::to_string(data_size) +
                               " bytes; file truncated or header lying)");
    }
    const uint64_t want = uint64_t(dtype_row_bytes(t.dtype, t.numel()));
    if (en - b != want) {
      return corrupt(path, where + ": field 'data_offsets' spans " + std::to_string(en - b) + " bytes but shape " +
                               t.shape_string() + " x " + dtype + " needs " + std::to_string(want));
    }
    t.data = file.data() + data_begin + b;
    t.n_bytes = size_t(en - b);
    infos.push_back(std::move(t));
    ranges.emplace_back(size_t(b), size_t(en));
  }
  std::vector<size_t> order(infos.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  size_t max_end = 0;  // furthest end among tensors seen so far in offset order
  size_t max_end_owner = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& cur = ranges[order[i]];
    if (cur.second > cur.first && cur.first < max_end) {
      return corrupt(path, "field 'data_offsets' of tensors '" + infos[max_end_owner].name + "' and '" +
                               infos[order[i]].name + "' overlap");
    }
    if (cur.second > max_end) {
      max_end = cur.second;
      max_end_owner = order[i];
    }
  }
  for (auto& t : infos) out->push_back(std::move(t));
  return Status();
}

Status SafetensorsArchive::add_file(const std::string& path, const std::vector<std::string>* expected_names) {
  auto file = MappedFile::open(path);
  if (!file.ok()) return file.error();
  std::vector<TensorInfo> infos;
  STRATA_RETURN_IF_ERROR(parse_safetensors(**file, &infos));
  for (auto& t : infos) {
    if (tensors_.count(t.name)) {
      return corrupt(path, "tensor '" + t.name + "' also appears in " + tensors_[t.name].file);
    }
    tensors_.emplace(t.name, std::move(t));
  }
  if (expected_names != nullptr) {
    for (const auto& n : *expected_names) {
      if (!tensors_.count(n)) {
        return corrupt(path, "tensor '" + n + "' listed in model.safetensors.index.json is not in the file");
      }
    }
  }
  files_.push_back(std::move(*file));
  return Status();
}

Result<std::shared_ptr<SafetensorsArchive>> SafetensorsArchive::open_file(const std::string& path) {
  auto a = std::make_shared<SafetensorsArchive>();
  STRATA_RETURN_IF_ERROR(a->add_file(path, nullptr));
  return a;
}

Result<std::shared_ptr<SafetensorsArchive>> SafetensorsArchive::open_dir(const std::string& dir) {
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec)) {
      return make_error(ErrorCode::kNotFound, "no weights in " + dir + ": neither model.safetensors nor " +
                                                  "model.safetensors.index.json exists");
    }
    return open_file(single_path.string());
  }
  std::ifstream in(index_path);
  if (!in) return make_error(ErrorCode::kIo, "cannot read " + index_path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return make_error(ErrorCode::kCorrupt, index_path.string() + ": not valid JSON");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return make_error(ErrorCode::kCorrupt, index_path.string() + ": field 'weight_map' missing or not an object");
  }
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, f] : j["weight_map"].items()) {
    if (!f.is_string()) return make_error(ErrorCode::kCorrupt, index_path.string() + ": weight_map['" + name + "'] is not a string");
    const std::string fname = f.get<std::string>();
    if (fname.find('/') != std::string::npos || fname == "..") {
      return make_error(ErrorCode::kCorrupt, index_path.string() + ": weight_map['" + name + "'] names a file outside the directory: " + fname);
    }
    by_file[fname].push_back(name);
  }
  if (by_file.empty()) return make_error(ErrorCode::kCorrupt, index_path.string() + ": field 'weight_map' is empty");
  auto a = std::make_shared<SafetensorsArchive>();
  for (const auto& [fname, names] : by_file) {
    const fs::path p = fs::path(dir) / fname;
    if (!fs::exists(p, ec)) {
      return make_error(ErrorCode::kNotFound, "shard " + p.string() + " named by " + index_path.string() + " does not exist");
    }
    STRATA_RETURN_IF_ERROR(a->add_file(p.string(), &names));
  }
  return a;
}

const TensorInfo* SafetensorsArchive::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsArchive::names() const {
  std::vector<std::string> v;
  v.reserve(tensors_.size());
  for (const auto& [n, t] : tensors_) v.push_back(n);
  return v;
}

const TensorInfo* SafetensorsArchive::add_derived(TensorInfo info, std::shared_ptr<void> storage) const {
  std::lock_guard<std::mutex> lock(derived_mu_);
  const std::string name = info.name;
  auto it = derived_.emplace(name, std::make_pair(std::move(info), std::move(storage))).first;
  return &it->second.first;
}

const TensorInfo* SafetensorsArchive::find_derived(const std::string& name) const {
  std::lock_guard<std::mutex> lock(derived_mu_);
  auto it = derived_.find(name);
  return it == derived_.end() ? nullptr : &it->second.first;
}

}  // namespace strata
