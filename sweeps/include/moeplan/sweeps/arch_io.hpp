#pragma once
// Architectures as files: the Arch keys of ACCOUNTING.md at the top level of a TOML file
// (`moeplan plan --arch arch.toml`), and as JSON objects.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "moeplan/accounting/arch.hpp"

namespace moeplan {

// Required: d_model, layers, heads, head_dim, seq_len, vocab; d_ffn when a layer is dense;
// experts, top_k, d_expert when one is MoE. Optional: kv_heads (= heads), dense_layers (= layers
// without experts, else 1), d_shared (0), tied_embeddings, count_router, count_norms (false),
// attention = "mha" (the default when kv_heads = heads; heads·head_dim must equal d_model) |
// "gqa" (the default when kv_heads differs: heads·head_dim = d_model, kv_heads divides heads) |
// "any" (no width rule).
// Throws InputError naming the file, the key and what is expected; validate() runs on the result.
Arch read_arch(const std::filesystem::path& path);
Arch arch_from_toml_string(const std::string& text, const std::string& origin);

// A backbone for the MoE solver (`--backbone FILE`): the same keys without experts, top_k,
// d_expert, d_shared (the solver chooses them); dense_layers defaults to 1 and must leave at
// least one MoE layer.
Arch read_backbone(const std::filesystem::path& path);
Arch backbone_from_toml_string(const std::string& text, const std::string& origin);

nlohmann::json arch_to_json(const Arch& arch);
// The Arch keys as TOML lines ("d_model = 1408\n..."), in ACCOUNTING.md's order.
std::string arch_to_toml_lines(const Arch& arch);

}  // namespace moeplan
