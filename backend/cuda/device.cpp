#include "moeplan/backend/cuda/device.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "check.hpp"
#include "moeplan/accounting/error.hpp"

namespace moeplan::backend::cuda {

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return n;
  cudaGetLastError();  // clear the error
  // No GPU, or no driver at all (the runtime says "insufficient driver" with no driver
  // installed, as on a build machine): nothing visible. Any other failure (a driver older than
  // the runtime, a failed initialisation) is said, not reported as "no GPU".
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && driver == 0)) return 0;
  throw InputError(fmt::format(
      "CUDA cannot count this machine's GPUs: {} ({}; driver API {}, runtime {}): fix the driver, "
      "or train with --device cpu",
      cudaGetErrorString(e), cudaGetErrorName(e), driver, runtime));
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  DeviceInfo d;
  d.name = p.name;
  d.multiprocessors = p.multiProcessorCount;
  d.compute_major = p.major;
  d.compute_minor = p.minor;
  d.memory_gib = double(p.totalGlobalMem) / double(1ull << 30);
  d.shared_optin = p.sharedMemPerBlockOptin;
  d.peak_bf16_tflops = dense_bf16_peak_tflops(d.name);
  return d;
}

double dense_bf16_peak_tflops(const std::string& name) {
  if (name == "NVIDIA H200" || name == "NVIDIA H100 80GB HBM3") return 989.0;  // SXM
  if (name == "NVIDIA H100 PCIe") return 756.0;
  if (name == "NVIDIA A100-SXM4-80GB" || name == "NVIDIA A100-SXM4-40GB") return 312.0;
  return 0.0;
}

#ifndef MOEPLAN_CUDA_ARCHITECTURES
#error "MOEPLAN_CUDA_ARCHITECTURES: set by backend/cuda/CMakeLists.txt (and the emulation's)"
#endif
std::string built_architectures() {
  return MOEPLAN_CUDA_ARCHITECTURES;
}

std::pair<std::size_t, std::size_t> device_memory() {
  std::size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return {free_bytes, total_bytes};
}

void set_device(int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

namespace {
std::atomic<int64_t> g_wait_ns{0}, g_waits{0};
// Adds the time from its construction to its destruction to host_wait_seconds(), and one to
// host_waits().
class WaitTimer {
 public:
  WaitTimer() : t0_(std::chrono::steady_clock::now()) {
    g_waits.fetch_add(1, std::memory_order_relaxed);
  }
  ~WaitTimer() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - t0_);
    g_wait_ns.fetch_add(int64_t(ns.count()), std::memory_order_relaxed);
  }
  WaitTimer(const WaitTimer&) = delete;
  WaitTimer& operator=(const WaitTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace

double host_wait_seconds() {
  return double(g_wait_ns.load(std::memory_order_relaxed)) * 1e-9;
}
int64_t host_waits() {
  return g_waits.load(std::memory_order_relaxed);
}

void synchronize() {
  const WaitTimer timed;
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
  uint64_t x = seed;
  for (auto& v : h) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = float_to_bf16(float(int64_t(x >> 40) % 2001 - 1000) / 1000.f);
  }
  return h;
}

uint16_t float_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}

float bf16_to_float(uint16_t x) {
  const uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {
std::atomic<std::size_t> g_in_use{0};  // bytes held by live DeviceBuffers of this process
std::atomic<std::size_t> g_peak{0};    // the most g_in_use has been since the last reset

void note_in_use(std::size_t now) {
  std::size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

std::size_t device_bytes_in_use() {
  return g_in_use.load();
}
std::size_t device_bytes_peak() {
  return g_peak.load();
}
void reset_device_bytes_peak() {
  g_peak = g_in_use.load();
}

DeviceOutOfMemory::DeviceOutOfMemory(std::size_t requested_bytes, std::size_t in_use_bytes)
    : std::runtime_error("CUDA error in cudaMalloc: out of memory"),
      requested(requested_bytes),
      in_use(in_use_bytes) {}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    ptr_ = nullptr;
    bytes_ = 0;
    throw DeviceOutOfMemory(bytes, g_in_use.load());
  }
  check_cuda(e, "cudaMalloc");
  note_in_use(g_in_use += bytes);
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) {
    cudaFree(ptr_);
    g_in_use -= bytes_;
  }
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) {
      cudaFree(ptr_);
      g_in_use -= bytes_;
    }
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
  if (offset + bytes > bytes_) throw std::out_of_range("DeviceBuffer::upload past the end");
  const WaitTimer timed;  // a pageable copy waits for the stream's work before it
  check_cuda(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice),
             "cudaMemcpy H2D");
}
void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  if (offset + bytes > bytes_) throw std::out_of_range("DeviceBuffer::download past the end");
  const WaitTimer timed;
  check_cuda(
      cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost),
      "cudaMemcpy D2H");
}
void DeviceBuffer::fill_zero() {
  if (bytes_) check_cuda(cudaMemset(ptr_, 0, bytes_), "cudaMemset");
}

