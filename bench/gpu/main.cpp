// GPU benchmark: the measured bf16 GEMM ceiling (cuBLAS 8192³), then training steps of a dense
// model of ≈124M non-embedding parameters and an MoE of about equal N at r_a ≈ 0.2 (fine-grained
// experts plus a shared expert): median step time, tokens/s (consumed), achieved TFLOP/s from the
// ledger (exact/causal: the useful products; and as executed, padding included), and MFU against
// the vendor peak and the measured ceiling. Same shapes, batch and data as torch_ref.py.
// Usage: bench_gpu [--steps N] [--warmup N] [--batch B] [--json FILE] [--only NAME,NAME...]
//                  [--kernel-times]  (also each point's device time by kernel, 3 more steps)
//        bench_gpu --only NAME,... --kernels SPEC  (those points with the kernels SPEC names, as
//                                  `moeplan run --kernels` takes them: attention, experts, launch,
//                                  router; named NAME-with-SPEC)
//        bench_gpu --list-points   (the points' names, one a line; needs no GPU. --only refuses
//                                  a name not among them, before any device work)
//        bench_gpu --gemm-shapes   (each weight product of the dense step, and of the MoE step
//                                  but its routed experts, alone; batch 8)
//        bench_gpu --only NAME,... --gemm-tune FILE   (the products one step of each point asks
//                                  for that FILE does not list yet, each timed through
//                                  cublasGemmEx's default and through cuBLASLt's candidates; the
//                                  winners added to the GEMM table in FILE, made if missing)
//        bench_gpu ... --gemm-table auto|none|FILE  (the GEMM table: auto, the default, as
//                                  `moeplan run`'s gemm=auto: the built-in table made on this
//                                  device and cuBLASLt, if any; none: no table, the names get the
//                                  suffix -no-gemm-table; FILE: that table, suffix -lt-table)
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/backend/cuda/device.hpp"
#include "moeplan/backend/cuda/gemm.hpp"
#include "moeplan/backend/cuda/kernels.hpp"
#include "moeplan/backend/cuda/model.hpp"

using namespace moeplan;
using namespace moeplan::backend;
namespace cu = moeplan::backend::cuda;

namespace {

using moeplan::bench::median;

// Median milliseconds of op(A)·op(B) (M×N, depth K) through the model's wrapper, bf16 inputs and
// fp32 or bf16 output, after three warm-up calls.
double gemm_ms(cu::Blas& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, cu::DType out,
               const cu::DeviceBuffer& A, const cu::DeviceBuffer& B, cu::DeviceBuffer& C) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    blas.gemm({}, ta, tb, M, N, K, A.data(), ta ? M : K, B.data(), tb ? K : N, C.data(), N, 0.f,
              cu::DType::bf16, out);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(ms);
}

// bf16 8192³ through the same wrapper the model uses, fp32 out: the measured ceiling.
double gemm_ceiling_tflops() {
  const int64_t n = 8192;
  const std::vector<uint16_t> h = cu::random_bf16(size_t(n * n), 12345);
  cu::DeviceBuffer A(h.size() * 2), B(h.size() * 2), C(size_t(n * n) * 4);
  A.upload(h.data(), h.size() * 2);
  B.upload(h.data(), h.size() * 2);
  cu::Blas blas;
  const double ms = gemm_ms(blas, false, false, n, n, n, cu::DType::f32, A, B, C);
  return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
}

// cuBLASLt's candidate algorithms for one product (bf16 inputs, fp32 compute and output, the
// model's row-major operands mapped to column-major as Blas::gemm does): each timed alone, median
// of 7 after 2 warm-up calls. Says whether choosing an algorithm per shape could beat the one
// cublasGemmEx takes by default, and by how much; the model does not choose (yet).
struct LtBest {
  int candidates = 0, best = -1;  // best: index in the heuristic's order (0: its first choice)
  double first_ms = 0, best_ms = 0;
  int algo_id = 0, tile = 0, split_k = 0;
};
LtBest lt_sweep(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const cu::DeviceBuffer& A,
                const cu::DeviceBuffer& B, cu::DeviceBuffer& C, cu::DeviceBuffer& workspace) {
  LtBest r;
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return r;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  // C^T (N×M) = op(B)^T (N×K) · op(A)^T (K×M): Lt's A is our B, its B our A.
  const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(tb ? K : N), uint64_t(tb ? N : K), ldb);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(ta ? M : K), uint64_t(ta ? K : M), lda);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, uint64_t(N), uint64_t(M), N);
  cublasLtMatmulPreferenceCreate(&pref);
  const size_t ws = workspace.bytes();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t found[16] = {};
  int n = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, found, &n);
  const float alpha = 1.f, beta = 0.f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < n; ++i) {
    if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
    std::vector<double> ms;
    bool ok = true;
    for (int rep = 0; rep < 9 && ok; ++rep) {
      cudaEventRecord(e0);
      ok = cublasLtMatmul(lt, desc, &alpha, B.data(), la, A.data(), lb, &beta, C.data(), lc,
                          C.data(), lc, &found[i].algo, workspace.data(), ws,
                          nullptr) == CUBLAS_STATUS_SUCCESS;
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      if (rep >= 2) ms.push_back(t);
    }
    if (!ok) continue;
    ++r.candidates;
    const double m = median(ms);
    if (i == 0) r.first_ms = m;
    if (r.best < 0 || m < r.best_ms) {
      r.best = i;
      r.best_ms = m;
      size_t w = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_ID, &r.algo_id,
                                           sizeof(r.algo_id), &w);
      cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &r.tile,
                                           sizeof(r.tile), &w);
      cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                           &r.split_k, sizeof(r.split_k), &w);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  return r;
}

