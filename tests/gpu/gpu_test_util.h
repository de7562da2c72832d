// Helpers shared by the GPU tests: device buffers, bf16 random data, the oracle's error measure.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace strata::gpu_test {

#define ASSERT_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

// The repository root: $STRATA_SOURCE_DIR when set (the tree sits elsewhere on the GPU machine),
// else the build's source directory.
inline std::string source_dir() {
  const char* e = std::getenv("STRATA_SOURCE_DIR");
  return e != nullptr && *e != '\0' ? std::string(e) : std::string(STRATA_SOURCE_DIR);
}

// A reference model's directory: tests/data/reference/models/NAME under source_dir().
inline std::string model_path(const std::string& name) { return source_dir() + "/tests/data/reference/models/" + name; }

inline bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc of " << n * sizeof(T) << " bytes failed";
      p = nullptr;
    }
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& v) { cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  // Poisons the buffer (0xFF bytes: NaN in f32 and bf16) so an unwritten element fails.
  void poison() { cudaMemset(p, 0xff, std::max<size_t>(1, n) * sizeof(T)); }
};

// A fresh seed per run; printed so a failure can be replayed.
inline uint32_t fresh_seed() {
  const uint32_t s = std::random_device{}();
  std::printf("seed %u\n", s);
  return s;
}

// n values uniform in [-scale, scale], rounded to bf16: the bits and their exact f32 values.
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> f;
};
inline Bf16Data random_bf16(std::mt19937& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  Bf16Data d;
  d.bits.resize(n);
  d.f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.bits[i] = f32_to_bf16(u(rng));
    d.f[i] = bf16_to_f32(d.bits[i]);
  }
  return d;
}
inline std::vector<float> random_f32(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}
inline std::vector<float> bf16_to_floats(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

// max|got - ref| / max|ref|; NaN in got counts as infinite error.
inline double max_norm_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(ref[i]));
    if (std::isnan(e)) return INFINITY;
    num = std::max(num, e);
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return den == 0.0 ? num : num / den;
}

}  // namespace strata::gpu_test
