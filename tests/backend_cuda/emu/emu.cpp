// The CPU emulation of CUDA (see include/moeplan_cuda_emu.hpp): fibers, barriers, warp
// collectives, mma.sync, and the runtime calls.
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

// Built with AddressSanitizer (the emulated_asan tests): fiber switches are announced, so that
// ASan knows which stack is live, and a reused fiber stack starts unpoisoned.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MOEPLAN_EMU_ASAN 1
#endif

#include "cuda_runtime.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace moeplan_emu {
namespace {

// Hopper's limits (CUDA C++ Programming Guide, "Technical Specifications per Compute
// Capability", 9.0): 1024 threads a block, grid y/z ≤ 65535, 227 KiB of shared memory a block
// when the kernel opts in, 48 KiB without.
constexpr unsigned kMaxThreads = 1024, kMaxGridYZ = 65535;
constexpr std::size_t kMaxSharedOptIn = 227 * 1024, kDefaultShared = 48 * 1024;
constexpr std::size_t kStackBytes = 256 * 1024;

// The emulated device's compute capability: Hopper's 9.0 unless MOEPLAN_EMU_COMPUTE names
// another ("8.6"); false for a value that is not two numbers.
bool emulated_compute(int& major, int& minor) {
  major = 9;
  minor = 0;
  const char* cc = std::getenv("MOEPLAN_EMU_COMPUTE");
  return !cc || std::sscanf(cc, "%d.%d", &major, &minor) == 2;
}

// The most shared memory a block may opt in to at a compute capability (CUDA C++ Programming
// Guide, "Technical Specifications per Compute Capability"): 227 KiB on 9.0 and 10.x, 163 KiB on
// 8.0 and 8.7, 99 KiB on 8.6, 8.9 and 12.x, 64 KiB on 7.5, 96 KiB on 7.0.
std::size_t shared_optin() {
  int major = 0, minor = 0;
  if (!emulated_compute(major, minor)) return kMaxSharedOptIn;
  const std::size_t kib = major == 9 || major == 10                  ? 227
                          : major == 8 && (minor == 0 || minor == 7) ? 163
                          : major == 7 && minor == 0                 ? 96
                          : major == 7                               ? 64
                                                                     : 99;
  return kib * 1024;
}

// ---- context switching -------------------------------------------------------------------------
// On x86-64 a switch saves the callee-saved registers and the SSE/x87 control words on the old
// stack and swaps stack pointers: no system call (glibc's swapcontext makes two, to save and
// restore the signal mask, which cost 90 % of the emulation's time). Elsewhere, ucontext.
#if defined(__x86_64__)
extern "C" void moeplan_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl moeplan_emu_switch
  .type moeplan_emu_switch, @function
moeplan_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size moeplan_emu_switch, .-moeplan_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

struct Context {
  void* sp = nullptr;
};

// A fresh context that enters `entry` (which must never return) on the given stack.
void start_context(Context& c, unsigned char* lo, std::size_t bytes, void (*entry)()) {
  auto* p = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(lo + bytes) & ~uintptr_t(15));
  *--p = 0;                                  // entry sees rsp ≡ 8 (mod 16), as after a call
  *--p = reinterpret_cast<uint64_t>(entry);  // popped by the switch's ret
  for (int i = 0; i < 6; ++i) *--p = 0;      // rbp rbx r12 r13 r14 r15
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--p = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
  c.sp = p;
}
void switch_context(Context& from, Context& to) {
  moeplan_emu_switch(&from.sp, to.sp);
}
#else
struct Context {
  ucontext_t uc;
};
void start_context(Context& c, unsigned char* lo, std::size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = lo;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) {
  swapcontext(&from.uc, &to.uc);
}
#endif

#ifdef MOEPLAN_EMU_ASAN
// The scheduler's own stack, learnt at a fiber's first entry (for ASan's bookkeeping).
const void* g_sched_lo = nullptr;
std::size_t g_sched_bytes = 0;
#endif

// Switches to `to`, whose stack is [to_lo, to_lo + to_bytes) (null: the scheduler's). `dying`:
// the current context is never resumed.
void jump(Context& from, Context& to, const void* to_lo, std::size_t to_bytes, bool dying) {
#ifdef MOEPLAN_EMU_ASAN
  void* fake = nullptr;
  if (!to_lo) {
    to_lo = g_sched_lo;
    to_bytes = g_sched_bytes;
  }
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, to_lo, to_bytes);
  switch_context(from, to);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)to_lo;
  (void)to_bytes;
  (void)dying;
  switch_context(from, to);
#endif
}

enum class Wait { none, block, warp };

// A cp.async copy issued and not yet waited for: done at the issuing thread's cp.async.wait_group
// that covers its group (the latest moment the hardware allows), or when the thread exits.
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  int bytes;       // read from src; the rest of the 16 is zero-filled
  unsigned group;  // commit groups before it
};

