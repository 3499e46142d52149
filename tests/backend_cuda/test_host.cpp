// Host-side pieces of the CUDA backend that need no GPU (these run in CI): bf16 rounding, rank
// discovery from the environment, the window split across ranks, the tiled expert kernels'
// executed-work count, and the "cuda" engine's clean refusal on a machine without a device.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/cuda/comm.hpp"
#include "moeplan/backend/cuda/device.hpp"
#include "moeplan/backend/cuda/expert_gemm.hpp"
#include "moeplan/backend/cuda/gemm.hpp"
#include "moeplan/backend/cuda/model.hpp"
#include "moeplan/backend/engine.hpp"

namespace cu = moeplan::backend::cuda;

TEST_CASE("bf16 conversion rounds to nearest even (hand values)") {
  // 1.0 = 0x3F800000 → 0x3F80; 1 + 2^-8 lies exactly halfway between bf16 1.0 and 1 + 2^-7:
  // ties go to the even mantissa (1.0); 1 + 3·2^-8 ties up to 1 + 2^-6 (0x3F82).
  CHECK(cu::float_to_bf16(1.0f) == 0x3F80);
  CHECK(cu::float_to_bf16(1.0f + 1.0f / 256) == 0x3F80);
  CHECK(cu::float_to_bf16(1.0f + 3.0f / 256) == 0x3F82);
  CHECK(cu::float_to_bf16(-2.0f) == 0xC000);
  CHECK(cu::bf16_to_float(0x3F81) == 1.0f + 1.0f / 128);
  CHECK(std::isnan(cu::bf16_to_float(cu::float_to_bf16(NAN))));
}

TEST_CASE("ranks read RANK / WORLD_SIZE / LOCAL_RANK; windows split r, r+W, ...") {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  cu::RankInfo r = cu::rank_from_env();
  CHECK(r.rank == 0);
  CHECK(r.world_size == 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "3", 1);
  r = cu::rank_from_env();
  CHECK(r.rank == 3);
  CHECK(r.local_rank == 3);  // defaults to RANK on one machine
  setenv("RANK", "4", 1);
  CHECK_THROWS_AS(cu::rank_from_env(), moeplan::InputError);  // rank must be below world size
  setenv("RANK", "x1", 1);
  CHECK_THROWS_AS(cu::rank_from_env(), moeplan::InputError);
  // WORLD_SIZE 2 without RANK: both processes read rank 0 and both wrote the id file.
  unsetenv("RANK");
  CHECK_THROWS_WITH_AS(cu::rank_from_env(),
                       "WORLD_SIZE=4 but RANK is not set: give each process its RANK (0 to 3), as "
                       "torchrun does, or let `moeplan run --nproc 4` start them",
                       moeplan::InputError);
  // WORLD_SIZE 1 alone is one process, rank 0.
  setenv("WORLD_SIZE", "1", 1);
  CHECK(cu::rank_from_env().rank == 0);
  // RANK or LOCAL_RANK without WORLD_SIZE: the process trained alone on GPU 0, LOCAL_RANK unread.
  unsetenv("WORLD_SIZE");
  setenv("RANK", "1", 1);
  CHECK_THROWS_WITH_AS(cu::rank_from_env(),
                       "RANK=1 is set but WORLD_SIZE is not: set WORLD_SIZE too (torchrun sets "
                       "WORLD_SIZE, RANK and LOCAL_RANK), or unset RANK to train in one process",
                       moeplan::InputError);
  unsetenv("RANK");
  setenv("LOCAL_RANK", "1", 1);
  CHECK_THROWS_WITH_AS(cu::rank_from_env(), doctest::Contains("LOCAL_RANK=1 is set but WORLD_SIZE"),
                       moeplan::InputError);
  // LOCAL_RANK given or taken from RANK: the engine's error says which.
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "1", 1);
  CHECK(cu::rank_from_env().local_rank_given);
  unsetenv("LOCAL_RANK");
  r = cu::rank_from_env();
  CHECK(r.local_rank == 1);
  CHECK_FALSE(r.local_rank_given);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  // 10 windows over 3 ranks: {0,3,6,9}, {1,4,7}, {2,5,8}: every window once.
  int64_t total = 0;
  for (int rank = 0; rank < 3; ++rank) total += cu::windows_of_rank(10, rank, 3);
  CHECK(total == 10);
  CHECK(cu::windows_of_rank(10, 0, 3) == 4);
  CHECK(cu::window_of_rank(3, 0, 3) == 9);
  CHECK(cu::windows_of_rank(2, 3, 4) == 0);
}

