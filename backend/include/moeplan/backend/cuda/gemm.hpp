#pragma once
// Matrix products through cuBLAS, in row-major terms, each recorded in a FlopLedger with the
// shapes actually passed (2·M·N·K), the same (m, n, k) the CPU path records.
#include <array>
#include <compare>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// One matrix product as Blas::gemm is asked for it (row-major, leading dimensions included):
// what a GemmTable is keyed by.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  DType in = DType::bf16, out = DType::f32;
  auto operator<=>(const GemmShape&) const = default;
};
std::string to_string(const GemmShape& s);  // "bf16 8192x2304x768 (A^T, fp32 out)" style

// cuBLASLt algorithms for some bf16 products, chosen once by timing (tune_gemm_table) and then
// fixed, so that every process of a run multiplies the same way and a run stays repeatable bit
// for bit (choosing by timing in each process would not). An algorithm is only valid for the
// cuBLASLt version, device and workspace it was chosen with: a table for another is refused.
// Products the table does not list run through cublasGemmEx's default, as without a table.
struct GemmTable {
  struct Entry {
    GemmShape shape;
    // Whether the shape runs through cuBLASLt with `algo`; false: tuned, and cublasGemmEx's
    // default kept (no candidate saved enough), so that tuning it again cannot change a run.
    bool lt = true;
    std::array<uint64_t, 8> algo{};  // cublasLtMatmulAlgo_t, serialised as cuBLASLt allows
    int64_t align = 16;              // the operands' address alignment (bytes) it was chosen for
    double ms_default = 0;           // median ms through cublasGemmEx's default (for people)
    double ms_chosen = 0;            // median ms through this algorithm
  };
  std::string device;             // the device name (cudaDeviceProp::name)
  uint64_t cublaslt_version = 0;  // cublasLtGetVersion()
  uint64_t workspace_bytes = 0;   // the workspace the algorithms may use
  std::vector<Entry> entries;
};
std::string gemm_table_json(const GemmTable& table);
// Throws InputError naming `what` (e.g. the file) and the field on a malformed table.
GemmTable parse_gemm_table(const std::string& json, const std::string& what);
GemmTable load_gemm_table(const std::string& path);
void save_gemm_table(const std::string& path, const GemmTable& table);  // atomic

// The GEMM tables built into this program: backend/cuda/gemm_tables/NAME.json, compiled in and
// parsed at first use (sorted by name). `--kernels gemm=auto` runs a point with the one made on
// its device name, cuBLASLt version and workspace size, leniently (Blas::set_table).
struct BuiltinGemmTable {
  std::string name;
  std::shared_ptr<const GemmTable> table;
};
const std::vector<BuiltinGemmTable>& builtin_gemm_tables();
// The built-in table made on `device` with cuBLASLt `cublaslt_version` and Blas's workspace
// size; null when there is none (the last by name if two would be: tables are named
// DEVICE-DATE, so the newest).
const BuiltinGemmTable* builtin_gemm_table_for(const std::string& device,
                                               uint64_t cublaslt_version);
// The current device's name and this process's cuBLASLt version, as a GemmTable names them.
std::pair<std::string, uint64_t> gemm_table_identity();

// For each bf16 shape of positive depth (others are skipped; each shape once): times
// cublasGemmEx's default and cuBLASLt's heuristic candidates (up to 16, for the shape's alignment
// and the Blas workspace) on random operands, median of `reps` after warm-up, and lists the
// fastest candidate when it takes at most (1 - min_gain) of the default's time, else the shape
// with lt = false. The int of each pair: the shape's least operand alignment in bytes, as
// Blas::shapes_seen reports it.
GemmTable tune_gemm_table(const std::vector<std::pair<GemmShape, int64_t>>& shapes,
                          double min_gain = 0.03, int reps = 10);
// The shapes tune_gemm_table would time that `table` does not list yet.
std::vector<std::pair<GemmShape, int64_t>> untuned_shapes(
    const GemmTable& table, const std::vector<std::pair<GemmShape, int64_t>>& shapes);
// Times the shapes `table` does not list yet (tune_gemm_table) and adds them; an empty table
// becomes the new one. A table made on another device, cuBLASLt or workspace is refused
// (InputError) before anything is timed.
void add_tuned_shapes(GemmTable& table, const std::vector<std::pair<GemmShape, int64_t>>& shapes,
                      double min_gain = 0.03, int reps = 10);

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

  // Products that `table` lists run through cuBLASLt with its algorithm (gemm() only; the
  // batched and grouped calls, gemm_grouped's per-product loop included, are neither looked up
  // nor recorded: their shapes follow the routing); null: none. Throws InputError when the table
  // was chosen on another device, cuBLASLt version or workspace size. Strict (a user's table,
  // tuned for this point): throws when cuBLASLt refuses an entry's algorithm for its shape
  // (checked at its first use), and std::logic_error for operands less aligned than an entry was
  // timed for. Lenient (a built-in table, timed for other points' buffers): such a product runs
  // through cublasGemmEx's default instead, at every step alike, counted in table_skipped.
  void set_table(std::shared_ptr<const GemmTable> table, bool lenient = false);
  // Whether gemm() remembers each shape it is asked for and its operands' least alignment.
  void record_shapes(bool on);
  std::vector<std::pair<GemmShape, int64_t>> shapes_seen() const;  // (shape, alignment in bytes)
  struct Counts {
    int64_t products = 0;    // gemm() calls that ran a product
    int64_t from_table = 0;  // of which through the table's cuBLASLt algorithm
    int64_t table_skipped = 0;  // listed, but sent to the default by a lenient table
  };
  Counts counts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::backend::cuda
