#pragma once
// The shape of one model, with the code names of ACCOUNTING.md. Shape only: no training choices.
#include <cstdint>
#include <string>

namespace moeplan {

struct Arch {
  int64_t d_model = 0;
  int64_t layers = 0;        // L = dense_layers + moe layers; dense layers come first
  int64_t dense_layers = 0;  // L_d; equal to layers for a dense model
  int64_t heads = 0;
  int64_t kv_heads = 0;  // H_kv; MHA when kv_heads == heads
  int64_t head_dim = 0;
  int64_t d_ffn = 0;     // SwiGLU width of a dense FFN
  int64_t experts = 0;   // E routed experts per MoE layer (0 for a dense model)
  int64_t top_k = 0;     // K
  int64_t d_expert = 0;  // SwiGLU width of one routed expert
  int64_t d_shared = 0;  // total SwiGLU width of the shared expert(s); 0 = none
  int64_t seq_len = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;
  // Counting readings (conventions, not shape): is the router / are the RMSNorm scales inside N?
  bool count_router = false;
  bool count_norms = false;

  int64_t moe_layers() const { return layers - dense_layers; }
  bool is_dense() const { return moe_layers() == 0; }
  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
  bool operator==(const Arch&) const = default;
};

// Throws InputError naming the first inconsistent field (top_k > experts, heads not divisible by
// kv_heads, a MoE layer with no experts, ...). `require_mha_width` also demands heads·head_dim ==
// d_model (the declared-MHA rule of the paper family).
void validate(const Arch& arch, bool require_mha_width = false);

// One line, e.g. "L16 (1 dense) Dm1408 H11x128 Dffn3904 | E89 K1 De352 Dse352".
std::string describe(const Arch& arch);

}  // namespace moeplan