namespace {
// A non-blocking stream and timing-free events, each stored where its owner's destructor (or a
// constructor's catch) destroys it, so that a failure part way leaks none of them.
void create_stream(void*& slot) {
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  slot = s;
}
void create_event(void*& slot) {
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  slot = e;
}
void destroy_stream(void*& s) noexcept {  // lets the stream's work finish first
  if (s) cudaStreamDestroy(static_cast<cudaStream_t>(s));
  s = nullptr;
}
void destroy_event(void*& e) noexcept {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  e = nullptr;
}
}  // namespace

SideStream::SideStream() {
  try {
    create_stream(stream_);
    create_event(forked_);
    create_event(done_);
    for (void*& slot : slots_) create_event(slot);
  } catch (...) {
    release();  // what was created so far (a throwing constructor runs no destructor)
    throw;
  }
}

SideStream::~SideStream() {
  release();
}

void SideStream::release() noexcept {
  // Destroying a stream lets its work finish; the events may go at once.
  destroy_stream(stream_);
  destroy_event(forked_);
  destroy_event(done_);
  for (void*& slot : slots_) destroy_event(slot);
}

void SideStream::fork() {
  const auto e = static_cast<cudaEvent_t>(forked_);
  check_cuda(cudaEventRecord(e, nullptr), "cudaEventRecord (fork)");
  check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), e, 0), "cudaStreamWaitEvent");
}

void SideStream::join() {
  const auto e = static_cast<cudaEvent_t>(done_);
  check_cuda(cudaEventRecord(e, static_cast<cudaStream_t>(stream_)), "cudaEventRecord (join)");
  check_cuda(cudaStreamWaitEvent(nullptr, e, 0), "cudaStreamWaitEvent");
  std::fill(std::begin(marked_), std::end(marked_), false);
}

void SideStream::mark(int slot) {
  const auto e = static_cast<cudaEvent_t>(slots_[slot]);
  check_cuda(cudaEventRecord(e, static_cast<cudaStream_t>(stream_)), "cudaEventRecord (mark)");
  marked_[slot] = true;
}

void SideStream::wait(int slot) {
  if (!marked_[slot]) return;
  check_cuda(cudaStreamWaitEvent(nullptr, static_cast<cudaEvent_t>(slots_[slot]), 0),
             "cudaStreamWaitEvent");
}

StagedStream::StagedStream(int stages) : events_(size_t(stages), nullptr) {
  try {
    create_stream(stream_);
    create_event(begun_);
    for (void*& e : events_) create_event(e);
  } catch (...) {
    release();
    throw;
  }
}

StagedStream::~StagedStream() {
  release();
}

void StagedStream::release() noexcept {
  destroy_stream(stream_);
  destroy_event(begun_);
  for (void*& e : events_) destroy_event(e);
}

void StagedStream::begin() {
  const auto e = static_cast<cudaEvent_t>(begun_);
  check_cuda(cudaEventRecord(e, nullptr), "cudaEventRecord (begin)");
  check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), e, 0), "cudaStreamWaitEvent");
}

void StagedStream::mark(int stage) {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(events_.at(size_t(stage))),
                             static_cast<cudaStream_t>(stream_)),
             "cudaEventRecord (stage)");
}

void StagedStream::wait(int stage) {
  check_cuda(cudaStreamWaitEvent(nullptr, static_cast<cudaEvent_t>(events_.at(size_t(stage))), 0),
             "cudaStreamWaitEvent (stage)");
}

void StagedStream::finish() noexcept {
  if (!stream_) return;
  const WaitTimer timed;
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
}

}  // namespace moeplan::backend::cuda