// An issued wgmma, performed at the wait that covers its group. operands: the shared-memory
// elements this thread's results read, as they were at the issue; they must be the same at the
// wait (the hardware may read them at any moment between the two).
struct Wgmma {
  float* d;
  int n;
  uint64_t desc_a, desc_b;
  int scale_d, trans_a, trans_b;
  unsigned group;
  std::vector<float> operands;
};
// The value an accumulator array will hold once its issued products are performed.
struct WgmmaShadow {
  float* d;
  std::vector<float> value;
};

struct Fiber {
  std::vector<AsyncCopy> copies;
  unsigned committed = 0;
  std::vector<Wgmma> wgmma;
  std::vector<WgmmaShadow> shadows;
  unsigned wgmma_committed = 0;
  Context ctx;
  unsigned char* stack = nullptr;  // mmap'd, one guard page below
  uint3 tid;
  int warp = 0, lane = 0;
  bool done = false;
  bool waited_previous = false;  // after_previous_grid() called (programmatic launches)
  Wait wait = Wait::none;
  unsigned wait_gen = 0;
};

// Threads still running, threads waiting, and the interval count (bumped on each release).
struct Barrier {
  int live = 0, arrived = 0;
  unsigned gen = 0;
  void release() {
    arrived = 0;
    ++gen;
  }
};

struct Warp : Barrier {
  alignas(16) unsigned char slot[32][16];
  uint32_t mma[32][6];
  const unsigned char* rows[32];  // ldmatrix: each lane's row address
};

struct Block : Barrier {
  const char* file = nullptr;  // the source line of this interval's first arrival
  int line = 0;
  std::vector<Warp> warps;
  // Exactly the requested bytes, so that AddressSanitizer sees an overrun of shared memory.
  struct FreeAligned {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(128)); }
  };
  std::unique_ptr<unsigned char[], FreeAligned> smem;
  std::size_t smem_bytes = 0;
  bool programmatic = false;  // launched to overlap the kernel before it (launch.cuh)
};

// The order in which the scheduler resumes the threads of a block, and runs the blocks
// (MOEPLAN_EMU_SCHEDULE): forward, reverse, or a fixed-seed shuffle. The hardware promises no
// order, so a kernel must give the same results under each; one that reads, within a barrier
// interval, what another thread writes in it (a missing __syncthreads) does not. "greedy" always
// resumes the highest-numbered runnable thread, so the last warp runs as far ahead of the others
// as the block barriers allow (and warp 0, which holds the valid rows of a partial tile, lags): a
// buffer refilled while another warp may still read it (a missing barrier after the reads, as in
// a double-buffered loop) shows.
enum class Order { forward, reverse, shuffle, greedy };

Order order_from_env() {
  const char* v = std::getenv("MOEPLAN_EMU_SCHEDULE");
  const std::string o = v ? v : "";
  if (o.empty() || o == "forward") return Order::forward;
  if (o == "reverse") return Order::reverse;
  if (o == "shuffle") return Order::shuffle;
  if (o == "greedy") return Order::greedy;
  std::fprintf(stderr, "MOEPLAN_EMU_SCHEDULE='%s': use forward, reverse, shuffle or greedy\n", v);
  std::exit(2);
}

struct State {
  Order order = order_from_env();
  std::vector<unsigned> perm;  // this block's resume order
  std::vector<Fiber> fibers;
  Block block;
  Context scheduler;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  bool faulted = false;  // the running kernel faulted: stop it
  cudaError_t last = cudaSuccess, sticky = cudaSuccess;
  std::string message;
  // Each kernel's opted-in dynamic shared memory (cudaFuncSetAttribute); kDefaultShared without.
  std::map<const void*, std::size_t> max_dynamic_shared;
};

State& st() {
  static State s;
  return s;
}

void set_error(cudaError_t e, const std::string& what) {
  State& s = st();
  s.last = e;
  if (e == cudaErrorLaunchFailure) s.sticky = e;
  s.message = what;
}

// Performs the copies of groups below `groups` (all when ~0u), in issue order.
void complete_copies(Fiber& f, unsigned groups) {
  std::size_t kept = 0;
  for (const AsyncCopy& c : f.copies) {
    if (groups != ~0u && c.group >= groups) {
      f.copies[kept++] = c;
      continue;
    }
    std::memcpy(c.dst, c.src, std::size_t(c.bytes));
    std::memset(c.dst + c.bytes, 0, std::size_t(16 - c.bytes));
  }
  f.copies.resize(kept);
}

void fiber_entry() {
  State& s = st();
#ifdef MOEPLAN_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_sched_lo, &g_sched_bytes);
#endif
  (*s.body)();
  Fiber& f = *s.current;
  if (s.block.programmatic && !f.waited_previous)
    fault(
        "a thread of a programmatic dependent launch ended without after_previous_grid(): the "
        "next kernel's wait would not cover the kernel before this one (launch.cuh)");
  complete_copies(f, ~0u);  // the hardware finishes what a thread left in flight
  f.done = true;
  Block& b = s.block;
  Warp& w = b.warps[size_t(f.warp)];
  // An exited thread no longer holds a barrier back.
  for (Barrier* x : {static_cast<Barrier*>(&b), static_cast<Barrier*>(&w)})
    if (--x->live == x->arrived && x->arrived > 0) x->release();
  jump(f.ctx, s.scheduler, nullptr, 0, true);  // never resumed: the fiber is done
  std::abort();
}

