// cuBLAS, NCCL (one rank), events, pinned memory and asynchronous copies for the CPU emulation
// of CUDA (see include/moeplan_cuda_emu.hpp).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "nccl.h"

// ---- runtime: asynchronous calls, pinned memory, events ----------------------------------------
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t) {
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

struct CUevent_st {
  std::chrono::steady_clock::time_point t;
};
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new (std::nothrow) CUevent_st{};
  return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  e->t = std::chrono::steady_clock::now();
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
struct cublasContext {};

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

// Column-major C (m×n) = alpha·op(A)·op(B) + beta·C.
cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const void* A, cudaDataType_t at, int lda, const void* B, cudaDataType_t bt,
                    int ldb, float beta, void* C, cudaDataType_t ct, int ldc) {
  if (m < 0 || n < 0 || k < 0 || !known(at) || !known(bt) || !known(ct) || at != bt)
    return CUBLAS_STATUS_INVALID_VALUE;
  // Column-major leading dimensions: at least the stored rows (and at least 1).
  auto fits = [](int ld, int rows) { return ld >= (rows > 1 ? rows : 1); };
  if (!fits(ldc, m) || !fits(lda, ta == CUBLAS_OP_N ? m : k) ||
      !fits(ldb, tb == CUBLAS_OP_N ? k : n))
    return CUBLAS_STATUS_INVALID_VALUE;
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

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* A, cudaDataType_t at,
                            int lda, const void* B, cudaDataType_t bt, int ldb, const void* beta,
                            void* C, cudaDataType_t ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  return gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
              *static_cast<const float*>(beta), C, ct, ldc);
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void* alpha, const void* const A[],
                                   cudaDataType_t at, int lda, const void* const B[],
                                   cudaDataType_t bt, int ldb, const void* beta, void* const C[],
                                   cudaDataType_t ct, int ldc, int batch, cublasComputeType_t,
                                   cublasGemmAlgo_t) {
  for (int b = 0; b < batch; ++b) {
    const cublasStatus_t s = gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), A[b], at, lda,
                                  B[b], bt, ldb, *static_cast<const float*>(beta), C[b], ct, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS 12.5+: groups of equal shapes; A, B, C arrays list every product, group after group.
// Like the library, the result type must equal the operand type.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t, const cublasOperation_t ta[],
                                          const cublasOperation_t tb[], const int m[],
                                          const int n[], const int k[], const void* alpha,
                                          const void* const A[], cudaDataType_t at, const int lda[],
                                          const void* const B[], cudaDataType_t bt, const int ldb[],
                                          const void* beta, void* const C[], cudaDataType_t ct,
                                          const int ldc[], int group_count, const int group_size[],
                                          cublasComputeType_t) {
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

// ---- NCCL, one rank
// -------------------------------------------------------------------------------
struct ncclComm {};

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  if (nranks != 1 || rank != 0) return ncclInvalidUsage;  // the emulation has one device
  *comm = new ncclComm;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  if (!comm || (op != ncclSum && op != ncclAvg)) return ncclInvalidArgument;
  const std::size_t elem = type == ncclFloat32 ? 4 : 8;
  if (send != recv) std::memmove(recv, send, count * elem);  // one rank: sum = average = copy
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  return r == ncclSuccess ? "no error" : "emulated NCCL: one rank only";
}
