// The CUDA model against the CPU reference model (same Arch, options, seed, batch): gradients of a
// whole step in fp32, the bf16 step within bf16 tolerance, a 200-step loss curve on the built-in
// corpus, identical FLOP ledgers, bit-for-bit repeatability, the NCCL path at world size 1, and
// save/load.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common.hpp"
#ifdef MOEPLAN_CUDA_EMULATION
#include <cuda_runtime.h>  // the emulated device's memory (cudaMemGetInfo)
#endif
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/backend/corpus.hpp"
#include "moeplan/backend/cuda/comm.hpp"
#include "moeplan/backend/cuda/kernels.hpp"
#include "moeplan/backend/cuda/model.hpp"
#include "moeplan/backend/engine.hpp"
#include "moeplan/backend/model.hpp"
#include "moeplan/planner/equal_resource.hpp"

using namespace gputest;
using moeplan::Arch;
using moeplan::FlopCategory;
using moeplan::FlopLedger;
using moeplan::Phase;
using moeplan::backend::ModelOptions;
using moeplan::backend::OptimConfig;
using moeplan::backend::StepResult;
namespace cu = moeplan::backend::cuda;

namespace {

Arch dense_arch() {
  Arch a;
  a.d_model = 64;
  a.layers = 2;
  a.dense_layers = 2;
  a.heads = 4;
  a.kv_heads = 4;
  a.head_dim = 16;
  a.d_ffn = 128;
  a.seq_len = 32;
  a.vocab = 256;
  return a;
}

Arch moe_arch() {
  Arch a = dense_arch();
  a.layers = 3;
  a.dense_layers = 1;
  a.kv_heads = 2;  // grouped-query attention
  a.experts = 8;
  a.top_k = 2;
  a.d_expert = 32;
  a.d_shared = 32;
  return a;
}

#ifdef MOEPLAN_CUDA_EMULATION
// The emulated device's bytes in use (all of its cudaMalloc'd buffers).
size_t in_use() {
  size_t free_b = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total) == cudaSuccess);
  return total - free_b;
}

// An engine's request for moe_arch() in steps of 48 sequences (the fit check's tests).
moeplan::backend::EngineRequest moe_request() {
  moeplan::backend::EngineRequest req;
  req.arch = moe_arch();
  req.batch_seqs = 48;
  req.seed = 5;
  req.point_id = "moe";
  return req;
}
#endif

struct Batch {
  std::vector<int32_t> inputs, targets;
};

// Windows of the built-in corpus: sequence b of step s is window (s·B + b) mod windows.
Batch corpus_batch(const std::vector<uint16_t>& tok, int64_t B, int64_t S, int64_t step) {
  const int64_t windows = (int64_t(tok.size()) - 1) / S;
  Batch b;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t w = (step * B + i) % windows;
    for (int64_t t = 0; t < S; ++t) {
      b.inputs.push_back(tok[w * S + t]);
      b.targets.push_back(tok[w * S + t + 1]);
    }
  }
  return b;
}

Batch random_batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  Batch b;
  uint64_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < B * S; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b.inputs.push_back(int32_t((x >> 33) % uint64_t(V)));
    b.targets.push_back(i % 11 == 5 ? -1 : int32_t((x >> 17) % uint64_t(V)));
  }
  return b;
}

// The GPU executes the full S×S square: padding holds exactly the masked half, the rest equals.
void check_ledgers(const FlopLedger& gpu, const FlopLedger& cpu, const Arch& a, int64_t B,
                   int64_t fwd_products, int64_t bwd_products) {
  FlopLedger g = gpu;
  const int64_t S = a.seq_len, Dh = a.head_dim;
  CHECK(g.at(FlopCategory::padding, Phase::forward) == fwd_products * Dh * S * (S - 1));
  CHECK(g.at(FlopCategory::padding, Phase::input_grad) == bwd_products * Dh * S * (S - 1));
  g.flops[int(FlopCategory::padding)] = {};
  CHECK(g == cpu);
  (void)B;
}

std::vector<float> vec(std::span<const float> s) {
  return {s.begin(), s.end()};
}

// Diagnostics for a failing comparison: the tensors with the largest relative gradient error,
// and any ledger category that differs.
void print_worst_tensors(const std::vector<moeplan::backend::TensorInfo>& tensors,
                         const std::vector<float>& got, const std::vector<float>& want) {
  std::vector<std::pair<double, std::string>> errs;
  for (const auto& t : tensors) {
    std::vector<float> a(got.begin() + t.offset, got.begin() + t.offset + t.size());
    std::vector<float> b(want.begin() + t.offset, want.begin() + t.offset + t.size());
    errs.push_back({rel_err(a, b), t.name});
  }
  std::sort(errs.rbegin(), errs.rend());
  for (size_t i = 0; i < std::min<size_t>(5, errs.size()); ++i)
    std::printf("    grad rel err %-28s %.2e\n", errs[i].second.c_str(), errs[i].first);
}

void print_ledger_diff(const FlopLedger& g, const FlopLedger& c) {
  for (int i = 0; i < moeplan::kFlopCategories; ++i)
    for (int p = 0; p < moeplan::kPhases; ++p)
      if (g.flops[i][p] != c.flops[i][p])
        std::printf("    ledger %s/%s: gpu %lld cpu %lld\n",
                    std::string(moeplan::name(FlopCategory(i))).c_str(),
                    std::string(moeplan::name(Phase(p))).c_str(),
                    (long long)g.flops[i][p].to_int64(), (long long)c.flops[i][p].to_int64());
}

}  // namespace

TEST_CASE("fp32: one training step's loss, gradients and ledger equal the CPU model's") {
  struct Case {
    const char* name;
    Arch arch;
    ModelOptions opt;
  };
  ModelOptions alibi;
  ModelOptions rope;
  rope.positions = "rope";
  rope.renormalize_gates = true;
  rope.z_loss = 1e-3;
  Arch tied = moe_arch();
  tied.tied_embeddings = true;
  ModelOptions erc;  // the ERC loss of Lv et al.: noise from the CPU's generator, continued
  erc.erc_loss = 0.5;
  erc.erc_alpha = 0.8;
  const Case cases[] = {{"dense alibi", dense_arch(), alibi},
                        {"moe rope gqa z-loss renorm", moe_arch(), rope},
                        {"moe alibi tied", tied, alibi},
                        {"moe alibi erc", moe_arch(), erc}};
  const int64_t B = 3;
  for (const Case& c : cases) {
    INFO(c.name);
    moeplan::backend::Model<float> ref(c.arch, c.opt, 42, B);
    cu::Model gpu(c.arch, c.opt, 42, B, DType::f32);
    CHECK(vec(ref.parameters()) == gpu.parameters());  // same initial weights
    const Batch b = random_batch(B, c.arch.seq_len, c.arch.vocab, 3);
    StepResult rc, rg;
    const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
    const double og = gpu.compute_gradients(b.inputs.data(), b.targets.data(), &rg);
    const double grad_err = rel_err(gpu.gradients(), vec(ref.gradients()));
    std::printf("[%s] objective cpu %.7f gpu %.7f, gradient rel err %.2e\n", c.name, oc, og,
                grad_err);
    print_worst_tensors(gpu.tensors(), gpu.gradients(), vec(ref.gradients()));
    print_ledger_diff(rg.flops, rc.flops);
    CHECK(std::abs(og - oc) / oc < 1e-5);
    CHECK(std::abs(rg.aux_load_balance - rc.aux_load_balance) <= 1e-5 * rc.aux_load_balance + 1e-9);
    CHECK(std::abs(rg.aux_z - rc.aux_z) <= 1e-5 * rc.aux_z + 1e-12);
    CHECK(std::abs(rg.aux_erc - rc.aux_erc) <= 1e-5 * rc.aux_erc + 1e-12);
    if (c.opt.erc_loss > 0) CHECK(rc.aux_erc > 0);  // the case tests something
    CHECK(grad_err < 1e-4);
    CHECK(rg.routed_per_moe_layer == rc.routed_per_moe_layer);
    check_ledgers(rg.flops, rc.flops, c.arch, B, 2 * B * c.arch.heads * c.arch.layers,
                  4 * B * c.arch.heads * c.arch.layers);
    // The CPU ledger is itself the analytic exact count (issue 4): so is ours, padding aside.
    FlopLedger g = rg.flops;
    g.flops[int(FlopCategory::padding)] = {};
    moeplan::ExactStepOptions eo;
    eo.routed_per_moe_layer = rg.routed_per_moe_layer;
    eo.erc_loss = c.opt.erc_loss > 0;
    CHECK(g.flops == moeplan::exact_step_ledger(c.arch, B, eo).flops);
  }
}

TEST_CASE("gradient accumulation: passes of 2+2+1 sequences give the CPU's accumulated step") {
  // fp32 (cuBLAS attention: a short pass reads the first sequences of each query-head group of
  // the pointer tables), with the load balance and z-loss on, so the per-pass weights count.
  ModelOptions opt;
  opt.positions = "rope";
  opt.z_loss = 1e-3;
  opt.load_balance = 0.02;
  opt.micro_batch_seqs = 2;
  const int64_t B = 5;
  for (const Arch& arch : {dense_arch(), moe_arch()}) {
    const char* name = arch.experts > 0 ? "moe rope gqa" : "dense";
    INFO(name);
    moeplan::backend::Model<float> ref(arch, opt, 42, B);
    cu::Model gpu(arch, opt, 42, B, DType::f32);
    CHECK(gpu.batch_seqs() == B);
    CHECK(gpu.pass_seqs() == 2);
    const Batch b = random_batch(B, arch.seq_len, arch.vocab, 17);
    StepResult rc, rg;
    const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
    const double og = gpu.compute_gradients(b.inputs.data(), b.targets.data(), &rg);
    const double grad_err = rel_err(gpu.gradients(), vec(ref.gradients()));
    std::printf("[passes 2+2+1] objective cpu %.7f gpu %.7f, gradient rel err %.2e\n", oc, og,
                grad_err);
    print_worst_tensors(gpu.tensors(), gpu.gradients(), vec(ref.gradients()));
    CHECK(std::abs(og - oc) / oc < 1e-5);
    CHECK(std::abs(rg.aux_load_balance - rc.aux_load_balance) <= 1e-5 * rc.aux_load_balance);
    CHECK(std::abs(rg.aux_z - rc.aux_z) <= 1e-5 * rc.aux_z + 1e-12);
    CHECK(grad_err < 1e-4);
    CHECK(rg.loss_bearing_targets == rc.loss_bearing_targets);
    CHECK(rg.routed_per_moe_layer == rc.routed_per_moe_layer);
    check_ledgers(rg.flops, rc.flops, arch, B, 2 * B * arch.heads * arch.layers,
                  4 * B * arch.heads * arch.layers);
  }
}

// In its own test case: gpu-check runs the kernels first measured on a GPU (`*tiled*`) apart.
TEST_CASE("gradient accumulation: bf16 fused attention and tiled experts in passes equal one pass") {
  // bf16, each kernel set: passes of 2+2+1 against one pass of 5.
  ModelOptions opt;
  opt.positions = "rope";
  opt.z_loss = 1e-3;
  const int64_t B = 5;
  const Arch a = moe_arch();
  ModelOptions one = opt;
  one.micro_batch_seqs = 0;
  one.load_balance = 0;  // per pass it differs from the whole batch's
  ModelOptions passes = one;
  passes.micro_batch_seqs = 2;
  const Batch b = random_batch(B, a.seq_len, a.vocab, 18);
  struct Kernels {
    const char* name;
    cu::AttentionPath attention;
    cu::ExpertPath experts;
  };
  for (const Kernels& k : {Kernels{"fused, tiled", cu::AttentionPath::fused, cu::ExpertPath::tiled},
                           Kernels{"fused_mma, tiled", cu::AttentionPath::fused_mma,
                                   cu::ExpertPath::tiled},
                           Kernels{"cublas, grouped", cu::AttentionPath::cublas,
                                   cu::ExpertPath::grouped}}) {
    INFO(k.name);
    cu::Model whole(a, one, 9, B, DType::bf16, nullptr, k.attention);
    cu::Model acc(a, passes, 9, B, DType::bf16, nullptr, k.attention);
    whole.set_expert_path(k.experts);
    acc.set_expert_path(k.experts);
    CHECK(acc.fused_attention() == (k.attention != cu::AttentionPath::cublas));
    StepResult rw, ra;
    const double ow = whole.compute_gradients(b.inputs.data(), b.targets.data(), &rw);
    const double oa = acc.compute_gradients(b.inputs.data(), b.targets.data(), &ra);
    const double grad_err = rel_err(acc.gradients(), whole.gradients());
    std::printf("[bf16 %s, passes 2+2+1 vs one] objective %.6f vs %.6f, grad rel err %.2e\n",
                k.name, oa, ow, grad_err);
    CHECK(std::abs(oa - ow) / ow < 1e-5);
    CHECK(grad_err < 1e-2);
    // Tiles are padded per pass, so only the useful products must agree.
    FlopLedger fa = ra.flops, fw = rw.flops;
    fa.flops[int(FlopCategory::padding)] = {};
    fw.flops[int(FlopCategory::padding)] = {};
    CHECK(fa == fw);
  }
}

TEST_CASE("LM head in chunks of rows: the CPU's step and evaluation, less memory, same ledger") {
  // fp32, chunks of 37 rows: they cross sequence boundaries (S 32) and the last is short. Passes of
  // 2+2+1 sequences (64, 64, 32 rows: chunks 37+27, 37+27, 32). Untied (lm_head) and tied heads.
  ModelOptions opt;
  opt.micro_batch_seqs = 2;
  Arch tied = moe_arch();
  tied.tied_embeddings = true;
  const int64_t B = 5, rows = 37;
  for (const Arch& arch : {dense_arch(), tied}) {
    const char* name = arch.tied_embeddings ? "moe tied" : "dense";
    INFO(name);
    moeplan::backend::Model<float> ref(arch, opt, 42, B);
    cu::Model whole(arch, opt, 42, B, DType::f32);
    cu::Model chunked(arch, opt, 42, B, DType::f32, nullptr, cu::AttentionPath::cublas, false,
                      rows);
    CHECK(whole.logit_rows() == 2 * arch.seq_len);  // the automatic chunk holds a whole pass
    CHECK(chunked.logit_rows() == rows);
    // The fp32 logits and their fp32 gradient: 8 bytes a row and vocabulary entry.
    CHECK(whole.device_bytes() - chunked.device_bytes() ==
          size_t((2 * arch.seq_len - rows) * arch.vocab * 8));
    const Batch b = random_batch(B, arch.seq_len, arch.vocab, 23);
    StepResult rc, rw, rk;
    const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
    const double ow = whole.compute_gradients(b.inputs.data(), b.targets.data(), &rw);
    const double ok = chunked.compute_gradients(b.inputs.data(), b.targets.data(), &rk);
    const double err_cpu = rel_err(chunked.gradients(), vec(ref.gradients()));
    const double err_whole = rel_err(chunked.gradients(), whole.gradients());
    std::printf("[logits in chunks of %lld rows, %s] objective cpu %.7f chunked %.7f, gradient "
                "rel err vs cpu %.2e, vs whole-pass head %.2e\n",
                (long long)rows, name, oc, ok, err_cpu, err_whole);
    print_worst_tensors(chunked.tensors(), chunked.gradients(), vec(ref.gradients()));
    CHECK(std::abs(ok - oc) / oc < 1e-5);
    CHECK(std::abs(ok - ow) / ow < 1e-6);
    CHECK(err_cpu < 1e-4);
    CHECK(err_whole < 1e-5);  // only the head's weight gradient adds in another order
    CHECK(rk.flops == rw.flops);
    check_ledgers(rk.flops, rc.flops, arch, B, 2 * B * arch.heads * arch.layers,
                  4 * B * arch.heads * arch.layers);
    // Evaluation in chunks: the same loss at every position.
    std::vector<double> pc(size_t(B * arch.seq_len)), pk(pc.size());
    const double ec = ref.forward_loss(b.inputs.data(), b.targets.data(), B, pc.data());
    const double ek = chunked.forward_loss(b.inputs.data(), b.targets.data(), B, pk.data());
    double worst = 0;
    for (size_t i = 0; i < pc.size(); ++i)
      worst = std::max(worst, std::abs(pk[i] - pc[i]) / std::max(1.0, std::abs(pc[i])));
    std::printf("[logits in chunks, %s] eval loss cpu %.7f chunked %.7f, worst position %.2e\n",
                name, ec, ek, worst);
    CHECK(std::abs(ek - ec) / ec < 1e-5);
    CHECK(worst < 1e-5);
    whole.forward_loss(b.inputs.data(), b.targets.data(), B, pc.data());
    CHECK(chunked.eval_ledger() == whole.eval_ledger());
  }
}

TEST_CASE("bf16: one step within bf16 tolerance of the CPU") {
  const Arch a = moe_arch();
  ModelOptions plain, erc;
  erc.erc_loss = 0.5;  // its products run in fp32 in either mode
  for (const ModelOptions& opt : {plain, erc}) {
    INFO("erc_loss " << opt.erc_loss);
    const int64_t B = 8, S = a.seq_len;
    moeplan::backend::Model<float> ref(a, opt, 7, B);
    cu::Model gpu(a, opt, 7, B, DType::bf16);
    const Batch b = random_batch(B, S, a.vocab, 5);
    StepResult rc, rg;
    const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
    const double og = gpu.compute_gradients(b.inputs.data(), b.targets.data(), &rg);
    const double grad_err = rel_err(gpu.gradients(), vec(ref.gradients()));
    std::printf(
        "[bf16 step, erc %.1f] objective cpu %.6f gpu %.6f (erc cpu %.3e gpu %.3e), "
        "gradient rel err %.2e\n",
        opt.erc_loss, oc, og, rc.aux_erc, rg.aux_erc, grad_err);
    print_worst_tensors(gpu.tensors(), gpu.gradients(), vec(ref.gradients()));
    CHECK(std::abs(og - oc) / oc < 2e-2);
    CHECK(std::abs(rg.aux_erc - rc.aux_erc) <= 2e-2 * rc.aux_erc);
    CHECK(grad_err < 5e-2);
  }
}

