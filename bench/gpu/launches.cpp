// What a training step asks of the host, counted in the CPU emulation of CUDA (no GPU needed):
// kernel launches, library products, asynchronous copies, events, and the calls that block the
// host, for the GPU goals' two models as `moeplan run` trains them. Launch counts follow the
// models' structure (layers, experts, passes), not their widths, so the models here have the
// goals' structure (bench/gpu/main.cpp: dense124, 12 dense layers; moe_equal_n, 8 MoE layers of
// 66 experts, top-5, a shared expert) at small widths, which the emulation runs in seconds.
// Read beside bench_gpu's host table: a step of S ms issuing N calls leaves the device S/N on
// average for each, against the few µs the host takes to issue one. About 6 minutes on one core
// (the emulation runs every kernel); exits 1 if its counts of host waits and products disagree
// with the backend's own (cu::host_waits, Model::gemm_counts).
//
//   bench_launches_emulated            every configuration
//   bench_launches_emulated --by-site  also each configuration's launches by launch site
//                                      (file:line of the launch in backend/cuda)
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_runtime.h"
#include "moeplan/backend/cuda/kernels.hpp"
#include "moeplan/backend/cuda/model.hpp"

namespace cu = moeplan::backend::cuda;
using moeplan::Arch;
using moeplan::backend::ModelOptions;
using moeplan::backend::OptimConfig;

namespace {

Arch small(int64_t layers, int64_t dense_layers) {
  Arch a;
  a.d_model = 64;
  a.layers = layers;
  a.dense_layers = dense_layers;
  a.heads = 1;
  a.kv_heads = 1;
  a.head_dim = 64;  // the goals' head width: the same attention kernels
  a.d_ffn = 128;
  a.seq_len = 64;
  a.vocab = 512;
  return a;
}

Arch dense_goal() {
  return small(12, 12);
}

Arch moe_goal() {
  Arch a = small(8, 0);
  a.experts = 66;
  a.top_k = 5;
  a.d_expert = 8;
  a.d_shared = 40;  // K·D_e
  return a;
}

struct Config {
  std::string name;
  Arch arch;
  cu::AttentionPath attention = cu::AttentionPath::fused_mma_lean;
  cu::ExpertPath experts = cu::ExpertPath::tiled128;
  cu::RouterPath router = cu::RouterPath::cublas;
  int64_t micro_batch = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const bool by_site = argc > 1 && std::strcmp(argv[1], "--by-site") == 0;
  if (argc > 2 || (argc == 2 && !by_site)) {
    std::fprintf(stderr,
                 "bench_launches_emulated: '%s' is not an option (valid: --by-site, or none)\n",
                 argv[argc > 2 && by_site ? 2 : 1]);
    return 2;
  }
  const std::vector<Config> configs = {
      {"dense-124M (fused_mma_lean)", dense_goal()},
      {"moe-ra0.2 (tiled128, fused_mma_lean)", moe_goal()},
      {"moe-ra0.2 router=tiled", moe_goal(), cu::AttentionPath::fused_mma_lean,
       cu::ExpertPath::tiled128, cu::RouterPath::tiled},
      {"moe-ra0.2 experts=wgmma, attention=fused_wgmma", moe_goal(), cu::AttentionPath::fused_wgmma,
       cu::ExpertPath::wgmma},
      {"moe-ra0.2 experts=grouped (cuBLAS)", moe_goal(), cu::AttentionPath::fused_mma_lean,
       cu::ExpertPath::grouped},
      {"moe-ra0.2, two passes of 1", moe_goal(), cu::AttentionPath::fused_mma_lean,
       cu::ExpertPath::tiled128, cu::RouterPath::cublas, 1},
  };
  const int64_t batch = 2;
  std::printf(
      "A training step's host calls (CPU emulation; the goals' structure at small widths, "
      "%lld sequences in one pass unless said; as moeplan run trains: the shared expert and "
      "gradient norm beside, the AdamW update beside the next forward)\n\n",
      (long long)batch);
  std::printf(
      "| model, kernels | launches | launch sites | products | async copies | events "
      "| host waits | all |\n|---|---|---|---|---|---|---|---|\n");
  std::vector<std::pair<std::string, moeplan_emu::Tally>> tallies;
  for (const Config& c : configs) {
    ModelOptions opt;
    opt.micro_batch_seqs = c.micro_batch;
    OptimConfig cfg;
    cfg.total_steps = 10;
    cu::Model m(c.arch, opt, 1, batch, cu::DType::bf16, nullptr, c.attention, false, 0, c.experts);
    m.set_shared_overlap(true);
    m.set_update_overlap(true);
    m.set_norm_overlap(true);
    m.set_router_path(c.router);
    std::vector<int32_t> in(size_t(batch * c.arch.seq_len)), tg(in.size());
    int64_t waits0 = 0, products0 = 0;
    // Three steps; the third is counted (the first plans and allocates, the second is the
    // first to wait for an update beside it).
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = int32_t((int64_t(i) * 7919 + s * 104729) % c.arch.vocab);
        tg[i] = int32_t((int64_t(i + 1) * 7919 + s * 104729) % c.arch.vocab);
      }
      if (s == 2) {
        moeplan_emu::reset_tally();
        waits0 = cu::host_waits();
        products0 = m.gemm_counts().products;
      }
      m.train_step(in.data(), tg.data(), s, cfg);
    }
    const moeplan_emu::Tally t = moeplan_emu::tally();
    // Two counts kept apart from the emulation's: the backend's own, of its waits and of the
    // products it sent through Blas (all but the grouped experts' calls).
    const bool blas_all = c.experts != cu::ExpertPath::grouped;
    if (t.host_waits != cu::host_waits() - waits0 ||
        (blas_all && t.products != m.gemm_counts().products - products0)) {
      std::fprintf(stderr,
                   "%s: the emulation counted %lld host waits and %lld products, the backend %lld "
                   "and %lld\n",
                   c.name.c_str(), t.host_waits, t.products, (long long)(cu::host_waits() - waits0),
                   (long long)(m.gemm_counts().products - products0));
      return 1;
    }
    const long long all = t.launches + t.products + t.async_ops + t.events + t.host_waits;
    std::printf("| %s | %lld | %zu | %lld | %lld | %lld | %lld | %lld |\n", c.name.c_str(),
                t.launches, t.kernels.size(), t.products, t.async_ops, t.events, t.host_waits, all);
    tallies.emplace_back(c.name, t);
  }
  std::printf("\n(each call counted when the host issues it; all: their sum)\n");
  if (by_site)
    for (const auto& [name, t] : tallies) {
      std::printf("\n%s: launches by launch site\n", name.c_str());
      for (const auto& [k, n] : t.kernels) std::printf("  %5lld  %s\n", n, k.c_str());
    }
  return 0;
}
