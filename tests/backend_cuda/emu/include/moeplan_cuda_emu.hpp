#pragma once
// A CPU emulation of the part of CUDA that our kernels use, so that the kernel sources in
// backend/cuda/ run on a machine without a GPU, unchanged but for their `extern __shared__`
// declarations (and any `<<<>>>` launch; the kernels launch through launch.cuh), which
// rewrite.cpp turns into C++.
//
// Each CUDA thread is a fiber with a stack of its own, on the launching thread (switched by a
// few lines of assembly on x86-64, by ucontext elsewhere). A block's fibers run until they all
// finish, switching only at __syncthreads, warp collectives (shuffles, ballots, __syncwarp,
// mma.sync, WMMA) and exit, so a run is deterministic. What it checks beyond the arithmetic:
// - the threads of a block meet at the same __syncthreads (a deadlock is reported, not hung);
// - warp collectives have every lane of the warp;
// - WMMA pointers are 32-byte aligned and the same in every lane;
// - launch configurations are within the H100/H200 limits;
// - shared memory starts as NaN bytes, so an unwritten read shows;
// - with MOEPLAN_EMU_SCHEDULE=reverse or shuffle, a block's threads are resumed (and the blocks
//   run) in another order: a kernel that reads another thread's write without a barrier between
//   them gives other results;
// - built with ASan/UBSan (the _asan tests): out-of-bounds global and shared-memory accesses;
// - work on a created stream waits until another stream waits for an event recorded after it
//   (cuda_runtime.h), so reading its results without that wait reads them stale; with
//   MOEPLAN_EMU_STREAMS=eager it runs at once instead. Two streams writing the same scratch
//   between two waits are not caught: each stream's work runs whole, never interleaved.
//
// What it cannot check: the hardware's fragment layouts. mma.sync follows the PTX ISA's tables
// (section "Matrix Fragments for mma.m16n8k16 with floating point type"); WMMA fragments are
// opaque, so each lane holds the whole tile. A kernel that reads WMMA fragment elements by index
// would not compile here. Timing, coalescing, bank conflicts and register pressure are out of
// reach too; the GPU tests on a real device remain the authority.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#define MOEPLAN_CUDA_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Blocks run one after another, so a function-local static is exactly one block's shared memory.
#define __shared__ static
#define __restrict__ __restrict

// CUDA's device math library declares isnan/isinf for float in the global namespace.
using std::isinf;
using std::isnan;

// ---- vector types ------------------------------------------------------------------------------
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) {
  return {x, y};
}
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) {
  return {x, y, z, w};
}

// The running fiber's coordinates (set by the scheduler before it resumes a fiber). Plain
// globals: kernels run on the one host thread that launches them.
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

// ---- math --------------------------------------------------------------------------------------
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(a) < C(b) ? C(a) : C(b);
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(a) < C(b) ? C(b) : C(a);
}
inline float rsqrtf(float x) {
  return 1.f / std::sqrt(x);
}
// Rounding pinned as on the device: one fused multiply-add, one product never fused (the
// emulated kernels are compiled with -ffp-contract=off, so nothing else is fused either).
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
// The fast division: a times the reciprocal of b (2 ulp on the device, exact here), 0 for
// 2^126 < |b| (the device's reciprocal flushes there).
inline float __fdividef(float a, float b) {
  return std::fabs(b) > 0x1p126f ? 0.f * a : a / b;
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}

// ---- bf16 (round to nearest even, as __float2bfloat16 does) ------------------------------------
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  static uint16_t round(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
  __nv_bfloat16(float f) : bits(round(f)) {}  // NOLINT: implicit, as CUDA's
  operator float() const {                    // NOLINT
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4);
inline __nv_bfloat16 __float2bfloat16(float f) {
  return __nv_bfloat16(f);
}
inline float __bfloat162float(__nv_bfloat16 b) {
  return float(b);
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 a) {
  return make_float2(float(a.x), float(a.y));
}

// ---- the emulator's interface to the kernels ---------------------------------------------------
namespace moeplan_emu {

int lane();  // this thread's lane in its warp
// Ends the running kernel with a device fault (reported by the next cudaGetLastError and by every
// synchronising call); never returns to the calling thread.
[[noreturn]] void fault(const char* what);
void block_barrier(const char* file, int line);
void warp_barrier();  // every live lane of this warp; a full-mask warp op with a lane gone faults
void check_full_mask(unsigned mask, const char* op);
// Per-lane exchange slots of this warp (16 bytes each), valid between two warp barriers.
void* lane_slot(int lane);
unsigned char* block_shared_bytes();

template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(block_shared_bytes());
}

template <class T>
T exchange(T v, int from_lane) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>);
  std::memcpy(lane_slot(lane()), &v, sizeof(T));
  warp_barrier();
  T r;
  std::memcpy(&r, lane_slot(from_lane), sizeof(T));
  warp_barrier();
  return r;
}

// D (16×8 fp32) += A (16×16 bf16, row) · B (16×8 bf16, col), one warp, PTX register layouts.
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8×8 bf16 matrices from shared memory,
// one warp; lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes, 16-byte
// aligned, inside the block's shared memory). Register i of lane l holds matrix i's elements
// (row l/4, columns 2(l%4), 2(l%4)+1), or with trans (rows 2(l%4), 2(l%4)+1 of column l/4).
void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans);

// cp.async.cg.shared.global 16 bytes (src_bytes read, the rest zero-filled), commit_group and
// wait_group. A copy lands at the issuing thread's wait that covers its group, and its
// destination reads as NaN bytes until then; the destination must lie in the block's dynamic
// shared memory and both addresses be 16-byte aligned.
void cp_async_16(void* dst, const void* src, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending_groups);

