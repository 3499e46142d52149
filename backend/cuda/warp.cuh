#pragma once
// Warp-wide reductions shared by the CUDA translation units: butterfly shuffles over all 32 lanes
// (every lane gets the result; a fixed order, so the same bits every run).
#include <cuda_runtime.h>

namespace moeplan::backend::cuda {

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ double warp_sum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

}  // namespace moeplan::backend::cuda
