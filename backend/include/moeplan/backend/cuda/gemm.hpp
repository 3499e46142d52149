#pragma once
// Matrix products through cuBLAS, in row-major terms, each recorded in a FlopLedger with the
// shapes actually passed (2·M·N·K), the same (m, n, k) the CPU path records.
#include <cstdint>
#include <memory>

#include "moeplan/accounting/ledger.hpp"
#include "moeplan/backend/cuda/device.hpp"

namespace moeplan::backend::cuda {

// Where a product is recorded; a null ledger records nothing (the caller records, e.g. the
// attention core, whose executed square is split into causal work and padding).
struct LedgerEntry {
  FlopLedger* ledger = nullptr;
  FlopCategory category = FlopCategory::projection;
  Phase phase = Phase::forward;
};

class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  // The stream its products go to (a cudaStream_t; nullptr: the default stream). One handle and
  // workspace a stream: two streams must not share a Blas.
  void set_stream(void* stream);

  // Row-major C (M×N, ldc) = op(A)·op(B) + beta·C; op(A) is M×K (A stored K×M when transA),
  // op(B) is K×N. A and B in `in` (fp32: exact fp32 arithmetic, no TF32; bf16: tensor cores),
  // fp32 accumulation, C fp32.
  void gemm(const LedgerEntry& rec, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
            const void* A, int64_t lda, const void* B, int64_t ldb, float* C, int64_t ldc,
            float beta, DType in, float alpha = 1.f);
  // The same with C in `out` (bf16 C: the fp32 accumulation rounded once on the way out).
  void gemm(const LedgerEntry& rec, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
            const void* A, int64_t lda, const void* B, int64_t ldb, void* C, int64_t ldc,
            float beta, DType in, DType out, float alpha = 1.f);

  // `batch` products of one shape, product b's operands at A + b·strideA, B + b·strideB and
  // C + b·strideC (strides in elements). Row-major as gemm; C in `out`. Records nothing: the
  // caller books the useful and the padded parts of its products apart.
  void gemm_strided_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                            const void* A, int64_t lda, int64_t strideA, const void* B, int64_t ldb,
                            int64_t strideB, void* C, int64_t ldc, int64_t strideC, float beta,
                            DType in, DType out, int64_t batch);

  // `batch` products of one shape; A, B, C are device arrays of device pointers. C in `out`.
  void gemm_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K, const void* const* A,
                    int64_t lda, const void* const* B, int64_t ldb, void* const* C, int64_t ldc,
                    float beta, DType in, DType out, int64_t batch);

  // Products of differing shapes, e.g. one per routed expert with its real token count. M/N/K
  // (count) on the host; pointer arrays both on the host (h*) and the device (d*). C in `out`.
  // `loop` false: one cublasGemmGroupedBatchedEx call, which takes only Atype = Ctype (bf16 in,
  // bf16 out; or fp32), so bf16 products with fp32 results go through the caller's scratch.
  // `loop` true: one cublasGemmEx per product (any in/out pair), the comparison the benchmark
  // measures. There is no silent fallback between the two: a refused call throws.
  void gemm_grouped(const LedgerEntry& rec, bool transA, bool transB, const int64_t* M,
                    const int64_t* N, const int64_t* K, const void* const* hA,
                    const void* const* dA, int64_t lda, const void* const* hB,
                    const void* const* dB, int64_t ldb, void* const* hC, void* const* dC,
                    int64_t ldc, float beta, DType in, DType out, int64_t count, bool loop);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::backend::cuda
