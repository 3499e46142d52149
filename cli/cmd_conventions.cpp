// `moeplan conventions`: list the FLOP conventions and what each counts.
#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/flops.hpp"

namespace moeplan::cli {
namespace {
const bool registered = register_command(
    {"conventions", "List the FLOP conventions moeplan knows and what each counts", 90,
     [](CLI::App&) -> std::function<int()> {
       return [] {
         fmt::print(
             "paper     6·N_a + 12·L·D_m·S per token (training; full-S attention; no router, "
             "norms, LM head)\n");
         fmt::print(
             "exact     every matrix product as executed (causal attention (S+1)/2 keys per "
             "query, router, LM head)\n");
         fmt::print(
             "megatron  Megatron-LM's reading: causal S/2, SwiGLU 3 GEMMs, K·D_e experts, "
             "shared in full, LM head, no router\n");
         return 0;
       };
     }});
}  // namespace
}  // namespace moeplan::cli