void yield() {
  State& s = st();
  jump(s.current->ctx, s.scheduler, nullptr, 0, false);
}

void ensure_fibers(std::size_t n) {
  State& s = st();
  const long page = sysconf(_SC_PAGESIZE);
  while (s.fibers.size() < n) {
    Fiber f;
    void* m = mmap(nullptr, kStackBytes + std::size_t(page), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::perror("moeplan_emu: mmap of a fiber stack");
      std::abort();
    }
    mprotect(m, std::size_t(page), PROT_NONE);  // an overflow faults instead of corrupting
    f.stack = static_cast<unsigned char*>(m);
    s.fibers.push_back(f);
  }
}

bool runnable(const Fiber& f, const Block& b) {
  if (f.done) return false;
  switch (f.wait) {
    case Wait::none:
      return true;
    case Wait::block:
      return b.gen != f.wait_gen;
    case Wait::warp:
      return b.warps[size_t(f.warp)].gen != f.wait_gen;
  }
  return false;
}

// Runs one block to completion; false when it faulted.
bool run_block(const Config& cfg, uint3 bid) {
  State& s = st();
  const unsigned nt = cfg.block.x * cfg.block.y * cfg.block.z;
  const long page = sysconf(_SC_PAGESIZE);
  Block& b = s.block;
  b.live = int(nt);
  b.arrived = 0;
  b.gen = 0;
  b.warps.assign((nt + 31) / 32, Warp{});
  for (unsigned i = 0; i < nt; ++i) ++b.warps[i / 32].live;
  b.smem_bytes = cfg.smem;
  b.programmatic = cfg.programmatic;
  if (cfg.smem > 0) {
    // Exactly the requested bytes (16-byte multiple, 128-byte aligned), filled with 0xFF: an
    // uninitialised float reads as NaN, as shared memory promises nothing.
    b.smem.reset(static_cast<unsigned char*>(::operator new[](cfg.smem, std::align_val_t(128))));
    std::memset(b.smem.get(), 0xFF, cfg.smem);
  } else {
    b.smem.reset();
  }
  for (unsigned i = 0; i < nt; ++i) {
    Fiber& f = s.fibers[i];
    f.tid = {i % cfg.block.x, (i / cfg.block.x) % cfg.block.y, i / (cfg.block.x * cfg.block.y)};
    f.warp = int(i / 32);
    f.lane = int(i % 32);
    f.done = false;
    f.waited_previous = false;
    f.wait = Wait::none;
    f.copies.clear();
    f.committed = 0;
    f.wgmma.clear();
    f.shadows.clear();
    f.wgmma_committed = 0;
#ifdef MOEPLAN_EMU_ASAN
    __asan_unpoison_memory_region(f.stack + page, kStackBytes);
#endif
    start_context(f.ctx, f.stack + page, kStackBytes, fiber_entry);
  }
  blockIdx = bid;
  s.perm.resize(nt);
  std::iota(s.perm.begin(), s.perm.end(), 0u);
  if (s.order == Order::reverse || s.order == Order::greedy)
    std::reverse(s.perm.begin(), s.perm.end());
  if (s.order == Order::shuffle) {
    std::mt19937 rng(0x5eedu + bid.x * 7919u + bid.y * 104729u + bid.z);
    std::shuffle(s.perm.begin(), s.perm.end(), rng);
  }
  for (;;) {
    bool any = false, all_done = true;
    for (unsigned j = 0; j < nt && !s.faulted; ++j) {
      Fiber& f = s.fibers[s.perm[j]];
      if (!f.done) all_done = false;
      if (!runnable(f, b)) continue;
      any = true;
      f.wait = Wait::none;
      s.current = &f;
      threadIdx = f.tid;
      jump(s.scheduler, f.ctx, f.stack + page, kStackBytes, false);
      if (s.order == Order::greedy) {  // rescan from the lowest thread
        j = ~0u;
        all_done = true;
        any = false;
      }
    }
    if (s.faulted) return false;
    if (all_done) return true;
    if (!any) {
      set_error(cudaErrorLaunchFailure,
                "deadlock: the threads of a block wait at different barriers (a __syncthreads "
                "or warp collective inside a branch not all threads take?)");
      return false;
    }
  }
}

// The running fiber waits at `x` until every live thread of it has arrived. The last arrival
// releases the others and yields too, so that the scheduler resumes everyone in its order
// (running on at once would make the last arrival the first past the barrier).
void arrive(Barrier& x, Wait kind) {
  Fiber& f = *st().current;
  if (++x.arrived == x.live) {
    x.release();
    f.wait = Wait::none;
  } else {
    f.wait = kind;
    f.wait_gen = x.gen;
  }
  yield();
}

}  // namespace

int lane() {
  return st().current->lane;
}