TEST_CASE("the MoE layers `moeplan grid --N 2e9` plans, at a narrower width: the CPU's step") {
  // Issue 6's scale: the experts, top-K, expert and shared widths and head width that the
  // planner gives for N = 2e9 (as `moeplan grid --N 2e9 --ra 0.05:0.4` prints them), not the
  // small shapes of the other tests. Its ends and the paper's r_a: 0.05 (460 experts, top-1,
  // D_e 64), 0.2 (95, top-7, D_e 288) and 0.4 (84, top-18, D_e 288, a shared width of 5,184);
  // head width 128. The width is narrowed to two heads (d_model 256) and the depth to one dense
  // and one MoE layer, so that the CPU reference and the emulation run it (about 45 s here).
  // fp32 against the CPU's gradients tightly; bf16 with the kernels `auto` takes for head width
  // 128 on an H100/H200 (fused_mma, tiled128) within bf16 tolerance.
  moeplan::PlanRequest req;
  req.n_target = 2e9;
  const moeplan::EqualResourcePlanner planner(req);
  for (const double ra : {0.05, 0.2, 0.4}) {
    const moeplan::Plan p = planner.plan_point(ra);
    Arch a = p.arch;
    REQUIRE(a.experts > 0);
    CHECK(a.head_dim == 128);
    a.heads = a.kv_heads = 2;
    a.d_model = 2 * a.head_dim;
    a.d_ffn = 512;
    a.layers = 2;
    a.dense_layers = 1;
    a.seq_len = 32;
    a.vocab = 256;
    INFO(p.id << ": E" << a.experts << " K" << a.top_k << " De" << a.d_expert << " Dse"
              << a.d_shared);
    const int64_t B = 2;
    const ModelOptions opt;
    moeplan::backend::Model<float> ref(a, opt, 7, B);
    cu::Model f32(a, opt, 7, B, DType::f32);
    cu::Model b16(a, opt, 7, B, DType::bf16, nullptr, cu::AttentionPath::fused_mma);
    b16.set_expert_path(cu::ExpertPath::tiled128);
    const Batch b = random_batch(B, a.seq_len, a.vocab, 5);
    StepResult rc, r32, r16;
    const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
    const double o32 = f32.compute_gradients(b.inputs.data(), b.targets.data(), &r32);
    const double o16 = b16.compute_gradients(b.inputs.data(), b.targets.data(), &r16);
    const std::vector<float> want = vec(ref.gradients());
    const double e32 = rel_err(f32.gradients(), want), e16 = rel_err(b16.gradients(), want);
    std::printf(
        "[%s E%lld K%lld De%lld Dse%lld] objective cpu %.7f fp32 %.7f bf16 %.6f; gradient rel "
        "err fp32 %.2e bf16 %.2e\n",
        p.id.c_str(), (long long)a.experts, (long long)a.top_k, (long long)a.d_expert,
        (long long)a.d_shared, oc, o32, o16, e32, e16);
    CHECK(std::abs(o32 - oc) / oc < 1e-5);
    CHECK(e32 < 1e-4);
    CHECK(std::abs(o16 - oc) / oc < 2e-2);
    CHECK(e16 < 5e-2);
    CHECK(r32.routed_per_moe_layer == rc.routed_per_moe_layer);
    // Top-K over E experts for T tokens: every token routed K times (no capacity set).
    CHECK(rc.routed_per_moe_layer[0] == B * a.seq_len * a.top_k);
    check_ledgers(r32.flops, rc.flops, a, B, 2 * B * a.heads * a.layers,
                  4 * B * a.heads * a.layers);
  }
}

TEST_CASE("bf16: 200 steps on the built-in corpus follow the CPU's loss curve") {
  const Arch a = moe_arch();
  ModelOptions opt;
  const int64_t B = 8, S = a.seq_len;
  const auto corpus = moeplan::backend::builtin_corpus(11, 0, 200 * B * S + 1).tokens;
  moeplan::backend::Model<float> ref(a, opt, 9, B);
  cu::Model gpu(a, opt, 9, B, DType::bf16);
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.warmup_steps = 20;
  cfg.total_steps = 200;
  double worst = 0, tail_cpu = 0, tail_gpu = 0, first = 0;
  for (int64_t s = 0; s < 200; ++s) {
    const Batch b = corpus_batch(corpus, B, S, s);
    const StepResult rc = ref.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    const StepResult rg = gpu.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    if (s == 0) first = rc.loss;
    worst = std::max(worst, std::abs(rg.loss - rc.loss) / rc.loss);
    if (s >= 180) {
      tail_cpu += rc.loss / 20;
      tail_gpu += rg.loss / 20;
    }
    FlopLedger g = rg.flops;
    g.flops[int(FlopCategory::padding)] = {};
    g.flops[int(FlopCategory::recompute)] = {};  // the fused attention's backward recompute
    // Routing may differ between bf16 and fp32 on near ties: compare against the analytic count
    // of the GPU's own routing, and the totals of the routing-independent categories.
    moeplan::ExactStepOptions eo;
    eo.routed_per_moe_layer = rg.routed_per_moe_layer;
    CHECK(g.flops == moeplan::exact_step_ledger(a, B, eo).flops);
    CHECK(rg.flops.elementwise == rc.flops.elementwise);
    CHECK(g.category(FlopCategory::projection) == rc.flops.category(FlopCategory::projection));
    if (s % 50 == 0 || s == 199)
      std::printf("step %3lld  cpu %.4f  gpu(bf16) %.4f\n", (long long)s, rc.loss, rg.loss);
  }
  std::printf("[200 steps] first %.4f, last-20 mean cpu %.4f gpu %.4f, worst step rel diff %.3f\n",
              first, tail_cpu, tail_gpu, worst);
  CHECK(tail_cpu < 0.8 * first);  // it learned
  CHECK(std::abs(tail_gpu - tail_cpu) / tail_cpu < 2e-2);
  CHECK(worst < 5e-2);
  CHECK(gpu.ledger().category(FlopCategory::expert) == ref.ledger().category(FlopCategory::expert));
}

TEST_CASE("routed experts: one grouped call per product equals one product per expert") {
  // fp32: both paths are exact fp32 products (tight). bf16: the grouped path rounds each expert's
  // weight gradient to bf16 before adding it (cuBLAS's grouped call has no bf16 → fp32 form), the
  // loop path does not: within bf16 tolerance. Ledgers are the same either way.
  const Arch a = moe_arch();
  ModelOptions opt;
  const int64_t B = 4;
  const Batch b = random_batch(B, a.seq_len, a.vocab, 31);
  for (DType t : {DType::f32, DType::bf16}) {
    cu::Model grouped(a, opt, 3, B, t), loop(a, opt, 3, B, t);
    loop.set_expert_path(cu::ExpertPath::loop);
    StepResult rg, rl;
    const double og = grouped.compute_gradients(b.inputs.data(), b.targets.data(), &rg);
    const double ol = loop.compute_gradients(b.inputs.data(), b.targets.data(), &rl);
    const double err = rel_err(grouped.gradients(), loop.gradients());
    std::printf("[experts %s] objective grouped %.7f loop %.7f, gradient rel diff %.2e\n",
                t == DType::f32 ? "fp32" : "bf16", og, ol, err);
    print_worst_tensors(grouped.tensors(), grouped.gradients(), loop.gradients());
    const double tol = t == DType::f32 ? 1e-5 : 2e-2;
    CHECK(std::abs(og - ol) / ol < tol);
    CHECK(err < (t == DType::f32 ? 1e-5 : 5e-2));
    CHECK(rg.flops == rl.flops);
  }
}

// In its own test case: gpu-check runs the paths first measured on a GPU (`*batched*`) apart.
TEST_CASE("routed experts: strided-batched products over padded rows give the per-expert step") {
  // fp32 against the CPU and the loop path; bf16 against the loop path. Passes of 2+2+1
  // sequences: each pass pads to its own largest count (the short last pass to fewer rows).
  const Arch a = moe_arch();
  ModelOptions opt;
  opt.positions = "rope";
  opt.z_loss = 1e-3;
  opt.load_balance = 0.02;
  opt.micro_batch_seqs = 2;
  const int64_t B = 5, S = a.seq_len, E = a.experts, De = a.d_expert, Dm = a.d_model;
  const Batch b = random_batch(B, S, a.vocab, 31);
  for (const DType dt : {DType::f32, DType::bf16}) {
    const bool f32 = dt == DType::f32;
    const char* name = f32 ? "fp32" : "bf16";
    INFO(name);
    cu::Model loop(a, opt, 12, B, dt);
    cu::Model batched(a, opt, 12, B, dt);
    loop.set_expert_path(cu::ExpertPath::loop);
    batched.set_expert_path(cu::ExpertPath::batched);
    StepResult rl, rb;
    const double ol = loop.compute_gradients(b.inputs.data(), b.targets.data(), &rl);
    const double ob = batched.compute_gradients(b.inputs.data(), b.targets.data(), &rb);
    const double err = rel_err(batched.gradients(), loop.gradients());
    std::printf("[batched experts, %s] objective loop %.7f batched %.7f, gradient rel err vs "
                "loop %.2e\n",
                f32 ? "fp32" : "bf16", ol, ob, err);
    print_worst_tensors(batched.tensors(), batched.gradients(), loop.gradients());
    CHECK(std::abs(ob - ol) / ol < (f32 ? 1e-6 : 1e-4));
    CHECK(err < (f32 ? 1e-5 : 5e-3));
    CHECK(rb.routed_per_moe_layer == rl.routed_per_moe_layer);
    if (f32) {
      moeplan::backend::Model<float> ref(a, opt, 12, B);
      StepResult rc;
      const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
      CHECK(std::abs(ob - oc) / oc < 1e-5);
      CHECK(rel_err(batched.gradients(), vec(ref.gradients())) < 1e-4);
    }
    // The useful products are the loop's; the zero rows' work is padding, the same number of
    // padded rows in each of the three phases (forward: 2·rows·(Dm·2De + De·Dm)), and padded
    // plus routed rows fill whole multiples of 64 rows per expert.
    // (The attention's padding, the masked halves of the cuBLAS squares, is the same in both.)
    FlopLedger useful = rb.flops, loop_useful = rl.flops;
    useful.flops[int(FlopCategory::padding)] = {};
    loop_useful.flops[int(FlopCategory::padding)] = {};
    CHECK(useful == loop_useful);
    auto expert_padding = [&](Phase ph) {
      return (rb.flops.at(FlopCategory::padding, ph) - rl.flops.at(FlopCategory::padding, ph))
          .to_int64();
    };
    const int64_t per_row = 2 * 3 * Dm * De;
    const int64_t pad_fwd = expert_padding(Phase::forward);
    CHECK(pad_fwd % per_row == 0);
    CHECK(expert_padding(Phase::input_grad) == pad_fwd);
    CHECK(expert_padding(Phase::weight_grad) == pad_fwd);
    int64_t routed = 0;
    for (int64_t r : rb.routed_per_moe_layer) routed += r;
    CHECK(pad_fwd > 0);
    CHECK((pad_fwd / per_row + routed) % (E * 64) == 0);
    // Evaluation takes the same path.
    std::vector<double> pl(size_t(B * S)), pb(pl.size());
    const double el = loop.forward_loss(b.inputs.data(), b.targets.data(), B, pl.data());
    const double eb = batched.forward_loss(b.inputs.data(), b.targets.data(), B, pb.data());
    CHECK(std::abs(eb - el) / el < (f32 ? 1e-6 : 1e-4));
  }
}

TEST_CASE("routed experts: strided-batched padded rows grow when the routing is skewed") {
  // Router weights all zero: every logit ties and ties keep the lower expert, so each of the
  // T = 160 tokens of a pass goes to experts 0 and 1 (K 2): counts (160, 160, 0, ..., 0). The
  // padded layout was taken for 25 % above uniform (64 rows an expert); this pass needs
  // 160 → 192 rows for each of the 8 experts, so the buffers grow. By hand, per MoE layer and
  // phase: (8·192 − 320) padded rows, each 2·(Dm·2De + De·Dm) FLOPs.
  const Arch a = moe_arch();
  const ModelOptions opt;
  const int64_t B = 5, S = a.seq_len, E = a.experts, De = a.d_expert, Dm = a.d_model;
  cu::Model loop(a, opt, 4, B, DType::f32);
  cu::Model batched(a, opt, 4, B, DType::f32);
  loop.set_expert_path(cu::ExpertPath::loop);
  batched.set_expert_path(cu::ExpertPath::batched);
  std::vector<float> w = batched.parameters();
  for (const auto& t : batched.tensors())
    if (t.name.find(".router") != std::string::npos)
      std::fill(w.begin() + t.offset, w.begin() + t.offset + t.size(), 0.f);
  loop.set_parameters(w);
  batched.set_parameters(w);
  const size_t before = batched.device_bytes();
  const Batch b = random_batch(B, S, a.vocab, 8);
  StepResult rl, rb;
  const double ol = loop.compute_gradients(b.inputs.data(), b.targets.data(), &rl);
  const double ob = batched.compute_gradients(b.inputs.data(), b.targets.data(), &rb);
  const double err = rel_err(batched.gradients(), loop.gradients());
  std::printf("[batched experts, skewed routing] objective loop %.7f batched %.7f, gradient rel "
              "err %.2e, device bytes %zu -> %zu\n",
              ol, ob, err, before, batched.device_bytes());
  // Buffers of rows·9/8: taken for 8·64 = 512 rows (576), grown for 8·192 = 1536 (1728); a
  // row is a map entry, xg/dye (Dm), h13 (2De), act and dact (De) in fp32 and an fp32 Dm row.
  CHECK(batched.device_bytes() - before == size_t((1728 - 576) * (4 + 4 * (Dm + 4 * De) + 4 * Dm)));
  CHECK(std::abs(ob - ol) / ol < 1e-6);
  CHECK(err < 1e-5);
  const int64_t moe_layers = a.layers - a.dense_layers;
  const int64_t want = moe_layers * (E * 192 - B * S * a.top_k) * 2 * 3 * Dm * De;
  for (const Phase ph : {Phase::forward, Phase::input_grad, Phase::weight_grad})
    CHECK(rb.flops.at(FlopCategory::padding, ph) - rl.flops.at(FlopCategory::padding, ph) == want);
}

TEST_CASE("routed experts: the tiled kernels give the per-expert products' step; padding booked") {
  // Both paths take bf16 inputs and keep fp32 results where the model wants them; they differ in
  // summation order only, so a step agrees well inside bf16 tolerance. The ledgers agree except
  // for the tiled kernels' padding: the rows of each expert's last 64-row tile (and, for the
  // weight gradients, depth past the last row in steps of 32), in every phase.
  const Arch a = moe_arch();
  ModelOptions opt;
  opt.positions = "rope";
  const int64_t B = 4;
  const Batch b = random_batch(B, a.seq_len, a.vocab, 57);
  cu::Model tiled(a, opt, 6, B, DType::bf16), loop(a, opt, 6, B, DType::bf16);
  tiled.set_expert_path(cu::ExpertPath::tiled);
  loop.set_expert_path(cu::ExpertPath::loop);
  CHECK(tiled.expert_path() == cu::ExpertPath::tiled);
  StepResult rt, rl;
  const double ot = tiled.compute_gradients(b.inputs.data(), b.targets.data(), &rt);
  const double ol = loop.compute_gradients(b.inputs.data(), b.targets.data(), &rl);
  const auto gt = tiled.gradients();
  const double err = rel_err(gt, loop.gradients());
  std::printf("[experts tiled] objective tiled %.7f loop %.7f, gradient rel diff %.2e\n", ot, ol,
              err);
  print_worst_tensors(tiled.tensors(), gt, loop.gradients());
  CHECK(std::abs(ot - ol) / ol < 1e-3);
  CHECK(err < 2e-2);
  print_ledger_diff(rt.flops, rl.flops);
  FlopLedger t = rt.flops, l = rl.flops;
  t.flops[int(FlopCategory::padding)] = {};
  l.flops[int(FlopCategory::padding)] = {};
  CHECK(t == l);
  // Each expert's last tile is at most 63 rows short, and a product's columns run in whole tiles
  // of 128, its depth in steps of 32: for the forward products, (N, K) = (2De, Dm) and (Dm, De),
  // over R routed rows a layer, at most 2·((R + 63·E)·ceil128(N)·ceil32(K) − R·N·K) each.
  const int64_t E = a.experts, De = a.d_expert, Dm = a.d_model;
  const auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  int64_t bound = 0;
  for (const int64_t R : rt.routed_per_moe_layer)
    for (const auto& [N, K] : {std::pair<int64_t, int64_t>{2 * De, Dm}, {Dm, De}})
      bound += 2 * ((R + 63 * E) * up(N, 128) * up(K, 32) - R * N * K);
  CHECK(int64_t(rt.routed_per_moe_layer.size()) == a.moe_layers());
  for (Phase ph : {Phase::forward, Phase::input_grad, Phase::weight_grad}) {
    const int64_t extra =
        (rt.flops.at(FlopCategory::padding, ph) - rl.flops.at(FlopCategory::padding, ph))
            .to_int64();
    CHECK(extra > 0);
    if (ph == Phase::forward) CHECK(extra <= bound);
  }
  {  // Exactly, from each layer's own counts as the sort left them on the device: the forward's
    // two products execute whole 64-row tiles of each expert's rows. The first MoE layer's
    // router zeroed (every token to experts 0 and 1: whole tiles, no padding), so that the
    // layers' counts, and their padding, differ.
    cu::Model st(a, opt, 6, B, DType::bf16), sl(a, opt, 6, B, DType::bf16);
    st.set_expert_path(cu::ExpertPath::tiled);
    sl.set_expert_path(cu::ExpertPath::loop);
    std::vector<float> w = st.parameters();
    for (const auto& t : st.tensors())
      if (t.name == "layer" + std::to_string(a.dense_layers) + ".router")
        std::fill(w.begin() + t.offset, w.begin() + t.offset + t.size(), 0.f);
    st.set_parameters(w);
    sl.set_parameters(w);
    StepResult r1, r2;
    st.compute_gradients(b.inputs.data(), b.targets.data(), &r1);
    sl.compute_gradients(b.inputs.data(), b.targets.data(), &r2);
    int64_t exact = 0;
    std::vector<int64_t> per_layer;
    for (int64_t l = a.dense_layers; l < a.layers; ++l) {
      int64_t rows = 0, tiles_rows = 0;
      for (const int32_t c : st.routed_counts(l)) {
        rows += c;
        tiles_rows += up(c, 64);
      }
      int64_t layer = 0;
      for (const auto& [N, K] : {std::pair<int64_t, int64_t>{2 * De, Dm}, {Dm, De}})
        layer += 2 * (tiles_rows * up(N, 128) * up(K, 32) - rows * N * K);
      per_layer.push_back(layer);
      exact += layer;
    }
    REQUIRE(per_layer.size() >= 2);
    CHECK(per_layer[0] != per_layer[1]);  // the check below tells the layers apart
    CHECK((r1.flops.at(FlopCategory::padding, Phase::forward) -
           r2.flops.at(FlopCategory::padding, Phase::forward))
              .to_int64() == exact);
  }
  // The same step again: the same bits (fixed tile order, no atomics).
  tiled.compute_gradients(b.inputs.data(), b.targets.data());
  CHECK(tiled.gradients() == gt);
  // Evaluation runs the forward products only, and books their padding in the eval ledger.
  const double et = tiled.forward_loss(b.inputs.data(), b.targets.data(), B);
  const double el = loop.forward_loss(b.inputs.data(), b.targets.data(), B);
  CHECK(std::abs(et - el) / el < 1e-3);
  CHECK(tiled.eval_ledger().category(FlopCategory::expert) ==
        loop.eval_ledger().category(FlopCategory::expert));
  CHECK(tiled.eval_ledger().category(FlopCategory::padding) >
        loop.eval_ledger().category(FlopCategory::padding));

  // The 128-row tiles: each output element is still one warp's fixed-order walk over the depth
  // in the same 16-deep mma steps, so the same bits as the 64-row tiles; only the padding
  // differs, and it is at least as large (ceil128(c) ≥ ceil64(c) for every expert's count c).
  cu::Model tiled128(a, opt, 6, B, DType::bf16);
  tiled128.set_expert_path(cu::ExpertPath::tiled128);
  CHECK(tiled128.expert_path() == cu::ExpertPath::tiled128);
  StepResult r128;
  const double o128 = tiled128.compute_gradients(b.inputs.data(), b.targets.data(), &r128);
  CHECK(o128 == ot);
  CHECK(tiled128.gradients() == gt);
  FlopLedger u128 = r128.flops;
  u128.flops[int(FlopCategory::padding)] = {};
  CHECK(u128 == t);
  // Forward bound as above with 127 rows short a tile.
  int64_t bound128 = 0;
  for (const int64_t R : r128.routed_per_moe_layer)
    for (const auto& [N, K] : {std::pair<int64_t, int64_t>{2 * De, Dm}, {Dm, De}})
      bound128 += 2 * ((R + 127 * E) * up(N, 128) * up(K, 32) - R * N * K);
  for (Phase ph : {Phase::forward, Phase::input_grad, Phase::weight_grad}) {
    const int64_t p128 = r128.flops.at(FlopCategory::padding, ph).to_int64(),
                  p64 = rt.flops.at(FlopCategory::padding, ph).to_int64();
    CHECK(p128 >= p64);
    if (ph != Phase::weight_grad)
      CHECK(p128 > p64);  // this routing has counts c with c % 128 in [1, 64]
    if (ph == Phase::forward)
      CHECK(p128 - rl.flops.at(FlopCategory::padding, ph).to_int64() <= bound128);
  }
  CHECK(tiled128.forward_loss(b.inputs.data(), b.targets.data(), B) == et);

  // fp32 models have no tiled path.
  cu::Model f32(a, opt, 6, B, DType::f32);
  CHECK_THROWS_AS(f32.set_expert_path(cu::ExpertPath::tiled), moeplan::InputError);
  CHECK_THROWS_AS(f32.set_expert_path(cu::ExpertPath::tiled128), moeplan::InputError);
}

