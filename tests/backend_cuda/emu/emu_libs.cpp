// cuBLAS, NCCL (ranks as processes on one machine), events, pinned memory and asynchronous copies
// for the CPU emulation of CUDA (see include/moeplan_cuda_emu.hpp).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "nccl.h"

// ---- runtime: asynchronous calls, pinned memory, events ----------------------------------------
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  moeplan_emu::count(&moeplan_emu::Tally::async_ops);
  if (moeplan_emu::defer(s)) {
    moeplan_emu::enqueue(s, [=] { cudaMemcpy(dst, src, bytes, kind); });
    return cudaSuccess;
  }
  const moeplan_emu::Uncounted counted;
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t s) {
  moeplan_emu::count(&moeplan_emu::Tally::async_ops);
  if (moeplan_emu::defer(s)) {
    moeplan_emu::enqueue(s, [=] { cudaMemset(p, value, bytes); });
    return cudaSuccess;
  }
  const moeplan_emu::Uncounted counted;
  return cudaMemset(p, value, bytes);
}
cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

// An event recorded on a created stream marks how much of its queue comes before it.
struct CUevent_st {
  std::chrono::steady_clock::time_point t;
  cudaStream_t stream = nullptr;
  std::size_t mark = 0;
};
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new (std::nothrow) CUevent_st{};
  return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  return cudaEventCreate(e);
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  moeplan_emu::count(&moeplan_emu::Tally::events);
  e->t = std::chrono::steady_clock::now();  // the issue time: timing is for the default stream
  e->stream = s;
  e->mark = moeplan_emu::queued(s);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  moeplan_emu::count(&moeplan_emu::Tally::host_waits);
  moeplan_emu::run_until(e->stream, e->mark);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  moeplan_emu::count(&moeplan_emu::Tally::events);
  // The waiting stream's later work runs after what the event marks; running that now is one
  // order a GPU may take.
  moeplan_emu::run_until(e->stream, e->mark);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}

// ---- cuBLAS
// --------------------------------------------------------------------------------------
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

float load(const void* p, cudaDataType_t t, long i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return float(static_cast<const __nv_bfloat16*>(p)[i]);
}

void store(void* p, cudaDataType_t t, long i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p)[i] = __nv_bfloat16(v);
}

bool known(cudaDataType_t t) {
  return t == CUDA_R_32F || t == CUDA_R_16BF;
}