void fault(const char* what) {
  State& s = st();
  set_error(cudaErrorLaunchFailure, what);
  s.faulted = true;
  jump(s.current->ctx, s.scheduler, nullptr, 0, true);  // abandoned; its stack is reused
  std::abort();
}

void after_previous_grid() {
  st().current->waited_previous = true;
}

const char* launch_site(const char* file, unsigned line) {
  static std::mutex m;
  static std::set<std::string> sites;  // nodes stay put: their c_str() outlive the call
  const char* base = std::strrchr(file, '/');
  const std::string site = std::string(base ? base + 1 : file) + ":" + std::to_string(line);
  std::lock_guard<std::mutex> lock(m);
  return sites.insert(site).first->c_str();
}

void block_barrier(const char* file, int line) {
  Block& b = st().block;
  if (b.programmatic && !st().current->waited_previous)
    fault(
        "__syncthreads before after_previous_grid() in a programmatic dependent launch: the "
        "wait must come first (launch.cuh)");
  // Every thread of the block must wait at the same __syncthreads (CUDA C++ Programming Guide:
  // inside conditional code only when the condition is the same for the whole block). Compared
  // by source line, which the optimiser's code duplication leaves alone.
  if (b.arrived == 0) {
    b.file = file;
    b.line = line;
  } else if (line != b.line || std::strcmp(file, b.file) != 0) {
    static thread_local std::string msg;
    msg = "__syncthreads reached at different places by the threads of one block (" +
          std::string(b.file) + ":" + std::to_string(b.line) + " and " + file + ":" +
          std::to_string(line) + ")";
    fault(msg.c_str());
  }
  arrive(b, Wait::block);
}

void warp_barrier() {
  State& s = st();
  arrive(s.block.warps[size_t(s.current->warp)], Wait::warp);
}

void check_full_mask(unsigned mask, const char* op) {
  State& s = st();
  if (mask != 0xffffffffu) fault(op);  // partial masks are not used by our kernels
  if (s.block.warps[size_t(s.current->warp)].live != 32) {
    static thread_local std::string msg;
    msg = std::string(op) + ": full-mask warp collective with lanes that exited or do not exist";
    fault(msg.c_str());
  }
}

void* lane_slot(int l) {
  State& s = st();
  if (l < 0 || l >= 32) fault("warp exchange: source lane out of range");
  return s.block.warps[size_t(s.current->warp)].slot[l];
}

unsigned char* block_shared_bytes() {
  return st().block.smem.get();
}

void check_warp_uniform(const void* p, unsigned ld, const char* op) {
  struct Key {
    const void* p;
    unsigned ld;
  };
  const Key mine{p, ld};
  const Key first = exchange(mine, 0);
  if (first.p != p || first.ld != ld) fault(op);
}

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  State& s = st();
  const int me = lane();
  Warp& w = s.block.warps[size_t(s.current->warp)];
  if (w.live != 32) fault("mma.sync: a lane of the warp has exited");
  for (int i = 0; i < 4; ++i) w.mma[me][i] = a[i];
  w.mma[me][4] = b0;
  w.mma[me][5] = b1;
  warp_barrier();
  auto bf = [](uint32_t reg, int hi) {
    const uint32_t u = (hi ? reg >> 16 : reg & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  // PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (g = lane / 4,
  // t = lane % 4): A element (row, col) is in lane 4·(row % 8) + (col % 8) / 2, register
  // (row ≥ 8) + 2·(col ≥ 8), half col % 2; B element (k, n) in lane 4·n + (k % 8) / 2, register
  // k ≥ 8, half k % 2; C/D element i of a lane is (g + 8·(i ≥ 2), 2t + i % 2).
  auto A = [&](int row, int col) {
    const int l = 4 * (row % 8) + (col % 8) / 2, reg = (row >= 8) + 2 * (col >= 8);
    return bf(w.mma[l][reg], col % 2);
  };
  auto B = [&](int k, int n) {
    const int l = 4 * n + (k % 8) / 2;
    return bf(w.mma[l][4 + (k >= 8)], k % 2);
  };
  const int g = me / 4, t = me % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >= 2), col = 2 * t + i % 2;
    double acc = d[i];
    for (int k = 0; k < 16; ++k) acc += double(A(row, k)) * double(B(k, col));
    d[i] = float(acc);
  }
  warp_barrier();  // every lane has read the registers before they are overwritten
}

void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  State& s = st();
  const int me = lane();
  Warp& w = s.block.warps[size_t(s.current->warp)];
  if (w.live != 32) fault("ldmatrix: a lane of the warp has exited");
  const auto* p = static_cast<const unsigned char*>(row);
  const unsigned char* smem = s.block.smem.get();
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    fault("ldmatrix: row address not 16-byte aligned");
  if (!smem || p < smem || p + 16 > smem + s.block.smem_bytes)
    fault("ldmatrix: row address outside the block's dynamic shared memory");
  w.rows[me] = p;
  warp_barrier();
  auto element = [&](int matrix, int row_in, int col) {
    uint16_t v;
    std::memcpy(&v, w.rows[8 * matrix + row_in] + 2 * col, 2);
    return uint32_t(v);
  };
  const int g = me / 4, t = me % 4;
  for (int i = 0; i < 4; ++i)
    r[i] = trans ? element(i, 2 * t, g) | (element(i, 2 * t + 1, g) << 16)
                 : element(i, g, 2 * t) | (element(i, g, 2 * t + 1) << 16);
  warp_barrier();  // every lane has read the addresses before they are overwritten
}