TEST_CASE("routed experts: the wgmma kernels give the per-expert products' step; padding exact") {
  // The warpgroup-MMA kernels take the tiled kernels' bf16 inputs and fp32 results; their depth
  // sums run in another order, so a step agrees with the per-expert products (and with tiled128)
  // within bf16 tolerance, not bit for bit. Their tiles are 128 rows by 128 columns, walking the
  // depth 64 at a time: the padding they book is exactly that, from each layer's counts.
  const Arch a = moe_arch();
  ModelOptions opt;
  opt.positions = "rope";
  const int64_t B = 4;
  const Batch b = random_batch(B, a.seq_len, a.vocab, 57);
  cu::Model wg(a, opt, 6, B, DType::bf16), t128(a, opt, 6, B, DType::bf16),
      loop(a, opt, 6, B, DType::bf16);
  wg.set_expert_path(cu::ExpertPath::wgmma);
  t128.set_expert_path(cu::ExpertPath::tiled128);
  loop.set_expert_path(cu::ExpertPath::loop);
  CHECK(wg.expert_path() == cu::ExpertPath::wgmma);
  StepResult rw, r128, rl;
  const double ow = wg.compute_gradients(b.inputs.data(), b.targets.data(), &rw);
  const double o128 = t128.compute_gradients(b.inputs.data(), b.targets.data(), &r128);
  const double ol = loop.compute_gradients(b.inputs.data(), b.targets.data(), &rl);
  const auto gw = wg.gradients();
  const double err = rel_err(gw, loop.gradients()), err128 = rel_err(gw, t128.gradients());
  std::printf(
      "[experts wgmma] objective wgmma %.7f tiled128 %.7f loop %.7f, gradient rel diff %.2e "
      "(loop), %.2e (tiled128)\n",
      ow, o128, ol, err, err128);
  print_worst_tensors(wg.tensors(), gw, loop.gradients());
  CHECK(std::abs(ow - ol) / ol < 1e-3);
  CHECK(err < 2e-2);
  CHECK(err128 < 2e-2);
  const auto no_padding = [](FlopLedger l) {
    l.flops[int(FlopCategory::padding)] = {};
    return l;
  };
  CHECK(no_padding(rw.flops) == no_padding(rl.flops));
  // Padding, exactly: over each MoE layer's counts c_e (R = Σ c_e rows), the row products
  // (N, K) execute Σ ceil128(c_e)·ceil128(N)·ceil64(K) multiply-adds, the weight gradients
  // (M, N) ceil128(M)·ceil128(N)·Σ ceil64(c_e); minus the products' own R·N·K.
  const int64_t De = a.d_expert, Dm = a.d_model;
  const auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  using P = std::pair<int64_t, int64_t>;
  int64_t fwd = 0, dx = 0, dw = 0;
  for (int64_t l = a.dense_layers; l < a.layers; ++l) {
    int64_t rows = 0, tile_rows = 0, depth = 0;
    for (const int32_t c : wg.routed_counts(l)) {
      rows += c;
      tile_rows += up(c, 128);
      depth += up(c, 64);
    }
    for (const auto& [N, K] : {P{2 * De, Dm}, P{Dm, De}})  // h13 = x·W13, y = h·W2
      fwd += 2 * (tile_rows * up(N, 128) * up(K, 64) - rows * N * K);
    for (const auto& [N, K] : {P{De, Dm}, P{Dm, 2 * De}})  // dh = dy·W2^T, dx = dh13·W13^T
      dx += 2 * (tile_rows * up(N, 128) * up(K, 64) - rows * N * K);
    for (const auto& [M, N] : {P{Dm, 2 * De}, P{De, Dm}})  // dW13 = x^T·dh13, dW2 = h^T·dy
      dw += 2 * (up(M, 128) * up(N, 128) * depth - rows * M * N);
  }
  const auto padding = [&](Phase ph) {
    return (rw.flops.at(FlopCategory::padding, ph) - rl.flops.at(FlopCategory::padding, ph))
        .to_int64();
  };
  CHECK(padding(Phase::forward) == fwd);
  CHECK(padding(Phase::input_grad) == dx);
  CHECK(padding(Phase::weight_grad) == dw);
  // The same step again: the same bits (each block owns its tile and walks the depth in order).
  wg.compute_gradients(b.inputs.data(), b.targets.data());
  CHECK(wg.gradients() == gw);
  const double ew = wg.forward_loss(b.inputs.data(), b.targets.data(), B);
  const double el = loop.forward_loss(b.inputs.data(), b.targets.data(), B);
  CHECK(std::abs(ew - el) / el < 1e-3);
  {  // In passes, after another step: the same bits as the step alone (the first pass's weight
    // gradients overwrite, the later ones add; here and not in the test of every path, so that
    // a fault of these kernels on a GPU stays in their own process, see scripts/gpu-check).
    ModelOptions o2 = opt;
    o2.micro_batch_seqs = 2;
    const Batch other = random_batch(B, a.seq_len, a.vocab, 58);
    cu::Model after(a, o2, 6, B, DType::bf16), alone(a, o2, 6, B, DType::bf16);
    after.set_expert_path(cu::ExpertPath::wgmma);
    alone.set_expert_path(cu::ExpertPath::wgmma);
    after.compute_gradients(other.inputs.data(), other.targets.data());
    const double oa = after.compute_gradients(b.inputs.data(), b.targets.data());
    CHECK(oa == alone.compute_gradients(b.inputs.data(), b.targets.data()));
    CHECK(after.gradients() == alone.gradients());
  }
  // fp32 models, and shapes not in multiples of 8, have no wgmma path.
  cu::Model f32(a, opt, 6, B, DType::f32);
  CHECK_THROWS_AS(f32.set_expert_path(cu::ExpertPath::wgmma), moeplan::InputError);
  Arch odd = a;
  odd.d_expert = 36;
  cu::Model m36(odd, opt, 6, B, DType::bf16);
  CHECK_THROWS_AS(m36.set_expert_path(cu::ExpertPath::wgmma), moeplan::InputError);
  CHECK_NOTHROW(m36.set_expert_path(cu::ExpertPath::tiled128));
#ifdef MOEPLAN_CUDA_EMULATION
  {  // Nor has a device of another compute capability (the emulation can pretend to be one).
    setenv("MOEPLAN_EMU_COMPUTE", "8.0", 1);
    cu::Model ampere(a, opt, 6, B, DType::bf16);
    std::string what;
    try {
      ampere.set_expert_path(cu::ExpertPath::wgmma);
    } catch (const moeplan::InputError& e) {
      what = e.what();
    }
    unsetenv("MOEPLAN_EMU_COMPUTE");
    CHECK(what.find("compute capability 9.0") != std::string::npos);
    CHECK(what.find("is 8.0") != std::string::npos);
    CHECK(ampere.expert_path() != cu::ExpertPath::wgmma);
  }
#endif
}

// A capacity factor (BACKEND.md: each expert keeps its first ceil(cf·T·K/E) assignments of a
// pass, in token order; the load balance counts every assignment): what the CPU drops, on every
// expert path, in one pass and in passes, training and evaluating.
TEST_CASE(
    "the router's products on the tiled kernels give the cuBLAS router's step; padding exact") {
  // router=tiled runs the router's three products (logits; the input and weight gradients) on
  // the routed experts' kernels: the same bf16 inputs and fp32 sums in another order, so the
  // same step within rounding. E = 10 logits a row (not whole 16-byte words: staged element by
  // element) over 9 sequences of 32 tokens (288: a last 64-row tile of 32, weight-gradient
  // chunks of 256 and 32), in one pass and in passes of 4 (128, 128, 32 tokens), with the ERC
  // loss (which writes the router's gradient first: the chunks' sum must add to it).
  Arch a = moe_arch();
  a.experts = 10;
  ModelOptions plain, passes, erc;
  passes.micro_batch_seqs = 4;
  erc.erc_loss = 0.5;
  const int64_t B = 9, E = a.experts, Dm = a.d_model, S = a.seq_len;
  const Batch b = random_batch(B, S, a.vocab, 61);
  const auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  for (const ModelOptions& opt : {plain, passes, erc}) {
    INFO("passes of " << opt.micro_batch_seqs << ", erc " << opt.erc_loss);
    cu::Model tiled(a, opt, 8, B, DType::bf16, nullptr, cu::AttentionPath::cublas, false, 0,
                    cu::ExpertPath::tiled128),
        blas(a, opt, 8, B, DType::bf16, nullptr, cu::AttentionPath::cublas, false, 0,
             cu::ExpertPath::tiled128);
    tiled.set_router_path(cu::RouterPath::tiled);
    CHECK(tiled.router_path() == cu::RouterPath::tiled);
    CHECK(blas.router_path() == cu::RouterPath::cublas);
    moeplan::backend::Model<float> ref(a, opt, 8, B);
    const auto rng0 = tiled.rng_state();  // the ERC noise's generator, for the repeat below
    StepResult rt, rb, rc;
    const double ot = tiled.compute_gradients(b.inputs.data(), b.targets.data(), &rt);
    const double ob = blas.compute_gradients(b.inputs.data(), b.targets.data(), &rb);
    const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
    const auto gt = tiled.gradients(), gb = blas.gradients();
    // The routers' gradients alone: where a wrong sum (a chunk lost, the ERC part overwritten)
    // would show first.
    std::vector<float> rt_router, rb_router;
    for (const auto& t : tiled.tensors())
      if (t.name.ends_with(".router")) {
        rt_router.insert(rt_router.end(), gt.begin() + t.offset, gt.begin() + t.offset + t.size());
        rb_router.insert(rb_router.end(), gb.begin() + t.offset, gb.begin() + t.offset + t.size());
      }
    const double err = rel_err(gt, gb), router_err = rel_err(rt_router, rb_router),
                 cpu_err = rel_err(gt, vec(ref.gradients()));
    std::printf(
        "[router tiled, passes %lld, erc %.1f] objective tiled %.7f cublas %.7f cpu %.7f; "
        "gradient rel diff %.2e (routers %.2e), against the CPU %.2e\n",
        static_cast<long long>(opt.micro_batch_seqs), opt.erc_loss, ot, ob, oc, err, router_err,
        cpu_err);
    print_worst_tensors(tiled.tensors(), gt, gb);
    REQUIRE(!rt_router.empty());
    CHECK(std::abs(ot - ob) / ob < 1e-4);
    CHECK(router_err < 1e-3);
    CHECK(err < 1e-2);
    CHECK(std::abs(ot - oc) / oc < 2e-2);
    CHECK(cpu_err < 5e-2);
    // The ledgers: the same products; the tiles' padding on top, by hand for each pass of n
    // tokens and each MoE layer: the logits run 64-row tiles × 128 columns × depth in 32s, the
    // input gradient 64-row tiles × Dm in 128s × E in 32s, the weight gradient ceil64(E) rows ×
    // Dm in 128s over each 256-token chunk's tokens in 32s.
    FlopLedger ut = rt.flops, ub = rb.flops;
    ut.flops[int(FlopCategory::padding)] = {};
    ub.flops[int(FlopCategory::padding)] = {};
    CHECK(ut == ub);
    const int64_t per_pass = opt.micro_batch_seqs > 0 ? opt.micro_batch_seqs : B;
    int64_t fwd = 0, dx = 0, dw = 0;
    for (int64_t s0 = 0; s0 < B; s0 += per_pass) {
      const int64_t n = std::min(per_pass, B - s0) * S;
      fwd += 2 * (up(n, 64) * up(E, 128) * up(Dm, 32) - n * E * Dm);
      dx += 2 * (up(n, 64) * up(Dm, 128) * up(E, 32) - n * Dm * E);
      int64_t walked = 0;
      for (int64_t c = 0; c < n; c += 256) walked += up(std::min<int64_t>(256, n - c), 32);
      dw += 2 * (up(E, 64) * up(Dm, 128) * walked - E * Dm * n);
    }
    const int64_t moe = a.moe_layers();
    const auto extra = [&](Phase ph) {
      return (rt.flops.at(FlopCategory::padding, ph) - rb.flops.at(FlopCategory::padding, ph))
          .to_int64();
    };
    CHECK(extra(Phase::forward) == moe * fwd);
    CHECK(extra(Phase::input_grad) == moe * dx);
    CHECK(extra(Phase::weight_grad) == moe * dw);
    // Again, from the same generator state: the same bits (fixed tile and chunk order).
    tiled.set_rng_state(rng0);
    tiled.compute_gradients(b.inputs.data(), b.targets.data());
    CHECK(tiled.gradients() == gt);
    // Evaluation: the logits' product only, its padding in the eval ledger.
    const double et = tiled.forward_loss(b.inputs.data(), b.targets.data(), B);
    const double eb = blas.forward_loss(b.inputs.data(), b.targets.data(), B);
    CHECK(std::abs(et - eb) / eb < 1e-4);
    CHECK((tiled.eval_ledger().at(FlopCategory::padding, Phase::forward) -
           blas.eval_ledger().at(FlopCategory::padding, Phase::forward))
              .to_int64() == moe * fwd);
  }
  // fp32 models multiply in fp32: no tiled router.
  cu::Model f32(a, plain, 8, B, DType::f32);
  CHECK_THROWS_AS(f32.set_router_path(cu::RouterPath::tiled), moeplan::InputError);
  f32.set_router_path(cu::RouterPath::cublas);
}