TEST_CASE("a rank's share of a global batch: sequences r, r+W, ...; every sequence once, even or not") {
  // 6 sequences of 3 tokens; token value = 10·sequence + position.
  std::vector<int32_t> global;
  for (int32_t b = 0; b < 6; ++b)
    for (int32_t t = 0; t < 3; ++t) global.push_back(10 * b + t);
  std::vector<int32_t> share, seen;
  for (int rank = 0; rank < 3; ++rank) {
    cu::take_rank_share(share, global.data(), 6, 3, cu::RankInfo{rank, 3, rank});
    REQUIRE(share.size() == 6);
    CHECK(share[0] == 10 * rank);        // sequence r
    CHECK(share[3] == 10 * (rank + 3));  // sequence r + W
    CHECK(share[5] == 10 * (rank + 3) + 2);
    seen.insert(seen.end(), share.begin(), share.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int32_t> all = global;
  std::sort(all.begin(), all.end());
  CHECK(seen == all);
  CHECK(cu::rank_batch(6, cu::RankInfo{1, 3, 1}) == 2);
  // 6 over 4 ranks: {0,4}, {1,5}, {2}, {3}; still every sequence once.
  seen.clear();
  for (int rank = 0; rank < 4; ++rank) {
    cu::take_rank_share(share, global.data(), 6, 3, cu::RankInfo{rank, 4, rank});
    CHECK(int64_t(share.size()) == 3 * cu::rank_batch(6, cu::RankInfo{rank, 4, rank}));
    CHECK(share.size() == (rank < 2 ? 6u : 3u));
    CHECK(share[0] == 10 * rank);
    seen.insert(seen.end(), share.begin(), share.end());
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == all);
  CHECK_THROWS_WITH_AS(cu::rank_batch(3, cu::RankInfo{0, 4, 0}),
                       "batch_seqs 3 is smaller than WORLD_SIZE=4; every rank needs at least one "
                       "sequence",
                       moeplan::InputError);
}

TEST_CASE("the dense bf16 peaks MFU is given against: the datasheet's, by the name CUDA reports") {
  // NVIDIA's H100 datasheet: bf16 tensor core 1,979 TFLOP/s (SXM) and 1,513 (PCIe), both "with
  // sparsity", dense half; the H200 SXM has the H100 SXM's compute (issue 6 gives 989).
  CHECK(cu::dense_bf16_peak_tflops("NVIDIA H200") == doctest::Approx(1979.0 / 2).epsilon(1e-3));
  CHECK(cu::dense_bf16_peak_tflops("NVIDIA H100 80GB HBM3") ==
        doctest::Approx(1979.0 / 2).epsilon(1e-3));
  CHECK(cu::dense_bf16_peak_tflops("NVIDIA H100 PCIe") ==
        doctest::Approx(1513.0 / 2).epsilon(1e-3));
  // NVIDIA's A100 datasheet: bf16 tensor core 624 TFLOP/s with sparsity, dense half, for the
  // SXM4 parts of 40 and 80 GB (named as deviceQuery prints them).
  for (const char* a100 : {"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"})
    CHECK_MESSAGE(cu::dense_bf16_peak_tflops(a100) == doctest::Approx(624.0 / 2).epsilon(1e-3),
                  a100);
  // Not listed, so no MFU against a guess: another part, a name not quite the same, the emulator.
  for (const char* other : {"NVIDIA H100 NVL", "NVIDIA A100-PCIE-40GB", "NVIDIA H200 ",
                            "nvidia h200", "moeplan CUDA emulator (CPU)", ""})
    CHECK_MESSAGE(cu::dense_bf16_peak_tflops(other) == 0.0, other);
}

TEST_CASE("the cuda engine is registered, and refuses cleanly without a device") {
  const auto devices = moeplan::backend::engine_devices();
  CHECK(std::find(devices.begin(), devices.end(), "cuda") != devices.end());
  if (cu::device_count() == 0) {
    moeplan::backend::EngineRequest req;
    req.arch.d_model = 8;
    CHECK_THROWS_AS(moeplan::backend::make_engine("cuda", req), moeplan::InputError);
  }
}

TEST_CASE("--kernels auto: an option switched on is taken only where it can run") {
  const cu::KernelChoice d = cu::parse_kernel_choice("");
  const auto bf16 = cu::DType::bf16;
  cu::AutoOptions all;
  all.wgmma_experts = all.wgmma_attention = all.pdl = all.tiled_router = true;
  const cu::AutoTarget h200{
      .head_dim = 64, .d_model = 512, .d_expert = 128, .compute_major = 9, .compute_minor = 0};
  const auto resolved = [&](cu::AutoTarget t, cu::AutoOptions o = {}, cu::DType m = cu::DType::bf16,
                            const cu::KernelChoice& asked = {}) {
    return cu::to_string(cu::resolve_kernels(asked, t, m, o));
  };
  CHECK(resolved(h200, all) == "attention=fused_wgmma,experts=wgmma,launch=pdl,router=tiled");
  CHECK(resolved(h200) == "attention=fused_mma_lean,experts=tiled128");
  // Each alone, the others left as they are.
  cu::AutoOptions one;
  one.wgmma_experts = true;
  CHECK(resolved(h200, one) == "attention=fused_mma_lean,experts=wgmma");
  one = {};
  one.wgmma_attention = true;
  CHECK(resolved(h200, one) == "attention=fused_wgmma,experts=tiled128");
  one = {};
  one.pdl = true;
  CHECK(resolved(h200, one) == "attention=fused_mma_lean,experts=tiled128,launch=pdl");
  one = {};
  one.tiled_router = true;
  CHECK(resolved(h200, one) == "attention=fused_mma_lean,experts=tiled128,router=tiled");
  // The wgmma kernels are sm_90a code: not on 8.0, nor on a later device; pdl from 9.0 on; a
  // device not known (0.0) gets neither.
  cu::AutoTarget t = h200;
  t.compute_major = 8;
  CHECK(resolved(t, all) == "attention=fused_mma_lean,experts=tiled128,router=tiled");
  t.compute_major = 10;
  CHECK(resolved(t, all) == "attention=fused_mma_lean,experts=tiled128,launch=pdl,router=tiled");
  t.compute_major = 0;
  CHECK(resolved(t, all) == "attention=fused_mma_lean,experts=tiled128,router=tiled");
  // The shapes: wgmma attention at head width 64 only; wgmma experts with d_model and d_expert
  // multiples of 8; a dense model takes neither expert option (it has no experts).
  t = h200;
  t.head_dim = 128;
  CHECK(resolved(t, all) == "attention=fused_mma,experts=wgmma,launch=pdl,router=tiled");
  t.head_dim = 32;
  CHECK(resolved(t, all) == "attention=fused_mma_lean,experts=wgmma,launch=pdl,router=tiled");
  t = h200;
  t.d_expert = 12;
  CHECK(resolved(t, all) == "attention=fused_wgmma,experts=tiled128,launch=pdl,router=tiled");
  t = h200;
  t.d_model = 516;
  CHECK(resolved(t, all) == "attention=fused_wgmma,experts=tiled128,launch=pdl,router=tiled");
  t = h200;
  t.d_expert = 0;
  CHECK(resolved(t, all) == "attention=fused_wgmma,experts=tiled128,launch=pdl");
  // fp32 models: cuBLAS attention, grouped experts, the router on cuBLAS; launches either way.
  CHECK(resolved(h200, all, cu::DType::f32) == "attention=cublas,experts=grouped,launch=pdl");
  // What was asked for is kept.
  CHECK(resolved(h200, all, bf16, cu::parse_kernel_choice("experts=tiled,launch=plain")) ==
        "attention=fused_wgmma,experts=tiled,router=tiled");
  CHECK(resolved(h200, all, bf16, cu::parse_kernel_choice("attention=fused_mma,router=cublas")) ==
        "attention=fused_mma,experts=wgmma,launch=pdl");
  // A device's shared memory a block: at head width 128 fused_mma's backward needs 120.5 KiB
  // (below), more than compute capability 8.6's and 8.9's 99 KiB, so auto takes cuBLAS there; an
  // A100's 163 KiB holds it; at head width 64 the lean kernels fit 99 KiB; 0 is not known.
  t = h200;
  t.head_dim = 128;
  t.compute_major = 8;
  t.compute_minor = 6;
  t.shared_optin = 99 * 1024;
  CHECK(resolved(t, all) == "attention=cublas,experts=tiled128,router=tiled");
  t.compute_minor = 0;
  t.shared_optin = 163 * 1024;
  CHECK(resolved(t, all) == "attention=fused_mma,experts=tiled128,router=tiled");
  t.head_dim = 64;
  t.compute_minor = 6;
  t.shared_optin = 99 * 1024;
  CHECK(resolved(t, all) == "attention=fused_mma_lean,experts=tiled128,router=tiled");
  t = h200;
  t.head_dim = 128;
  t.shared_optin = 0;
  CHECK(resolved(t) == "attention=fused_mma,experts=tiled128");
  // The target of a point: its shapes and the device's capability; a dense point has no d_expert.
  moeplan::Arch a;
  a.d_model = 768;
  a.layers = a.dense_layers = 12;
  a.head_dim = 64;
  a.d_expert = 96;  // not read: the point is dense
  cu::DeviceInfo dev;
  dev.compute_major = 9;
  dev.compute_minor = 0;
  const cu::AutoTarget dense = cu::auto_target(a, dev);
  CHECK(dense.head_dim == 64);
  CHECK(dense.d_model == 768);
  CHECK(dense.d_expert == 0);
  CHECK(dense.compute_major == 9);
  CHECK(dense.shared_optin == 0);
  dev.shared_optin = 227 * 1024;
  CHECK(cu::auto_target(a, dev).shared_optin == 227 * 1024);
  a.dense_layers = 2;
  a.experts = 64;
  CHECK(cu::auto_target(a, dev).d_expert == 96);
}

TEST_CASE("attention paths' shared memory a block, from the kernels' tiles worked by hand") {
  // Tiles of 64 query rows and 64 keys; bf16 tiles of a head width D stored in rows of D + 8,
  // the bf16 P and dS tiles in rows of 64 + 8, the fp32 scores and dP in rows of 64 + 4, the fp32
  // output tile in rows of D + 4.
  const auto bf16_tile = [](std::size_t cols) { return 64 * (cols + 8) * 2; };
  const std::size_t scores = 64 * (64 + 4) * 4, p = bf16_tile(64), rows = 64 * 4;
  // At 128: the backward keeps q, dO, k, v, P, dS, the scores, dP, lse and delta.
  const std::size_t backward128 = 4 * bf16_tile(128) + 2 * p + 2 * scores + 2 * rows;
  CHECK(backward128 == 123392);  // 120.5 KiB
  // fused_mma's forward: q, and k and v twice over.
  CHECK(cu::attention_shared_bytes(cu::AttentionPath::fused_mma, 128) == backward128);
  // fused's forward keeps q, k, v, P, the scores, the fp32 output and three row statistics.
  const std::size_t forward128 = 3 * bf16_tile(128) + p + scores + 64 * (128 + 4) * 4 + 3 * rows;
  CHECK(forward128 < backward128);
  CHECK(cu::attention_shared_bytes(cu::AttentionPath::fused, 128) == backward128);
  // At 64 the lean path's largest is the dK/dV kernel: k, v, then q and dO twice over, and lse
  // and delta twice over.
  const std::size_t dkdv64 = 2 * bf16_tile(64) + 4 * bf16_tile(64) + 4 * rows;
  CHECK(cu::attention_shared_bytes(cu::AttentionPath::fused_mma_lean, 64) == dkdv64);
  CHECK(dkdv64 <= 99 * 1024);
  CHECK(cu::attention_shared_bytes(cu::AttentionPath::cublas, 128) == 0);
  CHECK(cu::attention_shared_bytes(cu::AttentionPath::fused_mma, 48) == 0);  // no kernel at 48
}

TEST_CASE("--kernels: attention and experts by name or auto, everything else refused") {
  const cu::KernelChoice d = cu::parse_kernel_choice("");
  CHECK_FALSE(d.attention.has_value());
  CHECK_FALSE(d.experts.has_value());
  CHECK(cu::to_string(d) == "attention=auto,experts=auto");
  CHECK(cu::to_string(cu::parse_kernel_choice("attention=auto,experts=auto")) ==
        "attention=auto,experts=auto");
  // auto: the fastest measured kernels that can run the point (bf16 only; the lean dK/dV
  // kernel at head widths 16, 32, 64, fused attention with the WMMA backward at 128), here on an
  // H200 (compute capability 9.0) and a MoE of d_model 512, d_expert 128: none of the options
  // not yet measured (kAutoMeasured) even where they could run.
  const auto at = [](int64_t dh) {
    return cu::AutoTarget{
        .head_dim = dh, .d_model = 512, .d_expert = 128, .compute_major = 9, .compute_minor = 0};
  };
  for (const int64_t dh : {16, 32, 64})
    CHECK(cu::to_string(cu::resolve_kernels(d, at(dh), cu::DType::bf16)) ==
          "attention=fused_mma_lean,experts=tiled128");
  CHECK(cu::to_string(cu::resolve_kernels(d, at(128), cu::DType::bf16)) ==
        "attention=fused_mma,experts=tiled128");
  for (const int64_t dh : {8, 48, 96, 256})
    CHECK(cu::to_string(cu::resolve_kernels(d, at(dh), cu::DType::bf16)) ==
          "attention=cublas,experts=tiled128");
  for (const int64_t dh : {16, 64, 128})
    CHECK(cu::to_string(cu::resolve_kernels(d, at(dh), cu::DType::f32)) ==
          "attention=cublas,experts=grouped");
  // What was asked for is kept; only what was left out is chosen.
  CHECK(cu::to_string(cu::resolve_kernels(cu::parse_kernel_choice("experts=grouped"), at(64),
                                          cu::DType::bf16)) ==
        "attention=fused_mma_lean,experts=grouped");
  CHECK(cu::to_string(cu::resolve_kernels(cu::parse_kernel_choice("attention=cublas,logits=64"),
                                          at(64), cu::DType::bf16)) ==
        "attention=cublas,experts=tiled128,logits=64");
  const cu::KernelChoice k = cu::parse_kernel_choice("experts=tiled,attention=fused_mma");
  CHECK(k.attention == cu::AttentionPath::fused_mma);
  CHECK(k.experts == cu::ExpertPath::tiled);
  CHECK(cu::to_string(k) == "attention=fused_mma,experts=tiled");
  CHECK(cu::to_string(cu::parse_kernel_choice("experts=loop")) == "attention=auto,experts=loop");
  CHECK(cu::parse_kernel_choice("experts=tiled128").experts == cu::ExpertPath::tiled128);
  CHECK(cu::to_string(cu::parse_kernel_choice("attention=fused_mma_lean")) ==
        "attention=fused_mma_lean,experts=auto");
  CHECK(cu::to_string(cu::parse_kernel_choice("experts=tiled128")) ==
        "attention=auto,experts=tiled128");
  CHECK(cu::to_string(cu::parse_kernel_choice("attention=fused")) ==
        "attention=fused,experts=auto");
  auto message = [](const std::string& spec) {
    try {
      cu::parse_kernel_choice(spec);
    } catch (const moeplan::InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message("attention=flash") ==
        "--kernels: attention=flash is not known (valid: "
        "attention=auto|cublas|fused|fused_mma|fused_mma_wide|fused_mma_lean|fused_wgmma)");
  CHECK(cu::parse_kernel_choice("attention=fused_wgmma").attention ==
        cu::AttentionPath::fused_wgmma);
  CHECK(message("experts=fast") ==
        "--kernels: experts=fast is not known (valid: "
        "experts=auto|grouped|loop|tiled|tiled128|wgmma|batched)");
  CHECK(cu::parse_kernel_choice("experts=wgmma").experts == cu::ExpertPath::wgmma);
  // Programmatic dependent launches: asked for by name, plain when left to auto (not measured
  // yet), shown only when pdl.
  CHECK(cu::parse_kernel_choice("launch=pdl").launch == cu::LaunchMode::programmatic);
  CHECK(cu::parse_kernel_choice("launch=plain").launch == cu::LaunchMode::plain);
  CHECK(!cu::parse_kernel_choice("launch=auto").launch);
  CHECK(cu::resolve_kernels(d, at(64), cu::DType::bf16).launch == cu::LaunchMode::plain);
  CHECK(cu::to_string(cu::resolve_kernels(cu::parse_kernel_choice("launch=pdl,experts=tiled"),
                                          at(64), cu::DType::bf16)) ==
        "attention=fused_mma_lean,experts=tiled,launch=pdl");
  CHECK(cu::to_string(cu::parse_kernel_choice("launch=plain")) == "attention=auto,experts=auto");
  CHECK(message("launch=eager") ==
        "--kernels: launch=eager is not known (valid: launch=auto|plain|pdl)");
  // The router's products: cublas unless asked (tiled is not measured yet), shown only when
  // tiled.
  CHECK(cu::parse_kernel_choice("router=tiled").router == cu::RouterPath::tiled);
  CHECK(cu::parse_kernel_choice("router=cublas").router == cu::RouterPath::cublas);
  CHECK(!cu::parse_kernel_choice("router=auto").router);
  CHECK(cu::resolve_kernels(d, at(64), cu::DType::bf16).router == cu::RouterPath::cublas);
  CHECK(cu::to_string(cu::resolve_kernels(cu::parse_kernel_choice("router=tiled,launch=pdl"),
                                          at(64), cu::DType::bf16)) ==
        "attention=fused_mma_lean,experts=tiled128,launch=pdl,router=tiled");
  CHECK(cu::to_string(cu::parse_kernel_choice("router=cublas")) == "attention=auto,experts=auto");
  CHECK(message("router=fast") ==
        "--kernels: router=fast is not known (valid: router=auto|cublas|tiled)");
  CHECK(message("speed=fast") ==
        "--kernels: 'speed' is not a kernel name (valid names, each at most once: attention, "
        "experts, logits, gemm, launch, router)");
  // `moeplan run --help` lists what the parser takes: each name it knows, and for each name
  // with a set of values the same set as its refusal lists.
  const std::string help = moeplan::backend::kCudaKernelChoices;
  const std::string names = message("speed=fast");
  for (size_t at = names.find("once: ") + 6; at < names.size();) {
    const size_t end = std::min(names.find(", ", at), names.find(')', at));
    const std::string name = names.substr(at, end - at);
    INFO(name);
    CHECK((help.starts_with(name + "=") || help.find(" " + name + "=") != std::string::npos));
    at = end + 2;
  }
  for (const char* name : {"attention", "experts", "launch", "router"}) {
    const std::string refusal = message(std::string(name) + "=nothing");
    const size_t from = refusal.find("(valid: ") + 8;
    const std::string values = refusal.substr(from, refusal.size() - 1 - from);
    INFO(values);
    CHECK((help.starts_with(values + ", ") || help.find(" " + values + ",") != std::string::npos ||
           help.ends_with(" " + values)));
  }
  CHECK(message("attention").find("is not name=value") != std::string::npos);
  CHECK(message("attention=,experts=tiled").find("is not name=value") != std::string::npos);
  CHECK(message("experts=tiled,experts=loop").find("given twice") != std::string::npos);
  // The LM head's chunk: a positive row count, or auto; shown only when asked for.
  CHECK(d.logit_rows == 0);
  const cu::KernelChoice l = cu::parse_kernel_choice("logits=2048,experts=tiled");
  CHECK(l.logit_rows == 2048);
  CHECK(cu::to_string(l) == "attention=auto,experts=tiled,logits=2048");
  CHECK(cu::parse_kernel_choice("logits=auto").logit_rows == 0);
  CHECK(cu::to_string(cu::parse_kernel_choice("logits=auto")) == "attention=auto,experts=auto");
  for (const char* bad : {"logits=0", "logits=-5", "logits=2k", "logits=1e4", "logits=all"})
    CHECK(message(bad) == fmt::format("--kernels: {} is not a row count (valid: logits=auto or a "
                                      "positive whole number of token rows, e.g. logits=2048)",
                                      bad));
  CHECK(message("logits=64,logits=128").find("given twice") != std::string::npos);
  // The engine refuses a bad choice before it looks for a device.
  moeplan::backend::EngineRequest req;
  req.arch.d_model = 8;
  req.kernels = "attention=flash";
  try {
    moeplan::backend::make_engine("cuda", req);
    FAIL("accepted");
  } catch (const moeplan::InputError& e) {
    CHECK(std::string(e.what()).find("attention=flash is not known") != std::string::npos);
  }
}

TEST_CASE("built-in GEMM tables: parsed, and chosen only on their own device and cuBLASLt") {
  // The one committed so far, as its file (backend/cuda/gemm_tables/h200-2026-12-04.json) states:
  // timed on an H200 with cuBLASLt 130100 (CUDA 13.0's) and a 32 MiB workspace, for the
  // benchmark's points at 8 x 1024 tokens: 33 shapes, 23 of them through a cuBLASLt algorithm.
  const auto& tables = cu::builtin_gemm_tables();
  REQUIRE_FALSE(tables.empty());
  for (size_t i = 1; i < tables.size(); ++i) CHECK(tables[i - 1].name < tables[i].name);
  const auto h200 = std::find_if(tables.begin(), tables.end(),
                                 [](const auto& b) { return b.name == "h200-2026-12-04"; });
  REQUIRE(h200 != tables.end());
  CHECK(h200->table->device == "NVIDIA H200");
  CHECK(h200->table->cublaslt_version == 130100);
  CHECK(h200->table->workspace_bytes == 32u << 20);
  CHECK(h200->table->entries.size() == 33);
  CHECK(std::count_if(h200->table->entries.begin(), h200->table->entries.end(),
                      [](const auto& e) { return e.lt; }) == 23);
  CHECK(cu::builtin_gemm_table_for("NVIDIA H200", 130100) == &*h200);
  CHECK(cu::builtin_gemm_table_for("NVIDIA H100 80GB HBM3", 130100) == nullptr);
  CHECK(cu::builtin_gemm_table_for("NVIDIA H200", 130101) == nullptr);
  CHECK(cu::builtin_gemm_table_for("NVIDIA H200", 120900) == nullptr);

  // --kernels gemm: auto (the built-in table where one was made here), none, builtin,
  // builtin:NAME (a name the program knows), or a file; shown only when asked for.
  CHECK(cu::parse_kernel_choice("gemm=auto").gemm_table.empty());
  CHECK(cu::to_string(cu::parse_kernel_choice("gemm=auto")) == "attention=auto,experts=auto");
  CHECK(cu::parse_kernel_choice("gemm=none").gemm_table == "none");
  CHECK(cu::parse_kernel_choice("gemm=builtin").gemm_table == "builtin");
  CHECK(cu::to_string(cu::parse_kernel_choice("gemm=builtin:h200-2026-12-04")) ==
        "attention=auto,experts=auto,gemm=builtin:h200-2026-12-04");
  CHECK(cu::parse_kernel_choice("gemm=tables/mine.json").gemm_table == "tables/mine.json");
  try {
    cu::parse_kernel_choice("gemm=builtin:a100");
    FAIL("accepted");
  } catch (const moeplan::InputError& e) {
    const std::string what = e.what();
    CHECK(what.find("gemm=builtin:a100 names no built-in GEMM table (built in: ") !=
          std::string::npos);
    CHECK(what.find("h200-2026-12-04") != std::string::npos);
  }
}

TEST_CASE("tiled expert products: executed work counts whole 64-row, 128-column, 32-deep tiles") {
  namespace eg = cu::expert_gemm;
  // Row product, counts {0, 1, 64, 65} (130 rows), N 128, K 32: the tiles cover 0 + 64 + 64 + 128
  // = 256 rows, so 2·256·128·32 = 2,097,152 executed against 2·130·128·32 = 1,064,960 useful.
  const std::vector<int32_t> c = {0, 1, 64, 65};
  CHECK(eg::executed_row_product_flops(c.data(), 4, 128, 32, 64) == 2097152);
  // N 100 and K 40 run as 128 columns and 64 deep: 2·256·128·64 = 4,194,304; N 130 as 256
  // columns: twice that.
  CHECK(eg::executed_row_product_flops(c.data(), 4, 100, 40, 64) == 4194304);
  CHECK(eg::executed_row_product_flops(c.data(), 4, 130, 40, 64) == 8388608);
  // Weight gradient M 64, N 128, depth = rows in steps of 32: counts {0, 1, 32, 33} take
  // 0 + 32 + 32 + 64 = 128 deep, 2·64·128·128 = 2,097,152.
  const std::vector<int32_t> w = {0, 1, 32, 33};
  CHECK(eg::executed_weight_grad_flops(w.data(), 4, 64, 128, 64) == 2097152);
  // M 100 runs as 128 rows, N 64 as 128 columns: 2·128·128·128 = 4,194,304.
  CHECK(eg::executed_weight_grad_flops(w.data(), 4, 100, 64, 64) == 4194304);
  // Tile bound: ceil(c/64) summed is at most (R + 63·E)/64; here 0+1+1+2 = 4 ≤ (130 + 252)/64 = 5.
  CHECK(eg::max_row_tiles(130, 4, 64) == 5);
  CHECK(eg::max_row_tiles(0, 0, 64) == 0);
}

TEST_CASE("tiled expert products in 128-row tiles: executed work counts whole 128-row tiles") {
  namespace eg = cu::expert_gemm;
  // Row product, counts {0, 1, 64, 65} (130 rows): each non-empty expert takes one 128-row tile,
  // 0 + 128 + 128 + 128 = 384 rows; N 128, K 32: 2·384·128·32 = 3,145,728.
  const std::vector<int32_t> c = {0, 1, 64, 65};
  CHECK(eg::executed_row_product_flops(c.data(), 4, 128, 32, 128) == 3145728);
  // Counts {128, 129}: 128 + 256 = 384 rows again, so the same figure.
  const std::vector<int32_t> c2 = {128, 129};
  CHECK(eg::executed_row_product_flops(c2.data(), 2, 128, 32, 128) == 3145728);
  // Weight gradient: the output rows M run in tiles of 128; M 64 as 128, M 130 as 256. Counts
  // {0, 1, 32, 33}: 128 deep. 2·128·128·128 = 4,194,304 and twice that.
  const std::vector<int32_t> w = {0, 1, 32, 33};
  CHECK(eg::executed_weight_grad_flops(w.data(), 4, 64, 128, 128) == 4194304);
  CHECK(eg::executed_weight_grad_flops(w.data(), 4, 130, 128, 128) == 8388608);
  // Tile bound: (R + 127·E)/128; 130 rows over 4 experts: (130 + 508)/128 = 4 (the tiles: 0 + 1
  // + 1 + 1 = 3). The 64-row bound (5) is the larger, so a buffer sized for it serves both.
  CHECK(eg::max_row_tiles(130, 4, 128) == 4);
  CHECK(eg::max_row_tiles(130, 4, 64) >= eg::max_row_tiles(130, 4, 128));
  // Only 64 and 128 are tile heights.
  CHECK_THROWS_AS(eg::max_row_tiles(130, 4, 96), std::logic_error);
  CHECK_THROWS_AS(eg::executed_row_product_flops(c.data(), 4, 128, 32, 32), std::logic_error);
}