// A weight product of a training step. gemm_shapes_table says which fall short of the ceiling,
// and how much of the step they take at their measured rates.
struct Product {
  const char* name;
  int64_t C, OC, count;  // inp (T, C) · w (C, OC); count: per step
};

// Each product of a step alone, with the model's transposes: forward (T×C)·(C×OC), input gradient
// (T×OC)·(C×OC)^T, weight gradient (T×C)^T·(T×OC) (small outputs with a deep K: the products
// that fill the fewest SMs). `model` names the step in the table.
std::string gemm_shapes_table(const char* model, int64_t T, const std::vector<Product>& products,
                              double ceiling, double step_budget_ms) {
  size_t most = 0;
  for (const Product& p : products)
    most = std::max({most, size_t(T * p.C), size_t(T * p.OC), size_t(p.C * p.OC)});
  const std::vector<uint16_t> h = cu::random_bf16(most, 777);
  cu::DeviceBuffer A(most * 2), B(most * 2), C(most * 4);
  A.upload(h.data(), most * 2);
  B.upload(h.data(), most * 2);
  cu::Blas blas;
  cu::DeviceBuffer workspace(32u << 20);  // as much as the model's cuBLAS handle has
  std::string out = fmt::format(
      "\n| product ({}, T {}) | pass | M×N×K | ms fp32 out | TFLOP/s | % of ceiling | ms "
      "bf16 out | TFLOP/s | ms per step (fp32 out) | cuBLASLt: candidates, first's ms, best's ms "
      "(its rank; algo, tile, split-K) | best / ours |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n",
      model, T);
  double step_ms = 0, best_step_ms = 0;
  for (const Product& p : products) {
    struct Pass {
      const char* name;
      bool ta, tb;
      int64_t M, N, K;
    };
    for (const Pass& q : {Pass{"forward", false, false, T, p.OC, p.C},
                          Pass{"input grad", false, true, T, p.C, p.OC},
                          Pass{"weight grad", true, false, p.C, p.OC, T}}) {
      const double flop = 2.0 * double(q.M) * double(q.N) * double(q.K);
      const double f32 = gemm_ms(blas, q.ta, q.tb, q.M, q.N, q.K, cu::DType::f32, A, B, C);
      const double b16 = gemm_ms(blas, q.ta, q.tb, q.M, q.N, q.K, cu::DType::bf16, A, B, C);
      const double tf = flop / (f32 * 1e-3) / 1e12, tb = flop / (b16 * 1e-3) / 1e12;
      step_ms += f32 * double(p.count);
      const LtBest lt = lt_sweep(q.ta, q.tb, q.M, q.N, q.K, A, B, C, workspace);
      const double best = lt.best >= 0 ? std::min(lt.best_ms, f32) : f32;
      best_step_ms += best * double(p.count);
      out += fmt::format(
          "| {} | {} | {}×{}×{} | {:.3f} | {:.0f} | {:.0f}% | {:.3f} | {:.0f} | {:.2f} | {}, "
          "{:.3f}, {:.3f} (#{}; {}, {}, {}) | {:.2f} |\n",
          p.name, q.name, q.M, q.N, q.K, f32, tf, 100 * tf / ceiling, b16, tb,
          f32 * double(p.count), lt.candidates, lt.first_ms, lt.best_ms, lt.best, lt.algo_id,
          lt.tile, lt.split_k, lt.best >= 0 ? lt.best_ms / f32 : 1.0);
    }
  }
  out += fmt::format(
      "\nThese products of one {} step at these rates: {:.2f} ms (a step at the MFU goal has "
      "{:.1f} ms for everything); with the faster of ours and cuBLASLt's best candidate for "
      "each: {:.2f} ms.\n",
      model, step_ms, step_budget_ms, best_step_ms);
  return out;
}

struct Point {
  std::string name;
  Arch arch;
  cu::AttentionPath attention = cu::AttentionPath::cublas;  // the model's defaults
  cu::ExpertPath experts = cu::ExpertPath::grouped;
  int64_t micro_batch = 0;  // ModelOptions::micro_batch_seqs: passes of this many sequences
  int64_t logit_rows = 0;   // the LM head's chunk in rows (0: the model's automatic one)
  bool serial_shared = false;  // the MoE's shared expert on the default stream (not beside)
  bool wgrad_beside = false;   // weight gradients on the second stream (set_weight_grad_overlap)
  double capacity_factor = 0;  // ModelOptions::capacity_factor (0: dropless)
  double erc_loss = 0;         // ModelOptions::erc_loss (0: off)
  bool adamw_beside = false;   // the AdamW update beside the next forward (set_update_overlap)
  bool norm_after = false;     // the gradient norm's sums after the backward (set_norm_overlap)
  bool pdl = false;  // programmatic dependent launches of the project's kernels (launch.cuh)
  bool router_tiled = false;  // the router's products on the tiled kernels (RouterPath::tiled)
};