void cp_async_16(void* dst, const void* src, int src_bytes) {
  State& s = st();
  auto* d = static_cast<unsigned char*>(dst);
  const unsigned char* smem = s.block.smem.get();
  if (src_bytes < 0 || src_bytes > 16) fault("cp.async: source size outside 0..16");
  if (reinterpret_cast<std::uintptr_t>(d) % 16 != 0 ||
      (src_bytes > 0 && reinterpret_cast<std::uintptr_t>(src) % 16 != 0))
    fault("cp.async: a 16-byte copy needs 16-byte aligned addresses");
  if (!smem || d < smem || d + 16 > smem + s.block.smem_bytes)
    fault("cp.async: destination outside the block's dynamic shared memory");
  // Until the wait, the destination holds nothing a kernel may read: NaN bytes, so a read before
  // cp.async.wait_group shows.
  std::memset(d, 0xFF, 16);
  Fiber& f = *s.current;
  f.copies.push_back({d, static_cast<const unsigned char*>(src), src_bytes, f.committed});
}

void cp_async_commit() {
  ++st().current->committed;
}

void cp_async_wait(int pending) {
  Fiber& f = *st().current;
  if (pending < 0) fault("cp.async.wait_group: negative count");
  if (f.committed > unsigned(pending)) complete_copies(f, f.committed - unsigned(pending));
}

uint32_t shared_offset(const void* p) {
  State& s = st();
  const auto* b = static_cast<const unsigned char*>(p);
  const unsigned char* smem = s.block.smem.get();
  if (!smem || b < smem || b > smem + s.block.smem_bytes)
    fault("shared address: pointer outside the block's dynamic shared memory");
  return uint32_t(b - smem);
}

void wgmma_fence() {}
void fence_proxy_async() {}

namespace {

// Element (mn, k) of a bf16 operand through a no-swizzle descriptor (PTX ISA, canonical layouts:
// K-major ((8,m),(8,2k)):((8,SBO),(1,LBO)), MN-major ((8,1,m),(8,k)):((1,8,SBO),(8,LBO)), in
// elements, LBO and SBO in bytes in the descriptor).
float wgmma_operand(uint64_t desc, int mn, int k, bool mn_major) {
  State& s = st();
  if ((desc >> 62) != 0) fault("wgmma: a swizzled descriptor (only no-swizzle is emulated)");
  if (((desc >> 49) & 7) != 0) fault("wgmma: a descriptor with a base offset");
  constexpr uint64_t kReserved = (3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3FFull << 52);
  if ((desc & kReserved) != 0) fault("wgmma: a descriptor's reserved bits are set");
  const uint64_t start = (desc & 0x3FFF) << 4, lbo = ((desc >> 16) & 0x3FFF) << 4,
                 sbo = ((desc >> 32) & 0x3FFF) << 4;
  const uint64_t at = start + uint64_t(mn / 8) * sbo + uint64_t(k / 8) * lbo +
                      (mn_major ? uint64_t(k % 8) * 16 + uint64_t(mn % 8) * 2
                                : uint64_t(mn % 8) * 16 + uint64_t(k % 8) * 2);
  if (at + 2 > s.block.smem_bytes) fault("wgmma: an operand element outside shared memory");
  uint16_t v;
  std::memcpy(&v, s.block.smem.get() + at, 2);
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The operand elements thread (w, g, t) of the warpgroup reads for its results of op: A's rows
// 16w + g and 16w + g + 8, then B's columns 8·(j/4) + 2t + j%2, each over the 16 depth elements.
std::vector<float> wgmma_operands(const Wgmma& op, int w, int g, int t) {
  std::vector<float> v;
  v.reserve(size_t(32 + 16 * (op.n / 4)));
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k)
      v.push_back(wgmma_operand(op.desc_a, 16 * w + g + 8 * h, k, op.trans_a != 0));
  for (int j = 0; j < op.n / 2; j += 4)
    for (int e = 0; e < 2; ++e)
      for (int k = 0; k < 16; ++k)
        v.push_back(wgmma_operand(op.desc_b, 8 * (j / 4) + 2 * t + e, k, op.trans_b != 0));
  return v;
}

WgmmaShadow* find_shadow(Fiber& f, float* d) {
  for (WgmmaShadow& x : f.shadows)
    if (x.d == d) return &x;
  return nullptr;
}

// Performs the products of groups below `groups`, in issue order.
void complete_wgmma(Fiber& f, unsigned groups) {
  const int w = f.warp % 4, g = f.lane / 4, t = f.lane % 4;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < f.wgmma.size(); ++i) {
    Wgmma op = std::move(f.wgmma[i]);
    if (op.group >= groups) {
      f.wgmma[kept++] = std::move(op);
      continue;
    }
    const std::vector<float> now = wgmma_operands(op, w, g, t);
    if (now.size() != op.operands.size() ||
        std::memcmp(now.data(), op.operands.data(), now.size() * sizeof(float)) != 0)
      fault(
          "wgmma: an operand in shared memory changed between the product's issue and its wait "
          "(a barrier missing before the issue, or a write before the wait)");
    WgmmaShadow& x = *find_shadow(f, op.d);
    for (int j = 0; j < op.n / 2; ++j) {
      const int row = 16 * w + g + 8 * ((j / 2) % 2), col = 8 * (j / 4) + 2 * t + j % 2;
      double acc = op.scale_d ? double(x.value[size_t(j)]) : 0.0;
      for (int k = 0; k < 16; ++k)
        acc += double(wgmma_operand(op.desc_a, row, k, op.trans_a != 0)) *
               double(wgmma_operand(op.desc_b, col, k, op.trans_b != 0));
      x.value[size_t(j)] = float(acc);
    }
    bool more = false;  // a later product on the same accumulators still to come
    for (std::size_t j = i + 1; j < f.wgmma.size(); ++j) more |= f.wgmma[j].d == op.d;
    if (!more) {
      std::copy(x.value.begin(), x.value.end(), op.d);
      f.shadows.erase(f.shadows.begin() + (&x - f.shadows.data()));
    }
  }
  f.wgmma.resize(kept);
}

}  // namespace

