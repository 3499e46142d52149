// Solver rules and invariants. Golden values are the published backbones (ACCOUNTING.md) and
// hand calculations written out beside each check.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/planner/equal_resource.hpp"
#include "moeplan/planner/family.hpp"
#include "moeplan/planner/solve.hpp"

using namespace moeplan;

namespace {

// The paper's 7B MoE backbone (Table 12): L 24 (1 dense), D_m 2048, D_ffn 5464, H 16, D_h 128.
Arch paper_7b_backbone() {
  Arch a;
  a.d_model = 2048;
  a.layers = 24;
  a.dense_layers = 1;
  a.heads = a.kv_heads = 16;
  a.head_dim = 128;
  a.d_ffn = 5464;
  a.seq_len = 2048;
  a.vocab = 65536;
  return a;
}

void check_moe_invariants(const Arch& a, int64_t align) {
  CHECK(a.d_model % a.head_dim == 0);
  CHECK(a.heads * a.head_dim == a.d_model);
  CHECK(a.d_expert % align == 0);
  CHECK(a.d_expert >= align);
  CHECK(a.d_shared == a.top_k * a.d_expert);  // paper family: one shared expert of K·D_e
  CHECK(a.top_k >= 1);
  CHECK(a.experts >= a.top_k);
  CHECK(a.layers >= 2);
  CHECK(a.dense_layers == 1);
  CHECK_NOTHROW(validate(a, true));
}

}  // namespace

TEST_CASE("family scaling rules, by hand") {
  const FamilyRules f;
  CHECK(aspect_ratio_for(f, 2e9) == 88.0);
  // 88·(3e5/1e9)^0.14 = 88·exp(0.14·ln 3e-4) = 88·exp(0.14·(−8.1117)) = 88·0.32127 = 28.27
  CHECK(aspect_ratio_for(f, 3e5) == doctest::Approx(28.27).epsilon(0.001));
  // head_dim: largest power of two <= d_model/4, in [8, 128]
  CHECK(head_dim_for(f, 1408) == 128);  // 352 -> 128 (cap)
  CHECK(head_dim_for(f, 500) == 64);    // 125 -> 64
  CHECK(head_dim_for(f, 100) == 16);    // 25 -> 16
  CHECK(head_dim_for(f, 50) == 8);      // 12.5 -> 8
  CHECK(head_dim_for(f, 20) == 8);      // 5 -> 4, floor 8
  // alignment: largest power of two <= d_model/32, in [8, 32]
  CHECK(alignment_for(1408) == 32);
  CHECK(alignment_for(2048) == 32);
  CHECK(alignment_for(512) == 16);
  CHECK(alignment_for(112) == 8);
  CHECK(default_vocab(f, 2e9) == 65536);
  CHECK(default_vocab(f, 2e6) == 256);
  CHECK(default_seq_len(f, 2e9) == 2048);
  CHECK(default_seq_len(f, 2e6) == 256);
  CHECK(default_seq_len(f, 3e5) == 128);
  CHECK(family_by_name("paper").has_value());
  CHECK_FALSE(family_by_name("llama").has_value());
}

TEST_CASE("N = 2e9 gives the paper's published 2B backbone") {
  // Published 2B: L 16, D_m 1408, D_ffn 3904, H 11, D_h 128. By hand: ζ = 1408/16 = 88;
  // α·D_m = 2.77·1408 = 3900.2 -> nearest multiple of 32 is 3904.
  const Arch a = solve_moe_backbone(2e9, FamilyRules{});
  CHECK(a.d_model == 1408);
  CHECK(a.layers == 16);
  CHECK(a.dense_layers == 1);
  CHECK(a.heads == 11);
  CHECK(a.head_dim == 128);
  CHECK(a.d_ffn == 3904);
  CHECK(a.seq_len == 2048);
  CHECK(a.vocab == 65536);
}

