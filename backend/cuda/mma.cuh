#pragma once
// Tensor-core products through PTX (sm_80+), shared by the attention and routed-expert kernels:
// mma.sync m16n8k16 (bf16 in, fp32 accumulate) and ldmatrix.x4, whose fragment layouts are fixed
// by the PTX ISA. With g = lane/4 and t = lane%4:
//   A (16×16, row-major): reg0 (row g, cols 2t, 2t+1), reg1 (row g+8, same cols), reg2 (row g,
//     cols 2t+8, 2t+9), reg3 (row g+8, cols 2t+8, 2t+9);
//   B (16×8): reg0 (rows 2t, 2t+1 of column g), reg1 (rows 2t+8, 2t+9 of column g);
//   C (16×8, fp32): c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same cols);
// two bf16 in a register, the lower index in the low half. The CPU emulation of the tests
// (tests/backend_cuda/emu) implements both instructions from the same tables.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::backend::cuda {

// d (16×8) += a (16×16) · b (16×8: b0, b1).
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::mma_m16n8k16_bf16(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ldmatrix.x4: four 8×8 bf16 matrices from shared memory in one instruction. Lane l gives the
// address of row l % 8 of matrix l / 8 (16 contiguous, 16-byte aligned bytes; a padded row stride
// keeps the eight rows of a matrix on different banks). Register i receives matrix i in the mma
// fragment layout: (row g, columns 2t, 2t+1), or with .trans (rows 2t, 2t+1 of column g), which
// is what a B fragment of consecutive rows of one column needs.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::ldmatrix_x4(r, row, false);
#else
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* row) {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::ldmatrix_x4(r, row, true);
#else
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

}  // namespace moeplan::backend::cuda