TEST_CASE("capacity factor: every expert path drops what the CPU drops") {
  const Arch a = moe_arch();
  ModelOptions opt;
  opt.capacity_factor = 0.75;
  opt.z_loss = 1e-3;
  const auto no_padding = [](FlopLedger l) {
    l.flops[int(FlopCategory::padding)] = {};
    return l;
  };
  for (const int64_t passes_of : {0, 2}) {  // one pass of 5 sequences; passes of 2 + 2 + 1
    INFO("passes of " << passes_of);
    ModelOptions o = opt;
    o.micro_batch_seqs = passes_of;
    const int64_t B = 5;
    const Batch b = random_batch(B, a.seq_len, a.vocab, 91);
    moeplan::backend::Model<float> ref(a, o, 13, B);
    StepResult rc;
    const double oc = ref.compute_gradients(b.inputs.data(), b.targets.data(), &rc);
    const std::vector<float> gc = vec(ref.gradients());
    REQUIRE(rc.dropped_assignments > 0);  // the case tests something
    const double ec = ref.forward_loss(b.inputs.data(), b.targets.data(), B);
    for (const cu::ExpertPath path :
         {cu::ExpertPath::grouped, cu::ExpertPath::loop, cu::ExpertPath::batched}) {
      INFO("fp32 experts " << int(path));
      cu::Model gpu(a, o, 13, B, DType::f32);
      gpu.set_expert_path(path);
      StepResult rg;
      const double og = gpu.compute_gradients(b.inputs.data(), b.targets.data(), &rg);
      const double err = rel_err(gpu.gradients(), gc);
      std::printf(
          "[capacity, passes of %lld, fp32 path %d] objective cpu %.7f gpu %.7f, dropped "
          "%lld, gradient rel err %.2e\n",
          (long long)passes_of, int(path), oc, og, (long long)rg.dropped_assignments, err);
      CHECK(std::abs(og - oc) / oc < 1e-5);
      CHECK(std::abs(rg.aux_load_balance - rc.aux_load_balance) <= 1e-5 * rc.aux_load_balance);
      CHECK(err < 1e-4);
      CHECK(rg.dropped_assignments == rc.dropped_assignments);
      CHECK(rg.routed_per_moe_layer == rc.routed_per_moe_layer);
      print_ledger_diff(no_padding(rg.flops), no_padding(rc.flops));
      CHECK(no_padding(rg.flops) == no_padding(rc.flops));
      const double eg = gpu.forward_loss(b.inputs.data(), b.targets.data(), B);
      CHECK(std::abs(eg - ec) / ec < 1e-5);
    }
    // bf16: the tiled and wgmma kernels against the per-expert products, the same drops.
    cu::Model loop(a, o, 13, B, DType::bf16);
    loop.set_expert_path(cu::ExpertPath::loop);
    StepResult rl;
    const double ol = loop.compute_gradients(b.inputs.data(), b.targets.data(), &rl);
    for (const cu::ExpertPath path : {cu::ExpertPath::tiled, cu::ExpertPath::wgmma}) {
      INFO("bf16 experts " << int(path));
      cu::Model tiled(a, o, 13, B, DType::bf16);
      tiled.set_expert_path(path);
      StepResult rt;
      const double ot = tiled.compute_gradients(b.inputs.data(), b.targets.data(), &rt);
      const double err = rel_err(tiled.gradients(), loop.gradients());
      std::printf(
          "[capacity, passes of %lld, bf16 path %d] objective %.7f loop %.7f cpu %.7f, "
          "gradient rel diff %.2e\n",
          (long long)passes_of, int(path), ot, ol, oc, err);
      CHECK(std::abs(ot - ol) / ol < 1e-3);
      CHECK(std::abs(ot - oc) / oc < 2e-2);
      CHECK(err < 2e-2);
      CHECK(rt.dropped_assignments == rl.dropped_assignments);
      CHECK(rt.dropped_assignments > 0);
      CHECK(rt.routed_per_moe_layer == rl.routed_per_moe_layer);
      CHECK(no_padding(rt.flops) == no_padding(rl.flops));
      const double et = tiled.forward_loss(b.inputs.data(), b.targets.data(), B);
      CHECK(std::abs(et - ec) / ec < 2e-2);
    }
  }
}

namespace {

// A bf16 step with the given fused attention against the cuBLAS attention. The two paths differ
// in rounding (the fused kernels keep the scores in fp32 on chip, the cuBLAS path stores P in
// bf16) and in what they execute: the ledgers agree once the executed-only categories (padding,
// recompute) are set aside.
void check_fused_attention_step(cu::AttentionPath path, const char* label) {
  Arch a = moe_arch();
  a.seq_len = 80;  // two query tiles, the second partial
  for (const char* pos : {"alibi", "rope"}) {
    INFO(pos);
    ModelOptions opt;
    opt.positions = pos;
    const int64_t B = 3;
    cu::Model fused(a, opt, 4, B, DType::bf16, nullptr, path);
    cu::Model plain(a, opt, 4, B, DType::bf16, nullptr, cu::AttentionPath::cublas);
    CHECK(fused.fused_attention());
    CHECK_FALSE(plain.fused_attention());
    const Batch b = random_batch(B, a.seq_len, a.vocab, 77);
    StepResult rf, rp;
    const double of = fused.compute_gradients(b.inputs.data(), b.targets.data(), &rf);
    const double op = plain.compute_gradients(b.inputs.data(), b.targets.data(), &rp);
    const double err = rel_err(fused.gradients(), plain.gradients());
    std::printf("[attention %s %s] objective fused %.6f cublas %.6f, gradient rel diff %.2e\n",
                label, pos, of, op, err);
    CHECK(std::abs(of - op) / op < 2e-2);
    CHECK(err < 5e-2);
    FlopLedger f = rf.flops, q = rp.flops;
    for (FlopLedger* l : {&f, &q}) {
      l->flops[int(FlopCategory::padding)] = {};
      l->flops[int(FlopCategory::recompute)] = {};
    }
    CHECK(f.category(FlopCategory::attention_core) == q.category(FlopCategory::attention_core));
    // Recomputed in the backward, per head and layer, as causal products of Dh·S·(S+1) FLOPs:
    // the WMMA kernels redo S and dP in the dQ kernel besides S in the dK/dV one (3); the
    // register-resident ones (head width 16 here) only S, their dQ kernel reading the stored dS.
    const int64_t redone = path == cu::AttentionPath::fused_mma ? 1 : 3;
    CHECK(rf.flops.at(FlopCategory::recompute, Phase::input_grad) ==
          redone * B * a.heads * a.layers * a.head_dim * a.seq_len * (a.seq_len + 1));
    CHECK(rf.flops.category(FlopCategory::recompute) ==
          rf.flops.at(FlopCategory::recompute, Phase::input_grad));
  }
}

}  // namespace

TEST_CASE("bf16: fused attention and cuBLAS attention give the same step within bf16 tolerance") {
  check_fused_attention_step(cu::AttentionPath::fused, "fused");
}

TEST_CASE("bf16: register-resident attention (mma.sync) gives the cuBLAS attention's step") {
  check_fused_attention_step(cu::AttentionPath::fused_mma, "fused_mma");
}

namespace {

// A step with attention path `path` against fused_mma's, bit for bit (objective, gradients and
// ledger, padding included), with ALiBi and RoPE; its profile names `kernel` (what ran); a head
// width of 128, which it has no kernel for, is refused with one line naming `name`.
void check_same_step_as_fused_mma(cu::AttentionPath path, const char* name, const char* kernel,
                                  int64_t seq_len, uint64_t seed) {
  Arch a = moe_arch();
  a.seq_len = seq_len;
  for (const char* pos : {"alibi", "rope"}) {
    INFO(pos);
    ModelOptions opt;
    opt.positions = pos;
    const int64_t B = 2;
    cu::Model other(a, opt, 4, B, DType::bf16, nullptr, path);
    cu::Model plain(a, opt, 4, B, DType::bf16, nullptr, cu::AttentionPath::fused_mma);
    const Batch b = random_batch(B, a.seq_len, a.vocab, seed);
    StepResult ro, rp;
    const double oo = other.compute_gradients(b.inputs.data(), b.targets.data(), &ro);
    const double op = plain.compute_gradients(b.inputs.data(), b.targets.data(), &rp);
    CHECK(oo == op);
    CHECK(other.gradients() == plain.gradients());
    CHECK(ro.flops.flops == rp.flops.flops);
    other.set_profiling(true, true);
    other.train_step(b.inputs.data(), b.targets.data(), 1, OptimConfig{});
    const auto kernels = other.profile_ms_per_step();
    other.set_profiling(false);
    CHECK(std::any_of(kernels.begin(), kernels.end(),
                      [&](const auto& k) { return k.first == kernel; }));
  }
  Arch w = moe_arch();
  w.head_dim = 128;
  w.d_model = w.heads * 128;
  CHECK_THROWS_WITH_AS(cu::Model(w, ModelOptions{}, 4, 2, DType::bf16, nullptr, path),
                       doctest::Contains((std::string("attention=") + name +
                                          " needs a head width of 16, 32 or 64 (this model: 128)")
                                             .c_str()),
                       moeplan::InputError);
}

}  // namespace

#ifdef MOEPLAN_CUDA_EMULATION
TEST_CASE("a device's shared memory a block: fused attention refused where it does not fit") {
  // Head width 128: fused_mma's and fused's backward kernels ask 120.5 KiB a block, more than a
  // device of compute capability 8.6 allows (99 KiB), within an A100's (8.0: 163 KiB). The
  // emulation pretends each device, and refuses an opt-in past its limit as CUDA does.
  Arch w = dense_arch();
  w.head_dim = 128;
  w.d_model = w.heads * 128;
  const int64_t B = 2;
  const Batch b = random_batch(B, w.seq_len, w.vocab, 77);
  struct Compute {  // MOEPLAN_EMU_COMPUTE for one block
    explicit Compute(const char* cc) { setenv("MOEPLAN_EMU_COMPUTE", cc, 1); }
    ~Compute() { unsetenv("MOEPLAN_EMU_COMPUTE"); }
  };
  {
    const Compute ampere86("8.6");
    for (const auto& [path, name] : {std::pair{cu::AttentionPath::fused_mma, "fused_mma"},
                                     {cu::AttentionPath::fused, "fused"}}) {
      INFO(name);
      std::string what;
      try {
        cu::Model m(w, ModelOptions{}, 4, B, DType::bf16, nullptr, path);
      } catch (const moeplan::InputError& e) {
        what = e.what();
      }
      CHECK_MESSAGE(what.find(std::string("--kernels attention=") + name +
                              ": its kernels ask 120.5 KiB of shared memory a block at head "
                              "width 128") != std::string::npos,
                    what);
      CHECK_MESSAGE(what.find("compute capability 8.6) allows 99.0 KiB (valid here: cublas)") !=
                        std::string::npos,
                    what);
    }
    // auto takes cuBLAS's attention here, and its step runs.
    const cu::KernelChoice k =
        cu::resolve_kernels({}, cu::auto_target(w, cu::device_info(0)), DType::bf16);
    REQUIRE(k.attention == cu::AttentionPath::cublas);
    cu::Model m(w, ModelOptions{}, 4, B, DType::bf16, nullptr, *k.attention);
    CHECK(std::isfinite(m.compute_gradients(b.inputs.data(), b.targets.data())));
  }
  {  // On an A100 the same kernels fit, and auto takes them.
    const Compute ampere80("8.0");
    const cu::KernelChoice k =
        cu::resolve_kernels({}, cu::auto_target(w, cu::device_info(0)), DType::bf16);
    CHECK(k.attention == cu::AttentionPath::fused_mma);
    cu::Model m(w, ModelOptions{}, 4, B, DType::bf16, nullptr, cu::AttentionPath::fused_mma);
    CHECK(std::isfinite(m.compute_gradients(b.inputs.data(), b.targets.data())));
  }
}
#endif

TEST_CASE("bf16: the wide register-resident forward gives fused_mma's step bit for bit") {
  // 32 query rows a warp run the same tiles with the same arithmetic per row. S 200: a 128-row
  // block and a second one with a partial first half.
  check_same_step_as_fused_mma(cu::AttentionPath::fused_mma_wide, "fused_mma_wide",
                               "attention::forward_mma_wide", 200, 78);
}

TEST_CASE("each step's gradients start from nothing: a step after another equals it alone") {
  // Nothing zeroes the whole gradient buffer: the first writer of most tensors overwrites
  // (beta 0), the rest are zeroed when the step starts. A step on batch B after one on batch A
  // must give the gradients of B alone, bit for bit, on every expert path, with gradient
  // accumulation over passes, with tied and untied embeddings, in fp32 and bf16.
  struct Config {
    const char* name;
    Arch arch;
    DType type;
    cu::ExpertPath experts;
    int64_t passes_of;
  };
  Arch tied = moe_arch();
  tied.tied_embeddings = true;
  const Config configs[] = {
      {"dense fp32", dense_arch(), DType::f32, cu::ExpertPath::grouped, 0},
      {"dense bf16, passes of 2", dense_arch(), DType::bf16, cu::ExpertPath::grouped, 2},
      {"moe bf16 tiled", moe_arch(), DType::bf16, cu::ExpertPath::tiled, 0},
      {"moe bf16 tiled128, passes of 2", moe_arch(), DType::bf16, cu::ExpertPath::tiled128, 2},
      {"moe bf16 tied, grouped", tied, DType::bf16, cu::ExpertPath::grouped, 0},
      {"moe bf16 loop, passes of 2", moe_arch(), DType::bf16, cu::ExpertPath::loop, 2},
      {"moe fp32 batched", moe_arch(), DType::f32, cu::ExpertPath::batched, 0}};
  for (const Config& c : configs) {
    INFO(c.name);
    ModelOptions opt;
    opt.micro_batch_seqs = c.passes_of;
    const int64_t B = 5;
    const Batch first = random_batch(B, c.arch.seq_len, c.arch.vocab, 201);
    const Batch second = random_batch(B, c.arch.seq_len, c.arch.vocab, 202);
    cu::Model after(c.arch, opt, 3, B, c.type), alone(c.arch, opt, 3, B, c.type);
    after.set_expert_path(c.experts);
    alone.set_expert_path(c.experts);
    after.compute_gradients(first.inputs.data(), first.targets.data());
    const double oa = after.compute_gradients(second.inputs.data(), second.targets.data());
    const double ob = alone.compute_gradients(second.inputs.data(), second.targets.data());
    CHECK(oa == ob);
    CHECK(after.gradients() == alone.gradients());
  }
}

TEST_CASE("bf16: the wgmma attention kernels' step is fused_mma's within bf16 tolerance") {
  // attention=fused_wgmma: the forward and the dK/dV products on wgmma (another summation order,
  // so not the same bits). Head width 64 with grouped-query heads and a partial last tile
  // (S 100), ALiBi (dqkv straight into bf16) and RoPE (through fp32): the objective and the
  // gradients near fused_mma's, the same ledger, both kernels in the profile; refused at another
  // head width and (in the emulation, pretending) on another compute capability.
  Arch a = moe_arch();
  a.head_dim = 64;
  a.d_model = a.heads * 64;
  a.seq_len = 100;
  for (const char* pos : {"alibi", "rope"}) {
    INFO(pos);
    ModelOptions opt;
    opt.positions = pos;
    const int64_t B = 2;
    cu::Model wg(a, opt, 4, B, DType::bf16, nullptr, cu::AttentionPath::fused_wgmma);
    cu::Model plain(a, opt, 4, B, DType::bf16, nullptr, cu::AttentionPath::fused_mma);
    const Batch b = random_batch(B, a.seq_len, a.vocab, 80);
    StepResult rw, rp;
    const double ow = wg.compute_gradients(b.inputs.data(), b.targets.data(), &rw);
    const double op = plain.compute_gradients(b.inputs.data(), b.targets.data(), &rp);
    const double e = rel_err(wg.gradients(), plain.gradients());
    std::printf("[fused_wgmma %s] objective %.7f fused_mma %.7f, gradient rel diff %.2e\n", pos, ow,
                op, e);
    CHECK(std::abs(ow - op) < 1e-5 * std::abs(op));
    CHECK(e < 1e-2);
    CHECK(rw.flops.flops == rp.flops.flops);
    wg.set_profiling(true, true);
    wg.train_step(b.inputs.data(), b.targets.data(), 1, OptimConfig{});
    const auto kernels = wg.profile_ms_per_step();
    wg.set_profiling(false);
    for (const char* name : {"attention::forward_wgmma", "attention::backward_wgmma"})
      CHECK(std::any_of(kernels.begin(), kernels.end(),
                        [&](const auto& k) { return k.first == name; }));
  }
  CHECK_THROWS_WITH_AS(
      cu::Model(moe_arch(), ModelOptions{}, 4, 2, DType::bf16, nullptr,
                cu::AttentionPath::fused_wgmma),
      doctest::Contains("attention=fused_wgmma needs a head width of 64 (this model: 16)"),
      moeplan::InputError);
#ifdef MOEPLAN_CUDA_EMULATION
  setenv("MOEPLAN_EMU_COMPUTE", "8.0", 1);
  std::string what;
  try {
    cu::Model ampere(a, ModelOptions{}, 4, 2, DType::bf16, nullptr, cu::AttentionPath::fused_wgmma);
  } catch (const moeplan::InputError& e) {
    what = e.what();
  }
  unsetenv("MOEPLAN_EMU_COMPUTE");
  CHECK(what.find("compute capability 9.0") != std::string::npos);
  CHECK(what.find("is 8.0") != std::string::npos);
#endif
}

TEST_CASE("bf16: the lean dK/dV kernel gives fused_mma's step bit for bit") {
  // Fewer registers live at once, the same products with every accumulator's terms in the same
  // order. Grouped-query heads (moe_arch), a partial last tile (S 100); with RoPE dqkv goes
  // through fp32, with ALiBi straight into bf16.
  check_same_step_as_fused_mma(cu::AttentionPath::fused_mma_lean, "fused_mma_lean",
                               "attention::backward_mma_lean", 100, 79);
}

namespace {

// The orders a second stream's work is checked in: in the emulation, deferred until a stream
// waits for it, and run at once (MOEPLAN_EMU_STREAMS); on a GPU, whatever the hardware does.
// MOEPLAN_TEST_STREAM_ORDERS (a comma-separated list of the two) runs fewer: the sanitized
// variant runs the deferred order alone, the one where work left running when its buffers are
// freed is still to run (in the eager one it has run, and the addresses either order reads are
// the same).
std::vector<const char*> stream_orders() {
#ifdef MOEPLAN_CUDA_EMULATION
  const char* asked = std::getenv("MOEPLAN_TEST_STREAM_ORDERS");
  if (!asked) return {"deferred", "eager"};
  std::vector<const char*> orders;
  const std::string list = asked;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string one = list.substr(at, end - at);
    if (one == "deferred" || one == "eager")
      orders.push_back(one == "deferred" ? "deferred" : "eager");
    else
      FAIL("MOEPLAN_TEST_STREAM_ORDERS: '" << one << "' is not an order (deferred, eager)");
    at = end + 1;
  }
  return orders;
#else
  return {"gpu"};
#endif
}
void use_stream_order(const char* order) {  // nullptr: the emulation's default again
#ifdef MOEPLAN_CUDA_EMULATION
  if (order)
    ::setenv("MOEPLAN_EMU_STREAMS", order, 1);
  else
    ::unsetenv("MOEPLAN_EMU_STREAMS");
#else
  (void)order;
#endif
}