// Hopper's warpgroup MMA (wgmma.cuh). shared_offset: a pointer's offset in the block's dynamic
// shared memory (what a descriptor's start address encodes here). wgmma_bf16: d (64×n fp32,
// this thread's n/2 entries in the PTX accumulator layout) = A (64×16) · B (16×n) +
// (scale_d ? d : 0), both bf16 operands read through no-swizzle matrix descriptors (K-major, or
// MN-major when trans): issued by every thread of a warpgroup, it is performed at the wait that
// covers its group, reading shared memory then, and d reads as NaN until that wait; products
// issued on the same d before it chain in order, as on the hardware. The operand elements a
// thread's results read are also read at the issue, and must be the same at the wait (the
// hardware may read them at any moment between): a difference faults, which catches a barrier
// missing before the issue as well as a write before the wait. Unsupported descriptors
// (swizzled, a base offset, reserved bits set, outside the block's shared memory) fault.
// fence_proxy_async and wgmma_fence are ordering points only (not checked).
uint32_t shared_offset(const void* p);
void wgmma_fence();
void wgmma_bf16(float* d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d, int trans_a,
                int trans_b);
void wgmma_commit();
void wgmma_wait(int pending_groups);
void fence_proxy_async();

// All lanes must pass the same value (a WMMA pointer or stride).
void check_warp_uniform(const void* p, unsigned ld, const char* op);

// A kernel's identity, for its attributes: the function's address (a memcpy, since C++ casts no
// function pointer to an object pointer).
template <class F>
const void* kernel_key(F* f) {
  static_assert(sizeof(F*) == sizeof(const void*));
  const void* p;
  std::memcpy(&p, &f, sizeof p);
  return p;
}

struct Config {
  dim3 grid, block;
  std::size_t smem;
  void* stream;
  const void* kernel = nullptr;  // kernel_key of the launched function (set by the rewrite)
  // A programmatic dependent launch (launch.cuh): every thread must call after_previous_grid()
  // before it ends or reaches __syncthreads, which the emulation checks.
  bool programmatic = false;
  Config(dim3 g, dim3 b, std::size_t s = 0, void* st = nullptr)
      : grid(g), block(b), smem(s), stream(st) {}
  Config& of(const void* k) {
    kernel = k;
    return *this;
  }
  Config& overlapping(bool on) {
    programmatic = on;
    return *this;
  }
};
// griddepcontrol.wait and .launch_dependents (launch.cuh): the emulation runs launches one after
// another, so there is nothing to wait for; it records that the running thread has waited.
void after_previous_grid();
// "file:line", kept for the process (a launch's name in messages, also after a deferred run).
const char* launch_site(const char* file, unsigned line);
// Runs `thread` once per CUDA thread of the grid, block after block; returns when all are done.
// On a created stream whose work is deferred (cuda_runtime.h) it queues the launch instead:
// launch_kernel (launch.cuh) captures the kernel's arguments by value for this, as the rewrite of
// a `<<<>>>` launch does.
void launch(const char* kernel, const Config& cfg, const std::function<void()>& thread);

}  // namespace moeplan_emu

// ---- warp intrinsics ---------------------------------------------------------------------------
// A macro, so that the barrier knows its source line (see block_barrier).
#define __syncthreads() ::moeplan_emu::block_barrier(__FILE__, __LINE__)
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  moeplan_emu::check_full_mask(mask, "__syncwarp");
  moeplan_emu::warp_barrier();
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  moeplan_emu::check_full_mask(mask, "__shfl_xor_sync");
  if (width != 32) moeplan_emu::fault("__shfl_xor_sync: only width 32 is emulated");
  return moeplan_emu::exchange(v, moeplan_emu::lane() ^ lane_mask);
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  moeplan_emu::check_full_mask(mask, "__shfl_sync");
  if (width != 32) moeplan_emu::fault("__shfl_sync: only width 32 is emulated");
  return moeplan_emu::exchange(v, src_lane & 31);
}
// Lanes below `delta` keep their own value, as on the device.
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  moeplan_emu::check_full_mask(mask, "__shfl_up_sync");
  if (width != 32) moeplan_emu::fault("__shfl_up_sync: only width 32 is emulated");
  const int me = moeplan_emu::lane();
  return moeplan_emu::exchange(v, me >= int(delta) ? me - int(delta) : me);
}
// The lanes whose value equals this lane's (this lane included).
inline unsigned __match_any_sync(unsigned mask, int value) {
  moeplan_emu::check_full_mask(mask, "__match_any_sync");
  std::memcpy(moeplan_emu::lane_slot(moeplan_emu::lane()), &value, sizeof value);
  moeplan_emu::warp_barrier();
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) {
    int v;
    std::memcpy(&v, moeplan_emu::lane_slot(l), sizeof v);
    if (v == value) bits |= 1u << l;
  }
  moeplan_emu::warp_barrier();
  return bits;
}
inline int __ffs(int x) {  // 1 + the lowest set bit's position; 0 for 0
  return x == 0 ? 0 : __builtin_ctz(unsigned(x)) + 1;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  moeplan_emu::check_full_mask(mask, "__ballot_sync");
  const int me = moeplan_emu::lane();
  std::memcpy(moeplan_emu::lane_slot(me), &pred, sizeof pred);
  moeplan_emu::warp_barrier();
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) {
    int p;
    std::memcpy(&p, moeplan_emu::lane_slot(l), sizeof p);
    if (p) bits |= 1u << l;
  }
  moeplan_emu::warp_barrier();
  return bits;
}
