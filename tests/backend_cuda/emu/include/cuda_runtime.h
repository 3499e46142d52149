#pragma once
// The CUDA runtime calls of backend/cuda/, emulated on the host (see moeplan_cuda_emu.hpp):
// device memory is host memory, copies are memcpy, launches run to completion before they return.
#include <cstddef>

#include "moeplan_cuda_emu.hpp"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
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

// Streams are all the default stream: asynchronous calls complete before they return.
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
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream = nullptr);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t e);

namespace moeplan_emu {
cudaError_t set_max_dynamic_shared(int bytes);
}
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return moeplan_emu::set_max_dynamic_shared(value);
}
