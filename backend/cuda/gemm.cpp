#include "moeplan/backend/cuda/gemm.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"

namespace moeplan::backend::cuda {
namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS error in ") + what + ": " +
                             cublasGetStatusString(s));
  if (LaunchHook h = launch_hook()) h(what);
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
}
cublasOperation_t op(bool t) {
  return t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

}  // namespace

struct Blas::Impl {
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
};

Blas::Blas() : impl_(std::make_unique<Impl>()) {
  check_blas(cublasCreate(&impl_->handle), "cublasCreate");
  // Hopper kernels want a workspace; 32 MiB is what cuBLAS recommends for sm_90.
  impl_->workspace = DeviceBuffer(32u << 20);
  check_blas(cublasSetWorkspace(impl_->handle, impl_->workspace.data(), impl_->workspace.bytes()),
             "cublasSetWorkspace");
  // Default math: CUBLAS_COMPUTE_32F on fp32 inputs stays fp32 (TF32 only on request).
  check_blas(cublasSetMathMode(impl_->handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

void Blas::set_stream(void* stream) {
  check_blas(cublasSetStream(impl_->handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
}

Blas::~Blas() {
  if (impl_ && impl_->handle) cublasDestroy(impl_->handle);
}

// Row-major C = op(A)·op(B) is column-major C^T = op(B)^T·op(A)^T: swap the operands.
void Blas::gemm(const LedgerEntry& rec, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                const void* A, int64_t lda, const void* B, int64_t ldb, float* C, int64_t ldc,
                float beta, DType in, float alpha) {
  gemm(rec, transA, transB, M, N, K, A, lda, B, ldb, static_cast<void*>(C), ldc, beta, in,
       DType::f32, alpha);
}

void Blas::gemm(const LedgerEntry& rec, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                const void* A, int64_t lda, const void* B, int64_t ldb, void* C, int64_t ldc,
                float beta, DType in, DType out, float alpha) {
  if (M == 0 || N == 0) return;
  if (rec.ledger) rec.ledger->add_gemm(rec.category, rec.phase, M, N, K);
  check_blas(cublasGemmEx(impl_->handle, op(transB), op(transA), int(N), int(M), int(K), &alpha, B,
                          cuda_type(in), int(ldb), A, cuda_type(in), int(lda), &beta, C,
                          cuda_type(out), int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

void Blas::gemm_strided_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                const void* A, int64_t lda, int64_t strideA, const void* B,
                                int64_t ldb, int64_t strideB, void* C, int64_t ldc,
                                int64_t strideC, float beta, DType in, DType out, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const float alpha = 1.f;
  check_blas(cublasGemmStridedBatchedEx(impl_->handle, op(transB), op(transA), int(N), int(M),
                                        int(K), &alpha, B, cuda_type(in), int(ldb), strideB, A,
                                        cuda_type(in), int(lda), strideA, &beta, C, cuda_type(out),
                                        int(ldc), strideC, int(batch), CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
}

void Blas::gemm_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                        const void* const* A, int64_t lda, const void* const* B, int64_t ldb,
                        void* const* C, int64_t ldc, float beta, DType in, DType out,
                        int64_t batch) {
  const float alpha = 1.f;
  check_blas(cublasGemmBatchedEx(impl_->handle, op(transB), op(transA), int(N), int(M), int(K),
                                 &alpha, B, cuda_type(in), int(ldb), A, cuda_type(in), int(lda),
                                 &beta, C, cuda_type(out), int(ldc), int(batch), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
             "cublasGemmBatchedEx");
}

void Blas::gemm_grouped(const LedgerEntry& rec, bool transA, bool transB, const int64_t* M,
                        const int64_t* N, const int64_t* K, const void* const* hA,
                        const void* const* dA, int64_t lda, const void* const* hB,
                        const void* const* dB, int64_t ldb, void* const* hC, void* const* dC,
                        int64_t ldc, float beta, DType in, DType out, int64_t count, bool loop) {
  if (count == 0) return;
  if (rec.ledger)
    for (int64_t g = 0; g < count; ++g)
      rec.ledger->add_gemm(rec.category, rec.phase, M[g], N[g], K[g]);
  if (loop) {  // recorded above: the single products record nothing
    for (int64_t g = 0; g < count; ++g)
      gemm({}, transA, transB, M[g], N[g], K[g], hA[g], lda, hB[g], ldb, hC[g], ldc, beta, in,
           out);
    return;
  }
  if (in != out)
    throw std::logic_error("gemm_grouped: cublasGemmGroupedBatchedEx needs Atype == Ctype");
  const size_t n = size_t(count);
  std::vector<cublasOperation_t> ta(n, op(transB)), tb(n, op(transA));
  std::vector<int> m(n), nn(n), k(n), la(n, int(ldb)), lb(n, int(lda)), lc(n, int(ldc)),
      sizes(n, 1);
  std::vector<float> alphas(n, 1.f), betas(n, beta);
  for (size_t g = 0; g < n; ++g) {  // column-major view: C^T = op(B)^T·op(A)^T
    m[g] = int(N[g]);
    nn[g] = int(M[g]);
    k[g] = int(K[g]);
  }
  check_blas(cublasGemmGroupedBatchedEx(impl_->handle, ta.data(), tb.data(), m.data(), nn.data(),
                                        k.data(), alphas.data(), dB, cuda_type(in), la.data(), dA,
                                        cuda_type(in), lb.data(), betas.data(), dC, cuda_type(out),
                                        lc.data(), int(count), sizes.data(), CUBLAS_COMPUTE_32F),
             "cublasGemmGroupedBatchedEx");
}

}  // namespace moeplan::backend::cuda