void wgmma_bf16(float* d, int n, uint64_t desc_a, uint64_t desc_b, int scale_d, int trans_a,
                int trans_b) {
  State& s = st();
  Fiber& f = *s.current;
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  if (threads % 128 != 0) fault("wgmma: the block is not whole warpgroups");
  if (n % 8 != 0 || n < 8 || n > 256) fault("wgmma: N outside 8..256 in steps of 8");
  if (!find_shadow(f, d)) f.shadows.push_back({d, std::vector<float>(d, d + n / 2)});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::fill(d, d + n / 2, nan);  // unreadable until the wait
  Wgmma op{d, n, desc_a, desc_b, scale_d, trans_a, trans_b, f.wgmma_committed, {}};
  op.operands = wgmma_operands(op, f.warp % 4, f.lane / 4, f.lane % 4);
  f.wgmma.push_back(std::move(op));
}

void wgmma_commit() {
  ++st().current->wgmma_committed;
}

void wgmma_wait(int pending) {
  Fiber& f = *st().current;
  if (pending < 0) fault("wgmma.wait_group: negative count");
  if (f.wgmma_committed > unsigned(pending))
    complete_wgmma(f, f.wgmma_committed - unsigned(pending));
}

cudaError_t set_max_dynamic_shared(const void* kernel, int bytes) {
  if (bytes < 0 || std::size_t(bytes) > shared_optin()) {
    set_error(cudaErrorInvalidValue,
              "cudaFuncSetAttribute: " + std::to_string(bytes) + " bytes of shared memory, more " +
                  "than the device's opt-in (" + std::to_string(shared_optin()) + ")");
    return cudaErrorInvalidValue;
  }
  State& s = st();
  s.max_dynamic_shared[kernel] = std::size_t(bytes);
  return cudaSuccess;
}

void launch(const char* kernel, const Config& cfg, const std::function<void()>& thread) {
  count_launch(kernel);
  State& s = st();
  const unsigned long long nt = (unsigned long long)cfg.block.x * cfg.block.y * cfg.block.z;
  const auto name = std::string(kernel);
  if (nt == 0 || nt > kMaxThreads || cfg.grid.x == 0 || cfg.grid.y == 0 || cfg.grid.z == 0 ||
      cfg.grid.y > kMaxGridYZ || cfg.grid.z > kMaxGridYZ) {
    set_error(cudaErrorInvalidConfiguration, "invalid launch configuration of " + name);
    return;
  }
  // Over 48 KiB of dynamic shared memory needs this kernel's own opt-in (kernel_key), as in CUDA.
  const auto opted = s.max_dynamic_shared.find(cfg.kernel);
  const std::size_t limit = opted == s.max_dynamic_shared.end()
                                ? kDefaultShared
                                : std::max(kDefaultShared, opted->second);
  if (cfg.smem > limit) {
    set_error(cudaErrorInvalidValue,
              name + ": dynamic shared memory over what this kernel opted in to");
    return;
  }
  const auto stream = static_cast<cudaStream_t>(cfg.stream);
  if (defer(stream)) {  // checked now, run when something waits for the stream
    enqueue(stream, [kernel, grid = cfg.grid, block = cfg.block, smem = cfg.smem, key = cfg.kernel,
                     programmatic = cfg.programmatic, thread] {
      launch(kernel, Config(grid, block, smem).of(key).overlapping(programmatic), thread);
    });
    return;
  }
  if (s.sticky != cudaSuccess) return;  // a faulted context runs nothing more
  ensure_fibers(nt);
  s.body = &thread;
  s.faulted = false;
  gridDim = cfg.grid;
  blockDim = cfg.block;
  const bool rev = s.order == Order::reverse;
  for (unsigned zi = 0; zi < cfg.grid.z; ++zi)
    for (unsigned yi = 0; yi < cfg.grid.y; ++yi)
      for (unsigned xi = 0; xi < cfg.grid.x; ++xi) {
        const unsigned x = rev ? cfg.grid.x - 1 - xi : xi, y = rev ? cfg.grid.y - 1 - yi : yi,
                       z = rev ? cfg.grid.z - 1 - zi : zi;
        if (!run_block(cfg, uint3{x, y, z})) {
          s.message = name + " block (" + std::to_string(x) + "," + std::to_string(y) + "," +
                      std::to_string(z) + "): " + s.message;
          s.faulted = false;
          s.block.smem.reset();
          return;
        }
      }
  s.block.smem.reset();
}

