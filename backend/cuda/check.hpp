#pragma once
// Every CUDA/cuBLAS/NCCL return code is checked; a failure is a std::runtime_error naming the call.
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace moeplan::backend::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// Called with the kernel's (or cuBLAS call's) name after each launch while set: the per-kernel
// device times of Model::set_profiling(true, true) (bench_gpu --kernel-times). Null otherwise.
using LaunchHook = void (*)(const char* name);
inline LaunchHook& launch_hook() {
  static LaunchHook hook = nullptr;
  return hook;
}

// After each launch: catches bad launch configurations at once (asynchronous faults surface at
// the next synchronising call).
inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
  if (LaunchHook h = launch_hook()) h(kernel);
}

// A kernel's opt-in to Bytes of dynamic shared memory where they pass the 48 KiB a launch gets
// without asking, once per process and kernel: the kernel is the template argument, so each has
// its own flag. (A flag per function type, shared by two kernels of one signature, left the
// second at 48 KiB: invalid argument at its first launch on an H200, 2026-12-04.)
template <auto Kernel, size_t Bytes>
void opt_in_shared_memory(const char* what) {
  if constexpr (Bytes > 48 * 1024) {
    static const bool done = [what] {
      check_cuda(
          cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Bytes)),
          what);
      return true;
    }();
    (void)done;
  }
}

}  // namespace moeplan::backend::cuda