TEST_CASE("N = 6.52e9 gives the published 7B width") {
  // Published 7B: D_m 2048, L 24 with µ = 21. At L 23, µ = (6.52e9 − 23·4·2048² − 3·2048·5664)
  // / (22·3·2048²) = (6.52e9 − 385.9e6 − 34.8e6) / 276.8e6 = 22.03: the family's µ ≈ 22 picks 23.
  const Arch a = solve_moe_backbone(6.52e9, FamilyRules{});
  CHECK(a.d_model == 2048);
  CHECK(a.head_dim == 128);
  CHECK((a.layers == 23 || a.layers == 24));
}

TEST_CASE("MoE solve on the paper's 7B backbone reaches the published r_a values") {
  // Table 12 r_a (router included in the published N_a, so 0.2–1 % above ours): each is
  // reachable on this backbone, e.g. E78 K6 De512: base = 24·4·2048² + 3·2048·5464
  // = 402,653,184 + 33,570,816 = 436,224,000; N = base + 23·2048·3·(6+78)·512 = 6,513,770,496;
  // N_a = base + 23·2048·3·12·512 = 1,304,444,928; r_a = 20.03 %.
  const MoeSolver solver(paper_7b_backbone(), 6.52e9, FamilyRules{});
  CHECK(solver.alignment() == 32);
  // fixed fraction = 436,224,000 / 6.52e9 = 6.69 %
  CHECK(solver.fixed_fraction() == doctest::Approx(0.066905).epsilon(1e-4));
  for (double ra : {0.0897, 0.1119, 0.1341, 0.1563, 0.2007, 0.2618, 0.3007, 0.5338}) {
    const MoeSolution s = solver.solve(ra);
    CAPTURE(ra);
    CAPTURE(describe(s.arch));
    CHECK(s.reachable);
    CHECK(s.note.empty());
    CHECK(std::fabs(s.activation_rate - ra) <= 0.005);
    CHECK(std::fabs(double(s.total_params) - 6.52e9) <= 0.01 * 6.52e9);
    const ParamCounts c = count_params(s.arch);  // the solver's own arithmetic agrees
    CHECK(c.total_params == s.total_params);
    CHECK(c.active_params == s.active_params);
    check_moe_invariants(s.arch, 32);
  }
  // The paper's own choice at ~9 % is K = 1, E 83: fine-grained experts, the family's band.
  const MoeSolution low = solver.solve(0.0897);
  CHECK(low.arch.top_k == 1);
  CHECK(low.arch.experts >= 60);
  CHECK(low.arch.experts <= 110);
}

TEST_CASE("unreachable r_a is flagged with the nearest reachable value") {
  // 2B backbone: attention 16·4·1408² = 126,877,696 and dense FFN 3·1408·3904 = 16,490,496 are
  // always active: 143,368,192 / 2e9 = 7.17 % of N, so r_a = 5 % cannot be met.
  const Arch backbone = solve_moe_backbone(2e9, FamilyRules{});
  const MoeSolver solver(backbone, 2e9, FamilyRules{});
  CHECK(solver.fixed_fraction() == doctest::Approx(0.071684).epsilon(1e-4));
  const MoeSolution s = solver.solve(0.05);
  CHECK_FALSE(s.reachable);
  CHECK(s.activation_rate > 0.0717);
  CHECK(s.activation_rate < 0.0717 + 0.01);  // the lowest the family allows (E <= 512, K = 1)
  CHECK(s.note.find("nearest reachable") != std::string::npos);
  // The note gives that share of the point's own N, as its parameter table would: E460 K1 De64
  // with a shared expert of 64 in 15 MoE layers is 15·3·1408·64·461 = 1,869,373,440 more, N =
  // 2,012,741,632, and 143,368,192 / N = 7.12 %.
  CHECK(s.total_params == 2012741632);
  CHECK(s.note.find("attention and dense layers alone are 7.12% of its N") != std::string::npos);
  CHECK(std::fabs(double(s.total_params) - 2e9) <= 0.01 * 2e9);  // N is still held
  // r_a = 1: every expert active (E = K), reachable.
  const MoeSolution all = solver.solve(1.0);
  CHECK(all.reachable);
  CHECK(all.arch.experts == all.arch.top_k);
  CHECK_THROWS_AS(solver.solve(0.0), InputError);
  CHECK_THROWS_AS(solver.solve(1.5), InputError);
}