// Two training steps of each model on the same batches: the same losses and ledgers, then the
// same gradients and weights, bit for bit. A learning rate that moves every weight, so that the
// second step runs on updated ones (OptimConfig{}'s rate is 0).
void check_same_two_steps(cu::Model& two, cu::Model& one, const Arch& a, int64_t B, uint64_t seed) {
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.total_steps = 100;
  for (int64_t step = 0; step < 2; ++step) {
    const Batch b = random_batch(B, a.seq_len, a.vocab, seed + uint64_t(step));
    const StepResult r2 = two.train_step(b.inputs.data(), b.targets.data(), step, cfg);
    const StepResult r1 = one.train_step(b.inputs.data(), b.targets.data(), step, cfg);
    CHECK(r2.loss == r1.loss);
    CHECK(r2.flops.flops == r1.flops.flops);
  }
  CHECK(two.gradients() == one.gradients());
  CHECK(two.parameters() == one.parameters());
}

// Steps 0, 1, 2 of each model on the same batches (seeds seed, seed + 1, ...): the same losses,
// gradient norms and ledgers, bit for bit. Returns x's gradient norms.
std::vector<double> check_same_three_steps(cu::Model& x, cu::Model& y, const Arch& a, int64_t B,
                                           const OptimConfig& cfg, uint64_t seed) {
  std::vector<double> norms;
  for (int64_t step = 0; step < 3; ++step) {
    const Batch b = random_batch(B, a.seq_len, a.vocab, seed + uint64_t(step));
    const StepResult rx = x.train_step(b.inputs.data(), b.targets.data(), step, cfg);
    const StepResult ry = y.train_step(b.inputs.data(), b.targets.data(), step, cfg);
    CHECK(rx.loss == ry.loss);
    CHECK(rx.grad_norm == ry.grad_norm);
    CHECK(rx.flops.flops == ry.flops.flops);
    norms.push_back(rx.grad_norm);
  }
  return norms;
}

// Profiling times one stream: an overlap (the getter says whether a step runs it now) is off
// while it runs, and back after.
void check_off_while_profiling(cu::Model& m, bool (cu::Model::*on)() const) {
  m.set_profiling(true);
  CHECK_FALSE((m.*on)());
  m.set_profiling(false);
  CHECK((m.*on)());
}

// The MoE models in bf16 on tiled128, the expert path `moeplan run` takes.
void use_tiled128(const Arch& a, DType dt, std::initializer_list<cu::Model*> models) {
  if (dt != DType::bf16 || a.experts == 0) return;
  for (cu::Model* m : models) m->set_expert_path(cu::ExpertPath::tiled128);
}

}  // namespace

TEST_CASE("the shared expert on a second stream gives the one-stream steps bit for bit") {
  // Beside the routing and routed experts the shared expert computes the same products on the
  // same data, and what it adds to the residual stream (forward) and to dln (backward) is added
  // in the same order: the steps, weights, ledgers and an evaluation must be the same bits. In the
  // emulation a created stream's work is deferred until a stream waits for it (so a missing
  // wait reads stale results), and then run at once; both orders must agree with one stream.
  const Arch a = moe_arch();
  ModelOptions opt;
  opt.positions = "rope";
  const int64_t B = 3;
  for (const char* mode : stream_orders()) {
    use_stream_order(mode);
    for (const DType dt : {DType::f32, DType::bf16}) {
      INFO(mode << (dt == DType::bf16 ? ", bf16" : ", fp32"));
      cu::Model two(a, opt, 6, B, dt);
      cu::Model one(a, opt, 6, B, dt);
      if (dt == DType::bf16) {
        two.set_expert_path(cu::ExpertPath::tiled);
        one.set_expert_path(cu::ExpertPath::tiled);
      }
      one.set_shared_overlap(false);
      CHECK(two.shared_overlap());
      CHECK_FALSE(one.shared_overlap());
      check_same_two_steps(two, one, a, B, 90);
      const Batch v = random_batch(B, a.seq_len, a.vocab, 99);
      CHECK(two.forward_loss(v.inputs.data(), v.targets.data(), B) ==
            one.forward_loss(v.inputs.data(), v.targets.data(), B));
      // Profiling times one stream.
      check_off_while_profiling(two, &cu::Model::shared_overlap);
    }
  }
  use_stream_order(nullptr);
  // Without shared experts there is nothing to overlap.
  Arch no_shared = moe_arch();
  no_shared.d_shared = 0;
  cu::Model m(no_shared, opt, 6, B, DType::bf16);
  CHECK_FALSE(m.shared_overlap());
}

TEST_CASE("weight gradients on a second stream give the one-stream steps bit for bit") {
  // Each layer's FFN, attention-out and qkv weight gradients beside the input gradients after
  // them: the same products on the same data, so the same bits; with the MoE's shared expert on
  // the side stream too, and with it on the default stream (its weight gradients must then stay
  // there: the routed backward overwrites what they read before the layer's wait).
  struct Case {
    const char* name;
    Arch arch;
    DType dt;
  };
  ModelOptions opt;
  opt.positions = "alibi";
  const int64_t B = 3;
  for (const char* mode : stream_orders()) {
    use_stream_order(mode);
    for (const Case& c :
         {Case{"dense bf16", dense_arch(), DType::bf16}, Case{"moe fp32", moe_arch(), DType::f32},
          Case{"moe bf16", moe_arch(), DType::bf16}}) {
      const bool moe = c.arch.experts > 0;
      for (const bool shared_beside : {true, false}) {
        if (!moe && !shared_beside) continue;
        INFO(mode << ", " << c.name << (shared_beside ? ", shared expert beside" : ""));
        cu::Model two(c.arch, opt, 8, B, c.dt);
        two.set_shared_overlap(shared_beside);
        two.set_weight_grad_overlap(true);
        CHECK(two.weight_grad_overlap());
        cu::Model base(c.arch, opt, 8, B, c.dt);  // one stream
        base.set_shared_overlap(false);
        CHECK_FALSE(base.weight_grad_overlap());
        check_same_two_steps(two, base, c.arch, B, 120);
      }
    }
  }
  use_stream_order(nullptr);
}

TEST_CASE("the AdamW update beside the next step's forward gives the same steps bit for bit") {
  // The update in stages on a stream of its own, the next forward waiting for each stage before
  // its weights: the same kernel on the same values, so the same losses, ledgers, weights,
  // moments (in the state) and evaluation, bit for bit, over three steps (the second and third
  // start while the update before them runs). In the emulation a created stream's work waits
  // until a stream waits for it: a forward that read a layer before its stage, a zeroing of
  // gradients the update still reads, or a host copy before the update ends would see the old
  // values and fail here.
  struct Case {
    const char* name;
    Arch arch;
    DType dt;
    ModelOptions opt;
  };
  ModelOptions alibi;
  alibi.positions = "alibi";
  ModelOptions passes = alibi;  // two passes a step: the second forward has nothing to wait for
  passes.micro_batch_seqs = 2;
  ModelOptions erc = alibi;  // the ERC loss reads the routers and experts before the forward
  erc.erc_loss = 0.01;
  Arch tied = moe_arch();
  tied.tied_embeddings = true;
  const int64_t B = 3;
  OptimConfig cfg;  // a rate that moves every weight
  cfg.lr_peak = 3e-3;
  cfg.total_steps = 100;
  for (const char* mode : stream_orders()) {
    use_stream_order(mode);
    for (const Case& c : {Case{"dense bf16", dense_arch(), DType::bf16, alibi},
                          Case{"moe bf16 tiled128, passes of 2", moe_arch(), DType::bf16, passes},
                          Case{"moe fp32 tied", tied, DType::f32, alibi},
                          Case{"moe bf16 erc", moe_arch(), DType::bf16, erc}}) {
      INFO(mode << ", " << c.name);
      cu::Model beside(c.arch, c.opt, 11, B, c.dt);
      cu::Model base(c.arch, c.opt, 11, B, c.dt);
      use_tiled128(c.arch, c.dt, {&beside, &base});
      CHECK_FALSE(beside.update_overlap());  // off unless asked
      beside.set_update_overlap(true);
      CHECK(beside.update_overlap());
      check_same_three_steps(beside, base, c.arch, B, cfg, 300);
      // An evaluation straight after a step reads the weights its update writes.
      const Batch v = random_batch(B, c.arch.seq_len, c.arch.vocab, 399);
      CHECK(beside.forward_loss(v.inputs.data(), v.targets.data(), B) ==
            base.forward_loss(v.inputs.data(), v.targets.data(), B));
      const Batch w = random_batch(B, c.arch.seq_len, c.arch.vocab, 398);
      beside.train_step(w.inputs.data(), w.targets.data(), 3, cfg);
      base.train_step(w.inputs.data(), w.targets.data(), 3, cfg);
      std::vector<char> s2, s1;  // weights, moments, step count, ledgers
      beside.save_state(s2);
      base.save_state(s1);
      CHECK(s2 == s1);
      beside.train_step(w.inputs.data(), w.targets.data(), 4, cfg);
      base.train_step(w.inputs.data(), w.targets.data(), 4, cfg);
      CHECK(beside.parameters() == base.parameters());
      CHECK(beside.gradients() == base.gradients());
      // Profiling times one stream.
      check_off_while_profiling(beside, &cu::Model::update_overlap);
      // A model destroyed while its update runs: the update ends before the buffers it reads
      // (the gradient norm among them) are freed (under the sanitizers a read of a freed buffer
      // fails here).
      cu::Model brief(c.arch, c.opt, 11, B, c.dt);
      brief.set_update_overlap(true);
      brief.train_step(w.inputs.data(), w.targets.data(), 0, cfg);
    }
  }
  use_stream_order(nullptr);
}

TEST_CASE("a step's host waits: none a MoE layer on the tiled paths, one a layer on cuBLAS's") {
  // The host's synchronous calls in a training step (cu::host_waits). Each drains the device's
  // queue and none can be part of a CUDA graph. Counted by hand from model.cpp, a pass uploads
  // its tokens and targets and the embedding's three segment arrays and downloads its results
  // once (collect_pass): 6; a step with the update beside the forward also uploads the flags of
  // the embedding rows its tokens read and downloads the gradient norm: 2 more. The tiled
  // experts size their products on the device, so MoE layers add nothing; the grouped cuBLAS
  // path reads each MoE layer's routed counts back in each pass.
  ModelOptions one_pass;
  one_pass.positions = "alibi";
  ModelOptions two_passes = one_pass;
  two_passes.micro_batch_seqs = 1;
  const int64_t B = 2;
  const auto waits = [&](int64_t moe_layers, cu::ExpertPath path, const ModelOptions& o) {
    Arch a = moe_arch();
    a.layers = a.dense_layers + moe_layers;
    cu::Model m(a, o, 5, B, DType::bf16);
    m.set_expert_path(path);
    m.set_update_overlap(true);  // as moeplan run trains
    OptimConfig cfg;
    cfg.total_steps = 10;
    const Batch b0 = random_batch(B, a.seq_len, a.vocab, 3),
                b1 = random_batch(B, a.seq_len, a.vocab, 4);
    m.train_step(b0.inputs.data(), b0.targets.data(), 0, cfg);  // the first: plans, allocations
    const int64_t n0 = cu::host_waits();
    m.train_step(b1.inputs.data(), b1.targets.data(), 1, cfg);
    return cu::host_waits() - n0;
  };
  for (const cu::ExpertPath path : {cu::ExpertPath::tiled128, cu::ExpertPath::tiled}) {
    INFO("tiled path " << int(path));
    CHECK(waits(2, path, one_pass) == 6 + 2);
    CHECK(waits(4, path, one_pass) == 6 + 2);
    CHECK(waits(2, path, two_passes) == 2 * 6 + 2);
  }
  CHECK(waits(2, cu::ExpertPath::grouped, one_pass) == 6 + 2 + 2);
  CHECK(waits(4, cu::ExpertPath::grouped, one_pass) == 6 + 2 + 4);
  CHECK(waits(2, cu::ExpertPath::grouped, two_passes) == 2 * (6 + 2) + 2);
}

TEST_CASE("the gradient norm summed beside the backward gives the same steps bit for bit") {
  // The norm's sums of squares a bucket at a time (the final norm and LM head, each layer, the
  // embedding), each on a stream of its own as soon as the backward has written the bucket for
  // the last time, against the same sums after the backward: the parts are added in bucket
  // order either way, so the same norms, weights and gradients, bit for bit. In the emulation's
  // deferred order a finish that did not wait for the sums would read the last step's; in the
  // eager order a bucket summed before its last gradient write (norm1's, the embedding's, a
  // pass's) would sum an unfinished gradient.
  struct Case {
    const char* name;
    Arch arch;
    DType dt;
    ModelOptions opt;
    bool update_beside;
  };
  ModelOptions alibi;
  alibi.positions = "alibi";
  ModelOptions passes = alibi;  // two passes a step: only the last one sums
  passes.micro_batch_seqs = 2;
  ModelOptions erc = alibi;  // the ERC loss writes gradients before the passes
  erc.erc_loss = 0.01;
  Arch tied = moe_arch();
  tied.tied_embeddings = true;
  const int64_t B = 3;
  OptimConfig cfg;  // a rate that moves every weight, and a clip that scales
  cfg.lr_peak = 3e-3;
  cfg.total_steps = 100;
  cfg.grad_clip = 0.5;
  for (const char* mode : stream_orders()) {
    use_stream_order(mode);
    for (const Case& c :
         {Case{"dense bf16", dense_arch(), DType::bf16, alibi, false},
          Case{"moe bf16 tiled128, passes of 2", moe_arch(), DType::bf16, passes, false},
          Case{"moe fp32 tied, the update beside", tied, DType::f32, alibi, true},
          Case{"moe bf16 erc, the update beside", moe_arch(), DType::bf16, erc, true}}) {
      INFO(mode << ", " << c.name);
      cu::Model beside(c.arch, c.opt, 12, B, c.dt);
      cu::Model after(c.arch, c.opt, 12, B, c.dt);
      use_tiled128(c.arch, c.dt, {&beside, &after});
      beside.set_update_overlap(c.update_beside);
      after.set_update_overlap(c.update_beside);
      CHECK(beside.norm_overlap());  // on by default
      after.set_norm_overlap(false);
      CHECK_FALSE(after.norm_overlap());
      // The clip acts in every step, so the norm reaches the weights.
      for (const double n : check_same_three_steps(beside, after, c.arch, B, cfg, 500))
        CHECK(n > cfg.grad_clip);
      CHECK(beside.parameters() == after.parameters());
      CHECK(beside.gradients() == after.gradients());
      // Profiling times one stream; the weight gradients beside are not final at a bucket's site.
      check_off_while_profiling(beside, &cu::Model::norm_overlap);
      beside.set_weight_grad_overlap(true);
      CHECK_FALSE(beside.norm_overlap());
    }
  }
  use_stream_order(nullptr);
}

namespace {

// A configuration for the programmatic-launch tests: the model, its attention and expert paths.
struct LaunchCase {
  const char* name;
  Arch arch;
  DType dt;
  ModelOptions opt;
  cu::AttentionPath attention;
  std::optional<cu::ExpertPath> experts;
};

ModelOptions with_positions(const char* positions) {
  ModelOptions o;
  o.positions = positions;
  return o;
}

// Two steps (the update beside, the clip acting) and an evaluation of one model with every launch
// programmatic and of another with plain launches, from the same weights and batches: the same
// losses, norms, ledgers and weights, bit for bit.
// f() with every launch programmatic; plain launches again after, also if f throws.
template <class F>
auto programmatically(F&& f) {
  struct Reset {
    ~Reset() { cu::kernels::set_programmatic_launch(false); }
  } reset;
  cu::kernels::set_programmatic_launch(true);
  return f();
}

void check_programmatic_same_as_plain(const LaunchCase& c) {
  INFO(c.name);
  const int64_t B = 3;
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.total_steps = 100;
  cfg.grad_clip = 0.5;
  cu::Model pdl(c.arch, c.opt, 21, B, c.dt, nullptr, c.attention);
  cu::Model plain(c.arch, c.opt, 21, B, c.dt, nullptr, c.attention);
  if (c.experts) {
    pdl.set_expert_path(*c.experts);
    plain.set_expert_path(*c.experts);
  }
  for (cu::Model* m : {&pdl, &plain}) m->set_update_overlap(true);
  for (int64_t step = 0; step < 2; ++step) {
    const Batch b = random_batch(B, c.arch.seq_len, c.arch.vocab, 800 + uint64_t(step));
    const StepResult rp = programmatically(
        [&] { return pdl.train_step(b.inputs.data(), b.targets.data(), step, cfg); });
    const StepResult rq = plain.train_step(b.inputs.data(), b.targets.data(), step, cfg);
    CHECK(rp.loss == rq.loss);
    CHECK(rp.grad_norm == rq.grad_norm);
    CHECK(rp.flops.flops == rq.flops.flops);
  }
  const Batch e = random_batch(B, c.arch.seq_len, c.arch.vocab, 900);
  const auto [lp, wp] = programmatically([&] {
    return std::pair(pdl.forward_loss(e.inputs.data(), e.targets.data(), B), pdl.parameters());
  });
  CHECK(lp == plain.forward_loss(e.inputs.data(), e.targets.data(), B));
  CHECK(wp == plain.parameters());
}

}  // namespace

