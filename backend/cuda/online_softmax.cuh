#pragma once
// The online softmax's running-max step shared by the attention forwards on mma.sync
// (attention.cu) and wgmma (attention_wgmma.cu), whose accumulators have the same layout: thread
// (g, t) of a warp holds part of rows g and g + 8 of its 16, the four threads of group g the rest.
#include <cuda_runtime.h>

#include <cmath>

namespace moeplan::backend::cuda::attention {

// mx0, mx1: this thread's maxima of its part of the tile's rows g and g + 8 (base-2 units). Takes
// the group's maxima, updates the running maxima m and returns the factors that rescale the old
// sums: 2^(m_old − m_new), or 1 for a row with no key yet (m stays −inf, its p are 0).
__device__ __forceinline__ float2 online_max_step(float (&m)[2], float mx0, float mx1) {
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
  const float a0 = mn0 == -INFINITY ? 1.f : exp2f(m[0] - mn0);
  const float a1 = mn1 == -INFINITY ? 1.f : exp2f(m[1] - mn1);
  m[0] = mn0;
  m[1] = mn1;
  return make_float2(a0, a1);
}

}  // namespace moeplan::backend::cuda::attention
