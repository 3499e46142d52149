#pragma once
// Storing products' results from fp32 accumulators: one value or two adjacent columns, into fp32
// (overwritten, or added to when accumulating) or bf16 (rounded to nearest, overwritten). Shared
// by the routed-expert kernels (expert_gemm.cu, expert_wgmma.cu).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::backend::cuda {

__device__ inline void put(float* p, float v, bool accumulate) {
  *p = accumulate ? *p + v : v;
}
__device__ inline void put(__nv_bfloat16* p, float v, bool) {
  *p = __float2bfloat16(v);
}
// Two adjacent columns; one 8- or 4-byte access where the address allows.
__device__ inline void put2(float* p, float v0, float v1, bool accumulate) {
  if (reinterpret_cast<uintptr_t>(p) % 8 == 0) {
    float2* q = reinterpret_cast<float2*>(p);
    if (accumulate) {
      const float2 o = *q;
      v0 += o.x;
      v1 += o.y;
    }
    *q = make_float2(v0, v1);
  } else {
    put(p, v0, accumulate);
    put(p + 1, v1, accumulate);
  }
}
__device__ inline void put2(__nv_bfloat16* p, float v0, float v1, bool) {
  if (reinterpret_cast<uintptr_t>(p) % 4 == 0) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
  } else {
    *p = __float2bfloat16(v0);
    p[1] = __float2bfloat16(v1);
  }
}

}  // namespace moeplan::backend::cuda