TEST_CASE("programmatic dependent launches give the same steps; every kernel waits first") {
  // --kernels launch=pdl: each of the project's kernels may start while the one before it in its
  // stream ends, and waits for it before touching memory (launch.cuh). On a GPU a kernel that
  // read or wrote before its wait would race, and the steps would differ from the plain launches'.
  // The emulation runs launches in order, so it cannot race; it faults a programmatically
  // launched kernel any of whose threads ends or meets __syncthreads without having waited.
  // Between these cases and the wgmma one below every kernel a step or an evaluation launches is
  // launched so: each attention path, each expert path (capacity drops on grouped, padded rows on
  // batched), ERC, fp32 and bf16, passes, and the update and the norm beside. (The kernel test
  // suite runs programmatically too: ctest's backend_cuda_kernels_emulated_pdl.)
  ModelOptions passes = with_positions("alibi");
  passes.micro_batch_seqs = 2;
  ModelOptions erc = with_positions("rope");
  erc.erc_loss = 0.01;
  ModelOptions capacity = with_positions("alibi");
  capacity.capacity_factor = 1.0;
  Arch tied = moe_arch();
  tied.tied_embeddings = true;
  using A = cu::AttentionPath;
  using E = cu::ExpertPath;
  for (const LaunchCase& c : {LaunchCase{"dense fp32, cuBLAS attention",
                                         dense_arch(),
                                         DType::f32,
                                         with_positions("rope"),
                                         A::cublas,
                                         {}},
                              LaunchCase{"dense bf16, cuBLAS attention",
                                         dense_arch(),
                                         DType::bf16,
                                         with_positions("alibi"),
                                         A::cublas,
                                         {}},
                              LaunchCase{"moe bf16 fused, tiled128, passes", moe_arch(),
                                         DType::bf16, passes, A::fused, E::tiled128},
                              LaunchCase{"moe bf16 fused_mma_wide, tiled, erc", moe_arch(),
                                         DType::bf16, erc, A::fused_mma_wide, E::tiled},
                              LaunchCase{"moe bf16 fused_mma_lean, grouped, capacity", moe_arch(),
                                         DType::bf16, capacity, A::fused_mma_lean, E::grouped},
                              LaunchCase{"moe bf16 fused_mma, batched", moe_arch(), DType::bf16,
                                         with_positions("alibi"), A::fused_mma, E::batched},
                              LaunchCase{"moe fp32 tied, loop", tied, DType::f32,
                                         with_positions("alibi"), A::cublas, E::loop}})
    check_programmatic_same_as_plain(c);
}

TEST_CASE("programmatic dependent launches with the wgmma kernels give the same steps") {
  // The same for the wgmma attention (head width 64) and expert kernels: a case of its own, so
  // that on a GPU where the wgmma kernels fail their own tests (gpu-check) the rest still runs.
  Arch wide = moe_arch();
  wide.head_dim = 64;
  wide.d_model = wide.heads * 64;
  check_programmatic_same_as_plain(
      LaunchCase{"moe bf16 fused_wgmma, wgmma experts", wide, DType::bf16, with_positions("rope"),
                 cu::AttentionPath::fused_wgmma, cu::ExpertPath::wgmma});
}

#ifdef MOEPLAN_CUDA_EMULATION
TEST_CASE("a cuBLAS handle whose workspace does not fit: out of memory, and nothing leaks") {
  // The emulated device holds less than the 32 MiB workspace, so the constructor throws after
  // cublasCreate: the handle must go with it (under the sanitizers the leak check at exit fails
  // this program otherwise).
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", "1024", 1);
  CHECK_THROWS_AS(cu::Blas(), cu::DeviceOutOfMemory);
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
  const cu::Blas fits;
  CHECK(fits.counts().products == 0);
}

TEST_CASE("the emulated device's size: MOEPLAN_EMU_MEMORY_KIB's where set, else 1 GiB") {
  // What the engine's lines print as "of the device's ..." (and the fit check reads): an
  // emulated H200 (140 GiB) must not read as 1 GiB when a real sweep's fit is checked here.
  const auto total = [] {
    size_t free_b = 0, t = 0;
    REQUIRE(cudaMemGetInfo(&free_b, &t) == cudaSuccess);
    return t;
  };
  CHECK(total() == size_t(1) << 30);
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", "147222528", 1);  // 140.4 GiB
  CHECK(total() == size_t(147222528) * 1024);
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", "38912", 1);  // 38 MiB
  CHECK(total() == size_t(38) << 20);
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
}
#endif

#ifdef MOEPLAN_CUDA_EMULATION
// `moeplan run`'s fit check (backend::check_fit: every point's model built before the first
// trains) held to the engine's own build: where a batch does not fit, the most sequences a pass
// it names is what the engine builds, and one more is what it refuses.
TEST_CASE("the fit check: the largest pass it names builds as an engine, one more does not") {
  namespace be = moeplan::backend;
  be::EngineRequest req = moe_request();
  const size_t base = in_use();
  size_t one = 0, whole = 0;  // what the engine holds in passes of 1 and of the whole batch
  req.options.micro_batch_seqs = 1;
  {
    const auto e = be::make_engine("cuda", req);
    one = in_use() - base;
  }
  req.options.micro_batch_seqs = 0;
  {
    const auto e = be::make_engine("cuda", req);
    whole = in_use() - base;
  }
  REQUIRE(whole > one);
  CHECK(in_use() == base);  // an engine leaves nothing behind
  // Room for one sequence's model and half of what the other 47 add.
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", std::to_string((base + one + (whole - one) / 2) >> 10).c_str(),
           1);
  const std::optional<be::PassFit> fit = be::check_fit("cuda", req);
  REQUIRE(fit.has_value());
  CHECK(fit->pass == 48);
  const int64_t most = fit->largest;
  CHECK(most > 1);
  CHECK(most < 48);
  CHECK(in_use() == base);  // each try's model freed
  CHECK_MESSAGE(fit->why.find(fmt::format("with passes of 48 sequences of 32 tokens; run smaller "
                                          "passes: --micro-batch {} (at most {} sequences a "
                                          "pass fit)",
                                          most, most)) != std::string::npos,
                fit->why);
  req.options.micro_batch_seqs = most;
  CHECK_NOTHROW(be::make_engine("cuda", req));
  const std::optional<be::PassFit> fits = be::check_fit("cuda", req);
  CHECK(fits->pass == most);
  CHECK(fits->share == 48);
  CHECK(fits->largest == most);
  CHECK(fits->why.empty());
  // An estimate's look up from a pass that fits finds the same most, from below.
  req.options.micro_batch_seqs = 3;
  const std::optional<be::PassFit> up = be::check_fit("cuda", req, true);
  CHECK(up->pass == 3);
  CHECK(up->largest == most);
  CHECK(up->why.empty());
  CHECK(in_use() == base);
  req.options.micro_batch_seqs = most + 1;
  CHECK_THROWS_WITH_AS(be::make_engine("cuda", req),
                       doctest::Contains("--device cuda: out of device memory"),
                       moeplan::InputError);
  // Room for less than one sequence's model: no pass fits, and the line says what would.
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", std::to_string((base + one / 2) >> 10).c_str(), 1);
  req.options.micro_batch_seqs = 0;
  const std::optional<be::PassFit> none = be::check_fit("cuda", req);
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
  // With room for all: the whole share, in one more build.
  req.options.micro_batch_seqs = 3;
  const std::optional<be::PassFit> all = be::check_fit("cuda", req, true);
  CHECK(all->largest == 48);
  CHECK(none->largest == 0);
  CHECK_MESSAGE(
      none->why.find("with passes of 48 sequences of 32 tokens; not even passes of 1 "
                     "sequence fit; the weights, gradients and AdamW state alone take ") !=
          std::string::npos,
      none->why);
  CHECK_MESSAGE(none->why.find("(or GPUs that share its AdamW state: --nproc N "
                               "--shard-optimizer)") != std::string::npos,
                none->why);
}
#endif

#ifdef MOEPLAN_CUDA_EMULATION
// What a record keeps of a point's memory (Engine::memory_use): the engine's count of its
// buffers, held to the emulated device's own count of every byte cudaMalloc gave out.
TEST_CASE("an engine's memory use: the most its buffers held at once, as the device counts it") {
  namespace be = moeplan::backend;
  be::EngineRequest req = moe_request();
  req.batch_seqs = 6;
  req.options.micro_batch_seqs = 2;
  {
    // Held and freed before the engine: not the engine's (it counts from its own start).
    const cu::DeviceBuffer before(size_t(256) << 20);
  }
  moeplan_emu::reset_memory_peak();
  const auto engine = be::make_engine("cuda", req);
  const size_t built = in_use();
  be::Engine::MemoryUse m = engine->memory_use();
  CHECK(m.peak_bytes == moeplan_emu::memory_peak());
  CHECK(m.peak_bytes >= built);
  // 68.5 MiB: two cuBLAS handles' 32-MiB workspaces and the model.
  CHECK(m.peak_bytes < size_t(256) << 20);
  CHECK(m.device_bytes == size_t(1) << 30);  // the emulated device's size unless set
  const Batch b = random_batch(6, moe_arch().seq_len, moe_arch().vocab, 8);
  for (int64_t step = 0; step < 2; ++step)
    engine->train_step(b.inputs.data(), b.targets.data(), step, OptimConfig{});
  m = engine->memory_use();
  CHECK(m.peak_bytes == moeplan_emu::memory_peak());
  {
    // A buffer beside the engine's, past their peak: the process's peak, as the device's.
    const cu::DeviceBuffer beside(m.peak_bytes - in_use() + 4096);
    CHECK(engine->memory_use().peak_bytes == m.peak_bytes + 4096);
  }
  CHECK(engine->memory_use().peak_bytes == moeplan_emu::memory_peak());
  // The CPU engine has no device memory of its own to report.
  const auto cpu = be::make_engine("cpu", req);
  CHECK(cpu->memory_use().peak_bytes == 0);
  CHECK(cpu->memory_use().device_bytes == 0);
}
#endif

#ifdef MOEPLAN_CUDA_EMULATION
TEST_CASE("a tiled expert path given at construction: no gathered-rows buffer, even for a moment") {
  // The cuBLAS expert paths gather each MoE layer's routed rows into a T·K × Dm bf16 buffer (xg);
  // the tiled paths read them where they lie. Set after construction, the path frees xg, but the
  // construction's peak held it: a device that fits the tiled model alone could refuse it.
  const Arch a = moe_arch();
  ModelOptions opt;
  const int64_t B = 3;
  const size_t base = in_use();
  size_t tiled = 0, grouped = 0, set_later = 0;
  {
    cu::Model m(a, opt, 5, B, DType::bf16, nullptr, cu::AttentionPath::cublas, false, 0,
                cu::ExpertPath::tiled128);
    CHECK(m.expert_path() == cu::ExpertPath::tiled128);
    tiled = in_use() - base;
  }
  {
    cu::Model m(a, opt, 5, B, DType::bf16);
    grouped = in_use() - base;
    m.set_expert_path(cu::ExpertPath::tiled128);
    set_later = in_use() - base;
  }
  CHECK(set_later == tiled);  // the same steady size
  const size_t xg = size_t(a.moe_layers() * B * a.seq_len * a.top_k * a.d_model) * 2;
  CHECK(grouped == tiled + xg);
  // A device with room for the tiled model and half of xg besides.
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", std::to_string((base + tiled + xg / 2) >> 10).c_str(), 1);
  CHECK_NOTHROW(cu::Model(a, opt, 5, B, DType::bf16, nullptr, cu::AttentionPath::cublas, false, 0,
                          cu::ExpertPath::tiled128));
  CHECK_THROWS_AS(cu::Model(a, opt, 5, B, DType::bf16), cu::DeviceOutOfMemory);
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
  // fp32 products and a tiled path: refused at construction, as set_expert_path refuses them.
  CHECK_THROWS_AS(cu::Model(a, opt, 5, B, DType::f32, nullptr, cu::AttentionPath::cublas, false, 0,
                            cu::ExpertPath::tiled),
                  moeplan::InputError);
}
#endif

TEST_CASE("a GEMM table runs the products it lists through cuBLASLt: the same step") {
  // The shapes one step asks for (both streams: the MoE's shared expert and the weight gradients
  // run beside), a table tuned for them that keeps every shape's fastest cuBLASLt candidate
  // (min_gain -inf: kept even when slower), then the same step with the table. Every product
  // must go through it, and the step must be the same: bit for bit in the emulation (whose
  // cuBLASLt multiplies as its cublasGemmEx does, from the layouts as cuBLASLt reads them), within
  // bf16 tolerance on a GPU (another algorithm sums in another order).
  ModelOptions opt;
  opt.positions = "rope";
  const int64_t B = 3;
  for (const Arch& a : {dense_arch(), moe_arch()}) {
    INFO((a.experts > 0 ? "moe" : "dense"));
    cu::Model plain(a, opt, 11, B, DType::bf16), listed(a, opt, 11, B, DType::bf16);
    for (cu::Model* m : {&plain, &listed}) {
      m->set_expert_path(cu::ExpertPath::tiled);
      m->set_weight_grad_overlap(true);
    }
    plain.record_gemm_shapes(true);
    const Batch b = random_batch(B, a.seq_len, a.vocab, 31);
    const StepResult r0 = plain.train_step(b.inputs.data(), b.targets.data(), 0, OptimConfig{});
    const auto shapes = plain.gemm_shapes();
    REQUIRE(shapes.size() >= 5);  // qkv, attention out, FFN or experts' neighbours, LM head, ...
    for (const auto& [shape, align] : shapes) CHECK(align >= 16);
    const cu::GemmTable table =
        cu::tune_gemm_table(shapes, -std::numeric_limits<double>::infinity(), 1);
    std::vector<cu::GemmShape> distinct;
    for (const auto& [shape, align] : shapes)
      if (shape.in == DType::bf16 &&
          std::find(distinct.begin(), distinct.end(), shape) == distinct.end())
        distinct.push_back(shape);
    CHECK(table.entries.size() == distinct.size());
    for (const auto& e : table.entries) CHECK(e.ms_chosen > 0);
    listed.set_gemm_table(std::make_shared<const cu::GemmTable>(table));
    const StepResult r1 = listed.train_step(b.inputs.data(), b.targets.data(), 0, OptimConfig{});
    const cu::Blas::Counts c = listed.gemm_counts();
    CHECK(c.from_table > 0);
    CHECK(c.from_table == c.products);  // a bf16 model: every product is bf16 and listed
    CHECK(plain.gemm_counts().from_table == 0);
    CHECK(r1.flops.flops == r0.flops.flops);
#ifdef MOEPLAN_CUDA_EMULATION
    CHECK(r1.loss == r0.loss);
    CHECK(listed.gradients() == plain.gradients());
    CHECK(listed.parameters() == plain.parameters());
#else
    CHECK(std::abs(r1.loss - r0.loss) <= 2e-2 * std::abs(r0.loss));
    CHECK(rel_err(listed.gradients(), plain.gradients()) < 2e-2);
#endif
  }
}

TEST_CASE("a GEMM table leaves the per-expert products alone: their shapes follow the routing") {
  // experts=loop runs one product per expert through Blas::gemm, shaped by that step's routing:
  // recorded, they would be tuned for one routing and met by chance later. Its recorded shapes
  // must be those of the tiled experts (whose products are our own kernels, not Blas's).
  const Arch a = moe_arch();
  ModelOptions opt;
  auto shapes_of = [&](cu::ExpertPath path) {
    cu::Model m(a, opt, 4, 2, DType::bf16);
    m.set_expert_path(path);
    m.record_gemm_shapes(true);
    const Batch b = random_batch(2, a.seq_len, a.vocab, 8);
    m.compute_gradients(b.inputs.data(), b.targets.data());
    std::vector<cu::GemmShape> s;
    for (const auto& [shape, align] : m.gemm_shapes()) s.push_back(shape);
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return std::pair{s, m.gemm_counts().products};
  };
  const auto [loop, loop_products] = shapes_of(cu::ExpertPath::loop);
  const auto [tiled, tiled_products] = shapes_of(cu::ExpertPath::tiled);
  CHECK(loop == tiled);
  CHECK(loop_products > tiled_products);  // the per-expert products ran, unrecorded
}

TEST_CASE("a lenient GEMM table (a built-in one) sends what it cannot take to cuBLAS's default") {
  // A built-in table was timed for the benchmark's points; another point may ask for a listed
  // shape with operands less aligned than it was timed for, or (emulation) with an algorithm
  // cuBLASLt refuses. Lenient, such a product runs through cublasGemmEx's default, counted, the
  // same way at every step; strict (a user's table), it is an error.
  const Arch a = dense_arch();
  ModelOptions opt;
  const Batch b = random_batch(2, a.seq_len, a.vocab, 6);
  cu::Model plain(a, opt, 3, 2, DType::bf16);
  plain.record_gemm_shapes(true);
  const StepResult r0 = plain.train_step(b.inputs.data(), b.targets.data(), 0, OptimConfig{});
  cu::GemmTable t =
      cu::tune_gemm_table(plain.gemm_shapes(), -std::numeric_limits<double>::infinity(), 1);
  REQUIRE(t.entries.size() >= 3);
  t.entries[0].align = 512;  // more than any operand here (alignment counts up to 256)
#ifdef MOEPLAN_CUDA_EMULATION
  t.entries[1].algo[0] ^= 0xff;  // an algorithm the emulation's cuBLASLt does not know
#endif
  const auto table = std::make_shared<const cu::GemmTable>(t);
  // The same table without the entries it cannot take: their products unlisted, by the default.
  cu::GemmTable without = t;
#ifdef MOEPLAN_CUDA_EMULATION
  without.entries.erase(without.entries.begin(), without.entries.begin() + 2);
#else
  without.entries.erase(without.entries.begin());
#endif

  cu::Model lenient(a, opt, 3, 2, DType::bf16), fewer(a, opt, 3, 2, DType::bf16);
  lenient.set_gemm_table(table, true);
  fewer.set_gemm_table(std::make_shared<const cu::GemmTable>(without));
  std::vector<cu::Blas::Counts> after;
  for (int64_t step = 0; step < 2; ++step) {
    const StepResult r = lenient.train_step(b.inputs.data(), b.targets.data(), step, OptimConfig{});
    fewer.train_step(b.inputs.data(), b.targets.data(), step, OptimConfig{});
    after.push_back(lenient.gemm_counts());
    if (step == 0) {
      CHECK(r.flops.flops == r0.flops.flops);
#ifdef MOEPLAN_CUDA_EMULATION
      CHECK(r.loss == r0.loss);
#endif
    }
  }
  const cu::Blas::Counts c = after[1];
  CHECK(c.products == 2 * plain.gemm_counts().products);
  CHECK(c.table_skipped > 0);
  CHECK(c.table_skipped == 2 * after[0].table_skipped);  // both steps alike
  CHECK(c.from_table + c.table_skipped == c.products);   // every bf16 product is listed
  CHECK(c.from_table == fewer.gemm_counts().from_table);
  CHECK(fewer.gemm_counts().table_skipped == 0);

  cu::Model strict(a, opt, 3, 2, DType::bf16);
  strict.set_gemm_table(table);
  CHECK_THROWS(strict.compute_gradients(b.inputs.data(), b.targets.data()));
}

