#pragma once
// Kernel launches, each optionally a programmatic dependent launch (compute capability 9.0; CUDA
// C++ Programming Guide, "Programmatic Dependent Launch and Synchronization"). Launched so, a
// kernel's blocks may be scheduled while the kernel before it in the stream is still running:
// its launch and its blocks' placement overlap the previous kernel's last wave instead of
// following its end. Each kernel of backend/cuda/ therefore begins with after_previous_grid(),
// which waits until the previous kernel has finished and its writes are visible, and then lets
// the next kernel's blocks be scheduled. A kernel launched the ordinary way passes the wait at
// once, so the same kernels serve both launches; set_programmatic_launch (kernels.hpp) picks.
//
// Only the kernel immediately before in the same stream is overlapped: a kernel that follows a
// copy, an event wait or a cuBLAS product waits for them as usual. The wait must come before
// anything the kernel reads or writes in global memory, and every thread must reach it (else the
// next kernel's wait would no longer cover the kernel before this one). The CPU emulation checks
// the second: a programmatically launched thread that ends, or reaches __syncthreads, without
// having waited faults the launch.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#ifdef MOEPLAN_CUDA_EMULATION
#include <source_location>
#endif

#include "moeplan/backend/cuda/kernels.hpp"

namespace moeplan::backend::cuda {

// Every thread of every kernel of backend/cuda/, first.
__device__ __forceinline__ void after_previous_grid() {
#ifdef MOEPLAN_CUDA_EMULATION
  moeplan_emu::after_previous_grid();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The <<<grid, block, smem, stream>>> of a launch.
struct LaunchShape {
  dim3 grid, block;
  std::size_t smem = 0;
  cudaStream_t stream = nullptr;
#ifdef MOEPLAN_CUDA_EMULATION
  std::source_location site = std::source_location::current();  // the launch's, for messages
#endif
};

// kernel<<<shape>>>(args...), programmatic when set_programmatic_launch(true). Errors surface
// through cudaGetLastError (check_launch), as an ordinary launch's do.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), const LaunchShape& shape, Args&&... args) {
#ifdef MOEPLAN_CUDA_EMULATION
  ::moeplan_emu::launch(::moeplan_emu::launch_site(shape.site.file_name(), shape.site.line()),
                        ::moeplan_emu::Config(shape.grid, shape.block, shape.smem, shape.stream)
                            .of(::moeplan_emu::kernel_key(kernel))
                            .overlapping(kernels::programmatic_launch()),
                        [=] { kernel(args...); });
#else
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.smem;
  config.stream = shape.stream;
  const bool programmatic = kernels::programmatic_launch();
  config.attrs = programmatic ? overlap : nullptr;  // the runtime asks for null when none
  config.numAttrs = programmatic ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
#endif
}

}  // namespace moeplan::backend::cuda