// Whether the product below takes these shapes and types (as cuBLAS checks before it runs).
cublasStatus_t gemm_check(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          cudaDataType_t at, int lda, cudaDataType_t bt, int ldb, cudaDataType_t ct,
                          int ldc) {
  if (m < 0 || n < 0 || k < 0 || !known(at) || !known(bt) || !known(ct) || at != bt)
    return CUBLAS_STATUS_INVALID_VALUE;
  // Column-major leading dimensions: at least the stored rows (and at least 1).
  auto fits = [](int ld, int rows) { return ld >= (rows > 1 ? rows : 1); };
  if (!fits(ldc, m) || !fits(lda, ta == CUBLAS_OP_N ? m : k) ||
      !fits(ldb, tb == CUBLAS_OP_N ? k : n))
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

// Column-major C (m×n) = alpha·op(A)·op(B) + beta·C.
cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const void* A, cudaDataType_t at, int lda, const void* B, cudaDataType_t bt,
                    int ldb, float beta, void* C, cudaDataType_t ct, int ldc) {
  const cublasStatus_t ok = gemm_check(ta, tb, m, n, k, at, lda, bt, ldb, ct, ldc);
  if (ok != CUBLAS_STATUS_SUCCESS) return ok;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int l = 0; l < k; ++l) {
        const long ai = ta == CUBLAS_OP_N ? long(l) * lda + i : long(i) * lda + l;
        const long bi = tb == CUBLAS_OP_N ? long(j) * ldb + l : long(l) * ldb + j;
        s += double(load(A, at, ai)) * double(load(B, bt, bi));
      }
      const long ci = long(j) * ldc + i;
      double v = double(alpha) * s;
      if (beta != 0.f) v += double(beta) * double(load(C, ct, ci));
      store(C, ct, ci, float(v));
    }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, std::size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    default:
      return "CUBLAS_STATUS (emulated)";
  }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void* alpha, const void* A,
                            cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb,
                            const void* beta, void* C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t, cublasGemmAlgo_t) {
  moeplan_emu::count(&moeplan_emu::Tally::products);
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (moeplan_emu::defer(handle->stream)) {  // checked now, run when the stream's work is needed
    const cublasStatus_t ok = gemm_check(ta, tb, m, n, k, at, lda, bt, ldb, ct, ldc);
    if (ok != CUBLAS_STATUS_SUCCESS) return ok;
    moeplan_emu::enqueue(
        handle->stream, [=] { gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc); });
    return CUBLAS_STATUS_SUCCESS;
  }
  return gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc);
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t ta,
                                   cublasOperation_t tb, int m, int n, int k, const void* alpha,
                                   const void* const A[], cudaDataType_t at, int lda,
                                   const void* const B[], cudaDataType_t bt, int ldb,
                                   const void* beta, void* const C[], cudaDataType_t ct, int ldc,
                                   int batch, cublasComputeType_t, cublasGemmAlgo_t) {
  moeplan_emu::count(&moeplan_emu::Tally::products);
  if (handle->stream) return CUBLAS_STATUS_NOT_SUPPORTED;  // only cublasGemmEx takes one
  for (int b = 0; b < batch; ++b) {
    const cublasStatus_t s = gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), A[b], at, lda,
                                  B[b], bt, ldb, *static_cast<const float*>(beta), C[b], ct, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

static std::size_t type_size(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType_t at, int lda, long long strideA, const void* B,
    cudaDataType_t bt, int ldb, long long strideB, const void* beta, void* C, cudaDataType_t ct,
    int ldc, long long strideC, int batch, cublasComputeType_t, cublasGemmAlgo_t) {
  moeplan_emu::count(&moeplan_emu::Tally::products);
  if (handle->stream) return CUBLAS_STATUS_NOT_SUPPORTED;  // only cublasGemmEx takes one
  if (batch < 0 || !known(at) || !known(bt) || !known(ct)) return CUBLAS_STATUS_INVALID_VALUE;
  for (int b = 0; b < batch; ++b) {
    const cublasStatus_t s =
        gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha),
             static_cast<const char*>(A) + b * strideA * (long long)(type_size(at)), at, lda,
             static_cast<const char*>(B) + b * strideB * (long long)(type_size(bt)), bt, ldb,
             *static_cast<const float*>(beta),
             static_cast<char*>(C) + b * strideC * (long long)(type_size(ct)), ct, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS 12.5+: groups of equal shapes; A, B, C arrays list every product, group after group.
// Like the library, the result type must equal the operand type.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t handle, const cublasOperation_t ta[],
                                          const cublasOperation_t tb[], const int m[],
                                          const int n[], const int k[], const void* alpha,
                                          const void* const A[], cudaDataType_t at, const int lda[],
                                          const void* const B[], cudaDataType_t bt, const int ldb[],
                                          const void* beta, void* const C[], cudaDataType_t ct,
                                          const int ldc[], int group_count, const int group_size[],
                                          cublasComputeType_t) {
  moeplan_emu::count(&moeplan_emu::Tally::products);
  if (handle->stream) return CUBLAS_STATUS_NOT_SUPPORTED;  // only cublasGemmEx takes one
  if (at != ct) return CUBLAS_STATUS_NOT_SUPPORTED;
  const float* alphas = static_cast<const float*>(alpha);
  const float* betas = static_cast<const float*>(beta);
  int p = 0;
  for (int g = 0; g < group_count; ++g)
    for (int i = 0; i < group_size[g]; ++i, ++p) {
      const cublasStatus_t s = gemm(ta[g], tb[g], m[g], n[g], k[g], alphas[g], A[p], at, lda[g],
                                    B[p], bt, ldb[g], betas[g], C[p], ct, ldc[g]);
      if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt
// ------------------------------------------------------------------------------------
struct cublasLtContext {};
struct cublasLtMatmulDescOpaque {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque {
  uint64_t max_workspace = 0;
  uint32_t min_align = 256;  // cuBLASLt's default: operands 256-byte aligned
};

namespace {

constexpr uint64_t kEmuAlgo = 0x6d6f65706c616e00;  // "moeplan\0": the emulation's algorithms
constexpr int kEmuAlgos = 3;

// m, n, k of D = op(A)·op(B) + C from the layouts, or false when they do not fit together.
bool lt_shape(const cublasLtMatmulDescOpaque& d, const cublasLtMatrixLayoutOpaque& a,
              const cublasLtMatrixLayoutOpaque& b, const cublasLtMatrixLayoutOpaque& c,
              const cublasLtMatrixLayoutOpaque& dd, int* m, int* n, int* k) {
  const uint64_t am = d.ta == CUBLAS_OP_N ? a.rows : a.cols,
                 ak = d.ta == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t bk = d.tb == CUBLAS_OP_N ? b.rows : b.cols,
                 bn = d.tb == CUBLAS_OP_N ? b.cols : b.rows;
  if (ak != bk || c.rows != am || c.cols != bn || a.type != b.type || c.type != dd.type ||
      c.rows != dd.rows || c.cols != dd.cols || c.ld != dd.ld)
    return false;
  for (const auto* l : {&a, &b, &c})
    if (l->ld < int64_t(l->rows > 1 ? l->rows : 1)) return false;
  *m = int(am);
  *n = int(bn);
  *k = int(ak);
  return true;
}

uint32_t address_alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v == 0 ? 256u : uint32_t(std::min<uintptr_t>(256, v & (~v + 1)));
}

}  // namespace

std::size_t cublasLtGetVersion() {
  return 900000;  // not a real cuBLASLt: a table tuned here is refused on a GPU, and one from
                  // a GPU here
}
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t bytes) {
  if (bytes != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
  const auto v = *static_cast<const cublasOperation_t*>(buf);
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA)
    desc->ta = v;
  else if (attr == CUBLASLT_MATMUL_DESC_TRANSB)
    desc->tb = v;
  else
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!known(type)) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t bytes) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && bytes == sizeof(uint64_t)) {
    pref->max_workspace = *static_cast<const uint64_t*>(buf);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
      attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && bytes == sizeof(uint32_t)) {
    // One figure for the four operands: the least asked for (what every algorithm offered takes).
    pref->min_align = std::min(pref->min_align, *static_cast<const uint32_t*>(buf));
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
// Three algorithms using 0, 1 and 2 MiB of workspace (those that fit the preference's), each
// taking operands as little aligned as the preference says.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  int m, n, k;
  if (!lt_shape(*desc, *a, *b, *c, *d, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  for (int i = 0; i < kEmuAlgos && *returned < requested; ++i) {
    const std::size_t ws = std::size_t(i) << 20;
    if (ws > pref->max_workspace) continue;
    cublasLtMatmulHeuristicResult_t& r = results[(*returned)++];
    r = {};
    r.algo.data[0] = kEmuAlgo + uint64_t(i);
    r.algo.data[1] = pref->min_align;
    r.workspaceSize = ws;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.f;
  }
  return *returned > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  int m, n, k;
  if (!lt_shape(*desc, *a, *b, *c, *d, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo->data[0] < kEmuAlgo || algo->data[0] >= kEmuAlgo + kEmuAlgos)
    return CUBLAS_STATUS_INVALID_VALUE;
  *result = {};
  result->algo = *algo;
  result->workspaceSize = std::size_t(algo->data[0] - kEmuAlgo) << 20;
  result->state = CUBLAS_STATUS_SUCCESS;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream) {
  moeplan_emu::count(&moeplan_emu::Tally::products);
  cublasLtMatmulHeuristicResult_t r;
  const cublasStatus_t ok = cublasLtMatmulAlgoCheck(handle, desc, a, b, c, d, algo, &r);
  if (ok != CUBLAS_STATUS_SUCCESS) return ok;
  if (r.workspaceSize > workspace_bytes || (r.workspaceSize > 0 && !workspace))
    return CUBLAS_STATUS_INVALID_VALUE;
  const uint32_t need = uint32_t(algo->data[1]);
  for (const void* p : {A, B, C, static_cast<const void*>(D)})
    if (address_alignment(p) < need) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (C != D) return CUBLAS_STATUS_NOT_SUPPORTED;  // the emulation multiplies in place only
  int m, n, k;
  lt_shape(*desc, *a, *b, *c, *d, &m, &n, &k);
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const cublasOperation_t ta = desc->ta, tb = desc->tb;
  const cudaDataType_t at = a->type, bt = b->type, ct = c->type;
  const int lda = int(a->ld), ldb = int(b->ld), ldc = int(c->ld);
  if (moeplan_emu::defer(stream)) {
    moeplan_emu::enqueue(
        stream, [=] { gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, D, ct, ldc); });
    return CUBLAS_STATUS_SUCCESS;
  }
  return gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, D, ct, ldc);
}

// ---- NCCL: one process per rank, ranks meet in a shared-memory file ----------------------------
// A communicator of W ranks maps one file under /dev/shm (the temporary folder where there is
// none): a header with a barrier, then one slot per rank. An all-reduce goes through it in chunks:
// each rank copies its chunk into its slot, waits for all, reduces the W slots in rank order into
// its own result (so every rank computes the same bits), and waits again before the slots are
// reused. Rank 0 creates the file under a temporary name and renames it when it is ready; once
// every rank has mapped it, rank 0 removes the name, so nothing is left behind. A rank that waits
// longer than MOEPLAN_EMU_NCCL_TIMEOUT seconds (default 120) for the others fails with
// ncclSystemError instead of hanging.
namespace {

constexpr std::size_t slot_bytes = std::size_t(1) << 20;
constexpr uint64_t shm_magic = 0x6d6f65706c616e31ull;  // "moeplan1"

struct SharedHeader {
  uint64_t magic;
  int32_t nranks;
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory barrier needs lock-free");

std::size_t header_bytes() {
  return (sizeof(SharedHeader) + 63) / 64 * 64;
}

double nccl_timeout_seconds() {
  const char* v = std::getenv("MOEPLAN_EMU_NCCL_TIMEOUT");
  const double t = v && *v ? std::atof(v) : 120.0;
  return t > 0 ? t : 120.0;
}

std::string shm_folder() {
  struct stat sb;
  if (::stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && ::access("/dev/shm", W_OK) == 0)
    return "/dev/shm";
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

}  // namespace

struct ncclComm {
  int nranks = 1, rank = 0;
  SharedHeader* header = nullptr;
  char* slots = nullptr;
  std::size_t mapped = 0;
  double timeout = 120;
  // A collective queued on a created stream that failed when it ran: every later call fails with
  // it, and ncclCommGetAsyncError says it.
  ncclResult_t async = ncclSuccess;

  // All ranks wait here until every rank has arrived (a generation-counting barrier).
  bool barrier() const {
    const uint32_t gen = header->generation.load(std::memory_order_acquire);
    if (header->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(nranks)) {
      header->arrived.store(0, std::memory_order_relaxed);
      header->generation.fetch_add(1, std::memory_order_release);
      return true;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0; header->generation.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins < 1000) continue;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout)
        return false;
    }
    return true;
  }
  ~ncclComm() {
    if (header) ::munmap(header, mapped);
  }
};

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<uint64_t> counter{0};
  std::memset(id, 0, sizeof *id);
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::snprintf(id->internal, sizeof id->internal, "moeplan-emu-nccl-%ld-%lld-%llu",
                long(::getpid()), static_cast<long long>(now),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  id.internal[sizeof id.internal - 1] = '\0';
  if (nranks > 1 && std::strncmp(id.internal, "moeplan-emu-nccl-", 17) != 0)
    return ncclInvalidArgument;  // not an id from ncclGetUniqueId
  auto c = std::make_unique<ncclComm>();
  c->nranks = nranks;
  c->rank = rank;
  c->timeout = nccl_timeout_seconds();
  if (nranks == 1) {
    *comm = c.release();
    return ncclSuccess;
  }
  const std::string path = shm_folder() + "/" + id.internal;
  const std::size_t bytes = header_bytes() + std::size_t(nranks) * slot_bytes;
  int fd = -1;
  if (rank == 0) {
    const std::string tmp = path + ".init";
    fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ::ftruncate(fd, off_t(bytes)) != 0) {
      if (fd >= 0) ::close(fd), ::unlink(tmp.c_str());
      return ncclSystemError;
    }
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return ::unlink(tmp.c_str()), ncclSystemError;
    auto* h = new (m) SharedHeader{shm_magic, nranks, {0}, {0}};
    c->header = h;
    c->mapped = bytes;
    if (::rename(tmp.c_str(), path.c_str()) != 0) return ::unlink(tmp.c_str()), ncclSystemError;
  } else {
    const auto start = std::chrono::steady_clock::now();
    while ((fd = ::open(path.c_str(), O_RDWR)) < 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
          c->timeout)
        return ncclSystemError;  // rank 0 never came (or the id is stale)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    struct stat sb;
    if (::fstat(fd, &sb) != 0 || std::size_t(sb.st_size) != bytes)
      return ::close(fd), ncclInvalidUsage;
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return ncclSystemError;
    c->header = static_cast<SharedHeader*>(m);
    c->mapped = bytes;
    if (c->header->magic != shm_magic || c->header->nranks != nranks) return ncclInvalidUsage;
  }
  c->slots = reinterpret_cast<char*>(c->header) + header_bytes();
  if (!c->barrier()) return ncclSystemError;  // every rank has mapped the file ...
  if (rank == 0) ::unlink(path.c_str());      // ... so its name can go
  *comm = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

// Abort frees the communicator at once. A collective still queued for it on a created stream
// (below) must not run after that: under the sanitizers it would be reported as a read of freed
// memory.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!comm || !error) return ncclInvalidArgument;
  *error = comm->async;
  return ncclSuccess;
}

