#pragma once
// WMMA for the CPU emulation of CUDA (see moeplan_cuda_emu.hpp). The hardware spreads a fragment
// over the 32 lanes in an unspecified layout; here every lane holds the whole tile, which gives
// the same results through the public API (load, store, fill, mma) and no element access.
#include <cstdint>

#include "moeplan_cuda_emu.hpp"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K>
struct shape_of;
template <int M, int N, int K>
struct shape_of<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct shape_of<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct shape_of<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = shape_of<Use, M, N, K>::rows, cols = shape_of<Use, M, N, K>::cols;
  using Stored = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, float, T>;
  Stored v[rows * cols];  // row-major, whole tile (bf16 values held exactly as float)
};

namespace detail {
inline void check(const void* p, unsigned ldm, std::size_t elem, const char* op) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) moeplan_emu::fault(op);
  if ((ldm * elem) % 16 != 0) moeplan_emu::fault(op);
  moeplan_emu::check_warp_uniform(p, ldm, op);
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout, class U>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, U value) {
  for (auto& x : f.v) x = float(value);
}

template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  detail::check(p, ldm, sizeof(T),
                "wmma::load_matrix_sync: pointer not 32-byte aligned, "
                "stride not a multiple of 16 bytes, or not warp-uniform");
  using F = fragment<Use, M, N, K, T, Layout>;
  constexpr bool row = std::is_same_v<Layout, row_major>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.v[r * F::cols + c] = float(row ? p[r * ldm + c] : p[c * ldm + r]);
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                      layout_t layout) {
  detail::check(p, ldm, 4, "wmma::load_matrix_sync (accumulator): bad pointer or stride");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.v[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                       layout_t layout) {
  detail::check(p, ldm, 4, "wmma::store_matrix_sync: bad pointer or stride");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.v[r * N + c];
  moeplan_emu::warp_barrier();  // every lane's store is done before any lane reads
}

// D = A·B + C in fp32 (products of bf16 are exact in fp32; summed in double, rounded once).
template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  moeplan_emu::warp_barrier();
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = c.v[i * N + j];
      for (int k = 0; k < K; ++k) s += double(a.v[i * K + k]) * double(b.v[k * N + j]);
      out[i * N + j] = float(s);
    }
  for (int i = 0; i < M * N; ++i) d.v[i] = out[i];
}

}  // namespace nvcuda::wmma
