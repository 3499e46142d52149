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

// After each launch: catches bad launch configurations at once (asynchronous faults surface at
// the next synchronising call).
inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
}

}  // namespace moeplan::backend::cuda
