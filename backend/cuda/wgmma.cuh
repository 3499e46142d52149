#pragma once
// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) through PTX, for the routed-expert kernels of
// expert_wgmma.cu. A warpgroup (four consecutive warps, 128 threads) multiplies A (64×16 bf16)
// by B (16×N bf16) into an fp32 accumulator of 64×N, both operands read from shared memory
// through 64-bit matrix descriptors, asynchronously: issue (wgmma_fence first), commit the issued
// products as a group, and wgmma_wait<N>() until at most N groups are in flight; only then may
// the accumulators be read or the operands' shared memory be written again.
//
// Operands are staged without swizzling, in 8×8 "core matrices" of 128 contiguous bytes (PTX ISA
// 9.7.15.5.1.2, canonical layouts "No-swizzling", in CuTe's notation):
//   K-major  ((8,m),(8,2k)):((8,SBO),(1,LBO)): a core matrix is 8 rows (M or N) of 8 depth
//            elements, each row 16 bytes;
//   MN-major ((8,1,m),(8,k)):((1,8,SBO),(8,LBO)): a core matrix is 8 depth rows of 8 M (or N)
//            elements;
// in both, LBO is the byte step between core matrices along the depth and SBO the byte step
// between core matrices along M (or N). The accumulator of thread (warp w of the warpgroup,
// lane 4g + t) holds, as d[i], row 16w + g + 8·((i/2)%2) and column 8·(i/4) + 2t + i%2: the
// mma.sync C layout, repeated over N/8 column blocks.
//
// The CPU emulation (tests/backend_cuda/emu) implements these from the same reading of the ISA,
// so it checks the kernels' staging and pipelining, not the reading itself: the GPU kernel test
// (test_kernels.cpp, against a double-precision host loop) is the authority on that. A second
// reading agrees (2026-12-05): CUTLASS's CuTe (cute/atom/mma_traits_sm90_gmma.hpp) sets, for its
// no-swizzle ("INTERLEAVE") layouts, SBO to the step between core matrices along M/N and LBO to
// the step along the depth, K-major and MN-major alike, with the same bit fields; and its
// accumulator layout CLayout_64xN, ((4,8,4),(2,2,N/8)):((128,1,16),(64,8,512)) over a column-major
// 64×N tile, is the d[i] mapping above.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include "async_copy.cuh"

namespace moeplan::backend::cuda {

// MOEPLAN_WGMMA_SWAP=k|mn|both exchanges LBO and SBO in the K-major (bit 1), the MN-major (bit 2)
// or all descriptors of every wgmma kernel (the routed experts' and attention's): a
// diagnostic for a GPU run whose kernel test finds the documented layout wrong (scripts/gpu-check
// tries each after a failure), never set otherwise. It says so on stderr, once.
inline int wgmma_swap_mode() {
  static const int mode = [] {
    const char* v = std::getenv("MOEPLAN_WGMMA_SWAP");
    const std::string s = v ? v : "";
    const int m = s.empty() || s == "none" ? 0
                  : s == "k"               ? 1
                  : s == "mn"              ? 2
                  : s == "both"            ? 3
                                           : -1;
    if (m < 0)
      throw std::invalid_argument("MOEPLAN_WGMMA_SWAP=" + s + " (valid: none, k, mn, both)");
    if (m > 0)
      std::fprintf(stderr,
                   "MOEPLAN_WGMMA_SWAP=%s: wgmma descriptors with LBO and SBO exchanged (a layout "
                   "diagnostic)\n",
                   s.c_str());
    return m;
  }();
  return mode;
}

// A descriptor's byte steps for a tile read K-major or MN-major (mn): lbo and sbo as the layout
// gives them, exchanged where MOEPLAN_WGMMA_SWAP says. Host code.
inline void wgmma_strides(bool mn, uint32_t& lbo, uint32_t& sbo) {
  if (wgmma_swap_mode() & (mn ? 2 : 1)) std::swap(lbo, sbo);
}

// The shared-memory address a descriptor takes (the offset in the shared window).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
#ifdef MOEPLAN_CUDA_EMULATION
  return moeplan_emu::shared_offset(p);
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// A no-swizzle matrix descriptor: start address, LBO and SBO in bytes (multiples of 16, below
// 256 KiB), each stored >> 4 (bits 0–13, 16–29, 32–45); base offset 0, swizzle mode 0.
__device__ __forceinline__ uint64_t smem_desc(const void* start, uint32_t lbo, uint32_t sbo) {
  const auto enc = [](uint32_t x) { return uint64_t((x & 0x3FFFFu) >> 4); };
  return enc(shared_address(start)) | enc(lbo) << 16 | enc(sbo) << 32;
}

// Orders this thread's earlier accesses to the accumulator registers (and shared memory) before
// the wgmma that follows.
__device__ __forceinline__ void wgmma_fence() {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::wgmma_fence();
#else
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::wgmma_commit();
#else
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::wgmma_wait(N);
#else
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Makes this thread's writes to shared memory through the generic proxy (plain stores, cp.async
// once waited for) visible to the async proxy, through which wgmma reads its operands. Each
// writing thread fences before the barrier that publishes its writes.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::fence_proxy_async();
#else
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// begin_step (async_copy.cuh) for tiles that wgmma reads: between this thread's wait for its
// copies and the barrier, the proxy fence that makes them visible to wgmma's reads.
template <class IssueNext>
__device__ __forceinline__ void begin_wgmma_step(bool has_next, IssueNext&& issue_next) {
  wait_for_step(has_next, issue_next);
  fence_proxy_async();
  __syncthreads();
}

// Keeps the compiler from moving accesses of the accumulators across the asynchronous product's
// issue and wait (it sees neither as touching them otherwise).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#ifndef MOEPLAN_CUDA_EMULATION
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
  (void)d;
#endif
}

// d (64×128 fp32, this thread's 64 entries) = A (64×16) · B (16×128) + (scale_d ? d : 0), bf16
// operands in shared memory: A K-major (TRANS_A 0) or M-major (1), B K-major (TRANS_B 0) or
// N-major (1).
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
  static_assert((TRANS_A == 0 || TRANS_A == 1) && (TRANS_B == 0 || TRANS_B == 1));
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::wgmma_bf16(d, 128, desc_a, desc_b, scale_d, TRANS_A, TRANS_B);
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
#endif
}

// d (64×64 fp32, this thread's 32 entries) = A (64×16) · B (16×64) + (scale_d ? d : 0), as
// wgmma_m64n128k16 with half the columns.
template <int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                int scale_d) {
  static_assert((TRANS_A == 0 || TRANS_A == 1) && (TRANS_B == 0 || TRANS_B == 1));
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::wgmma_bf16(d, 64, desc_a, desc_b, scale_d, TRANS_A, TRANS_B);
#else
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, "
      "%36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));
#endif
}

}  // namespace moeplan::backend::cuda