Arch dense124() {
  Arch a;
  a.d_model = 768;
  a.layers = 12;
  a.dense_layers = 12;
  a.heads = 12;
  a.kv_heads = 12;
  a.head_dim = 64;
  a.d_ffn = 3456;  // 12·(4·768² + 3·768·3456) = 123.9M non-embedding
  a.seq_len = 1024;
  a.vocab = 50304;
  return a;
}

Arch moe_equal_n() {
  Arch a;
  a.d_model = 512;
  a.layers = 8;
  a.dense_layers = 0;
  a.heads = 8;
  a.kv_heads = 8;
  a.head_dim = 64;
  a.experts = 66;  // fine-grained: E·D_e = 8448
  a.top_k = 5;
  a.d_expert = 128;
  a.d_shared = 640;  // = K·D_e, the paper family's shared width
  a.seq_len = 1024;
  a.vocab = 50304;
  return a;
}

// Synthetic tokens shared with torch_ref.py: x = ((b·S + t)·7919 + step·104729) mod V.
void make_batch(std::vector<int32_t>& in, std::vector<int32_t>& tg, int64_t B, int64_t S, int64_t V,
                int64_t step) {
  in.resize(size_t(B * S));
  tg.resize(size_t(B * S));
  for (int64_t i = 0; i < B * S; ++i) {
    in[size_t(i)] = int32_t((i * 7919 + step * 104729) % V);
    tg[size_t(i)] = int32_t(((i + 1) * 7919 + step * 104729) % V);
  }
}

}  // namespace

