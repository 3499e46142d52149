#include "moeplan/accounting/arch.hpp"

#include <utility>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

namespace {
void require(bool ok, const char* field, int64_t value, const char* valid) {
  if (!ok) throw InputError(fmt::format("arch: {} = {} is invalid; {}", field, value, valid));
}
}  // namespace

void validate(const Arch& a, bool require_mha_width) {
  require(a.d_model > 0, "d_model", a.d_model, "it must be a positive integer");
  require(a.layers > 0, "layers", a.layers, "it must be a positive integer");
  require(a.dense_layers >= 0 && a.dense_layers <= a.layers, "dense_layers", a.dense_layers,
          fmt::format("it must be in [0, layers = {}]", a.layers).c_str());
  require(a.heads > 0, "heads", a.heads, "it must be a positive integer");
  require(a.kv_heads > 0 && a.kv_heads <= a.heads && a.heads % a.kv_heads == 0, "kv_heads",
          a.kv_heads, fmt::format("it must divide heads = {}", a.heads).c_str());
  require(a.head_dim > 0, "head_dim", a.head_dim, "it must be a positive integer");
  require(a.seq_len > 0, "seq_len", a.seq_len, "it must be a positive integer");
  require(a.vocab >= 2, "vocab", a.vocab,
          "it must be an integer >= 2 (a language model predicts one of several tokens)");
  if (require_mha_width && a.heads * a.head_dim != a.d_model)
    throw InputError(fmt::format(
        "arch: heads·head_dim = {}·{} = {} must equal d_model = {} for multi-head attention",
        a.heads, a.head_dim, a.heads * a.head_dim, a.d_model));
  if (a.dense_layers > 0) require(a.d_ffn > 0, "d_ffn", a.d_ffn, "dense layers need d_ffn > 0");
  require(a.d_ffn >= 0, "d_ffn", a.d_ffn, "it must be >= 0");
  if (a.moe_layers() > 0) {
    require(a.experts > 0, "experts", a.experts, "MoE layers need at least 1 expert");
    require(a.top_k > 0 && a.top_k <= a.experts, "top_k", a.top_k,
            fmt::format("it must be in [1, experts = {}]", a.experts).c_str());
    require(a.d_expert > 0, "d_expert", a.d_expert, "MoE layers need d_expert > 0");
    require(a.d_shared >= 0, "d_shared", a.d_shared, "it must be >= 0 (0 = no shared expert)");
  } else {
    // Named by the first one that is set (a dense file with a stray top_k = 2 is about top_k).
    const std::pair<const char*, int64_t> moe_keys[] = {{"experts", a.experts},
                                                        {"top_k", a.top_k},
                                                        {"d_expert", a.d_expert},
                                                        {"d_shared", a.d_shared}};
    for (const auto& [key, v] : moe_keys)
      require(v == 0, key, v,
              fmt::format("a model with dense_layers == layers ({} == {}) has no MoE layers: "
                          "experts, top_k, d_expert and d_shared must be 0 (or give MoE layers: "
                          "dense_layers < layers)",
                          a.dense_layers, a.layers)
                  .c_str());
  }
}

std::string describe(const Arch& a) {
  std::string s =
      fmt::format("L{} ({} dense) Dm{} H{}", a.layers, a.dense_layers, a.d_model, a.heads);
  if (a.kv_heads != a.heads) s += fmt::format("/kv{}", a.kv_heads);
  s += fmt::format("x{}", a.head_dim);
  if (a.dense_layers > 0) s += fmt::format(" Dffn{}", a.d_ffn);
  if (a.moe_layers() > 0)
    s += fmt::format(" | E{} K{} De{} Dse{}", a.experts, a.top_k, a.d_expert, a.d_shared);
  return s;
}

}  // namespace moeplan