cudaError_t code_for_device() {
  int major = 0, minor = 0;
  if (!emulated_compute(major, minor)) return cudaErrorInvalidValue;
  if (major >= 8) return cudaSuccess;
  set_error(cudaErrorNoKernelImageForDevice,
            "no kernel image is available for execution on the device");
  return cudaErrorNoKernelImageForDevice;
}

}  // namespace moeplan_emu

// A created stream: its work not yet run, in issue order (cuda_runtime.h).
struct CUstream_st {
  std::deque<std::function<void()>> work;
  std::size_t issued = 0, ran = 0;
};

namespace moeplan_emu {
namespace {
std::vector<cudaStream_t>& created_streams() {
  static std::vector<cudaStream_t> v;
  return v;
}
}  // namespace

bool defer(cudaStream_t s) {
  if (!s) return false;
  if (!s->work.empty()) return true;  // behind queued work, whatever the mode: issue order holds
  const char* v = std::getenv("MOEPLAN_EMU_STREAMS");
  const std::string mode = v ? v : "";
  if (mode.empty() || mode == "deferred") return true;
  if (mode == "eager") return false;
  std::fprintf(stderr, "MOEPLAN_EMU_STREAMS='%s': use deferred or eager\n", v);
  std::exit(2);
}
void enqueue(cudaStream_t s, std::function<void()> work) {
  s->work.push_back(std::move(work));
  ++s->issued;
}
std::size_t queued(cudaStream_t s) {
  return s ? s->issued : 0;
}
void run_until(cudaStream_t s, std::size_t mark) {
  if (!s) return;
  const Uncounted counted_when_issued;
  while (s->ran < mark) {  // the queue holds issued - ran items
    const std::function<void()> w = std::move(s->work.front());
    s->work.pop_front();
    ++s->ran;
    w();  // a queued launch runs as the default stream's: it adds nothing to this queue
  }
}

namespace {
int g_uncounted = 0;  // the host thread's depth of Uncounted scopes
}  // namespace
Tally& tally() {
  static Tally t;
  return t;
}
void reset_tally() {
  tally() = Tally{};
}
void count(long long Tally::*field) {
  if (g_uncounted == 0) ++(tally().*field);
}
void count_launch(const char* kernel) {
  if (g_uncounted > 0) return;
  ++tally().launches;
  ++tally().kernels[kernel];
}
Uncounted::Uncounted() {
  ++g_uncounted;
}
Uncounted::~Uncounted() {
  --g_uncounted;
}
void run_all_streams() {
  for (cudaStream_t s : created_streams()) run_until(s, s->issued);
}

}  // namespace moeplan_emu

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st;
  moeplan_emu::created_streams().push_back(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidValue;
  moeplan_emu::run_until(s, s->issued);  // CUDA lets the stream's work finish
  auto& v = moeplan_emu::created_streams();
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
  delete s;
  return moeplan_emu::st().sticky;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  moeplan_emu::count(&moeplan_emu::Tally::host_waits);
  moeplan_emu::run_until(s, moeplan_emu::queued(s));
  return moeplan_emu::st().sticky;
}

using moeplan_emu::st;

namespace {
// How many devices the emulated machine shows: MOEPLAN_EMU_DEVICES (1 to 64, default 1), so that
// data-parallel runs of several processes (one per LOCAL_RANK) can be tested. Every device is the
// same host; each process runs its kernels on its own.
int emulated_devices() {
  const char* v = std::getenv("MOEPLAN_EMU_DEVICES");
  if (!v || !*v) return 1;
  const int n = std::atoi(v);
  if (n < 1 || n > 64) {
    std::fprintf(stderr, "MOEPLAN_EMU_DEVICES='%s' must be an integer from 1 to 64\n", v);
    std::abort();
  }
  // CUDA_VISIBLE_DEVICES, as CUDA reads it: the devices it lists, up to the first entry that
  // names none of the machine's (`moeplan run --points-at-once` gives each worker its own).
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) return n;
  int shown = 0;
  for (const char* c = visible; *c;) {
    char* end = nullptr;
    const long id = std::strtol(c, &end, 10);
    if (end == c || id < 0 || id >= n || (*end != ',' && *end != '\0')) break;
    ++shown;
    c = *end == ',' ? end + 1 : end;
  }
  return shown;
}
}  // namespace