namespace {
// A collective whose arguments were checked: run now, or, on a created stream whose work the
// emulation defers (moeplan_emu::defer), queued there like a kernel and run when something waits
// for the stream (every rank runs the same program, so the ranks still meet in the same order).
// Queued, its failure becomes the communicator's asynchronous error, as NCCL reports a failure
// inside a launched collective.
template <class F>
ncclResult_t run_collective(ncclComm_t comm, cudaStream_t stream, F now) {
  if (comm->async != ncclSuccess) return comm->async;
  if (!moeplan_emu::defer(stream)) return now();
  moeplan_emu::enqueue(stream, [comm, now]() mutable {
    if (comm->async != ncclSuccess) return;
    const ncclResult_t r = now();
    if (r != ncclSuccess) comm->async = r;
  });
  return ncclSuccess;
}

template <class T>
void reduce_slots(const ncclComm& c, std::size_t offset_elems, std::size_t n, bool average,
                  T* out) {
  for (std::size_t i = 0; i < n; ++i) {
    T sum = reinterpret_cast<const T*>(c.slots)[i];
    for (int r = 1; r < c.nranks; ++r)
      sum += reinterpret_cast<const T*>(c.slots + std::size_t(r) * slot_bytes)[i];
    out[offset_elems + i] = average ? T(sum / T(c.nranks)) : sum;
  }
}

}  // namespace

ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  moeplan_emu::count(&moeplan_emu::Tally::collectives);
  if (!comm || (op != ncclSum && op != ncclAvg)) return ncclInvalidArgument;
  if (type != ncclFloat32 && type != ncclFloat64 && type != ncclInt64) return ncclInvalidArgument;
  return run_collective(comm, stream, [=]() -> ncclResult_t {
    const std::size_t elem = type == ncclFloat32 ? 4 : 8;
    if (comm->nranks == 1) {
      if (send != recv) std::memmove(recv, send, count * elem);  // one rank: sum = average = copy
      return ncclSuccess;
    }
    const std::size_t per_chunk = slot_bytes / elem;
    for (std::size_t done = 0; done < count; done += per_chunk) {
      const std::size_t n = std::min(per_chunk, count - done);
      std::memcpy(comm->slots + std::size_t(comm->rank) * slot_bytes,
                  static_cast<const char*>(send) + done * elem, n * elem);
      if (!comm->barrier()) return ncclSystemError;
      const bool avg = op == ncclAvg;
      if (type == ncclFloat32) reduce_slots(*comm, done, n, avg, static_cast<float*>(recv));
      if (type == ncclFloat64) reduce_slots(*comm, done, n, avg, static_cast<double*>(recv));
      if (type == ncclInt64) reduce_slots(*comm, done, n, avg, static_cast<int64_t*>(recv));
      if (!comm->barrier()) return ncclSystemError;  // all have read the slots before reuse
    }
    return ncclSuccess;
  });
}

