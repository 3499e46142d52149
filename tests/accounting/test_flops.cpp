// FLOP conventions on small shapes worked out by hand.
#include <doctest/doctest.h>

#include <string>
#include <tuple>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"

using namespace moeplan;

namespace {
// L 2, D_m 64, H 4 × D_h 16, D_ffn 128, S 32, V 100.
Arch tiny_dense() {
  Arch a;
  a.d_model = 64;
  a.layers = 2;
  a.dense_layers = 2;
  a.heads = 4;
  a.kv_heads = 4;
  a.head_dim = 16;
  a.d_ffn = 128;
  a.seq_len = 32;
  a.vocab = 100;
  return a;
}
// As tiny_dense, second layer MoE: E 4, K 2, D_e 32, D_se 32.
Arch tiny_moe() {
  Arch a = tiny_dense();
  a.dense_layers = 1;
  a.experts = 4;
  a.top_k = 2;
  a.d_expert = 32;
  a.d_shared = 32;
  return a;
}
}  // namespace

TEST_CASE("paper convention on a tiny dense model") {
  // N = 2·(4·64² + 3·64·128) = 2·(16,384 + 24,576) = 81,920.
  // M = 6·81,920 + 12·2·64·32 = 491,520 + 49,152 = 540,672.
  const Arch a = tiny_dense();
  CHECK(count_params(a).total_params == 81'920);
  CHECK(flops_per_token(a, Convention::paper).total == 540'672.0);
}

TEST_CASE("exact convention, causal and full, on a tiny dense model") {
  // Per layer, per token, training (fwd + input-grad + weight-grad = 3 × forward):
  //   projections 3·4·(2·64·64) = 98,304; FFN 3·3·(2·64·128) = 147,456.
  //   attention core causal: 3·2·(2·16·(32+1)/2)·4 heads = 6·64·33 = 12,672; full: 3·4·32·64 =
  //   24,576.
  // LM head 3·2·64·100 = 38,400.
  const Arch a = tiny_dense();
  const FlopsPerToken causal = flops_per_token(a, Convention::exact, AttentionMask::causal);
  CHECK(causal.total == 2 * (98'304 + 12'672 + 147'456) + 38'400);  // 555,264
  CHECK(causal.by_category[int(FlopCategory::attention_core)] == 2 * 12'672);
  CHECK(causal.by_category[int(FlopCategory::lm_head)] == 38'400);
  CHECK(causal.label() == "exact/causal");
  const FlopsPerToken full = flops_per_token(a, Convention::exact, AttentionMask::full);
  CHECK(full.total == 2 * (98'304 + 24'576 + 147'456) + 38'400);  // 579,072
  // exact/full less the LM head is the paper figure when H·D_h = D_m.
  CHECK(full.total - 38'400 == flops_per_token(a, Convention::paper).total);
}

TEST_CASE("megatron convention on a tiny dense model") {
  // Megatron-LM form: 12·L·D_m²·[(1 + H_kv/H + S/(2·D_m)) + 1.5·D_ffn/D_m + V/(2·L·D_m)]
  // = 12·2·4096·[2 + 0.25 + 3 + 100/256] = 98,304 · 5.640625 = 554,496.
  CHECK(flops_per_token(tiny_dense(), Convention::megatron).total == 554'496.0);
}

TEST_CASE("exact convention on a tiny MoE with shared expert") {
  // Layer 0 (dense) as above: 98,304 + 12,672 + 147,456 = 258,432.
  // Layer 1: projections 98,304 + core 12,672 + router 3·2·64·4 = 1,536
  //          + experts 3·3·(2·64·32)·K=2 = 73,728 + shared 3·3·2·64·32 = 36,864 → 223,104.
  // LM head 38,400. Total 519,936.
  const Arch a = tiny_moe();
  validate(a, true);
  const FlopsPerToken f = flops_per_token(a, Convention::exact);
  CHECK(f.total == 519'936.0);
  CHECK(f.by_category[int(FlopCategory::router)] == 1'536.0);
  CHECK(f.by_category[int(FlopCategory::expert)] == 73'728.0);
  CHECK(f.by_category[int(FlopCategory::shared_expert)] == 36'864.0);
  // Params: attention 32,768; dense FFN 24,576; experts 3·64·4·32 = 24,576 (active 12,288);
  // shared 6,144; router 256; norms 2·2·64 + 64 = 320.
  const ParamCounts c = count_params(a);
  CHECK(c.total_params == 88'064);
  CHECK(c.active_params == 75'776);
  CHECK(c.router == 256);
  CHECK(c.norms == 320);
  Arch counted = a;
  counted.count_norms = true;
  CHECK(count_params(counted).total_params == 88'064 + 320);
}

TEST_CASE("exact step ledger: phases, routed counts and ERC") {
  const Arch a = tiny_moe();
  const int64_t B = 3, T = B * 32;
  // Dropless: every phase of the expert category is 2·(T·K)·64·32·3 products.
  const FlopLedger l = exact_step_ledger(a, B);
  CHECK(l.at(FlopCategory::expert, Phase::forward) == 2 * T * 2 * 64 * 32 * 3);
  CHECK(l.at(FlopCategory::expert, Phase::weight_grad) ==
        l.at(FlopCategory::expert, Phase::forward));
  // Attention core: backward = 2 × forward, all of it input gradients.
  CHECK(l.at(FlopCategory::attention_core, Phase::input_grad) ==
        2 * l.at(FlopCategory::attention_core, Phase::forward));
  CHECK(l.at(FlopCategory::attention_core, Phase::weight_grad) == 0);
  // Unbalanced routing with drops: 50 assignments computed instead of T·K = 192.
  ExactStepOptions o;
  o.routed_per_moe_layer = std::vector<int64_t>{50};
  CHECK(exact_step_ledger(a, B, o).at(FlopCategory::expert, Phase::forward) ==
        2 * 50 * 64 * 32 * 3);
  // ERC: per MoE layer E products (E × D_e × D_m): 4·2·4·32·64 = 65,536 per phase.
  o.routed_per_moe_layer.reset();
  o.erc_loss = true;
  CHECK(exact_step_ledger(a, B, o).category(FlopCategory::aux_loss) == 3 * 65'536);
}

TEST_CASE("convention lenses reproduce the conventions from an exact ledger") {
  const Arch a = tiny_moe();
  const int64_t B = 2;
  const double tokens = double(B * a.seq_len);
  const FlopLedger l = exact_step_ledger(a, B);
  CHECK(lens(a, Convention::exact, AttentionMask::causal).apply(l) == double(l.total()));
  CHECK(lens(a, Convention::paper, AttentionMask::causal).apply(l) ==
        doctest::Approx(flops_per_token(a, Convention::paper).total * tokens));
  CHECK(lens(a, Convention::megatron, AttentionMask::causal).apply(l) ==
        doctest::Approx(flops_per_token(a, Convention::megatron).total * tokens));
  const FlopLedger lf = exact_step_ledger(a, B, ExactStepOptions{AttentionMask::full, false, {}});
  CHECK(lens(a, Convention::paper, AttentionMask::full).apply(lf) ==
        doctest::Approx(flops_per_token(a, Convention::paper).total * tokens));
  // exact/full from a causal run: the attention core scaled to S keys a query. Without the
  // counted mask an exact/full sweep's faithful runs fell 3 % short of their plan.
  CHECK(lens(a, Convention::exact, AttentionMask::causal, AttentionMask::full).apply(l) ==
        doctest::Approx(flops_per_token(a, Convention::exact, AttentionMask::full).total * tokens)
            .epsilon(1e-12));
  CHECK(lens(a, Convention::exact, AttentionMask::full, AttentionMask::full).apply(lf) ==
        double(lf.total()));
  // A device's padding and recomputed products are executed, not C, in any convention: 1000 and
  // 500 FLOPs of them leave every lens where the clean ledger put it, and the ledger's useful
  // count 1500 under its total.
  FlopLedger dev = l;
  dev.flops[int(FlopCategory::padding)][int(Phase::forward)] += 1000;
  dev.flops[int(FlopCategory::recompute)][int(Phase::input_grad)] += 500;
  CHECK(dev.total() == l.total() + 1500);
  CHECK(dev.useful() == l.total());
  for (const auto& [c, counted] : {std::pair{Convention::exact, AttentionMask::causal},
                                   {Convention::exact, AttentionMask::full},
                                   {Convention::paper, AttentionMask::causal},
                                   {Convention::megatron, AttentionMask::causal}}) {
    CAPTURE(name(c));
    const ConventionLens ln = lens(a, c, AttentionMask::causal, counted);
    CHECK(ln.apply(dev) == ln.apply(l));
  }
  // Under the counting readings paper's 6·N_a grows by 6·router (executed: the router's
  // products) and 6·norms (no product executes them: the lens scales the attention projections,
  // 6·attention per token exactly, by (attention + norms) / attention). Without the norms term
  // a --count-norms run's measured C [paper] fell 6·norms·D short of its plan.
  for (const auto& [router, norms] : {std::pair{true, false}, {false, true}, {true, true}}) {
    Arch r = a;
    r.count_router = router;
    r.count_norms = norms;
    CAPTURE(router);
    CAPTURE(norms);
    CHECK(lens(r, Convention::paper, AttentionMask::causal).apply(exact_step_ledger(r, B)) ==
          doctest::Approx(flops_per_token(r, Convention::paper).total * tokens).epsilon(1e-12));
  }
}

TEST_CASE("names round-trip") {
  for (int i = 0; i < kFlopCategories; ++i)
    CHECK(parse_flop_category(name(FlopCategory(i))) == FlopCategory(i));
  CHECK(parse_convention("megatron") == Convention::megatron);
  CHECK_FALSE(parse_convention("chinchilla").has_value());
  CHECK(name(FlopCategory::attention_core) == "attention-core");
}

TEST_CASE("flops_label names the counting readings that change M") {
  // tiny_moe: router D_m·E = 64·4 = 256 weights; norms 2·64 per layer + 64 final = 320. Under
  // paper they enter M as 6·N_a does: +6·256 = 1,536 with the router in, +6·320 = 1,920 with the
  // norms in; so the label says so. exact and megatron M do not move with the readings.
  Arch out = tiny_moe();
  Arch router = out, norms = out, both = out;
  router.count_router = true;
  norms.count_norms = true;
  both.count_router = both.count_norms = true;
  const double m_out = flops_per_token(out, Convention::paper).total;
  CHECK(flops_per_token(router, Convention::paper).total - m_out == 1'536.0);
  CHECK(flops_per_token(norms, Convention::paper).total - m_out == 1'920.0);
  CHECK(flops_label(out, Convention::paper, AttentionMask::full) == "paper");
  CHECK(flops_label(router, Convention::paper, AttentionMask::full) == "paper (router in)");
  CHECK(flops_label(norms, Convention::paper, AttentionMask::full) == "paper (norms in)");
  CHECK(flops_label(both, Convention::paper, AttentionMask::full) == "paper (router in, norms in)");
  for (const auto& [c, mask, label] :
       {std::tuple{Convention::exact, AttentionMask::causal, "exact/causal"},
        {Convention::exact, AttentionMask::full, "exact/full"},
        {Convention::megatron, AttentionMask::causal, "megatron"}}) {
    CAPTURE(label);
    CHECK(flops_per_token(both, c, mask).total == flops_per_token(out, c, mask).total);
    CHECK(flops_label(both, c, mask) == label);
  }
}

TEST_CASE("parameter counts: by hand on the tiny MoE; past 4e18 refused naming the component") {
  const ParamCounts c = count_params(tiny_moe());
  // By hand: attention 2 layers · (2·64·64 + 2·64·64) = 32768; dense FFN 1 · 3·64·128 = 24576;
  // experts 1 · 3·64·4·32 = 24576, active K = 2 of 4: 12288; shared 3·64·32 = 6144;
  // router 64·4 = 256; norms (2·2 + 1)·64 = 320; embedding 100·64 = 6400, untied head alike.
  CHECK(c.attention == 32768);
  CHECK(c.dense_ffn == 24576);
  CHECK(c.expert_total == 24576);
  CHECK(c.expert_active == 12288);
  CHECK(c.shared_expert == 6144);
  CHECK(c.router == 256);
  CHECK(c.norms == 320);
  CHECK(c.embedding == 6400);
  CHECK(c.total_params == 32768 + 24576 + 6144 + 24576);
  CHECK(c.active_params == 32768 + 24576 + 6144 + 12288);

  auto refusal = [](const Arch& a) {
    try {
      count_params(a);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // A vocabulary of 4e15 at d_model 10752 is a 4.3e19-parameter embedding: it wrapped negative.
  Arch a = tiny_moe();
  a.vocab = 4'000'000'000'000'000;
  a.d_model = 10752;
  CHECK(refusal(a).find("arch: the token embedding would have 4.301e+19 parameters") == 0);
  // Widths whose product passes 64 bits several times over (3·64·E·D_e with E = D_e = 2^40).
  a = tiny_moe();
  a.experts = a.d_expert = int64_t(1) << 40;
  CHECK(refusal(a).find("arch: the routed experts would have") == 0);
  a = tiny_moe();
  a.layers = a.dense_layers = 3'000'000'000;
  a.experts = a.top_k = a.d_expert = a.d_shared = 0;
  a.d_model = a.heads * a.head_dim;
  a.d_ffn = 3'000'000'000;
  CHECK(refusal(a).find("arch: the dense FFN would have") == 0);
  // Each component under the bound, their sum over it: one dense layer at d_model = 2^29 (one
  // head of 2^29) has attention 4·2^58 = 2^60 and an FFN of width 2^31 has 3·2^29·2^31 = 3·2^60;
  // N = 4·2^60 = 4.612e18 (norm scales not counted, as by default). Several components under
  // the bound can add past 64 bits, so the sum is sized before it is made in integers.
  a = tiny_moe();
  a.layers = a.dense_layers = 1;
  a.experts = a.top_k = a.d_expert = a.d_shared = 0;
  a.d_model = a.head_dim = int64_t(1) << 29;
  a.heads = a.kv_heads = 1;
  a.d_ffn = int64_t(1) << 31;
  CHECK(refusal(a).find("arch: N = 4.612e+18 parameters is above the 4e18 moeplan counts") == 0);
  // Under the bound a count is exact: the planner's shape searches (N <= 1e18) count candidates
  // of up to about 4·N. Same layer at FFN width 2^30: 2^60 + 3·2^59 = 5·2^59 = 2.882e18.
  a.d_ffn = int64_t(1) << 30;
  CHECK(count_params(a).total_params == 5 * (int64_t(1) << 59));
  // The vocabulary is outside N but inside what a backend allocates (trainable()): at d_model
  // 2^29 and V 2^31 the embedding and the untied LM head are 2^60 each, under the bound alone;
  // with N above (5·2^59) all trainable scalars are 5·2^59 + 2^61 + norms (3·2^29) = 5.188e18.
  a.vocab = int64_t(1) << 31;
  a.tied_embeddings = false;
  CHECK(refusal(a).find("arch: 5.188e+18 trainable parameters (vocabulary, router and norms "
                        "included) is above the 4e18") == 0);
}

TEST_CASE("grouped-query attention: K and V at kv_heads, Q and O at heads") {
  // 8 query heads, 2 KV heads, head_dim 8 over D_m 64, 2 layers:
  // Q and O: 2 layers · 2 · 64·(8·8) = 16,384; K and V: 2 layers · 2 · 64·(2·8) = 4,096.
  Arch a = tiny_dense();
  a.heads = 8;
  a.kv_heads = 2;
  a.head_dim = 8;
  CHECK(count_params(a).attention == 20'480);
}

TEST_CASE("paper lens on a model whose query width is not D_m") {
  // L 1 dense, D_m 64, 4 heads of 32 (query width 128), FFN 128, S 16, one sequence, full mask.
  // Executed attention core: 3 phases · (QK^T + PV) = 3 · 2 · 2·S²·128 = 12·256·128 = 393,216.
  // Paper counts 12·L·D_m·S a token: 12·64·16 · 16 tokens = 196,608, half the executed core.
  // N_a = Q,K,V,O 4·64·128 + FFN 3·64·128 = 32,768 + 24,576 = 57,344; 6·N_a·16 = 5,505,024.
  // Paper C of the step: 5,505,024 + 196,608 = 5,701,632.
  Arch a;
  a.d_model = 64;
  a.layers = 1;
  a.dense_layers = 1;
  a.heads = 4;
  a.kv_heads = 4;
  a.head_dim = 32;
  a.d_ffn = 128;
  a.seq_len = 16;
  a.vocab = 100;
  const FlopLedger lf = exact_step_ledger(a, 1, ExactStepOptions{AttentionMask::full, false, {}});
  CHECK(double(lf.category(FlopCategory::attention_core)) == 393'216.0);
  CHECK(lens(a, Convention::paper, AttentionMask::full).apply(lf) == doctest::Approx(5'701'632.0));
  CHECK(flops_per_token(a, Convention::paper).total * 16 == 5'701'632.0);
}
