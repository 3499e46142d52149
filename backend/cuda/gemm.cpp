#include "moeplan/backend/cuda/gemm.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/atomic_file.hpp"

namespace moeplan::backend::cuda {
namespace {

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS error in ") + what + ": " +
                             cublasGetStatusString(s));
  if (LaunchHook h = launch_hook()) h(what);
}

// Descriptor calls: checked as products are, but not products themselves (no launch hook).
void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt error in ") + what + ": " +
                             cublasGetStatusString(s));
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
}
cublasOperation_t op(bool t) {
  return t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

// Hopper kernels want a workspace; 32 MiB is what cuBLAS recommends for sm_90.
constexpr std::size_t kWorkspaceBytes = 32u << 20;

// The largest power of two (up to 256) that divides the address.
int64_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256 : std::min<int64_t>(256, int64_t(a & (~a + 1)));
}

// A product's cuBLASLt description, in the column-major view Blas::gemm uses: C^T (N×M) =
// op(B)^T (N×K) · op(A)^T (K×M), so cuBLASLt's A is our B and its B our A; C and D are one.
struct LtProduct {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  explicit LtProduct(const GemmShape& s) {
    // A constructor that throws runs no destructor: what was created so far is destroyed here.
    try {
      create(s);
    } catch (...) {
      release();
      throw;
    }
  }
  ~LtProduct() { release(); }

 private:
  void create(const GemmShape& s) {
    check_lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
             "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = op(s.trans_b), tb = op(s.trans_a);
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
             "cublasLtMatmulDescSetAttribute");
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
             "cublasLtMatmulDescSetAttribute");
    // Stored shapes: our B is K×N row-major (N×K column-major), or N×K when transposed.
    check_lt(cublasLtMatrixLayoutCreate(&a, cuda_type(s.in), uint64_t(s.trans_b ? s.k : s.n),
                                        uint64_t(s.trans_b ? s.n : s.k), s.ldb),
             "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&b, cuda_type(s.in), uint64_t(s.trans_a ? s.m : s.k),
                                        uint64_t(s.trans_a ? s.k : s.m), s.lda),
             "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&c, cuda_type(s.out), uint64_t(s.n), uint64_t(s.m), s.ldc),
             "cublasLtMatrixLayoutCreate");
  }
  void release() noexcept {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
    desc = nullptr;
    a = b = c = nullptr;
  }

 public:
  LtProduct(const LtProduct&) = delete;
  LtProduct& operator=(const LtProduct&) = delete;
};

cublasLtMatmulAlgo_t to_algo(const std::array<uint64_t, 8>& data) {
  cublasLtMatmulAlgo_t a;
  static_assert(sizeof(a.data) == sizeof(data));
  std::copy(data.begin(), data.end(), a.data);
  return a;
}

const char* dtype_name(DType t) {
  return t == DType::f32 ? "f32" : "bf16";
}

}  // namespace

std::string to_string(const GemmShape& s) {
  return fmt::format("{} {}x{}x{}{}{} (ld {}, {}, {}; {} out)", dtype_name(s.in), s.m, s.n, s.k,
                     s.trans_a ? ", A^T" : "", s.trans_b ? ", B^T" : "", s.lda, s.ldb, s.ldc,
                     dtype_name(s.out));
}

struct Blas::Impl {
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::shared_ptr<const GemmTable> table;
  bool lenient = false;  // set_table's: a listed product it cannot take goes by the default
  std::map<GemmShape, const GemmTable::Entry*> listed;
  std::map<GemmShape, std::unique_ptr<LtProduct>> plans;  // made at each shape's first use
  std::set<GemmShape> refused;  // a lenient table's entries cuBLASLt refuses here
  bool recording = false;
  std::map<GemmShape, int64_t> seen;  // shape -> least operand alignment
  // Inside gemm_grouped's per-expert loop: the shapes follow the routing, so they are neither
  // recorded nor looked up (cublasGemmEx's default, as documented for experts=loop).
  bool per_expert = false;
  Counts counts;
  bool lt_takes(const GemmShape& shape, const GemmTable::Entry& e, int64_t align,
                const cublasLtMatmulAlgo_t& algo);
  // Here rather than in ~Blas, so that a Blas constructor that throws after cublasCreate (its
  // workspace not allocated, say) frees the handle too.
  ~Impl() {
    plans.clear();
    if (lt) cublasLtDestroy(lt);
    if (handle) cublasDestroy(handle);
  }
};