namespace {
std::size_t elem_size(ncclDataType_t type) {
  return type == ncclFloat32 ? 4 : 8;
}
bool known_type(ncclDataType_t type) {
  return type == ncclFloat32 || type == ncclFloat64 || type == ncclInt64;
}
}  // namespace

// Each rank's send holds nranks·recvcount elements; rank r receives the reduction of elements
// [r·recvcount, (r+1)·recvcount). Chunks of the whole send go through the slots in order, so an
// in-place recv (send + rank·recvcount) is written only after its inputs were staged.
ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t recvcount,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  moeplan_emu::count(&moeplan_emu::Tally::collectives);
  if (!comm || (op != ncclSum && op != ncclAvg) || !known_type(type)) return ncclInvalidArgument;
  return run_collective(comm, stream, [=]() -> ncclResult_t {
    const std::size_t elem = elem_size(type);
    if (comm->nranks == 1) {
      if (send != recv) std::memmove(recv, send, recvcount * elem);
      return ncclSuccess;
    }
    const std::size_t total = recvcount * std::size_t(comm->nranks);
    const std::size_t lo = recvcount * std::size_t(comm->rank), hi = lo + recvcount;
    const std::size_t per_chunk = slot_bytes / elem;
    std::vector<char> out;
    for (std::size_t done = 0; done < total; done += per_chunk) {
      const std::size_t n = std::min(per_chunk, total - done);
      std::memcpy(comm->slots + std::size_t(comm->rank) * slot_bytes,
                  static_cast<const char*>(send) + done * elem, n * elem);
      if (!comm->barrier()) return ncclSystemError;
      const std::size_t a = std::max(lo, done), b = std::min(hi, done + n);
      if (a < b) {  // reduce the whole chunk into scratch, keep this rank's part
        out.resize(n * elem);
        const bool avg = op == ncclAvg;
        if (type == ncclFloat32)
          reduce_slots(*comm, 0, n, avg, reinterpret_cast<float*>(out.data()));
        if (type == ncclFloat64)
          reduce_slots(*comm, 0, n, avg, reinterpret_cast<double*>(out.data()));
        if (type == ncclInt64)
          reduce_slots(*comm, 0, n, avg, reinterpret_cast<int64_t*>(out.data()));
        std::memcpy(static_cast<char*>(recv) + (a - lo) * elem, out.data() + (a - done) * elem,
                    (b - a) * elem);
      }
      if (!comm->barrier()) return ncclSystemError;
    }
    return ncclSuccess;
  });
}