TEST_CASE("an unreachable r_a's note names the actual cause: the floor or the step size") {
  // Backbone L2 (1 dense) D_m 16, H 2x8, D_ffn 48: attention 2·4·16² = 2,048, dense FFN
  // 3·16·48 = 2,304: base 4,352 (always active). One MoE layer, unit 16, shared width K·D_e:
  // N = 4,352 + 48·D_e·(K + E), N_a = 4,352 + 96·K·D_e. N target 27,392 = 4,352 + 48·480 with
  // ±1 % = ±274 admits only D_e·(K + E) = 480 exactly (one step of K + E at D_e 8 is 384), so
  // K·D_e is a multiple of 8 and r_a = (4,352 + 768·j)/27,392: steps of 768/27,392 = 2.80 points.
  Arch b;
  b.d_model = 16;
  b.layers = 2;
  b.dense_layers = 1;
  b.heads = b.kv_heads = 2;
  b.head_dim = 8;
  b.d_ffn = 48;
  b.seq_len = 128;
  b.vocab = 256;
  const MoeSolver solver(b, 27392, FamilyRules{});
  // Floor: 4,352 / 27,392 = 15.89 %; 10 % is below it.
  CHECK(solver.fixed_fraction() == doctest::Approx(4352.0 / 27392.0));
  const MoeSolution floor = solver.solve(0.10);
  CHECK_FALSE(floor.reachable);
  CHECK(floor.note.find("attention and dense layers alone are 15.89% of its N") !=
        std::string::npos);
  CHECK(floor.note.find("expert granularity") == std::string::npos);
  // Above the floor but below the lowest shape, j = 1: 5,120 / 27,392 = 18.69 %.
  const MoeSolution low = solver.solve(0.17);
  CHECK_FALSE(low.reachable);
  CHECK(low.note.find("nearest reachable 18.69%") != std::string::npos);
  CHECK(low.note.find("the lowest reachable r_a at this N: attention and dense layers are 15.89% "
                      "of its N") != std::string::npos);
  // Granularity: 45.3 % lies between j = 10, 12,032 / 27,392 = 43.93 %, and j = 11,
  // 12,800 / 27,392 = 46.73 %, each more than 0.5 points away; the floor has nothing to do with it.
  const MoeSolution step = solver.solve(0.453);
  CHECK_FALSE(step.reachable);
  CHECK(step.note.find("r_a 45.30% not reachable within ±0.50 points; nearest reachable 43.93%") ==
        0);
  CHECK(step.note.find("at this N one expert or one top_k more or less moves r_a from 43.93% to "
                       "46.73%, a step wider than the tolerance (expert granularity)") !=
        std::string::npos);
  CHECK(step.note.find("attention and dense layers") == std::string::npos);
  // On a grid point, j = 11, it is reachable and has no note.
  const MoeSolution on = solver.solve(12800.0 / 27392.0);
  CHECK(on.reachable);
  CHECK(on.note.empty());
}

