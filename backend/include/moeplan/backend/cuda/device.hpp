#pragma once
// Host-visible view of the GPU: how many there are, what they are, and device memory that frees
// itself. No CUDA header is needed by includers.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace moeplan::backend::cuda {

// ctest's SKIP_RETURN_CODE for GPU tests on a machine without a GPU.
inline constexpr int kSkipReturnCode = 77;

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

struct DeviceInfo {
  std::string name;
  int multiprocessors = 0;
  int compute_major = 0, compute_minor = 0;
  double memory_gib = 0;
  // The most dynamic shared memory one block may opt in to, in bytes (227 KiB on an H100/H200).
  std::size_t shared_optin = 0;
  // Vendor dense bf16 tensor peak in TFLOP/s when the device is one we know
  // (dense_bf16_peak_tflops); 0 when unknown, so that no MFU is printed against a guessed peak.
  double peak_bf16_tflops = 0;
};
DeviceInfo device_info(int device = 0);
// The maker's dense bf16 tensor-core peak of a GPU by the name CUDA reports for it, in TFLOP/s;
// 0 for a name not listed. NVIDIA's H100 datasheet gives bf16 with sparsity as 1,979 TFLOP/s
// (SXM) and 1,513 (PCIe), dense half of that; the H200's compute is the H100 SXM's (issue 6: 989).
// NVIDIA's A100 datasheet gives 312 TFLOP/s of dense bf16 for the SXM4 parts (40 and 80 GB),
// named as CUDA's deviceQuery prints them. Other parts (the A100 PCIe, H100 NVL, GH200, the
// Blackwell GPUs) are left out until their names and figures are checked on one (meanwhile
// `moeplan run --peak-tflops X` gives a run its peak).
double dense_bf16_peak_tflops(const std::string& name);
// The GPU code this build carries: its CMAKE_CUDA_ARCHITECTURES with commas, e.g.
// "80-real,90-real,90-virtual" (sm_80 and sm_90 code, compute_90 PTX).
std::string built_architectures();
void set_device(int device);
void synchronize();  // waits for all work on the current device; throws on a CUDA error

// Seconds this process's host threads have spent blocked in the backend's synchronous calls
// (DeviceBuffer's copies, synchronize(), StagedStream::finish), since the process began. Taken
// before and after a training step, it splits the step's wall time into the host's own work and
// its waits for the device: a step whose host waited close to nothing was bound by the host
// (issuing launches), not by the device.
double host_wait_seconds();
// How many of those synchronous calls this process has made. Each drains the device's queue
// before the host goes on (a pageable upload waits for the work before it), and none can be
// part of a CUDA graph: a pass's count tells how it could be captured.
int64_t host_waits();

// Element types of matrix-product inputs: fp32 (tight tests) or bf16 (training).
enum class DType { f32, bf16 };
inline std::size_t dtype_size(DType t) {
  return t == DType::f32 ? 4 : 2;
}

// bf16 conversions for host-side references (round to nearest even, as the device does).
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t x);
// n bf16 values in [-1, 1] from `seed` (operands for timing products: zeros multiply faster than
// real data).
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed);

// The current device's free and total memory in bytes (cudaMemGetInfo).
std::pair<std::size_t, std::size_t> device_memory();
// Bytes held by this process's live DeviceBuffers (model buffers, cuBLAS's workspace, ...).
std::size_t device_bytes_in_use();
// The most bytes those DeviceBuffers held at once since reset_device_bytes_peak() (or since the
// process began); the reset starts it again from the bytes held then. Not the CUDA context's
// memory, nor what cuBLAS, cuBLASLt or NCCL allocate for themselves.
std::size_t device_bytes_peak();
void reset_device_bytes_peak();

// cudaMalloc found no room: `requested` bytes asked while `in_use` bytes of DeviceBuffers were
// allocated by this process (the device may hold others').
class DeviceOutOfMemory : public std::runtime_error {
 public:
  DeviceOutOfMemory(std::size_t requested, std::size_t in_use);
  std::size_t requested, in_use;
};

// Device memory, allocated once (cudaMalloc) and freed by the destructor.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  template <class T>
  T* as() {
    return static_cast<T*>(ptr_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  // Synchronous copies (host memory may be pageable); offsets and sizes in bytes.
  void upload(const void* host, std::size_t bytes, std::size_t offset = 0);
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
  void fill_zero();

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// A second stream, for work that may run beside the default stream's (the MoE layer's shared
// expert beside its routing and routed experts), and the two events that order it: fork() makes
// it wait for the default stream's work issued so far, join() makes the default stream wait for
// its own. It does not synchronise with the default stream otherwise (non-blocking), so whatever
// it reads or writes must be fenced by those two. handle() is its cudaStream_t.
class SideStream {
 public:
  SideStream();
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  void* handle() const { return stream_; }
  void fork();
  void join();
  // Finer fences than join(), one event a slot: mark(slot) records the side stream's work issued
  // so far; wait(slot) makes the default stream wait for the slot's last mark (nothing when it
  // has none since the last join(), which covers everything).
  static constexpr int kSlots = 4;
  void mark(int slot);
  void wait(int slot);

 private:
  void release() noexcept;
  void* stream_ = nullptr;
  void* forked_ = nullptr;  // events
  void* done_ = nullptr;
  void* slots_[kSlots] = {};
  bool marked_[kSlots] = {};
};

// A stream for work that the default stream's later work waits for piece by piece: the AdamW
// update in stages (embedding, each layer, the final norm and LM head), so that the next step's
// forward can start on the first layers while the last are still updated. begin() makes it wait
// for the default stream's work issued so far; mark(s) records stage s as issued; wait(s) makes
// the default stream wait for every stage up to s (stages are marked in order on one stream);
// finish() blocks the host until the stream's work is done (for an owner's destructor: it
// throws nothing, and an error there shows at the next checked call). Non-blocking, like
// SideStream.
class StagedStream {
 public:
  explicit StagedStream(int stages);
  ~StagedStream();
  StagedStream(const StagedStream&) = delete;
  StagedStream& operator=(const StagedStream&) = delete;
  void* handle() const { return stream_; }
  void begin();
  void mark(int stage);
  void wait(int stage);
  void finish() noexcept;

 private:
  void release() noexcept;
  void* stream_ = nullptr;
  void* begun_ = nullptr;
  std::vector<void*> events_;
};

}  // namespace moeplan::backend::cuda
