// The CPU training step against the machine's own ceiling: Eigen's fp32 GEMM (2048³) on the same
// threads, then dense and MoE steps, FLOPs from the step's own ledger (exact/causal convention).
// Prints a table; never fails on time. Usage: bench_cpu_step [threads=2] [batch_seqs=16] [steps=7]
#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/model.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Rate {
  double median_gflops = 0, best_gflops = 0;
};

Rate gemm_ceiling(int n, int reps) {
  using M = Eigen::MatrixXf;
  M a = M::Random(n, n), b = M::Random(n, n), c(n, n);
  c.noalias() = a * b;  // warm-up
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    c.noalias() = a * b;
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double flops = 2.0 * n * n * double(n);
  return {flops / moeplan::bench::median(s) / 1e9,
          flops / *std::min_element(s.begin(), s.end()) / 1e9};
}

struct Case {
  std::string name;
  moeplan::Arch arch;
};

moeplan::Arch base(int64_t dm, int64_t layers, int64_t heads) {
  moeplan::Arch a;
  a.d_model = dm;
  a.layers = layers;
  a.dense_layers = layers;
  a.heads = heads;
  a.kv_heads = heads;
  a.head_dim = dm / heads;
  a.seq_len = 256;
  a.vocab = 256;
  return a;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  {  // llm.c's CPU shape (GELU 4·Dm there; SwiGLU 688 ≈ the same parameters here)
    moeplan::Arch a = base(256, 4, 4);
    a.d_ffn = 688;
    out.push_back({"dense-256 L4 (llm.c)", a});
  }
  {
    moeplan::Arch a = base(512, 4, 8);
    a.d_ffn = 1376;
    out.push_back({"dense-512 L4", a});
  }
  {  // N of dense-512 within 1.5 %, r_a ≈ 0.2: 36 experts of 64, K 2, a shared expert of 64
    moeplan::Arch a = base(256, 6, 4);
    a.dense_layers = 0;
    a.experts = 36;
    a.top_k = 2;
    a.d_expert = 64;
    a.d_shared = 64;
    out.push_back({"moe-256 L6 E36 K2", a});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const moeplan::bench::Args args(argc, argv,
                                  "bench_cpu_step [threads=2] [batch_seqs=16] [steps=7]", 3);
  const int threads = int(args.integer(1, 2, 1, 1024));
  const int64_t batch_seqs = args.integer(2, 16, 1, 4096);
  const int steps = int(args.integer(3, 7, 1, 1000));
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);

  fmt::print(
      "Eigen fp32 GEMM 2048^3 on {} threads is the ceiling, measured right before each "
      "model (5 runs; a shared machine drifts)\n",
      Eigen::nbThreads());
  fmt::print(
      "batch {} seqs x 256 = {} tokens consumed per step; {} timed steps after 2 warm-up\n\n",
      batch_seqs, batch_seqs * 256, steps);
  fmt::print("{:<22} {:>9} {:>6} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>8}\n", "model", "N",
             "r_a", "GF/step", "ceil GF/s", "step ms", "GFLOP/s", "%ceil", "%best", "tok/s",
             "tok/s*");
  for (const Case& c : cases()) {
    const moeplan::ParamCounts pc = moeplan::count_params(c.arch);
    const Rate ceiling = gemm_ceiling(2048, 5);
    moeplan::backend::Model<float> m(c.arch, moeplan::backend::ModelOptions{}, 1, batch_seqs);
    const int64_t T = batch_seqs * c.arch.seq_len;
    std::vector<int32_t> in(T), tg(T);
    uint64_t s = 12345;
    for (int64_t i = 0; i < T; ++i) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      in[i] = int32_t((s >> 33) % 256);
      tg[i] = int32_t((s >> 41) % 256);
    }
    moeplan::backend::OptimConfig cfg;
    cfg.lr_peak = 1e-3;
    cfg.warmup_steps = 2;
    cfg.total_steps = 100;
    std::vector<double> secs;
    int64_t flops = 0;
    for (int i = 0; i < steps + 2; ++i) {
      const auto t0 = Clock::now();
      const auto r = m.train_step(in.data(), tg.data(), i, cfg);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (i >= 2) secs.push_back(dt);
      flops = r.flops.total().to_int64();  // one step's count
    }
    const double med = moeplan::bench::median(secs),
                 best = *std::min_element(secs.begin(), secs.end());
    const double gf = double(flops) / med / 1e9, gf_best = double(flops) / best / 1e9;
    fmt::print(
        "{:<22} {:>9} {:>6.3f} {:>8.2f} {:>9.1f} {:>9.1f} {:>9.1f} {:>6.1f}% {:>6.1f}% {:>8.0f} "
        "{:>8.0f}\n",
        c.name, pc.total_params, pc.activation_rate(), double(flops) / 1e9, ceiling.median_gflops,
        med * 1e3, gf, 100.0 * gf / ceiling.median_gflops, 100.0 * gf_best / ceiling.best_gflops,
        double(T) / med, double(T) / best);
  }
  fmt::print(
      "\nGFLOP/s: {} convention (every matrix product as executed, causal attention), of "
      "the median step.\n%ceil = median step rate / median GEMM rate; %best = best step "
      "rate / best GEMM rate;\ntok/s = tokens consumed per second (median step), tok/s* "
      "(best step).\n",
      moeplan::convention_label(moeplan::Convention::exact));
  return 0;
}
