#pragma once
// cp.async (sm_80+): 16 bytes from global to shared memory without a register round trip, in
// flight until waited for. Issue copies, close them into a group with cp_async_commit, and
// cp_async_wait<N>() until at most N of this thread's groups are still in flight; other threads
// see the data after a __syncthreads that follows their owners' waits. Used for double-buffered
// tiles: the next step's loads fly while this step multiplies. The CPU emulation of the tests
// performs each copy at the wait that covers it (tests/backend_cuda/emu).
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::backend::cuda {

// src_bytes (0 or 16) are read; the rest of the 16 is zero-filled (0: a zero row past the end).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::cp_async_16(dst, src, src_bytes);
#else
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(src_bytes));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// The head of one step of a double-buffered loop: when there is a next step, issue its loads
// (issue_next commits them as one group) and wait for all but that group, else wait for all;
// then the block barrier after which every thread sees this step's tiles. The loop ends each
// step with a __syncthreads of its own before the buffer it read is refilled.
// wait_for_step is the part before the barrier (begin_wgmma_step, wgmma.cuh, adds a fence there).
template <class IssueNext>
__device__ __forceinline__ void wait_for_step(bool has_next, IssueNext&& issue_next) {
  if (has_next) {
    issue_next();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}
template <class IssueNext>
__device__ __forceinline__ void begin_step(bool has_next, IssueNext&& issue_next) {
  wait_for_step(has_next, issue_next);
  __syncthreads();
}

}  // namespace moeplan::backend::cuda