TEST_CASE("N out of range: the limit is named in the direction that helps") {
  auto error_of = [](auto solve) {
    try {
      solve();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Above 1e18 (64-bit parameter counts): the upper limit, not a minimum.
  for (double n : {1.01e18, 1e19, 1e20}) {
    CAPTURE(n);
    const std::string dense = error_of([&] { solve_dense(n, FamilyRules{}); });
    const std::string moe = error_of([&] { solve_moe_backbone(n, FamilyRules{}); });
    CHECK(dense.find("ask for N <= 1e18") != std::string::npos);
    CHECK(moe.find("ask for N <= 1e18") != std::string::npos);
    CHECK(dense.find(">=") == std::string::npos);
  }
  CHECK(error_of([] { solve_dense(1e20, FamilyRules{}); }) ==
        "N = 1e+20 is above the largest N moeplan plans, 1e18 (parameters are counted in 64-bit "
        "integers); ask for N <= 1e18");
  // 1e18 itself is inside: the shape is within 1 %.
  const Arch top = solve_dense(1e18, FamilyRules{});
  CHECK(std::fabs(double(count_params(top).total_params) - 1e18) <= 0.01 * 1e18);
  // The MoE points are solved to that baseline's N, which lands above 1e18 (1.0000000123e18):
  // it is a target the MoE solver takes, up to 1e18 · (1 + n_tolerance). It refused it once, so
  // `grid --N 1e18` failed with "N = 1e+18 is above the largest N".
  const double n_top = double(count_params(top).total_params);
  REQUIRE(n_top > 1e18);
  const MoeSolver top_solver(solve_moe_backbone(1e18, FamilyRules{}), n_top, FamilyRules{});
  const MoeSolution top_moe = top_solver.solve(0.2);
  CHECK(std::fabs(double(top_moe.total_params) / n_top - 1) <= 0.01);
  CHECK(error_of([] {
          MoeSolver(solve_moe_backbone(1e18, FamilyRules{}), 1.02e18, FamilyRules{});
        }).find("N = 1.02e+18 is above the largest N moeplan plans, 1e18") == 0);
  // Below the family's 1e5, a failed search gives the minimum. N 1e4: the backbone is L2 (1 dense)
  // D_m 16, D_ffn 48: base 2·4·16² + 3·16·48 = 4,352; one MoE layer of unit 16 (shared K·D_e):
  // N = 4,352 + 48·D_e·(K + E). Within 1 % of 1e4 needs D_e·(K + E) in [115.6, 119.75], and no
  // multiple of 8 (D_e is one) lies there: no layer fits.
  const Arch small = solve_moe_backbone(1e4, FamilyRules{});
  REQUIRE(small.d_model == 16);
  REQUIRE(small.d_ffn == 48);
  const MoeSolver solver(small, 1e4, FamilyRules{});
  const std::string e = error_of([&] { solver.solve(0.2); });
  CHECK(e.find("no MoE layer on backbone") == 0);
  CHECK(e.find("; N = 1e+04 is below the 1e5 the paper family's rules are made for: ask for N >= "
               "1e5") != std::string::npos);
}

TEST_CASE("a target the nearest-N expert count misses is met by a neighbouring count") {
  // N 1e5: backbone L2 (1 dense) D_m 40, H 5x8, D_ffn 112: attention 2·4·40² = 12,800, dense
  // FFN 3·40·112 = 13,440: base 26,240; one MoE layer, unit D_m = 40. At D_e 8, K 33 (shared
  // 33·8 = 264): E 44 gives N = 26,240 + 40·3·8·(33 + 44) = 100,160 and N_a = 26,240 +
  // 40·3·8·66 = 89,600: r_a 89.46 %, 0.54 points short of 90 %. E 43 gives N = 99,200 (-0.8 %,
  // inside 1 %) and r_a 89,600 / 99,200 = 90.32 %: inside ±0.5 points.
  const Arch backbone = solve_moe_backbone(1e5, FamilyRules{});
  REQUIRE(backbone.d_model == 40);
  const MoeSolver solver(backbone, 1e5, FamilyRules{});
  const MoeSolution s = solver.solve(0.9);
  CHECK(s.reachable);
  CHECK(std::fabs(s.activation_rate - 0.9) <= 0.005);
  CHECK(std::fabs(double(s.total_params) - 1e5) <= 0.01 * 1e5);
  CHECK(s.arch.experts == 43);
  CHECK(s.arch.top_k == 33);
  CHECK(s.total_params == 99200);
  CHECK(s.active_params == 89600);
}

TEST_CASE("explicit alignment and tolerance options are obeyed") {
  const Arch backbone = solve_moe_backbone(2e9, FamilyRules{});
  SolveOptions o;
  o.expert_alignment = 128;
  o.n_tolerance = 0.002;
  const MoeSolver solver(backbone, 2e9, FamilyRules{}, o);
  for (double ra : {0.1, 0.2, 0.3}) {
    const MoeSolution s = solver.solve(ra);
    CHECK(s.arch.d_expert % 128 == 0);
    CHECK(std::fabs(double(s.total_params) - 2e9) <= 0.002 * 2e9);
  }
}

TEST_CASE("dense baseline: every layer dense, MHA, N within 1 %, α near 2.77") {
  for (double n : {1e5, 3e5, 2e6, 1e7, 1e8, 2e9, 6.52e9, 7e9}) {
    CAPTURE(n);
    const Arch d = solve_dense(n, FamilyRules{});
    CHECK(d.is_dense());
    CHECK(d.experts == 0);
    CHECK(d.heads * d.head_dim == d.d_model);
    CHECK(d.kv_heads == d.heads);
    CHECK(d.layers >= 2);
    CHECK(d.head_dim >= 8);
    CHECK(std::fabs(double(count_params(d).total_params) - n) <= 0.01 * n);
    const double alpha = double(d.d_ffn) / double(d.d_model);
    CHECK(alpha > 2.0);
    CHECK(alpha < 3.6);
    CHECK_NOTHROW(validate(d, true));
  }
}

TEST_CASE("tiny models: at least 2 layers, head_dim >= 8, d_expert >= 8, byte vocabulary") {
  for (double n : {1e5, 3e5, 2e6, 1e7}) {
    CAPTURE(n);
    PlanRequest r;
    r.n_target = n;
    const EqualResourcePlanner planner(r);
    CHECK(planner.backbone().vocab == 256);
    CHECK(planner.dense().arch.vocab == 256);
    CHECK(planner.dense().arch.seq_len == planner.backbone().seq_len);
    CHECK(std::fabs(double(planner.dense().counts.total_params) - n) <= 0.01 * n);
    for (double ra : {0.25, 0.4, 0.6}) {
      const Plan p = planner.plan_point(ra);
      CAPTURE(describe(p.arch));
      check_moe_invariants(p.arch, alignment_for(p.arch.d_model));
      CHECK(p.arch.head_dim >= 8);
      CHECK(p.arch.d_expert >= 8);
      // Equal N is against the baseline: within 1 % of the dense N, which is within 1 % of N.
      const double dense_n = double(planner.dense().counts.total_params);
      CHECK(std::fabs(double(p.counts.total_params) - dense_n) <= 0.01 * dense_n);
      CHECK((p.reachable || !p.note.empty()));
    }
  }
}

TEST_CASE("equal resources: same C up to step rounding, same unique data, D ratio = M ratio") {
  PlanRequest r;
  r.n_target = 2e9;  // default budget: dense TPP 20, strict reuse
  const EqualResourcePlanner planner(r);
  const Plan& d = planner.dense();
  // C = M_dense · 20 · N_dense, and the dense point consumes 20 tokens per parameter (± a step).
  CHECK(planner.compute_target() ==
        doctest::Approx(d.flops_per_token * 20.0 * double(d.counts.total_params)));
  const double step_tokens = double(d.budget.batch_seqs * d.arch.seq_len);
  CHECK(std::fabs(double(d.budget.tokens_consumed) - 20.0 * double(d.counts.total_params)) <=
        0.5 * step_tokens);
  CHECK(d.budget.tokens_unique == d.budget.tokens_consumed);
  for (double ra : {0.1, 0.2, 0.4}) {
    const Plan p = planner.plan_point(ra);
    // Rounding to whole steps moves C by at most half a step.
    CHECK(std::fabs(p.budget.compute_rel_diff) <= 0.5 / double(p.budget.steps) + 1e-12);
    CHECK(p.budget.tokens_unique == d.budget.tokens_unique);
    const double ratio = double(p.budget.tokens_consumed) / double(d.budget.tokens_consumed);
    CHECK(ratio == doctest::Approx(d.flops_per_token / p.flops_per_token).epsilon(1e-3));
    CHECK(p.budget.epochs > 1.0);  // the MoE repeats the dense baseline's unique data
    // step-law by hand: η = 1.79·N^−0.713·D^0.307
    CHECK(p.hyper.lr_peak ==
          doctest::Approx(1.79 * std::pow(double(p.counts.total_params), -0.713) *
                          std::pow(double(p.budget.tokens_consumed), 0.307)));
    CHECK(p.hyper.warmup_steps >= 200);
    CHECK(p.hyper.warmup_steps <= 2000);
  }
}

TEST_CASE(
    "strict reuse: a unique budget above what the baseline consumes gives every point the "
    "baseline's D̂") {
  PlanRequest r;
  r.n_target = 2e6;
  r.budget.tokens_unique = 1e15;  // far more than 20 tokens per parameter
  const EqualResourcePlanner planner(r);
  const Plan& d = planner.dense();
  CHECK(d.budget.tokens_unique == d.budget.tokens_consumed);  // capped: nothing to repeat
  CHECK(d.note.find("--unique-tokens 1e+15") != std::string::npos);
  CHECK(d.note.find("--epochs 1") != std::string::npos);
  for (double ra : {0.2, 0.5}) {
    const Plan p = planner.plan_point(ra);
    CAPTURE(ra);
    // Equal unique data: the MoE repeats the baseline's D̂ instead of reading 1e15 unique tokens.
    CHECK(p.budget.tokens_unique == d.budget.tokens_unique);
    CHECK(p.budget.epochs > 1.0);
  }
  // A unique budget below the baseline's D is every point's D̂ as asked, with no note.
  r.budget.tokens_unique = 1e7;
  const EqualResourcePlanner b(r);
  CHECK(b.dense().note.empty());
  // Whole windows, rounded down: a strict D̂ is a cap, never above what was asked.
  CHECK(b.dense().budget.tokens_unique ==
        int64_t(std::floor(1e7 / double(b.dense().arch.seq_len))) * b.dense().arch.seq_len);
  CHECK(b.plan_point(0.2).budget.tokens_unique == b.dense().budget.tokens_unique);
}

TEST_CASE("strict reuse: a point with a higher M than the baseline's cannot read its D̂: noted") {
  // A deep, narrow backbone (64 layers of D_m 512 at S 8192): its attention term 12·L·D_m·S is
  // 3.2e9 FLOPs a token, so at r_a 1 its M is above the dense baseline's and at equal C it
  // consumes fewer tokens than the baseline's unique D̂.
  PlanRequest r;
  r.n_target = 3e8;
  Arch bb;
  bb.d_model = 512;
  bb.layers = 64;
  bb.dense_layers = 1;
  bb.heads = bb.kv_heads = 4;
  bb.head_dim = 128;
  bb.d_ffn = 1408;
  bb.seq_len = 8192;
  bb.vocab = 65536;
  r.given_backbone = bb;
  const EqualResourcePlanner planner(r);
  const Plan& d = planner.dense();
  const Plan p = planner.plan_point(1.0);
  REQUIRE(p.flops_per_token > d.flops_per_token);
  CHECK(p.budget.tokens_unique == p.budget.tokens_consumed);  // all it can read
  CHECK(p.budget.tokens_unique < d.budget.tokens_unique);
  CHECK(p.note.find("fewer than the dense baseline's") != std::string::npos);
  CHECK(p.note.find("so its D̂ is not the baseline's") != std::string::npos);
  // A point below the baseline's M repeats D̂ as usual, with no such note.
  const Plan q = planner.plan_point(0.2);
  CHECK(q.budget.tokens_unique == d.budget.tokens_unique);
  CHECK(q.note.find("fewer than the dense baseline's") == std::string::npos);
}

TEST_CASE("a given backbone's counting flags and tied embeddings reach the dense baseline too") {
  // A backbone file with count_router, count_norms or tied_embeddings: the MoE points took them,
  // the dense baseline (solved from the flags alone) did not, so "equal N" compared two counts.
  for (int flag = 0; flag < 3; ++flag) {
    CAPTURE(flag);
    PlanRequest r;
    r.n_target = 6.52e9;
    Arch bb;
    bb.d_model = 2048;
    bb.layers = 24;
    bb.dense_layers = 1;
    bb.heads = bb.kv_heads = 16;
    bb.head_dim = 128;
    bb.d_ffn = 5464;
    bb.seq_len = 2048;
    bb.vocab = 65536;
    bb.count_router = flag == 0;
    bb.count_norms = flag == 1;
    bb.tied_embeddings = flag == 2;
    r.given_backbone = bb;
    const EqualResourcePlanner planner(r);
    const Arch& d = planner.dense().arch;
    CHECK(d.count_router == (flag == 0));
    CHECK(d.count_norms == (flag == 1));
    CHECK(d.tied_embeddings == (flag == 2));
    const Plan p = planner.plan_point(0.2);
    CHECK(p.arch.count_router == d.count_router);
    CHECK(p.arch.count_norms == d.count_norms);
    CHECK(p.arch.tied_embeddings == d.tied_embeddings);
  }
}

TEST_CASE("a step-law η below the 1e-5 cosine floor lowers the floor to η") {
  // N 2e9 with 2e4 dense tokens: η = 1.79·N^-0.713·D^0.307 is about 8.8e-6 for the baseline.
  PlanRequest r;
  r.n_target = 2e9;
  r.budget.kind = BudgetKind::dense_tokens;
  r.budget.value = 2e4;
  const EqualResourcePlanner planner(r);
  const Plan& d = planner.dense();
  REQUIRE(d.hyper.lr_peak < 1e-5);
  CHECK(d.hyper.lr_min == d.hyper.lr_peak);
  // At an ordinary budget the floor stays 1e-5.
  PlanRequest ordinary;
  ordinary.n_target = 2e9;
  CHECK(EqualResourcePlanner(ordinary).dense().hyper.lr_min == 1e-5);
}

TEST_CASE("budget kinds: --compute, --dense-tokens, loose reuse") {
  PlanRequest r;
  r.n_target = 2e6;
  r.budget.kind = BudgetKind::compute;
  r.budget.value = 1e15;
  const EqualResourcePlanner a(r);
  CHECK(a.compute_target() == 1e15);
  CHECK(a.dense().budget.compute_target == 1e15);

  r.budget.kind = BudgetKind::dense_tokens;
  r.budget.value = 5e7;
  const EqualResourcePlanner b(r);
  CHECK(b.compute_target() == doctest::Approx(b.dense().flops_per_token * 5e7));

  r.budget.reuse = Reuse::loose;
  r.budget.epochs = 2;
  const EqualResourcePlanner c(r);
  const Plan p = c.plan_point(0.3);
  CHECK(p.budget.reuse == Reuse::loose);
  CHECK(p.budget.epochs == doctest::Approx(2.0).epsilon(0.01));

  r.budget.reuse = Reuse::strict;
  r.budget.tokens_unique = 1e7;
  const EqualResourcePlanner e(r);
  // 1e7 tokens in whole windows of 256: floor(1e7/256) = 39062 windows = 9,999,872 tokens (a
  // cap: never above the 1e7 asked for).
  CHECK(e.plan_point(0.3).budget.tokens_unique == 9'999'872);
}

TEST_CASE("bad targets are refused with InputError") {
  CHECK_THROWS_AS(solve_moe_backbone(0, FamilyRules{}), InputError);
  CHECK_THROWS_AS(solve_moe_backbone(-1, FamilyRules{}), InputError);
  CHECK_THROWS_AS(solve_dense(10, FamilyRules{}), InputError);
  Arch dense = paper_7b_backbone();
  dense.dense_layers = dense.layers;
  CHECK_THROWS_AS(MoeSolver(dense, 6.52e9, FamilyRules{}), InputError);             // no MoE layer
  CHECK_THROWS_AS(MoeSolver(paper_7b_backbone(), 1e8, FamilyRules{}), InputError);  // N too small
}

TEST_CASE("the solver recovers the paper's Table 12 MoE layers from their r_a alone") {
  // Published rows (tests/fixtures/reference/paper_7b_moe_fixed_compute.csv): the paper's own
  // (E, K, D_e) choices at each r_a, whose N_a counts the router (README there). Solving on the
  // published 7B backbone with count_router for each published r_a must give those choices.
  std::ifstream in(std::string(MOEPLAN_REFERENCE_DIR) + "/paper_7b_moe_fixed_compute.csv");
  REQUIRE(in.good());
  std::string line;
  std::getline(in, line);  // Na,ra_pct,M,D,C,D_over_N,mu,E,K,De,Dse,eta,B,iters,BPC
  Arch backbone = paper_7b_backbone();
  backbone.count_router = true;
  const MoeSolver solver(backbone, 6.52e9, FamilyRules{});
  int rows = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> cell;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cell.push_back(c);
    REQUIRE(cell.size() == 15);
    const double ra = std::stod(cell[1]) / 100.0;
    const MoeSolution s = solver.solve(ra);
    CAPTURE(line);
    CAPTURE(describe(s.arch));
    CHECK(s.arch.experts == std::stoll(cell[7]));
    CHECK(s.arch.top_k == std::stoll(cell[8]));
    CHECK(s.arch.d_expert == std::stoll(cell[9]));
    CHECK(s.arch.d_shared == std::stoll(cell[10]));
    // Published N_a (3 significant digits) within 1 %.
    CHECK(double(s.active_params) == doctest::Approx(std::stod(cell[0])).epsilon(0.01));
    ++rows;
  }
  CHECK(rows == 8);
}

TEST_CASE(
    "r_a 1 at small N: E = K above the nearest-E limit of K is tried when nothing else fits") {
  // N 1e5: the baseline is 100,352; the MoE backbone L2 (1 dense) Dm40 Dffn112 holds attention
  // 2·4·40² = 12,800 and a dense FFN 3·40·112 = 13,440: 26,240. E39 K39 D_e 8 with the shared
  // expert K·D_e = 312 adds 3·40·(312 + 39·8) = 74,880: N = N_a = 101,120, +0.77 % of the
  // baseline (inside 1 %), r_a exactly 1. The nearest E at K 39 is 38 (< K), which used to cap
  // K at 38, and the point was flagged at 99.04 %.
  PlanRequest r;
  r.n_target = 1e5;
  const EqualResourcePlanner planner(r);
  REQUIRE(planner.dense().counts.total_params == 100352);
  const Plan p = planner.plan_point(1.0);
  CAPTURE(describe(p.arch));
  CHECK(p.reachable);
  CHECK(p.arch.experts == 39);
  CHECK(p.arch.top_k == 39);
  CHECK(p.arch.d_expert == 8);
  CHECK(p.counts.total_params == 101120);
  CHECK(p.counts.active_params == 101120);
}

TEST_CASE("a shape search that fails names the baseline's N it aimed at and the tolerance") {
  PlanRequest r;
  r.n_target = 1e5;
  r.solve.n_tolerance = 0.001;
  const EqualResourcePlanner planner(r);
  const double dense_n = double(planner.dense().counts.total_params);
  CHECK(std::fabs(dense_n / 1e5 - 1) <= 0.001);
  const std::string want = "(the MoE points are solved to the dense baseline's N, " +
                           std::to_string(int64_t(dense_n)) +
                           ", for the N = 1e+05 asked for; a looser --n-tolerance than 0.001 or "
                           "another N may fit)";
  CHECK_THROWS_WITH_AS(planner.plan_point(0.2), doctest::Contains(want.c_str()), InputError);
}