// Every point bench_gpu knows, in the order it times them (--only picks some, in this order).
std::vector<Point> bench_points() {
  const auto fused = cu::AttentionPath::fused, cublas = cu::AttentionPath::cublas,
             fused_mma = cu::AttentionPath::fused_mma;
  const auto tiled = cu::ExpertPath::tiled;
  return {
      Point{"dense-124M", dense124()}, Point{"dense-124M-fused-attn", dense124(), fused},
      Point{"moe-ra0.2", moe_equal_n()}, Point{"moe-ra0.2-fused-attn", moe_equal_n(), fused},
      Point{"moe-ra0.2-tiled", moe_equal_n(), cublas, tiled},
      Point{"moe-ra0.2-tiled-fused-attn", moe_equal_n(), fused, tiled},
      Point{"dense-124M-fused-mma-attn", dense124(), fused_mma},
      Point{"moe-ra0.2-tiled-fused-mma-attn", moe_equal_n(), fused_mma, tiled},
      Point{"moe-ra0.2-loop", moe_equal_n(), cublas, cu::ExpertPath::loop},
      Point{"moe-ra0.2-batched", moe_equal_n(), cublas, cu::ExpertPath::batched},
      Point{"moe-ra0.2-batched-fused-mma-attn", moe_equal_n(), fused_mma, cu::ExpertPath::batched},
      // What gradient accumulation costs: the same batch in passes of 2 sequences.
      Point{"dense-124M-passes-of-2", dense124(), cublas, cu::ExpertPath::grouped, 2},
      Point{"moe-ra0.2-passes-of-2", moe_equal_n(), cublas, cu::ExpertPath::grouped, 2},
      // What the LM head in chunks costs: 4 chunks of 2048 rows (the head's weight gradient
      // read and written once a chunk) for 1.9 GB less logits.
      Point{"dense-124M-logits-2048", dense124(), cublas, cu::ExpertPath::grouped, 0, 2048},
      Point{"moe-ra0.2-logits-2048", moe_equal_n(), cublas, cu::ExpertPath::grouped, 0, 2048},
      // The register-resident forward at 32 query rows a warp (the same bits): after the
      // default points, so that gpu-check can compare their kernel times with these.
      Point{"dense-124M-fused-mma-wide-attn", dense124(), cu::AttentionPath::fused_mma_wide},
      Point{"moe-ra0.2-tiled-fused-mma-wide-attn", moe_equal_n(), cu::AttentionPath::fused_mma_wide,
            tiled},
      // The default MoE point with its shared expert on the default stream, one kernel after
      // another: what running it beside the routing and routed experts saves.
      Point{"moe-ra0.2-tiled-fused-mma-attn-serial-shared", moe_equal_n(), fused_mma, tiled, 0, 0,
            true},
      // The default points with the weight gradients beside the input gradients after them.
      Point{"dense-124M-fused-mma-attn-wgrad-beside", dense124(), fused_mma,
            cu::ExpertPath::grouped, 0, 0, false, true},
      Point{"moe-ra0.2-tiled-fused-mma-attn-wgrad-beside", moe_equal_n(), fused_mma, tiled, 0, 0,
            false, true},
      // The default MoE point with the training options that cost time of their own: a
      // capacity factor (one host wait per MoE layer for the kept rows) and the ERC loss (fp32
      // products of E x Dm x E*De a layer, three a step).
      Point{"moe-ra0.2-tiled-fused-mma-attn-capacity-1.25", moe_equal_n(), fused_mma, tiled, 0, 0,
            false, false, 1.25},
      Point{"moe-ra0.2-tiled-fused-mma-attn-erc", moe_equal_n(), fused_mma, tiled, 0, 0, false,
            false, 0, 0.01},
      // The default MoE point with the routed experts in 128-row tiles (8 warps a block).
      Point{"moe-ra0.2-tiled128-fused-mma-attn", moe_equal_n(), fused_mma,
            cu::ExpertPath::tiled128},
      // The default points with the lean dK/dV kernel (168 registers, three blocks an SM).
      Point{"dense-124M-fused-mma-lean-attn", dense124(), cu::AttentionPath::fused_mma_lean},
      Point{"moe-ra0.2-tiled-fused-mma-lean-attn", moe_equal_n(), cu::AttentionPath::fused_mma_lean,
            tiled},
      // Both options together: what `auto` would run if each wins on its own.
      Point{"moe-ra0.2-tiled128-fused-mma-lean-attn", moe_equal_n(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::tiled128},
      // The automatic kernels' points with the AdamW update beside the next step's forward.
      Point{"dense-124M-fused-mma-lean-attn-adamw-beside", dense124(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::grouped, 0, 0, false, false, 0, 0,
            true},
      Point{"moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside", moe_equal_n(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::tiled128, 0, 0, false, false, 0, 0,
            true},
      // The same with the gradient norm summed after the backward, as before 2026-12-05
      // (the points above sum it beside, a bucket at a time): what that saves.
      Point{"dense-124M-fused-mma-lean-attn-adamw-beside-norm-after", dense124(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::grouped, 0, 0, false, false, 0, 0,
            true, true},
      Point{"moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-norm-after", moe_equal_n(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::tiled128, 0, 0, false, false, 0, 0,
            true, true},
      // The routed experts on wgmma (sm_90a): the kernel-times point, and the goal's point.
      Point{"moe-ra0.2-wgmma-fused-mma-lean-attn", moe_equal_n(), cu::AttentionPath::fused_mma_lean,
            cu::ExpertPath::wgmma},
      Point{"moe-ra0.2-wgmma-fused-mma-lean-attn-adamw-beside", moe_equal_n(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::wgmma, 0, 0, false, false, 0, 0,
            true},
      // The attention forward and dK/dV on wgmma (sm_90a, head width 64): the dense
      // kernel-times point, and the goals' points with it (and with the wgmma experts too).
      Point{"dense-124M-fused-wgmma-attn", dense124(), cu::AttentionPath::fused_wgmma},
      Point{"dense-124M-fused-wgmma-attn-adamw-beside", dense124(), cu::AttentionPath::fused_wgmma,
            cu::ExpertPath::grouped, 0, 0, false, false, 0, 0, true},
      Point{"moe-ra0.2-tiled128-fused-wgmma-attn-adamw-beside", moe_equal_n(),
            cu::AttentionPath::fused_wgmma, cu::ExpertPath::tiled128, 0, 0, false, false, 0, 0,
            true},
      Point{"moe-ra0.2-wgmma-fused-wgmma-attn-adamw-beside", moe_equal_n(),
            cu::AttentionPath::fused_wgmma, cu::ExpertPath::wgmma, 0, 0, false, false, 0, 0, true},
      // The goals' points with programmatic dependent launches (--kernels launch=pdl): each
      // of the project's kernels launched while the one before it ends. Also with the wgmma
      // kernels, in case those win.
      Point{"dense-124M-fused-mma-lean-attn-adamw-beside-pdl", dense124(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::grouped, 0, 0, false, false, 0, 0,
            true, false, true},
      Point{"moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-pdl", moe_equal_n(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::tiled128, 0, 0, false, false, 0, 0,
            true, false, true},
      Point{"dense-124M-fused-wgmma-attn-adamw-beside-pdl", dense124(),
            cu::AttentionPath::fused_wgmma, cu::ExpertPath::grouped, 0, 0, false, false, 0, 0, true,
            false, true},
      Point{"moe-ra0.2-wgmma-fused-wgmma-attn-adamw-beside-pdl", moe_equal_n(),
            cu::AttentionPath::fused_wgmma, cu::ExpertPath::wgmma, 0, 0, false, false, 0, 0, true,
            false, true},
      // The MoE goal's point with the router's three products on the tiled kernels
      // (--kernels router=tiled) instead of cuBLAS (16–21 µs each at batch 8, run C's table).
      Point{"moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-router-tiled", moe_equal_n(),
            cu::AttentionPath::fused_mma_lean, cu::ExpertPath::tiled128, 0, 0, false, false, 0, 0,
            true, false, false, true}};
}

int main(int argc, char** argv) {
  int steps = 20, warmup = 5;  // warm-up: cuBLAS sets up each new shape on first use
  int64_t batch = 8;
  std::string json_path, only;  // only: ",name,name," to run a subset of the points
  std::string tune_path, table_path;
  std::string kernels_spec;  // --kernels: the points' kernels replaced by these
  bool kernel_times = false;
  bool shapes = false;
  bool list_points = false;
  // Every option known and with its value, or one line and exit 2 (unknown options and a last
  // option without its value were skipped in silence; atoi read "abc" as 0 steps).
  const char* usage =
      "bench_gpu [--steps N=20] [--warmup N=5] [--batch B=8] [--json FILE] [--only NAME,NAME] "
      "[--gemm-tune FILE] [--gemm-table FILE] [--kernels SPEC] [--kernel-times] [--gemm-shapes] "
      "[--list-points]";
  auto refuse = [&](const std::string& why) {
    std::fprintf(stderr, "bench_gpu: %s (usage: %s)\n", why.c_str(), usage);
    std::exit(2);
  };
  auto count = [&](const char* flag, const char* v, int64_t lo, int64_t hi) {
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (end == v || *end != '\0' || n < lo || n > hi)
      refuse(fmt::format("{} '{}': give a whole number from {} to {}", flag, v, lo, hi));
    return int64_t(n);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf("usage: %s\n", usage);
      return 0;
    }
    if (k == "--kernel-times") {
      kernel_times = true;
      continue;
    }
    if (k == "--gemm-shapes") {
      shapes = true;
      continue;
    }
    if (k == "--list-points") {
      list_points = true;
      continue;
    }
    const bool known = k == "--steps" || k == "--warmup" || k == "--batch" || k == "--json" ||
                       k == "--only" || k == "--gemm-tune" || k == "--gemm-table" ||
                       k == "--kernels";
    if (!known) refuse(fmt::format("'{}' is not an option", k));
    if (i + 1 >= argc) refuse(fmt::format("{} needs a value", k));
    const char* v = argv[++i];
    if (k == "--steps")
      steps = int(count("--steps", v, 1, 100000));
    else if (k == "--warmup")
      warmup = int(count("--warmup", v, 0, 100000));
    else if (k == "--batch")
      batch = count("--batch", v, 1, 4096);
    else if (k == "--json")
      json_path = v;
    else if (k == "--only")
      only = std::string(",") + v + ",";
    else if (k == "--gemm-tune")
      tune_path = v;
    else if (k == "--kernels") {
      kernels_spec = v;
      if (kernels_spec.empty())
        refuse("--kernels needs a spec, e.g. experts=wgmma,launch=pdl (moeplan run's syntax)");
    } else
      table_path = v;
  }
  // The points, and every name --only gives checked against them, before any device work: a
  // misspelt name is refused, not left out in silence while the others are timed (a lent GPU's
  // minutes spent on a list that lacks the point the run was for).
  const std::vector<Point> points = bench_points();
  if (list_points) {
    for (const Point& p : points) std::printf("%s\n", p.name.c_str());
    return 0;
  }
  if (!only.empty()) {
    std::string known;
    for (const Point& p : points) known += (known.empty() ? "" : ", ") + p.name;
    for (size_t at = 1; at < only.size();) {
      const size_t comma = only.find(',', at);
      const std::string name = only.substr(at, comma - at);
      at = comma + 1;
      if (std::none_of(points.begin(), points.end(),
                       [&](const Point& p) { return p.name == name; }))
        refuse(fmt::format("--only: '{}' is not a point (the points: {})", name, known));
    }
  }
  // --kernels SPEC: each point run with the kernels SPEC names (moeplan run's syntax; attention,
  // experts, launch and router only) in place of its own, named POINT-with-SPEC: what the goals'
  // points give with the kernels a run has found fastest (gpu-check's bench-best).
  cu::KernelChoice with;
  if (!kernels_spec.empty()) {
    try {
      with = cu::parse_kernel_choice(kernels_spec);
    } catch (const std::exception& e) {
      refuse(e.what());
    }
    if (with.logit_rows > 0 || !with.gemm_table.empty())
      refuse(
          fmt::format("--kernels {}: logits and gemm are not point kernels here (valid: "
                      "attention, experts, launch, router; --gemm-table for the table)",
                      kernels_spec));
  }
  std::shared_ptr<const cu::GemmTable> table;
  bool lenient = false;    // a built-in table (gemm=auto), as `moeplan run` takes it
  std::string table_name;  // what the JSON's "gemm_table" says: "builtin:NAME", a file, ""
  std::string suffix;      // of the point names: "" (auto), -no-gemm-table, -lt-table
  if (table_path == "none") {
    suffix = "-no-gemm-table";
  } else if (!table_path.empty() && table_path != "auto") {
    suffix = "-lt-table";
    table_name = table_path;
    try {
      table = std::make_shared<const cu::GemmTable>(cu::load_gemm_table(table_path));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_gpu: %s\n", e.what());
      return 2;
    }
  }
  std::vector<std::pair<cu::GemmShape, int64_t>> tune_shapes;  // --gemm-tune: all points' shapes
  int devices = 0;
  try {
    devices = cu::device_count();
  } catch (const std::exception& e) {  // a GPU CUDA cannot use (an old driver): a failure
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  if (devices == 0) {
    // Not a measurement: said on stderr, with automake's "skipped" status, so that a script
    // cannot read it as a run that measured.
    std::fprintf(stderr, "bench_gpu: no CUDA device, nothing measured\n");
    return 77;
  }
  const cu::DeviceInfo dev = cu::device_info(0);
  const double ceiling = gemm_ceiling_tflops();
  std::printf(
      "device: %s, %d SMs; vendor dense bf16 peak %.0f TFLOP/s; measured bf16 GEMM "
      "ceiling (cuBLAS 8192^3, median of 10) %.1f TFLOP/s\n",
      dev.name.c_str(), dev.multiprocessors, dev.peak_bf16_tflops, ceiling);
  if (table_path.empty() || table_path == "auto") {
    const auto [device, version] = cu::gemm_table_identity();
    if (const cu::BuiltinGemmTable* b = cu::builtin_gemm_table_for(device, version)) {
      table = b->table;
      lenient = true;
      table_name = "builtin:" + b->name;
      std::printf("GEMM table: built-in '%s' (gemm=auto, as moeplan run takes it)\n",
                  b->name.c_str());
    } else {
      std::printf("GEMM table: none (none built in for '%s' with cuBLASLt %llu)\n", device.c_str(),
                  (unsigned long long)version);
    }
  }
  if (shapes) {
    // The step time an MFU goal allows: the point's exact/causal FLOPs a step (the analytic
    // ledger, dropless) at the goal's share of the vendor peak (the H200's 989 TFLOP/s where the
    // device is unknown). At batch 8: dense 8.4513e12 / (0.4 · 989e12) = 21.4 ms, MoE
    // 2.6710e12 / (0.25 · 989e12) = 10.8 ms.
    const double peak = dev.peak_bf16_tflops > 0 ? dev.peak_bf16_tflops : 989.0;
    auto goal_ms = [&](const Arch& a, double mfu) {
      return double(exact_step_ledger(a, batch).total()) / (mfu * peak * 1e12) * 1e3;
    };
    // dense-124M (Dm 768, Dffn 3456, 12 layers): goal 40 % MFU.
    const int64_t T = batch * 1024, V = 50304;
    std::printf("%s", gemm_shapes_table("dense-124M", T,
                                        {{"qkv", 768, 3 * 768, 12},
                                         {"attention out", 768, 768, 12},
                                         {"ffn up (gate+up)", 768, 2 * 3456, 12},
                                         {"ffn down", 3456, 768, 12},
                                         {"lm head", 768, V, 1}},
                                        ceiling, goal_ms(dense124(), 0.4))
                          .c_str());
    // moe-ra0.2's products outside the routed experts (Dm 512, 8 layers, shared expert 640, 66
    // experts' router): goal 25 % MFU.
    std::printf("%s", gemm_shapes_table("moe-ra0.2, all but the routed experts", T,
                                        {{"qkv", 512, 3 * 512, 8},
                                         {"attention out", 512, 512, 8},
                                         {"router", 512, 66, 8},
                                         {"shared up (gate+up)", 512, 2 * 640, 8},
                                         {"shared down", 640, 512, 8},
                                         {"lm head", 512, V, 1}},
                                        ceiling, goal_ms(moe_equal_n(), 0.25))
                          .c_str());
    return 0;
  }
  std::string json = fmt::format(
      "{{\"device\": \"{}\", \"peak_tflops\": {}, \"gemm_ceiling_tflops\": {:.2f}, \"batch_seqs\": "
      "{}, \"points\": [",
      dev.name, dev.peak_bf16_tflops, ceiling, batch);
  std::printf(
      "\n| model | N (non-emb) | N_a | r_a | tokens/step | median step ms | tokens/s "
      "(consumed) | TFLOP/s exact/causal | TFLOP/s executed | MFU vs %.0f | MFU vs "
      "ceiling | expert products; attention |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      dev.peak_bf16_tflops);
  bool first = true;
  // --json written whole or not at all (temp file beside it, then renamed); a failed write is an
  // error, not a run that measured nothing.
  auto write_json = [&] {
    try {
      moeplan::write_file_atomic(json_path, json + "]}\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_gpu: --json: %s\n", e.what());
      std::exit(2);
    }
  };
  for (const Point& listed : points) {
    if (!only.empty() && only.find("," + listed.name + ",") == std::string::npos) continue;
    Point p = listed;
    if (!kernels_spec.empty()) {
      if (with.attention) p.attention = *with.attention;
      if (with.experts) p.experts = *with.experts;
      if (with.launch) p.pdl = *with.launch == cu::LaunchMode::programmatic;
      if (with.router) p.router_tiled = *with.router == cu::RouterPath::tiled;
      p.name += "-with-" + kernels_spec;
    }
    const std::string name = p.name + suffix;
    const ParamCounts pc = count_params(p.arch);
    ModelOptions opt;
    opt.micro_batch_seqs = p.micro_batch;
    opt.capacity_factor = p.capacity_factor;
    opt.erc_loss = p.erc_loss;
    OptimConfig cfg;
    cfg.lr_peak = 6e-4;
    cfg.warmup_steps = 2;
    cfg.total_steps = 1000;
    cu::kernels::set_programmatic_launch(p.pdl);  // process-wide: set for every point
    cu::Model model(p.arch, opt, 1, batch, cu::DType::bf16, nullptr, p.attention, false,
                    p.logit_rows, p.experts);
    model.set_shared_overlap(!p.serial_shared);
    model.set_weight_grad_overlap(p.wgrad_beside);
    model.set_update_overlap(p.adamw_beside);
    model.set_norm_overlap(!p.norm_after);
    model.set_router_path(p.router_tiled ? cu::RouterPath::tiled : cu::RouterPath::cublas);
    if (!tune_path.empty()) {  // one step's products, then on to the next point
      model.record_gemm_shapes(true);
      std::vector<int32_t> in, tg;
      make_batch(in, tg, batch, p.arch.seq_len, p.arch.vocab, 0);
      model.train_step(in.data(), tg.data(), 0, cfg);
      const auto seen = model.gemm_shapes();
      tune_shapes.insert(tune_shapes.end(), seen.begin(), seen.end());
      std::printf("%s: %zu products a step, %zu shapes\n", p.name.c_str(),
                  size_t(model.gemm_counts().products), seen.size());
      continue;
    }
    if (table) model.set_gemm_table(table, lenient);
    std::vector<int32_t> in, tg;
    std::vector<double> secs, busy, waited;  // a step's wall time, and the host's share of it
    int64_t waits = 0;                       // the host's synchronous calls in a step
    FlopLedger per_step;
    double loss0 = 0, loss_last = 0;
    // The batches made before the timed steps: with the update beside the next forward, a step
    // returns before its update ends, and host work between steps would hide that update's
    // rest from every step's time. Each step is timed from its call to its return (once its
    // gradient norm is read); with the update beside, the rest of one step's update falls in the
    // next step's time, so the median is still one step's.
    std::vector<std::vector<int32_t>> ins(size_t(warmup + steps)), tgs(size_t(warmup + steps));
    for (int s = 0; s < warmup + steps; ++s)
      make_batch(ins[size_t(s)], tgs[size_t(s)], batch, p.arch.seq_len, p.arch.vocab, s);
    for (int s = 0; s < warmup + steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      const double w0 = cu::host_wait_seconds();
      const int64_t n0 = cu::host_waits();
      const StepResult r =
          model.train_step(ins[size_t(s)].data(), tgs[size_t(s)].data(), s, cfg);  // norm read
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double w = cu::host_wait_seconds() - w0;
      if (s == 0) loss0 = r.loss;
      loss_last = r.loss;
      if (s >= warmup) {
        secs.push_back(dt);
        busy.push_back(dt - w);
        waited.push_back(w);
        waits = cu::host_waits() - n0;  // the same every step (model test "a step's host waits")
      }
      per_step = r.flops;
    }
    // Where the time goes: three more steps with per-phase CUDA events (not in the median).
    model.set_profiling(true);
    for (int s = 0; s < 3; ++s) {
      make_batch(in, tg, batch, p.arch.seq_len, p.arch.vocab, warmup + steps + s);
      model.train_step(in.data(), tg.data(), warmup + steps + s, cfg);
    }
    std::string phases;
    double phase_total = 0;
    for (const auto& [name, ms] : model.profile_ms_per_step()) phase_total += ms;
    for (const auto& [name, ms] : model.profile_ms_per_step())
      phases += fmt::format("    {:<34} {:8.2f} ms  {:5.1f}%\n", name, ms, 100 * ms / phase_total);
    std::fprintf(stderr, "[%s] device time per step by phase (sum %.2f ms):\n%s", name.c_str(),
                 phase_total, phases.c_str());
    if (kernel_times) {  // an event after every launch: slower steps, the shares are what count
      model.set_profiling(true, true);
      for (int s = 0; s < 3; ++s) {
        make_batch(in, tg, batch, p.arch.seq_len, p.arch.vocab, warmup + steps + 3 + s);
        model.train_step(in.data(), tg.data(), warmup + steps + 3 + s, cfg);
      }
      auto by_kernel = model.profile_ms_per_step();
      model.set_profiling(false);
      std::sort(by_kernel.begin(), by_kernel.end(),
                [](const auto& x, const auto& y) { return x.second > y.second; });
      double total = 0;
      for (const auto& [name, ms] : by_kernel) total += ms;
      std::string rows;
      for (const auto& [name, ms] : by_kernel)
        if (ms >= 0.005 * total)
          rows += fmt::format("    {:<34} {:8.2f} ms  {:5.1f}%\n", name, ms, 100 * ms / total);
      std::fprintf(stderr,
                   "[%s] device time per step by kernel (sum %.2f ms; an event after every "
                   "launch, so a row is the kernel's time plus any gap before it; phase names: "
                   "memory copies and gaps; rows under 0.5%% left out):\n%s",
                   name.c_str(), total, rows.c_str());
    }
    const double t = median(secs);
    const double tokens = double(batch * p.arch.seq_len);
    const double executed = double(per_step.total());
    // Useful work: the exact/causal count without what only this implementation executes (the
    // masked parts of attention tiles, and products recomputed in the backward).
    const double useful = executed - double(per_step.category(FlopCategory::padding)) -
                          double(per_step.category(FlopCategory::recompute));
    const double tf_useful = useful / t / 1e12, tf_exec = executed / t / 1e12;
    const std::string mfu_peak =
        dev.peak_bf16_tflops > 0 ? fmt::format("{:.1f}%", 100 * tf_useful / dev.peak_bf16_tflops)
                                 : "n/a (unknown device)";
    std::printf(
        "| %s | %.1fM | %.1fM | %.3f | %.0f | %.2f | %.0f | %.1f | %.1f | %s | %.1f%% | %s |\n",
        name.c_str(), pc.total_params / 1e6, pc.active_params / 1e6,
        double(pc.active_params) / double(pc.total_params), tokens, t * 1e3, tokens / t, tf_useful,
        tf_exec, mfu_peak.c_str(), 100 * tf_useful / ceiling,
        (std::string(
             p.arch.is_dense()                       ? "-"
             : p.experts == cu::ExpertPath::loop     ? "cublasGemmEx per expert"
             : p.experts == cu::ExpertPath::tiled    ? "tiled (own mma.sync kernels)"
             : p.experts == cu::ExpertPath::tiled128 ? "tiled, 128-row tiles (own mma.sync kernels)"
             : p.experts == cu::ExpertPath::batched  ? "strided-batched over padded rows"
             : p.experts == cu::ExpertPath::wgmma    ? "tiled, 128-row tiles (own wgmma kernels)"
                                                     : "grouped (bf16 out, fp32 add)") +
         (!model.fused_attention()                      ? "; cuBLAS attention"
          : p.attention == cu::AttentionPath::fused_mma ? "; fused attention, mma.sync"
          : p.attention == cu::AttentionPath::fused_mma_wide
              ? "; fused attention, mma.sync, forward 32 rows a warp"
          : p.attention == cu::AttentionPath::fused_mma_lean
              ? "; fused attention, mma.sync, lean dK/dV"
              : "; fused attention") +
         (model.pass_seqs() < batch ? fmt::format("; passes of {}", model.pass_seqs()) : "") +
         (p.arch.d_shared > 0 && p.serial_shared ? "; shared expert not overlapped" : "") +
         (p.wgrad_beside ? "; weight gradients on a second stream" : "") +
         (p.norm_after ? "; gradient norm after the backward" : "") +
         (table ? fmt::format("; {} of {} products by the GEMM table{}",
                              model.gemm_counts().from_table, model.gemm_counts().products,
                              lenient ? " (" + table_name + ")" : "")
                : ""))
            .c_str());
    std::fprintf(stderr, "[%s] loss %.4f -> %.4f over %d steps; %.2f GiB device buffers\n",
                 name.c_str(), loss0, loss_last, warmup + steps,
                 double(model.device_bytes()) / double(1u << 30));
    // The host's side of a step: its own work (issuing launches, cuBLAS's host code, the
    // ledger) and its waits in synchronous calls. A wait near zero says the device waited for
    // the host instead, and fewer or cheaper launches (CUDA graphs) are what would help.
    const double host_busy = median(busy), host_wait = median(waited);
    std::fprintf(stderr,
                 "[%s] host per step (medians): busy %.2f ms, waiting for the device %.2f ms "
                 "in %lld synchronous calls, of %.2f ms\n",
                 name.c_str(), 1e3 * host_busy, 1e3 * host_wait, (long long)waits, 1e3 * t);
    json += fmt::format(
        "{}{{\"name\": \"{}\", \"total_params\": {}, \"active_params\": {}, \"step_seconds\": {}, "
        "\"tokens_per_second_consumed\": {}, \"tflops_exact_causal\": {}, "
        "\"tflops_executed\": {}, \"kernels\": \"{}\", \"micro_batch\": {}, \"logit_rows\": {}, "
        "\"gemm_table\": \"{}\", \"gemm_products\": {}, \"gemm_products_from_table\": {}, "
        "\"host_busy_seconds\": {}, \"host_wait_seconds\": {}, \"host_waits_per_step\": {}}}",
        first ? "" : ", ", name, pc.total_params, pc.active_params, t, tokens / t, tf_useful,
        tf_exec,
        cu::to_string(
            cu::KernelChoice{p.attention, p.experts, 0, "",
                             p.pdl ? cu::LaunchMode::programmatic : cu::LaunchMode::plain,
                             p.router_tiled ? cu::RouterPath::tiled : cu::RouterPath::cublas}),
        p.micro_batch, model.logit_rows(), table_name, model.gemm_counts().products,
        model.gemm_counts().from_table, host_busy, host_wait, waits);
    first = false;
    // Written after every point, so that a later point that fails keeps the earlier ones.
    if (!json_path.empty()) write_json();
  }
  if (!json_path.empty() && first) write_json();  // --gemm-tune times no point: an empty list
  if (!tune_path.empty()) {
    // Keep a candidate that saves at least 3 % of the default's time: below that the medians of
    // 20 calls do not tell them apart reliably.
    // A table already in the file keeps what it lists (timed once, never again): only the
    // shapes it lacks are timed and added, so that one file can gather several batches' shapes.
    std::error_code ec;
    cu::GemmTable t;
    try {
      if (std::filesystem::exists(tune_path, ec)) t = cu::load_gemm_table(tune_path);
      cu::add_tuned_shapes(t, tune_shapes, 0.03, 20);
    } catch (const moeplan::InputError& e) {
      std::fprintf(stderr, "bench_gpu: --gemm-tune %s: %s\n", tune_path.c_str(), e.what());
      return 2;
    }
    cu::save_gemm_table(tune_path, t);
    const auto faster =
        std::count_if(t.entries.begin(), t.entries.end(), [](const auto& e) { return e.lt; });
    std::printf(
        "\nGEMM table (%s, cuBLASLt %llu): %zu of the %zu product shapes faster through "
        "a cuBLASLt candidate than cublasGemmEx's default (taken when at least 3 %% "
        "faster)\n\n| product | default ms | best cuBLASLt ms | saved | taken |\n"
        "|---|---|---|---|---|\n",
        tune_path.c_str(), (unsigned long long)t.cublaslt_version, size_t(faster),
        t.entries.size());
    for (const auto& e : t.entries)
      std::printf("| %s | %.4f | %.4f | %.1f %% | %s |\n", cu::to_string(e.shape).c_str(),
                  e.ms_default, e.ms_chosen, 100 * (1 - e.ms_chosen / e.ms_default),
                  e.lt ? "yes" : "no");
  }
  return 0;
}