TEST_CASE("a GEMM table from elsewhere, or one cuBLASLt refuses, is an error, not a fallback") {
  const Arch a = dense_arch();
  ModelOptions opt;
  cu::Model m(a, opt, 3, 2, DType::bf16);
  m.record_gemm_shapes(true);
  const Batch b = random_batch(2, a.seq_len, a.vocab, 5);
  m.compute_gradients(b.inputs.data(), b.targets.data());
  const cu::GemmTable good =
      cu::tune_gemm_table(m.gemm_shapes(), -std::numeric_limits<double>::infinity(), 1);
  REQUIRE_FALSE(good.entries.empty());
  auto refused = [&](const cu::GemmTable& t, const std::string& names) {
    try {
      m.set_gemm_table(std::make_shared<const cu::GemmTable>(t));
    } catch (const moeplan::InputError& e) {
      const std::string what = e.what();
      CHECK(what.find(names) != std::string::npos);
      CHECK(what.find('\n') == std::string::npos);
      return true;
    }
    return false;
  };
  cu::GemmTable other = good;
  other.device = "a device of another kind";
  CHECK(refused(other, "'a device of another kind'"));
  other = good;
  other.cublaslt_version += 1;
  CHECK(refused(other, std::to_string(other.cublaslt_version)));
  other = good;
  other.workspace_bytes /= 2;
  CHECK(refused(other, std::to_string(other.workspace_bytes)));
  CHECK(m.gemm_counts().from_table == 0);  // none of them was taken
#ifdef MOEPLAN_CUDA_EMULATION
  // An algorithm cuBLASLt does not accept for its shape (the emulation's check knows its own
  // three): refused at its first use, in one line. (On a GPU a made-up algorithm is left alone.)
  other = good;
  other.entries[0].algo[0] ^= 0xff;
  m.set_gemm_table(std::make_shared<const cu::GemmTable>(other));
  try {
    m.compute_gradients(b.inputs.data(), b.targets.data());
    FAIL("a refused algorithm ran");
  } catch (const moeplan::InputError& e) {
    CHECK(std::string(e.what()).find("refuses the listed algorithm") != std::string::npos);
  }
#endif
}

TEST_CASE("a GEMM table round-trips through its file; a malformed one names what is wrong") {
  cu::GemmTable t;
  t.device = "NVIDIA H200";
  t.cublaslt_version = 130001;
  t.workspace_bytes = 32u << 20;
  cu::GemmTable::Entry e;
  e.shape = {false, true, 8192, 2304, 768, 768, 768, 2304, DType::bf16, DType::f32};
  e.algo = {0x1, 0xffffffffffffffffull, 0x0123456789abcdefull, 0, 7, 8, 9, 10};
  e.align = 256;
  e.ms_default = 0.163;
  e.ms_chosen = 0.131;
  t.entries.push_back(e);
  e.shape = {true, false, 768, 3456, 8192, 768, 3456, 3456, DType::bf16, DType::bf16};
  e.align = 16;
  t.entries.push_back(e);
  e.shape.m = 512;  // tuned, cublasGemmEx's default kept
  e.lt = false;
  e.algo = {};
  t.entries.push_back(e);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("moeplan-gemm-table-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "table.json").string();
  cu::save_gemm_table(path, t);
  const cu::GemmTable r = cu::load_gemm_table(path);
  CHECK(r.device == t.device);
  CHECK(r.cublaslt_version == t.cublaslt_version);
  CHECK(r.workspace_bytes == t.workspace_bytes);
  REQUIRE(r.entries.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(r.entries[i].shape == t.entries[i].shape);
    CHECK(r.entries[i].lt == t.entries[i].lt);
    CHECK(r.entries[i].algo == t.entries[i].algo);
    CHECK(r.entries[i].align == t.entries[i].align);
    CHECK(r.entries[i].ms_chosen == t.entries[i].ms_chosen);
  }
  std::filesystem::remove_all(dir);

  const std::string json = cu::gemm_table_json(t);
  auto error_of = [](const std::string& text) -> std::string {
    try {
      cu::parse_gemm_table(text, "t.json");
    } catch (const moeplan::InputError& x) {
      return x.what();
    }
    return "(accepted)";
  };
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string s = json;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  CHECK(error_of("{").find("t.json: not JSON") == 0);
  CHECK(error_of(edited("moeplan-gemm-table-1", "x")).find("'format'") != std::string::npos);
  CHECK(error_of(edited("\"m\": 8192", "\"m\": 0")) ==
        "t.json: entry 1's 'm' must be a positive whole number");
  CHECK(error_of(edited("\"in\": \"bf16\"", "\"in\": \"fp16\"")) ==
        "t.json: entry 1's 'in' must be bf16 or f32");
  CHECK(error_of(edited("\"0000000000000001\"", "\"0x1g\"")) ==
        "t.json: entry 1's 'algo' must be a list of 8 hexadecimal words, or null (cublasGemmEx's "
        "default)");
  CHECK(json.find("\"algo\": null") != std::string::npos);
  cu::GemmTable twice = t;
  twice.entries[1] = twice.entries[0];
  CHECK(error_of(cu::gemm_table_json(twice)).find("t.json: entry 2 (bf16 8192x2304x768") == 0);
  CHECK(error_of(cu::gemm_table_json(twice)).find("must be listed once") != std::string::npos);
}

TEST_CASE("same seed, same data: bit-for-bit the same losses and weights; save/load resumes") {
  const Arch a = moe_arch();
  ModelOptions opt;
  opt.positions = "rope";
  opt.erc_loss = 0.2;  // its noise draws continue from the saved generator state
  const int64_t B = 4;
  OptimConfig cfg;
  cfg.lr_peak = 1e-3;
  cfg.total_steps = 10;
  cu::Model m1(a, opt, 5, B), m2(a, opt, 5, B);
  std::vector<char> state;
  StepResult at2;
  std::vector<float> weights_after2;
  for (int64_t s = 0; s < 4; ++s) {
    const Batch b = random_batch(B, a.seq_len, a.vocab, 100 + s);
    const StepResult r1 = m1.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    const StepResult r2 = m2.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    CHECK(r1.loss == r2.loss);
    CHECK(r1.aux_erc == r2.aux_erc);
    CHECK(r1.grad_norm == r2.grad_norm);
    if (s == 1) m1.save_state(state);
    if (s == 2) {
      at2 = r1;
      weights_after2 = m1.parameters();
    }
  }
  CHECK(m1.parameters() == m2.parameters());
  m2.load_state(state);
  const Batch b = random_batch(B, a.seq_len, a.vocab, 102);
  const StepResult resumed = m2.train_step(b.inputs.data(), b.targets.data(), 2, cfg);
  CHECK(resumed.loss == at2.loss);
  CHECK(resumed.aux_erc > 0);
  CHECK(resumed.aux_erc == at2.aux_erc);  // the same noise: the generator came back with the state
  CHECK(m2.parameters() == weights_after2);
}

// Model states written before the generator was saved (format 1: no ERC on the cuda device
// then, so nothing drawn after the initial weights), or before the ledgers counted in 128 bits
// (formats 1 and 2: 64-bit counts), still load and resume bit for bit.
TEST_CASE("model states of formats 1 and 2 (no generator; 64-bit ledgers) still load") {
  const Arch a = moe_arch();
  const ModelOptions opt;
  const int64_t B = 2;
  OptimConfig cfg;
  cfg.lr_peak = 1e-3;
  cfg.total_steps = 4;
  cu::Model m1(a, opt, 9, B);
  const Batch b0 = random_batch(B, a.seq_len, a.vocab, 600),
              b1 = random_batch(B, a.seq_len, a.vocab, 601);
  m1.train_step(b0.inputs.data(), b0.targets.data(), 0, cfg);
  std::vector<char> state;
  m1.save_state(state);
  REQUIRE(std::string(state.data(), 8) == "MOEPCUD3");
  // The two ledgers end the state: 31 counts each, 16 bytes in format 3, 8 before (the low 8
  // bytes of each, little-endian, as the counts fit 64 bits).
  constexpr size_t kCounts = 2 * (moeplan::kFlopCategories * moeplan::kPhases + 1);
  REQUIRE(state.size() > kCounts * 16);
  std::vector<char> v2(state.begin(), state.end() - std::ptrdiff_t(kCounts * 16));
  for (size_t i = 0; i < kCounts; ++i) {
    const char* wide = state.data() + state.size() - kCounts * 16 + i * 16;
    v2.insert(v2.end(), wide, wide + 8);
  }
  v2[7] = '2';
  // Format 1: magic ...1, and no generator state (4 words) after the AdamW step count.
  const size_t at = 8 + 8 + 3 * size_t(m1.trainable_params()) * 4 + 8;
  std::vector<char> v1(v2.begin(), v2.begin() + std::ptrdiff_t(at));
  v1.insert(v1.end(), v2.begin() + std::ptrdiff_t(at + 32), v2.end());
  v1[7] = '1';
  const StepResult r1 = m1.train_step(b1.inputs.data(), b1.targets.data(), 1, cfg);
  for (const std::vector<char>* old : {&v1, &v2}) {
    cu::Model m2(a, opt, 9, B);
    m2.load_state(*old);
    CHECK(m2.adam_steps() == 1);
    CHECK(m2.ledger().total() > 0);
    const StepResult r2 = m2.train_step(b1.inputs.data(), b1.targets.data(), 1, cfg);
    CHECK(r1.loss == r2.loss);
    CHECK(m1.parameters() == m2.parameters());
    CHECK(m1.ledger() == m2.ledger());
  }
  v1[7] = '9';
  CHECK_THROWS_AS(cu::Model(a, opt, 9, B).load_state(v1), moeplan::InputError);
}

TEST_CASE("NCCL data-parallel path at world size 1 equals the plain step; windows split by rank") {
  CHECK(cu::windows_of_rank(10, 0, 3) == 4);  // windows 0, 3, 6, 9
  CHECK(cu::windows_of_rank(10, 1, 3) == 3);  // 1, 4, 7
  CHECK(cu::windows_of_rank(10, 2, 3) == 3);  // 2, 5, 8
  CHECK(cu::window_of_rank(2, 1, 3) == 7);
  const std::string id_file =
      (std::filesystem::temp_directory_path() / ("moeplan-nccl-" + std::to_string(getpid())))
          .string();
  cu::Communicator comm(cu::RankInfo{0, 1, 0}, id_file);
  const Arch a = moe_arch();
  ModelOptions opt;
  const int64_t B = 2;
  OptimConfig cfg;
  cfg.lr_peak = 1e-3;
  cfg.total_steps = 3;
  cu::Model plain(a, opt, 8, B), dp(a, opt, 8, B, DType::bf16, &comm);
  // The optimizer sharded over one rank: reduce-scatter, all-gather and the split clip norm on
  // the device's NCCL, which must leave the same bits.
  cu::Model sharded(a, opt, 8, B, DType::bf16, &comm, cu::AttentionPath::cublas, true);
  // The all-reduce in buckets on a stream of its own beside the backward, and the update beside
  // the next forward (on a GPU: NCCL launched on a created stream between the backward's kernels).
  cu::Model beside(a, opt, 8, B, DType::bf16, &comm);
  beside.set_reduce_overlap(true);
  beside.set_update_overlap(true);
  REQUIRE(beside.reduce_overlap());
  for (int64_t s = 0; s < 3; ++s) {
    const Batch b = random_batch(B, a.seq_len, a.vocab, 200 + s);
    const StepResult r1 = plain.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    const StepResult r2 = dp.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    const StepResult r3 = sharded.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    const StepResult r4 = beside.train_step(b.inputs.data(), b.targets.data(), s, cfg);
    CHECK(r4.loss == r2.loss);
    CHECK(r4.grad_norm == r2.grad_norm);
    CHECK(r4.flops == r2.flops);
    CHECK(r1.loss == r2.loss);
    CHECK(r1.flops == r2.flops);
    CHECK(r1.loss_bearing_targets == r2.loss_bearing_targets);
    CHECK(r3.loss == r1.loss);
    CHECK(r3.grad_norm == r1.grad_norm);
    CHECK(r3.flops == r1.flops);
  }
  CHECK(plain.parameters() == dp.parameters());
  CHECK(sharded.parameters() == plain.parameters());
  CHECK(beside.parameters() == dp.parameters());
  std::vector<char> s_plain, s_sharded;
  plain.save_state(s_plain);
  sharded.save_state(s_sharded);
  CHECK(s_sharded == s_plain);  // the whole state: weights, both moments, step, ledgers
  std::filesystem::remove(id_file);
}

#ifdef MOEPLAN_CUDA_EMULATION
// Data parallel without --shard-optimizer, where the passes do not fit: the line says what
// splitting the AdamW state over the ranks would fit. Rank 0 of 2 (the rank variables as a
// launcher sets them; the check makes no NCCL group), its share 24 of 48 sequences; the device
// holds the sharded model of that share (its bytes measured below), less than the unsharded.
TEST_CASE("the fit check, data parallel: what --shard-optimizer would fit") {
  namespace be = moeplan::backend;
  be::EngineRequest req = moe_request();
  const size_t base = in_use();
  size_t sharded = 0, sharded_half = 0;  // in passes of all 24, and of 12
  {  // as the engine builds it here: `auto`'s kernels for head width 16 on this device
    cu::Model m(req.arch, req.options, 5, 24, DType::bf16, nullptr,
                cu::AttentionPath::fused_mma_lean, true, 0, cu::ExpertPath::tiled128, 2);
    sharded = in_use() - base;
  }
  {
    ModelOptions half = req.options;
    half.micro_batch_seqs = 12;
    cu::Model m(req.arch, half, 5, 24, DType::bf16, nullptr, cu::AttentionPath::fused_mma_lean,
                true, 0, cu::ExpertPath::tiled128, 2);
    sharded_half = in_use() - base;
  }
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", std::to_string((base + sharded + 1023) >> 10).c_str(), 1);
  const std::optional<be::PassFit> plain = be::check_fit("cuda", req);
  req.shard_optimizer = true;
  const std::optional<be::PassFit> split = be::check_fit("cuda", req);
  // Room for the sharded model in passes of 12: sharded, some pass from 12 up fits.
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", std::to_string((base + sharded_half + 1023) >> 10).c_str(), 1);
  const std::optional<be::PassFit> split_half = be::check_fit("cuda", req);
  req.shard_optimizer = false;
  const std::optional<be::PassFit> plain_half = be::check_fit("cuda", req);
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK"}) ::unsetenv(v);
  CHECK(plain->share == 24);
  CHECK(plain->largest > 0);
  CHECK(plain->largest < 24);
  CHECK_MESSAGE(plain->why.find(", or --shard-optimizer (the AdamW state split over the 2 ranks: "
                                "these passes fit)") != std::string::npos,
                plain->why);
  CHECK(split->largest == 24);
  CHECK(split->why.empty());
  CHECK(split_half->largest >= 12);
  CHECK(split_half->largest < 24);
  CHECK(plain_half->largest > 0);
  CHECK(plain_half->largest < split_half->largest);
  CHECK_MESSAGE(plain_half->why.find(fmt::format(", or --shard-optimizer (the AdamW state split "
                                                 "over the 2 ranks: up to {} a pass fit)",
                                                 split_half->largest)) != std::string::npos,
                plain_half->why);
}
#endif

#ifdef MOEPLAN_CUDA_EMULATION
// The fit check's model (sizing_world: no weights drawn; sharded without a communicator, so no
// NCCL group before training) holds what a sharded rank 0 holds: at world size 1 the same bytes
// as one with a communicator; at 2, the layout of ZeRO stage 1 worked by hand (below) less. It
// refuses to step.
TEST_CASE("a model sized as a sharded rank holds a sharded rank's buffers, and does not step") {
  const std::string id_file =
      (std::filesystem::temp_directory_path() / ("moeplan-nccl-sz-" + std::to_string(getpid())))
          .string();
  const Arch a = moe_arch();
  ModelOptions opt;
  const int64_t B = 2;
  size_t with_comm = 0, sized1 = 0, sized2 = 0;
  int64_t n = 0;
  {
    cu::Communicator comm(cu::RankInfo{0, 1, 0}, id_file);
    const size_t base = in_use();
    cu::Model m(a, opt, 8, B, DType::bf16, &comm, cu::AttentionPath::cublas, true);
    with_comm = in_use() - base;
    n = m.trainable_params();
  }
  std::filesystem::remove(id_file);
  const size_t base = in_use();
  {
    cu::Model m(a, opt, 8, B, DType::bf16, nullptr, cu::AttentionPath::cublas, true, 0,
                cu::ExpertPath::grouped, 1);
    sized1 = in_use() - base;
    const Batch b = random_batch(B, a.seq_len, a.vocab, 3);
    OptimConfig cfg;
    cfg.total_steps = 1;
    CHECK_THROWS_AS(m.train_step(b.inputs.data(), b.targets.data(), 0, cfg), std::logic_error);
    std::vector<char> state;
    CHECK_THROWS_AS(m.save_state(state), std::logic_error);
    const std::vector<float> w = m.parameters();  // none drawn
    CHECK(std::all_of(w.begin(), w.end(), [](float x) { return x == 0.0f; }));
  }
  {
    cu::Model m(a, opt, 8, B, DType::bf16, nullptr, cu::AttentionPath::cublas, true, 0,
                cu::ExpertPath::grouped, 2);
    sized2 = in_use() - base;
  }
  CHECK(sized1 == with_comm);
  // Sharded over W ranks, the n weights are padded to W chunks of ceil(n/W) rounded up to 64:
  // fp32 weights and gradients and the 1-byte decay mask cover the padded count (9 bytes each),
  // the two fp32 AdamW moments one chunk (8 bytes each).
  const auto chunk = [&](int64_t w) { return ((n + w - 1) / w + 63) / 64 * 64; };
  const int64_t layout1 = 9 * chunk(1) + 8 * chunk(1), layout2 = 9 * 2 * chunk(2) + 8 * chunk(2);
  CHECK(int64_t(sized1) - int64_t(sized2) == layout1 - layout2);
  CHECK(sized2 < sized1);
}
#endif

#ifdef MOEPLAN_CUDA_EMULATION
// Data parallelism at world size 2, each rank a process (fork) on the emulated machine's two
// devices, meeting through the emulated NCCL's shared memory. Compiled for the emulation only: on
// a GPU machine a forked child cannot reuse the parent's CUDA context.
namespace {

struct RankRun {
  std::vector<float> params, resumed_params;
  std::vector<StepResult> steps;
};

// shard: the optimizer sharded over the two ranks; then the run is also repeated with a save
// before the last step and a fresh model loading it (resumed_params), which must end bit for bit
// where the uninterrupted run ends.
RankRun train_rank(int rank, const Arch& a, const ModelOptions& opt, int64_t B,
                   const std::vector<Batch>& batches, const OptimConfig& cfg,
                   const std::string& id_file, bool shard) {
  const cu::RankInfo info{rank, 2, rank};
  cu::Communicator comm(info, id_file, 60);
  const int64_t local = cu::rank_batch(B, info);
  std::vector<int32_t> in, tg;
  auto step = [&](cu::Model& m, size_t s) {
    cu::take_rank_share(in, batches[s].inputs.data(), B, a.seq_len, info);
    cu::take_rank_share(tg, batches[s].targets.data(), B, a.seq_len, info);
    return m.train_step(in.data(), tg.data(), int64_t(s), cfg);
  };
  RankRun out;
  {
    cu::Model m(a, opt, 5, local, DType::f32, &comm, cu::AttentionPath::cublas, shard);
    for (size_t s = 0; s < batches.size(); ++s) out.steps.push_back(step(m, s));
    out.params = m.parameters();
  }
  if (shard) {
    std::vector<char> state;
    {
      cu::Model m(a, opt, 5, local, DType::f32, &comm, cu::AttentionPath::cublas, true);
      for (size_t s = 0; s + 1 < batches.size(); ++s) step(m, s);
      m.save_state(state);  // a collective: both ranks call it, each gets the whole state
    }
    cu::Model resumed(a, opt, 77, local, DType::f32, &comm, cu::AttentionPath::cublas, true);
    resumed.load_state(state);
    step(resumed, batches.size() - 1);
    out.resumed_params = resumed.parameters();
  }
  return out;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= size_t(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

}  // namespace

TEST_CASE(
    "data parallel at world size 2 (emulated, two processes): fp32 steps of the whole batch") {
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "60", 1);
  struct Case {
    const char* name;
    Arch arch;
    ModelOptions opt;
  };
  ModelOptions moe_opt;
  moe_opt.positions = "rope";
  // The load-balance loss is each rank's own (over its tokens), as in every data-parallel MoE
  // trainer; it is not the whole batch's, so it is off here where the steps must be equal.
  moe_opt.load_balance = 0;
  moe_opt.z_loss = 1e-3;  // z-loss is a mean of per-token terms: equal over ranks and batch
  // ERC depends on the weights only: rank 0 computes it for the job (gradients weighted by W).
  moe_opt.erc_loss = 0.5;
  ModelOptions passes_opt = moe_opt;
  passes_opt.micro_batch_seqs = 2;
  struct Sized {
    Case c;
    int64_t B;
    bool shard = false;
  };
  // The third: 5 sequences over two ranks (3 and 2), each rank in passes of 2 (2+1 and 2).
  for (const Sized& sized : {Sized{{"dense, ALiBi", dense_arch(), ModelOptions{}}, 4},
                             Sized{{"MoE, RoPE, GQA", moe_arch(), moe_opt}, 4},
                             Sized{{"MoE, uneven ranks, passes", moe_arch(), passes_opt}, 5},
                             Sized{{"MoE, optimizer sharded", moe_arch(), moe_opt}, 4, true}}) {
    const Case& c = sized.c;
    INFO(c.name);
    const int64_t B = sized.B, steps = 3;
    OptimConfig cfg;
    cfg.lr_peak = 1e-3;
    cfg.total_steps = steps;
    std::vector<Batch> batches;
    for (int64_t s = 0; s < steps; ++s) {
      batches.push_back(random_batch(B, c.arch.seq_len, c.arch.vocab, 300 + uint64_t(s)));
      // Sequence 1 (rank 1's) loses more targets: the ranks hold 58 and 49 loss-bearing
      // targets, so a mean of the ranks' means would not be the batch's mean.
      std::fill_n(batches.back().targets.begin() + c.arch.seq_len, 10, -1);
    }
    ModelOptions one_pass = c.opt;
    one_pass.micro_batch_seqs = 0;
    cu::Model whole(c.arch, one_pass, 5, B, DType::f32);
    const std::vector<float> init = whole.parameters();
    std::vector<StepResult> want;
    for (int64_t s = 0; s < steps; ++s)
      want.push_back(whole.train_step(batches[size_t(s)].inputs.data(),
                                      batches[size_t(s)].targets.data(), s, cfg));
    const std::vector<float> want_params = whole.parameters();

    const std::string id_file =
        (std::filesystem::temp_directory_path() / ("moeplan-nccl-dp2-" + std::to_string(getpid())))
            .string();
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // rank 1: no doctest here, only its results down the pipe
      ::close(fds[0]);
      int status = 0;
      try {
        const RankRun r = train_rank(1, c.arch, c.opt, B, batches, cfg, id_file, sized.shard);
        std::vector<double> losses;
        for (const auto& s : r.steps) losses.push_back(s.loss);
        if (!write_all(fds[1], r.params.data(), r.params.size() * 4) ||
            !write_all(fds[1], losses.data(), losses.size() * 8) ||
            (sized.shard &&
             !write_all(fds[1], r.resumed_params.data(), r.resumed_params.size() * 4)))
          status = 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank 1: %s\n", e.what());
        status = 1;
      }
      ::_exit(status);
    }
    ::close(fds[1]);
    const RankRun r0 = train_rank(0, c.arch, c.opt, B, batches, cfg, id_file, sized.shard);
    std::vector<float> p1(r0.params.size()), resumed1(sized.shard ? r0.params.size() : 0);
    std::vector<double> loss1(static_cast<size_t>(steps));
    const bool got = read_all(fds[0], p1.data(), p1.size() * 4) &&
                     read_all(fds[0], loss1.data(), loss1.size() * 8) &&
                     (!sized.shard || read_all(fds[0], resumed1.data(), resumed1.size() * 4));
    ::close(fds[0]);
    int st = 0;
    ::waitpid(child, &st, 0);
    REQUIRE_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 0 && got), "rank 1 failed");
    CHECK_FALSE(std::filesystem::exists(id_file));  // rank 0 removed the id once all had joined

    // Both ranks hold the same weights, bit for bit, and report the same losses.
    CHECK(p1 == r0.params);
    if (sized.shard) {  // saved sharded before the last step, loaded by fresh models: the same bits
      CHECK(r0.resumed_params == r0.params);
      CHECK(resumed1 == p1);
    }
    const int64_t n_params = int64_t(init.size());
    for (int64_t s = 0; s < steps; ++s) {
      INFO("step " << s);
      const StepResult& got_s = r0.steps[size_t(s)];
      const StepResult& want_s = want[size_t(s)];
      CHECK(loss1[size_t(s)] == got_s.loss);
      // The job's loss is the mean over all its loss-bearing targets, as one rank's would be.
      CHECK(got_s.loss == doctest::Approx(want_s.loss).epsilon(1e-6));
      CHECK(got_s.loss_bearing_targets == want_s.loss_bearing_targets);
      CHECK(got_s.aux_z == doctest::Approx(want_s.aux_z).epsilon(1e-5));
      CHECK(got_s.aux_erc == doctest::Approx(want_s.aux_erc).epsilon(1e-5));
      CHECK((c.opt.erc_loss == 0 || got_s.aux_erc > 0));
      CHECK(got_s.grad_norm == doctest::Approx(want_s.grad_norm).epsilon(1e-5));
      // Ledgers and routed counts are the job's: the ranks' sums equal the whole batch's (ERC's
      // products run on rank 0 alone), but the AdamW update, which each rank executes on every
      // parameter (sharded: on its chunk).
      CHECK(got_s.flops.flops == want_s.flops.flops);
      CHECK(got_s.flops.elementwise == want_s.flops.elementwise + (sized.shard ? 0 : n_params));
      CHECK(got_s.routed_per_moe_layer == want_s.routed_per_moe_layer);
    }
    // The weights after three steps: the pair's differ from one rank's by rounding only (here
    // 1.1e-4 of the largest change for the dense model, 5.8e-4 for the MoE; a mean of means
    // puts them 1.8x the largest change apart).
    double moved = 0, apart = 0;
    for (size_t i = 0; i < init.size(); ++i) {
      moved = std::max(moved, double(std::abs(want_params[i] - init[i])));
      apart = std::max(apart, double(std::abs(r0.params[i] - want_params[i])));
    }
    INFO("largest weight change " << moved << ", largest difference " << apart);
    CHECK(moved > 1e-3);
    CHECK(apart < 5e-3 * moved);
  }
}
// A capacity limit under data parallelism is each rank's, over its own pass (as expert-parallel
// trainers apply it per device), and the job's counts are the ranks' sums: the first step's drops
// and routed rows equal those of one process per rank share (the same initial weights).
TEST_CASE("data parallel at world size 2 (emulated, two processes): capacity drops are summed") {
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "60", 1);
  const Arch a = moe_arch();
  ModelOptions opt;
  opt.capacity_factor = 0.75;
  const int64_t B = 4;
  OptimConfig cfg;
  cfg.lr_peak = 1e-3;
  cfg.total_steps = 1;
  const std::vector<Batch> batches = {random_batch(B, a.seq_len, a.vocab, 808)};
  int64_t want_dropped = 0;
  std::vector<int64_t> want_routed(size_t(a.moe_layers()), 0);
  for (int r = 0; r < 2; ++r) {
    const cu::RankInfo info{r, 2, r};
    std::vector<int32_t> in, tg;
    cu::take_rank_share(in, batches[0].inputs.data(), B, a.seq_len, info);
    cu::take_rank_share(tg, batches[0].targets.data(), B, a.seq_len, info);
    cu::Model one(a, opt, 5, cu::rank_batch(B, info), DType::f32);
    StepResult res;
    one.compute_gradients(in.data(), tg.data(), &res);
    want_dropped += res.dropped_assignments;
    for (size_t l = 0; l < want_routed.size(); ++l) want_routed[l] += res.routed_per_moe_layer[l];
  }
  REQUIRE(want_dropped > 0);
  const std::string id_file =
      (std::filesystem::temp_directory_path() / ("moeplan-nccl-cap-" + std::to_string(getpid())))
          .string();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // rank 1
    int status = 0;
    try {
      train_rank(1, a, opt, B, batches, cfg, id_file, false);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
      status = 1;
    }
    ::_exit(status);
  }
  const RankRun r0 = train_rank(0, a, opt, B, batches, cfg, id_file, false);
  int st = 0;
  ::waitpid(child, &st, 0);
  REQUIRE_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 0), "rank 1 failed");
  CHECK(r0.steps[0].dropped_assignments == want_dropped);
  CHECK(r0.steps[0].routed_per_moe_layer == want_routed);
}