// recv = the ranks' sends one after another (rank r's at r·sendcount).
ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  moeplan_emu::count(&moeplan_emu::Tally::collectives);
  if (!comm || !known_type(type)) return ncclInvalidArgument;
  return run_collective(comm, stream, [=]() -> ncclResult_t {
    const std::size_t elem = elem_size(type);
    if (comm->nranks == 1) {
      if (send != recv) std::memmove(recv, send, sendcount * elem);
      return ncclSuccess;
    }
    const std::size_t per_chunk = slot_bytes / elem;
    for (std::size_t done = 0; done < sendcount; done += per_chunk) {
      const std::size_t n = std::min(per_chunk, sendcount - done);
      std::memcpy(comm->slots + std::size_t(comm->rank) * slot_bytes,
                  static_cast<const char*>(send) + done * elem, n * elem);
      if (!comm->barrier()) return ncclSystemError;
      for (int r = 0; r < comm->nranks; ++r)
        std::memcpy(static_cast<char*>(recv) + (std::size_t(r) * sendcount + done) * elem,
                    comm->slots + std::size_t(r) * slot_bytes, n * elem);
      if (!comm->barrier()) return ncclSystemError;
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  moeplan_emu::count(&moeplan_emu::Tally::collectives);
  if (!comm || !known_type(type) || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
  return run_collective(comm, stream, [=]() -> ncclResult_t {
    const std::size_t elem = elem_size(type);
    if (comm->nranks == 1) {
      if (send != recv) std::memmove(recv, send, count * elem);
      return ncclSuccess;
    }
    const std::size_t per_chunk = slot_bytes / elem;
    for (std::size_t done = 0; done < count; done += per_chunk) {
      const std::size_t n = std::min(per_chunk, count - done);
      if (comm->rank == root)
        std::memcpy(comm->slots + std::size_t(root) * slot_bytes,
                    static_cast<const char*>(send) + done * elem, n * elem);
      if (!comm->barrier()) return ncclSystemError;
      std::memcpy(static_cast<char*>(recv) + done * elem,
                  comm->slots + std::size_t(root) * slot_bytes, n * elem);
      if (!comm->barrier()) return ncclSystemError;
    }
    return ncclSuccess;
  });
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "emulated NCCL: shared-memory rendezvous failed or a rank did not arrive within "
             "MOEPLAN_EMU_NCCL_TIMEOUT seconds";
    case ncclInvalidArgument:
      return "emulated NCCL: invalid argument";
    case ncclInvalidUsage:
      return "emulated NCCL: ranks disagree on the world size";
    default:
      return "emulated NCCL: unknown error";
  }
}
