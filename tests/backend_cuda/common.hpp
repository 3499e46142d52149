#pragma once
// Shared helpers of the GPU tests: seeded random inputs, device round trips, relative errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "moeplan/backend/cuda/device.hpp"

namespace gputest {

using moeplan::backend::cuda::DeviceBuffer;
using moeplan::backend::cuda::DType;

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// A device buffer filled with NaN bytes (0xFF), so an unwritten output shows.
inline DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  std::vector<unsigned char> p(bytes, 0xFF);
  b.upload(p.data(), bytes);
  return b;
}

inline std::vector<float> download_f(const DeviceBuffer& b, size_t n, DType t = DType::f32) {
  std::vector<float> out(n);
  if (t == DType::f32) {
    b.download(out.data(), n * 4);
  } else {
    std::vector<uint16_t> h(n);
    b.download(h.data(), n * 2);
    for (size_t i = 0; i < n; ++i) out[i] = moeplan::backend::cuda::bf16_to_float(h[i]);
  }
  return out;
}

// ‖a − b‖ / ‖b‖ in double; NaN anywhere gives infinity.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

}  // namespace gputest
