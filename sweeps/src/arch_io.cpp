#include "moeplan/sweeps/arch_io.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "toml_reader.hpp"

namespace moeplan {

namespace {
const char* kPositive = "a positive integer";

// Keys an arch file and a backbone file share: attention, depth, width, sequence, vocabulary.
void read_shape_keys(detail::TomlTable& t, Arch& a) {
  a.d_model = t.integer("d_model", kPositive);
  a.layers = t.integer("layers", kPositive);
  a.heads = t.integer("heads", kPositive);
  a.head_dim = t.integer("head_dim", kPositive);
  a.seq_len = t.integer("seq_len", kPositive);
  a.vocab = t.integer("vocab", kPositive);
  a.kv_heads = t.integer_or("kv_heads", a.heads);
}

// d_ffn (needed only when there are dense layers), the counting readings and the attention kind;
// then no key may be left unread. Returns the attention kind ("mha", "gqa" or "any").
std::string read_tail_keys(detail::TomlTable& t, Arch& a) {
  if (a.dense_layers > 0)
    a.d_ffn = t.integer("d_ffn", "a positive integer (dense FFN width)");
  else
    a.d_ffn = t.integer_or("d_ffn", 0);
  a.tied_embeddings = t.boolean_or("tied_embeddings", false);
  a.count_router = t.boolean_or("count_router", false);
  a.count_norms = t.boolean_or("count_norms", false);
  const std::string attention = t.string_or("attention", a.kv_heads == a.heads ? "mha" : "gqa");
  t.reject_unknown();
  if (attention != "mha" && attention != "gqa" && attention != "any")
    t.fail("attention",
           fmt::format("= '{}' is not known; use \"mha\", \"gqa\" or \"any\"", attention));
  if (attention == "mha" && a.kv_heads != a.heads)
    t.fail("kv_heads", fmt::format("= {} differs from heads = {} but attention = \"mha\"; set "
                                   "attention = \"gqa\" or kv_heads = heads",
                                   a.kv_heads, a.heads));
  return attention;
}
}  // namespace

Arch arch_from_toml_string(const std::string& text, const std::string& origin) {
  const toml::value root = detail::parse_toml(text, origin);
  detail::TomlTable t(root, origin, "");
  Arch a;
  read_shape_keys(t, a);
  a.experts = t.integer_or("experts", 0);
  // MoE keys without `experts`: the missing key is experts, not "experts = 0 is invalid".
  if (a.experts == 0 && !t.has("experts"))
    for (const char* k : {"top_k", "d_expert"})
      if (t.integer_or(k, 0) != 0)  // a dense file may spell out top_k = 0
        t.integer("experts", fmt::format("a positive integer (the experts of a MoE layer; {} is "
                                         "given, which MoE layers use)",
                                         k)
                                 .c_str());
  if (a.experts > 0) {
    a.top_k = t.integer("top_k", "a positive integer (experts chosen per token)");
    a.d_expert = t.integer("d_expert", "a positive integer (SwiGLU width of one expert)");
  } else {
    a.top_k = t.integer_or("top_k", 0);
    a.d_expert = t.integer_or("d_expert", 0);
  }
  a.dense_layers = t.integer_or("dense_layers", a.experts > 0 ? 1 : a.layers);
  a.d_shared = t.integer_or("d_shared", 0);
  const std::string attention = read_tail_keys(t, a);
  try {
    validate(a, attention != "any");
  } catch (const InputError& e) {
    const bool width = std::string_view(e.what()).find("must equal d_model") != std::string::npos;
    throw InputError(
        fmt::format("{}: {}{}", origin, e.what(),
                    width ? " (attention = \"any\" in the arch file lifts this rule)" : ""));
  }
  return a;
}

namespace {
std::string slurp(const std::filesystem::path& path, const char* what) {
  // A folder opens as an empty stream on Linux and would read as a file missing every key.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(fmt::format("'{}' is a folder; give the {} file (TOML)", path.string(), what));
  return read_input_file(path, what);
}
}  // namespace

Arch read_arch(const std::filesystem::path& path) {
  return arch_from_toml_string(slurp(path, "arch"), path.string());
}

Arch read_backbone(const std::filesystem::path& path) {
  return backbone_from_toml_string(slurp(path, "backbone"), path.string());
}

Arch backbone_from_toml_string(const std::string& text, const std::string& origin) {
  const toml::value root = detail::parse_toml(text, origin);
  detail::TomlTable t(root, origin, "");
  for (const char* k : {"experts", "top_k", "d_expert", "d_shared"})
    if (t.has(k))
      t.fail(k,
             "is not allowed in a backbone: the planner solves the MoE layer (use --arch for a "
             "complete architecture)");
  Arch a;
  read_shape_keys(t, a);
  a.dense_layers = t.integer_or("dense_layers", 1);
  const std::string attention = read_tail_keys(t, a);
  if (a.layers < 1)
    t.fail("layers",
           fmt::format("= {} is invalid; it must be >= 1 (and above dense_layers)", a.layers));
  if (a.dense_layers >= a.layers)
    t.fail("dense_layers",
           fmt::format("= {} leaves no MoE layer (layers = {})", a.dense_layers, a.layers));
  // Validate the shape with a stand-in MoE layer; the solver replaces it.
  Arch probe = a;
  probe.experts = probe.top_k = probe.d_expert = 1;
  try {
    validate(probe, attention != "any");
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", origin, e.what()));
  }
  return a;
}

nlohmann::json arch_to_json(const Arch& a) {
  return nlohmann::json{{"d_model", a.d_model},
                        {"layers", a.layers},
                        {"dense_layers", a.dense_layers},
                        {"heads", a.heads},
                        {"kv_heads", a.kv_heads},
                        {"head_dim", a.head_dim},
                        {"d_ffn", a.d_ffn},
                        {"experts", a.experts},
                        {"top_k", a.top_k},
                        {"d_expert", a.d_expert},
                        {"d_shared", a.d_shared},
                        {"seq_len", a.seq_len},
                        {"vocab", a.vocab},
                        {"tied_embeddings", a.tied_embeddings},
                        {"count_router", a.count_router},
                        {"count_norms", a.count_norms}};
}

std::string arch_to_toml_lines(const Arch& a) {
  auto b = [](bool v) { return v ? "true" : "false"; };
  return fmt::format(
      "d_model = {}\nlayers = {}\ndense_layers = {}\nheads = {}\nkv_heads = {}\nhead_dim = {}\n"
      "d_ffn = {}\nexperts = {}\ntop_k = {}\nd_expert = {}\nd_shared = {}\nseq_len = {}\n"
      "vocab = {}\ntied_embeddings = {}\ncount_router = {}\ncount_norms = {}\n",
      a.d_model, a.layers, a.dense_layers, a.heads, a.kv_heads, a.head_dim, a.d_ffn, a.experts,
      a.top_k, a.d_expert, a.d_shared, a.seq_len, a.vocab, b(a.tied_embeddings), b(a.count_router),
      b(a.count_norms));
}

}  // namespace moeplan