// The overlaps under data parallelism: the gradients' all-reduce in buckets beside the backward
// and the AdamW update beside the next forward give each rank the same steps, evaluation,
// weights, gradients and state, bit for bit, as the plain data-parallel step (one all-reduce
// after the backward, the update after it). The emulated NCCL queues a collective issued on a
// created stream like a kernel: in the deferred order a gradient norm that did not wait for the
// buckets would read gradients not yet averaged; in the eager order a bucket issued before its
// layer's last gradient write would average an unfinished gradient.
namespace {

struct OverlapCase {
  const char* name;
  Arch arch;
  ModelOptions opt;
  DType dt;
  int64_t B;
};

// One rank's steps without and with the overlaps; the mismatches found (each also said on
// stderr, for rank 1 whose only report is its exit status).
int overlap_mismatches(int rank, const OverlapCase& c, const std::vector<Batch>& batches,
                       const OptimConfig& cfg, const std::string& id_file) {
  const cu::RankInfo info{rank, 2, rank};
  cu::Communicator comm(info, id_file, 60);
  const int64_t local = cu::rank_batch(c.B, info);
  struct Run {
    std::vector<StepResult> steps;
    double eval = 0;
    std::vector<float> params, grads;
    std::vector<char> state;
    bool overlaps = false;
  };
  auto run = [&](bool overlap) {
    cu::Model m(c.arch, c.opt, 5, local, c.dt, &comm);
    if (c.dt == DType::bf16 && c.arch.experts > 0) m.set_expert_path(cu::ExpertPath::tiled128);
    m.set_update_overlap(overlap);
    m.set_reduce_overlap(overlap);
    Run r;
    r.overlaps = m.update_overlap() && m.reduce_overlap();
    std::vector<int32_t> in, tg;
    for (size_t s = 0; s < batches.size(); ++s) {
      cu::take_rank_share(in, batches[s].inputs.data(), c.B, c.arch.seq_len, info);
      cu::take_rank_share(tg, batches[s].targets.data(), c.B, c.arch.seq_len, info);
      r.steps.push_back(m.train_step(in.data(), tg.data(), int64_t(s), cfg));
      if (s + 2 == batches.size())  // an evaluation between steps reads the update's weights
        r.eval = m.forward_loss(in.data(), tg.data(), local);
    }
    r.params = m.parameters();
    r.grads = m.gradients();
    m.save_state(r.state);
    return r;
  };
  const Run plain = run(false), beside = run(true);
  int bad = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (ok) return;
    ++bad;
    std::fprintf(stderr, "rank %d, %s: %s differs\n", rank, c.name, what.c_str());
  };
  expect(beside.overlaps && !plain.overlaps, "whether the overlaps are on");
  for (size_t s = 0; s < plain.steps.size(); ++s) {
    const StepResult &p = plain.steps[s], &b = beside.steps[s];
    expect(p.loss == b.loss && p.aux_z == b.aux_z && p.aux_erc == b.aux_erc &&
               p.aux_load_balance == b.aux_load_balance,
           "step " + std::to_string(s) + " losses");
    expect(p.grad_norm == b.grad_norm, "step " + std::to_string(s) + " gradient norm");
    expect(p.flops.flops == b.flops.flops && p.flops.elementwise == b.flops.elementwise,
           "step " + std::to_string(s) + " ledger");
  }
  expect(plain.eval == beside.eval, "evaluation");
  expect(plain.params == beside.params, "weights");
  expect(plain.grads == beside.grads, "gradients");
  expect(plain.state == beside.state, "state");
  return bad;
}

}  // namespace

TEST_CASE(
    "data parallel at world size 2 (emulated, two processes): the all-reduce beside the backward "
    "and the update beside the forward give the same steps bit for bit") {
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "60", 1);
  ModelOptions alibi;
  alibi.positions = "alibi";
  ModelOptions passes = alibi;  // 5 sequences: rank 0 in passes of 2 + 1, rank 1 in one of 2
  passes.micro_batch_seqs = 2;
  ModelOptions erc = alibi;  // ERC on rank 0 alone, before the forward
  erc.erc_loss = 0.01;
  Arch tied = moe_arch();
  tied.tied_embeddings = true;
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.total_steps = 100;
  for (const char* mode : stream_orders()) {
    use_stream_order(mode);  // before the fork: both ranks run in the same order
    for (const OverlapCase& c : {OverlapCase{"dense bf16", dense_arch(), alibi, DType::bf16, 4},
                                 OverlapCase{"moe bf16 tiled128, uneven ranks in passes",
                                             moe_arch(), passes, DType::bf16, 5},
                                 OverlapCase{"moe fp32 tied, erc", tied, erc, DType::f32, 4}}) {
      INFO(mode << ", " << c.name);
      std::vector<Batch> batches;
      for (uint64_t s = 0; s < 4; ++s)
        batches.push_back(random_batch(c.B, c.arch.seq_len, c.arch.vocab, 500 + s));
      const std::string id_file = (std::filesystem::temp_directory_path() /
                                   ("moeplan-nccl-overlap-" + std::to_string(getpid())))
                                      .string();
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {  // rank 1: its mismatches as its exit status
        int status = 0;
        try {
          status = std::min(overlap_mismatches(1, c, batches, cfg, id_file), 100);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank 1: %s\n", e.what());
          status = 101;
        }
        ::_exit(status);
      }
      const int bad0 = overlap_mismatches(0, c, batches, cfg, id_file);
      int st = 0;
      ::waitpid(child, &st, 0);
      REQUIRE(WIFEXITED(st));
      CHECK(bad0 == 0);
      CHECK(WEXITSTATUS(st) == 0);  // rank 1's mismatches (101: it failed)
    }
  }
  use_stream_order(nullptr);
  // Where the overlaps do not apply: without a communicator, with the optimizer sharded (its
  // all-gather follows the update), with the weight gradients beside (a layer's are not final
  // after its backward), while profiling.
  const std::string id_file =
      (std::filesystem::temp_directory_path() / ("moeplan-nccl-one-" + std::to_string(getpid())))
          .string();
  cu::Communicator comm(cu::RankInfo{0, 1, 0}, id_file);
  cu::Model alone(moe_arch(), alibi, 5, 2, DType::bf16);
  cu::Model sharded(moe_arch(), alibi, 5, 2, DType::bf16, &comm, cu::AttentionPath::cublas, true);
  cu::Model dp(moe_arch(), alibi, 5, 2, DType::bf16, &comm);
  for (cu::Model* m : {&alone, &sharded, &dp}) {
    m->set_update_overlap(true);
    m->set_reduce_overlap(true);
  }
  CHECK_FALSE(alone.reduce_overlap());
  CHECK(alone.update_overlap());
  CHECK_FALSE(sharded.reduce_overlap());
  CHECK_FALSE(sharded.update_overlap());
  CHECK(dp.reduce_overlap());
  CHECK(dp.update_overlap());
  dp.set_profiling(true);
  CHECK_FALSE(dp.reduce_overlap());
  CHECK_FALSE(dp.update_overlap());
  dp.set_profiling(false);
  dp.set_weight_grad_overlap(true);
  CHECK_FALSE(dp.reduce_overlap());
  CHECK(dp.update_overlap());
}

#endif