cudaError_t cudaGetDeviceCount(int* n) {
  *n = emulated_devices();
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device < 0 || device >= emulated_devices()) return cudaErrorInvalidDevice;
  std::memset(p, 0, sizeof *p);
  // The name a GPU reports, where a test pretends one (MOEPLAN_EMU_DEVICE_NAME, e.g. "NVIDIA
  // H200": what the engine's hardware and peak read); the emulator's own otherwise.
  const char* name = std::getenv("MOEPLAN_EMU_DEVICE_NAME");
  std::snprintf(p->name, sizeof p->name, "%s",
                name && *name ? name : "moeplan CUDA emulator (CPU)");
  p->multiProcessorCount = 1;
  // Hopper's, unless MOEPLAN_EMU_COMPUTE names another (e.g. "8.0")
  if (!moeplan_emu::emulated_compute(p->major, p->minor)) return cudaErrorInvalidValue;
  p->totalGlobalMem = std::size_t(1) << 30;
  p->sharedMemPerBlockOptin = moeplan_emu::shared_optin();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device >= 0 && device < emulated_devices() ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;  // each process runs its kernels on its own; the device number is not kept
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= emulated_devices()) return cudaErrorInvalidDevice;
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *value = int(moeplan_emu::shared_optin());
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  moeplan_emu::count(&moeplan_emu::Tally::host_waits);
  moeplan_emu::run_all_streams();
  return st().sticky;
}
namespace {
// Device memory: unlimited unless MOEPLAN_EMU_MEMORY_KIB sets a size, so that a test can see a
// model that does not fit (cudaMalloc then fails as CUDA's does, with cudaErrorMemoryAllocation,
// not sticky).
struct Allocations {
  std::mutex lock;
  std::unordered_map<void*, std::size_t> sizes;
  std::size_t in_use = 0, peak = 0;
};
Allocations& allocations() {
  static Allocations a;
  return a;
}
std::size_t memory_limit() {  // read at each allocation, so that a test can set it for a while
  const char* v = std::getenv("MOEPLAN_EMU_MEMORY_KIB");
  return v && *v ? std::size_t(std::strtoull(v, nullptr, 10)) << 10 : ~std::size_t(0);
}
}  // namespace

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  Allocations& a = allocations();
  std::lock_guard<std::mutex> g(a.lock);
  if (bytes > memory_limit() - a.in_use) {
    *p = nullptr;
    st().last = cudaErrorMemoryAllocation;
    st().message = "out of memory";
    return cudaErrorMemoryAllocation;
  }
  // 256-byte aligned, as cudaMalloc guarantees; exactly `bytes`, so that AddressSanitizer sees
  // a kernel read or write past the end.
  *p = ::operator new(bytes ? bytes : 1, std::align_val_t(256), std::nothrow);
  if (!*p) return cudaErrorMemoryAllocation;
  a.sizes[*p] = bytes;
  a.in_use += bytes;
  a.peak = std::max(a.peak, a.in_use);
  return cudaSuccess;
}
std::size_t moeplan_emu::memory_peak() {
  Allocations& a = allocations();
  std::lock_guard<std::mutex> g(a.lock);
  return a.peak;
}
void moeplan_emu::reset_memory_peak() {
  Allocations& a = allocations();
  std::lock_guard<std::mutex> g(a.lock);
  a.peak = a.in_use;
}
cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  Allocations& a = allocations();
  std::lock_guard<std::mutex> g(a.lock);
  // The size MOEPLAN_EMU_MEMORY_KIB gives (an H200's, to run a real sweep's fit check here), else
  // 1 GiB: unlimited allocations, but a size a line can print.
  const std::size_t limit = memory_limit();
  const std::size_t total = limit != ~std::size_t(0) ? limit : std::size_t(1) << 30;
  *total_bytes = total;
  *free_bytes = a.in_use < total ? total - a.in_use : 0;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  {
    Allocations& a = allocations();
    std::lock_guard<std::mutex> g(a.lock);
    const auto it = a.sizes.find(p);
    if (it != a.sizes.end()) {
      a.in_use -= it->second;
      a.sizes.erase(it);
    }
  }
  ::operator delete(p, std::align_val_t(256));
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  moeplan_emu::count(&moeplan_emu::Tally::host_waits);
  if (st().sticky != cudaSuccess) return st().sticky;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  moeplan_emu::count(&moeplan_emu::Tally::host_waits);
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  auto& s = st();
  const cudaError_t e = s.last;
  s.last = s.sticky;
  return e;
}
const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaSuccess) return "no error";
  return st().message.c_str();
}
const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess                       ? "cudaSuccess"
         : e == cudaErrorNoKernelImageForDevice ? "cudaErrorNoKernelImageForDevice"
                                                : "cudaErrorEmulated";
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = 12000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 12000;
  return cudaSuccess;
}
