#pragma once
// Every CUDA/cuBLAS/NCCL return code is checked; a failure is a std::runtime_error naming the call.
#include <cuda_runtime.h>

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

}  // namespace moeplan::backend::cuda
