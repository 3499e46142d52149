#pragma once
// Tiny shapes and data shared by the CPU model's tests.
#include <cstdint>
#include <vector>

#include "moeplan/accounting/arch.hpp"

namespace moeplan::backend::test {

inline Arch tiny_dense() {
  Arch a;
  a.d_model = 16;
  a.layers = 2;
  a.dense_layers = 2;
  a.heads = 4;
  a.kv_heads = 2;  // GQA
  a.head_dim = 4;
  a.d_ffn = 12;
  a.seq_len = 8;
  a.vocab = 11;
  return a;
}

// One dense layer, then one MoE layer with a shared expert (the paper's layout).
inline Arch tiny_moe() {
  Arch a = tiny_dense();
  a.layers = 2;
  a.dense_layers = 1;
  a.experts = 4;
  a.top_k = 2;
  a.d_expert = 6;
  a.d_shared = 6;
  return a;
}

// Deterministic token ids in [0, vocab) (a simple LCG; the tests need variety, not quality).
inline std::vector<int32_t> tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  uint64_t s = seed * 2862933555777941757ULL + 3037000493ULL;
  for (auto& v : t) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    v = int32_t((s >> 33) % uint64_t(vocab));
  }
  return t;
}

}  // namespace moeplan::backend::test
