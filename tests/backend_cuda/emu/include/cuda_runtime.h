#pragma once
// The CUDA runtime calls of backend/cuda/, emulated on the host (see moeplan_cuda_emu.hpp):
// device memory is host memory, copies are memcpy, launches on the default stream run to
// completion before they return (created streams: below).
#include <cstddef>
#include <functional>
#include <map>
#include <string>

#include "moeplan_cuda_emu.hpp"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
using cudaStream_t = struct CUstream_st*;

struct cudaDeviceProp {
  char name[256];
  int multiProcessorCount;
  int major, minor;
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlockOptin;
};

cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** p, std::size_t bytes);
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes);
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemset(void* p, int value, std::size_t bytes);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t cudaDriverGetVersion(int* version);   // the emulator's: 12000, as CUDA 12.0
cudaError_t cudaRuntimeGetVersion(int* version);  // the same

// Streams. The default stream (nullptr) runs each call before it returns. A created stream's
// work waits in its queue until something needs it done: another stream waiting on an event
// recorded after it (cudaStreamWaitEvent), or cudaEventSynchronize, cudaStreamSynchronize,
// cudaStreamDestroy, cudaDeviceSynchronize. So a stream that reads another's results without
// waiting on its event reads them stale, as a GPU may, and the tests see it. (A synchronous
// cudaMemcpy does not wait for a non-blocking stream on a GPU, and here it does not either.)
// MOEPLAN_EMU_STREAMS=eager runs a created stream's work at once instead, the other valid order
// of a correct program; the results must not differ.
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMallocHost(void** p, std::size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T** p, std::size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFreeHost(void* p);

// Events hold the host clock at their record (the emulation's "device time").
using cudaEvent_t = struct CUevent_st*;
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t e);

namespace moeplan_emu {
// Per kernel (kernel_key), as CUDA keeps it: one kernel's opt-in lets no other launch more.
cudaError_t set_max_dynamic_shared(const void* kernel, int bytes);
// A created stream's queue (above): `defer` says whether work on `s` waits; `enqueue` adds it;
// `queued` counts what was ever added (an event's mark); `run_until` runs the queue up to a mark.
bool defer(cudaStream_t s);
void enqueue(cudaStream_t s, std::function<void()> work);
std::size_t queued(cudaStream_t s);
void run_until(cudaStream_t s, std::size_t mark);
void run_all_streams();

// What the host issued since reset_tally() (bench/gpu/launches.cpp reads it): kernel launches,
// by launch site (file:line in backend/cuda, launch.cuh's); cuBLAS and cuBLASLt products;
// asynchronous copies and fills; events recorded and waited on; NCCL collectives; and the calls
// that block the host (synchronous copies and fills, stream, event and device synchronizations).
// Counted when issued, once: work a stream runs later is not counted again.
struct Tally {
  std::map<std::string, long long> kernels;  // launch site -> launches
  long long launches = 0, products = 0, async_ops = 0, events = 0, host_waits = 0, collectives = 0;
};
Tally& tally();
void reset_tally();
// The most bytes the emulated device's cudaMalloc'd memory held at once since
// reset_memory_peak() (which starts it again from what is held then): the device's own count,
// against which the backend's count of its buffers is held.
std::size_t memory_peak();
void reset_memory_peak();
// Counts `field` unless the call is part of another counted one (a queued launch run, the copy
// inside cudaMemcpyAsync).
void count(long long Tally::*field);
void count_launch(const char* kernel);
// While one lives, nothing is counted.
struct Uncounted {
  Uncounted();
  ~Uncounted();
  Uncounted(const Uncounted&) = delete;
  Uncounted& operator=(const Uncounted&) = delete;
};
}
namespace moeplan_emu {
// Whether the emulated device can run a default build's code (sm_80 and sm_90 code, compute_90
// PTX): compute capability 8.0 and later (MOEPLAN_EMU_COMPUTE).
cudaError_t code_for_device();
}  // namespace moeplan_emu
// Only whether the kernel's code loads on the device; no attribute is filled.
struct cudaFuncAttributes {
  int maxDynamicSharedSizeBytes;
};
template <class Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, Kernel*) {
  a->maxDynamicSharedSizeBytes = 0;
  return moeplan_emu::code_for_device();
}
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel k, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return moeplan_emu::set_max_dynamic_shared(moeplan_emu::kernel_key(k), value);
}