Blas::Blas() : impl_(std::make_unique<Impl>()) {
  check_blas(cublasCreate(&impl_->handle), "cublasCreate");
  impl_->workspace = DeviceBuffer(kWorkspaceBytes);
  check_blas(cublasSetWorkspace(impl_->handle, impl_->workspace.data(), impl_->workspace.bytes()),
             "cublasSetWorkspace");
  // Default math: CUBLAS_COMPUTE_32F on fp32 inputs stays fp32 (TF32 only on request).
  check_blas(cublasSetMathMode(impl_->handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

void Blas::set_stream(void* stream) {
  check_blas(cublasSetStream(impl_->handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  impl_->stream = static_cast<cudaStream_t>(stream);
  // cublasSetStream puts the handle back on cuBLAS's default workspace pool (cuBLAS docs,
  // cublasSetStream): give it ours again, or cuBLAS allocates one the memory figures never see.
  check_blas(cublasSetWorkspace(impl_->handle, impl_->workspace.data(), impl_->workspace.bytes()),
             "cublasSetWorkspace");
}

Blas::~Blas() = default;

void Blas::set_table(std::shared_ptr<const GemmTable> table, bool lenient) {
  impl_->listed.clear();
  impl_->plans.clear();
  impl_->refused.clear();
  impl_->table = nullptr;
  impl_->lenient = lenient;
  if (!table) return;
  const auto [name, version] = gemm_table_identity();
  if (table->device != name || table->cublaslt_version != version ||
      table->workspace_bytes != impl_->workspace.bytes())
    throw InputError(fmt::format(
        "gemm table: chosen on '{}' with cuBLASLt {} and a {}-byte workspace, but this process "
        "has '{}', cuBLASLt {} and {} bytes; its algorithms are valid only where they were "
        "chosen (tune one here: --kernels gemm=<a new file>, or bench_gpu --gemm-tune FILE)",
        table->device, table->cublaslt_version, table->workspace_bytes, name, version,
        impl_->workspace.bytes()));
  if (!impl_->lt) check_lt(cublasLtCreate(&impl_->lt), "cublasLtCreate");
  for (const GemmTable::Entry& e : table->entries)
    if (e.lt) impl_->listed[e.shape] = &e;
  impl_->table = std::move(table);
}

void Blas::record_shapes(bool on) {
  impl_->recording = on;
}

std::vector<std::pair<GemmShape, int64_t>> Blas::shapes_seen() const {
  return {impl_->seen.begin(), impl_->seen.end()};
}

Blas::Counts Blas::counts() const {
  return impl_->counts;
}

// Whether a listed product runs through the entry's algorithm (its plan made and checked at the
// shape's first use). A strict table throws where it cannot: operands less aligned than the
// algorithm was timed for (it may assume more; refused rather than risk a fault), or an algorithm
// cuBLASLt refuses here. A lenient table (a built-in one, timed for other points' buffers) sends
// such a product to cublasGemmEx's default instead, the same way at every step.
bool Blas::Impl::lt_takes(const GemmShape& shape, const GemmTable::Entry& e, int64_t align,
                          const cublasLtMatmulAlgo_t& algo) {
  if (align < e.align) {
    if (lenient) return false;
    throw std::logic_error(fmt::format(
        "gemm table: {} was chosen for {}-byte aligned operands, asked with {}-byte ones",
        to_string(shape), e.align, align));
  }
  if (refused.count(shape)) return false;
  std::unique_ptr<LtProduct>& plan = plans[shape];
  if (plan) return true;
  plan = std::make_unique<LtProduct>(shape);
  cublasLtMatmulHeuristicResult_t checked{};
  if (cublasLtMatmulAlgoCheck(lt, plan->desc, plan->a, plan->b, plan->c, plan->c, &algo,
                              &checked) == CUBLAS_STATUS_SUCCESS &&
      checked.workspaceSize <= workspace.bytes())
    return true;
  plans.erase(shape);
  if (lenient) {
    refused.insert(shape);
    return false;
  }
  // Strict: checked again if asked again.
  throw InputError(
      fmt::format("gemm table: cuBLASLt refuses the listed algorithm for {} (tune the table again)",
                  to_string(shape)));
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
  ++impl_->counts.products;
  const GemmShape shape{transA, transB, M, N, K, lda, ldb, ldc, in, out};
  const int64_t align = std::min({alignment(A), alignment(B), alignment(C)});
  if (impl_->recording && !impl_->per_expert) {
    auto [it, fresh] = impl_->seen.emplace(shape, align);
    if (!fresh) it->second = std::min(it->second, align);
  }
  if (const auto hit = impl_->per_expert ? impl_->listed.end() : impl_->listed.find(shape);
      hit != impl_->listed.end()) {
    const GemmTable::Entry& e = *hit->second;
    const cublasLtMatmulAlgo_t algo = to_algo(e.algo);
    if (impl_->lt_takes(shape, e, align, algo)) {
      const LtProduct& plan = *impl_->plans.at(shape);
      check_blas(cublasLtMatmul(impl_->lt, plan.desc, &alpha, B, plan.a, A, plan.b, &beta, C,
                                plan.c, C, plan.c, &algo, impl_->workspace.data(),
                                impl_->workspace.bytes(), impl_->stream),
                 "cublasLtMatmul");
      ++impl_->counts.from_table;
      return;
    }
    ++impl_->counts.table_skipped;  // a lenient table's entry this product cannot take
  }
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
    struct PerExpert {
      bool& flag;
      explicit PerExpert(bool& f) : flag(f) { flag = true; }
      ~PerExpert() { flag = false; }
    } per_expert(impl_->per_expert);
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

std::vector<std::pair<GemmShape, int64_t>> untuned_shapes(
    const GemmTable& table, const std::vector<std::pair<GemmShape, int64_t>>& shapes) {
  std::vector<std::pair<GemmShape, int64_t>> out;
  for (const auto& [s, align] : shapes) {
    if (s.in != DType::bf16 || s.k <= 0 ||
        std::any_of(table.entries.begin(), table.entries.end(),
                    [&](const GemmTable::Entry& e) { return e.shape == s; }))
      continue;
    const auto seen =
        std::find_if(out.begin(), out.end(), [&](const auto& q) { return q.first == s; });
    if (seen == out.end())
      out.emplace_back(s, align);
    else
      seen->second = std::min(seen->second, align);  // the least alignment it is asked with
  }
  return out;
}

// ---- GEMM tables: saved as JSON, chosen by timing --------------------------------------------

std::string gemm_table_json(const GemmTable& t) {
  nlohmann::ordered_json j;
  j["format"] = "moeplan-gemm-table-1";
  j["device"] = t.device;
  j["cublaslt_version"] = t.cublaslt_version;
  j["workspace_bytes"] = t.workspace_bytes;
  j["entries"] = nlohmann::ordered_json::array();
  for (const GemmTable::Entry& e : t.entries) {
    nlohmann::ordered_json r;
    r["shape"] = to_string(e.shape);  // for people; the fields below are what is read
    r["trans_a"] = e.shape.trans_a;
    r["trans_b"] = e.shape.trans_b;
    for (const auto& [k, v] : {std::pair{"m", e.shape.m},
                               {"n", e.shape.n},
                               {"k", e.shape.k},
                               {"lda", e.shape.lda},
                               {"ldb", e.shape.ldb},
                               {"ldc", e.shape.ldc}})
      r[k] = v;
    r["in"] = dtype_name(e.shape.in);
    r["out"] = dtype_name(e.shape.out);
    r["align"] = e.align;
    if (e.lt) {
      auto& algo = r["algo"] = nlohmann::ordered_json::array();
      for (uint64_t w : e.algo) algo.push_back(fmt::format("{:016x}", w));
    } else {
      r["algo"] = nullptr;  // cublasGemmEx's default kept
    }
    r["ms_default"] = e.ms_default;
    r["ms_chosen"] = e.ms_chosen;
    j["entries"].push_back(std::move(r));
  }
  return j.dump(1) + "\n";
}

GemmTable parse_gemm_table(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // out_of_range too: a number like 1e400
    throw InputError(fmt::format("{}: not JSON ({})", what, e.what()));
  }
  auto bad = [&](const std::string& where, const std::string& want) {
    return InputError(fmt::format("{}: {} must be {}", what, where, want));
  };
  if (!j.is_object() || j.value("format", "") != "moeplan-gemm-table-1")
    throw bad("'format'", "\"moeplan-gemm-table-1\" (a table written by bench_gpu --gemm-tune)");
  GemmTable t;
  if (!j.contains("device") || !j["device"].is_string()) throw bad("'device'", "a string");
  t.device = j["device"].get<std::string>();
  for (const char* k : {"cublaslt_version", "workspace_bytes"})
    if (!j.contains(k) || !j[k].is_number_unsigned())
      throw bad(fmt::format("'{}'", k), "a whole number");
  t.cublaslt_version = j["cublaslt_version"].get<uint64_t>();
  t.workspace_bytes = j["workspace_bytes"].get<uint64_t>();
  if (!j.contains("entries") || !j["entries"].is_array()) throw bad("'entries'", "a list");
  std::vector<GemmShape> shapes;
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    const nlohmann::json& r = j["entries"][i];
    const std::string at = fmt::format("entry {}", i + 1);
    if (!r.is_object()) throw bad(at, "an object");
    GemmTable::Entry e;
    for (const auto& [k, flag] :
         {std::pair{"trans_a", &e.shape.trans_a}, {"trans_b", &e.shape.trans_b}}) {
      if (!r.contains(k) || !r[k].is_boolean())
        throw bad(fmt::format("{}'s '{}'", at, k), "true or false");
      *flag = r[k].get<bool>();
    }
    for (const auto& [k, v] : {std::pair{"m", &e.shape.m},
                               {"n", &e.shape.n},
                               {"k", &e.shape.k},
                               {"lda", &e.shape.lda},
                               {"ldb", &e.shape.ldb},
                               {"ldc", &e.shape.ldc},
                               {"align", &e.align}}) {
      if (!r.contains(k) || !r[k].is_number_unsigned() || r[k].get<uint64_t>() == 0 ||
          r[k].get<uint64_t>() > uint64_t(1) << 40)
        throw bad(fmt::format("{}'s '{}'", at, k), "a positive whole number");
      *v = r[k].get<int64_t>();
    }
    for (const auto& [k, type] : {std::pair{"in", &e.shape.in}, {"out", &e.shape.out}}) {
      const std::string v = r.contains(k) && r[k].is_string() ? r[k].get<std::string>() : "";
      if (v != "bf16" && v != "f32") throw bad(fmt::format("{}'s '{}'", at, k), "bf16 or f32");
      *type = v == "bf16" ? DType::bf16 : DType::f32;
    }
    if (!r.contains("algo") || !(r["algo"].is_null() || r["algo"].size() == 8))
      throw bad(fmt::format("{}'s 'algo'", at),
                "a list of 8 hexadecimal words, or null (cublasGemmEx's default)");
    e.lt = !r["algo"].is_null();
    for (size_t w = 0; e.lt && w < 8; ++w) {
      const std::string h = r["algo"][w].is_string() ? r["algo"][w].get<std::string>() : "";
      size_t used = 0;
      try {
        e.algo[w] = std::stoull(h, &used, 16);
      } catch (const std::exception&) {
        used = 0;
      }
      if (h.empty() || used != h.size())
        throw bad(fmt::format("{}'s 'algo'", at),
                  "a list of 8 hexadecimal words, or null (cublasGemmEx's default)");
    }
    e.ms_default = r.value("ms_default", 0.0);
    e.ms_chosen = r.value("ms_chosen", 0.0);
    if (std::find(shapes.begin(), shapes.end(), e.shape) != shapes.end())
      throw bad(fmt::format("{} ({})", at, to_string(e.shape)), "listed once");
    shapes.push_back(e.shape);
    t.entries.push_back(e);
  }
  return t;
}

GemmTable load_gemm_table(const std::string& path) {
  return parse_gemm_table(read_file(path), path);
}

void save_gemm_table(const std::string& path, const GemmTable& table) {
  write_file_atomic(path, gemm_table_json(table));
}

void add_tuned_shapes(GemmTable& table, const std::vector<std::pair<GemmShape, int64_t>>& shapes,
                      double min_gain, int reps) {
  if (!table.entries.empty()) {
    const auto [device, version] = gemm_table_identity();
    if (table.device != device || table.cublaslt_version != version ||
        table.workspace_bytes != kWorkspaceBytes)
      throw InputError(fmt::format(
          "gemm table: chosen on '{}' with cuBLASLt {} and a {}-byte workspace, but this process "
          "has '{}', cuBLASLt {} and {} bytes; add to it where it was made, or start a new one",
          table.device, table.cublaslt_version, table.workspace_bytes, device, version,
          kWorkspaceBytes));
  }
  GemmTable tuned = tune_gemm_table(untuned_shapes(table, shapes), min_gain, reps);
  if (table.entries.empty())
    table = std::move(tuned);
  else
    table.entries.insert(table.entries.end(), tuned.entries.begin(), tuned.entries.end());
}

// ---- Built-in GEMM tables ---------------------------------------------------------------------

const std::vector<BuiltinGemmTable>& builtin_gemm_tables() {
  static const std::vector<BuiltinGemmTable> tables = [] {
    // {file name without .json, its text}: generated from backend/cuda/gemm_tables/ by CMake.
    const std::vector<std::pair<const char*, const char*>> texts = {
#include "builtin_gemm_tables.inc"
    };
    std::vector<BuiltinGemmTable> parsed;
    for (const auto& [name, text] : texts)
      parsed.push_back({name, std::make_shared<const GemmTable>(parse_gemm_table(
                                  text, fmt::format("built-in GEMM table '{}'", name)))});
    std::sort(parsed.begin(), parsed.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    return parsed;
  }();
  return tables;
}

const BuiltinGemmTable* builtin_gemm_table_for(const std::string& device,
                                               uint64_t cublaslt_version) {
  const BuiltinGemmTable* chosen = nullptr;  // the last by name: the newest, named by date
  for (const BuiltinGemmTable& b : builtin_gemm_tables())
    if (b.table->device == device && b.table->cublaslt_version == cublaslt_version &&
        b.table->workspace_bytes == kWorkspaceBytes)
      chosen = &b;
  return chosen;
}

std::pair<std::string, uint64_t> gemm_table_identity() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return {device_info(device).name, uint64_t(cublasLtGetVersion())};
}

namespace {

// Median milliseconds of `run` over `reps` timed calls after 3 untimed ones; a negative value
// when a call fails (that candidate is then not taken).
template <class Run>
double median_ms(Run&& run, int reps) {
  struct Events {  // destroyed however the timing ends (a failed record throws)
    cudaEvent_t a = nullptr, b = nullptr;
    ~Events() {
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
    }
  } ev;
  check_cuda(cudaEventCreate(&ev.a), "cudaEventCreate");
  check_cuda(cudaEventCreate(&ev.b), "cudaEventCreate");
  const cudaEvent_t e0 = ev.a, e1 = ev.b;
  std::vector<double> ms;
  bool ok = true;
  for (int i = 0; i < reps + 3 && ok; ++i) {
    check_cuda(cudaEventRecord(e0, nullptr), "cudaEventRecord");
    ok = run();
    check_cuda(cudaEventRecord(e1, nullptr), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
    if (i >= 3) ms.push_back(t);
  }
  if (!ok || ms.empty()) return -1;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

GemmTable tune_gemm_table(const std::vector<std::pair<GemmShape, int64_t>>& shapes, double min_gain,
                          int reps) {
  GemmTable t;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  t.device = device_info(device).name;
  t.cublaslt_version = cublasLtGetVersion();
  t.workspace_bytes = kWorkspaceBytes;
  Blas blas;  // the default path, timed through the model's own wrapper
  cublasLtHandle_t lt = nullptr;
  check_lt(cublasLtCreate(&lt), "cublasLtCreate");
  std::map<GemmShape, int64_t> todo;
  for (const auto& [s, align] : shapes)
    if (s.in == DType::bf16 && s.k > 0) {  // (a product of depth 0 only scales C)
      auto [it, fresh] = todo.emplace(s, align);
      if (!fresh) it->second = std::min(it->second, align);
    }
  DeviceBuffer ws(kWorkspaceBytes);
  try {
    for (const auto& [s, align] : todo) {
      // Stored sizes (elements): A is M×K (K×M transposed), B K×N (N×K), C M×N; rows of ld.
      const int64_t a_elems = (s.trans_a ? s.k : s.m) * s.lda,
                    b_elems = (s.trans_b ? s.n : s.k) * s.ldb, c_elems = s.m * s.ldc;
      DeviceBuffer A(size_t(a_elems) * 2), B(size_t(b_elems) * 2),
          C(size_t(c_elems) * (s.out == DType::f32 ? 4 : 2));
      const std::vector<uint16_t> ha = random_bf16(size_t(a_elems), 1 + uint64_t(s.m)),
                                  hb = random_bf16(size_t(b_elems), 7 + uint64_t(s.n));
      A.upload(ha.data(), ha.size() * 2);
      B.upload(hb.data(), hb.size() * 2);
      C.fill_zero();
      const float one = 1.f, zero = 0.f;
      const double base = median_ms(
          [&] {
            blas.gemm({}, s.trans_a, s.trans_b, s.m, s.n, s.k, A.data(), s.lda, B.data(), s.ldb,
                      C.data(), s.ldc, 0.f, s.in, s.out);
            return true;
          },
          reps);
      const LtProduct p(s);
      cublasLtMatmulPreference_t pref = nullptr;
      check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
      const uint64_t ws_bytes = kWorkspaceBytes;
      // The operands' alignment in the model (from Blas::shapes_seen), so that no candidate
      // assumes more than the model's pointers give.
      const uint32_t al = uint32_t(std::clamp<int64_t>(align, 2, 256));
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_bytes, sizeof(ws_bytes)),
               "cublasLtMatmulPreferenceSetAttribute");
      for (auto attr :
           {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)),
                 "cublasLtMatmulPreferenceSetAttribute");
      cublasLtMatmulHeuristicResult_t found[16] = {};
      int n = 0;
      const cublasStatus_t hs =
          cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 16, found, &n);
      cublasLtMatmulPreferenceDestroy(pref);
      GemmTable::Entry best;
      best.shape = s;
      best.align = al;
      best.ms_default = base;
      best.ms_chosen = -1;
      for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < n; ++i) {
        if (found[i].state != CUBLAS_STATUS_SUCCESS || found[i].workspaceSize > ws_bytes) continue;
        const double ms = median_ms(
            [&] {
              return cublasLtMatmul(lt, p.desc, &one, B.data(), p.a, A.data(), p.b, &zero, C.data(),
                                    p.c, C.data(), p.c, &found[i].algo, ws.data(), ws_bytes,
                                    nullptr) == CUBLAS_STATUS_SUCCESS;
            },
            reps);
        if (ms > 0 && (best.ms_chosen < 0 || ms < best.ms_chosen)) {
          best.ms_chosen = ms;
          std::copy(found[i].algo.data, found[i].algo.data + 8, best.algo.begin());
        }
      }
      best.lt = best.ms_chosen > 0 && base > 0 && best.ms_chosen <= (1.0 - min_gain) * base;
      if (!best.lt) best.algo = {};
      t.entries.push_back(best);
    }
  } catch (...) {
    cublasLtDestroy(lt);
    throw;
  }
  cublasLtDestroy(lt);
  return t;
}

}  // namespace moeplan::backend::cuda
