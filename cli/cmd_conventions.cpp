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
             "paper     6·N_a + 12·L·D_m·S per token (training; full-S attention; LM head out; "
             "router and norms only as far as N_a counts them)\n");
         fmt::print(
             "exact     every matrix product as executed (causal attention (S+1)/2 keys per "
             "query, router, LM head)\n");
         fmt::print(
             "megatron  Megatron-LM's reading: causal S/2, SwiGLU 3 GEMMs, K·D_e experts, "
             "shared in full, LM head, no router\n");
         fmt::print(
             "\nLabels outputs print:\n"
             "  paper                6·N_a with N_a as the paper counts it (router and norms "
             "out)\n"
             "  paper (router in)    6·N_a with the router's weights in N_a (--count-router); "
             "(norms in): --count-norms\n"
             "  exact/causal         exact with causal attention, as moeplan trains; the ledger's "
             "own reading\n"
             "  exact/full           exact with every key attended (S per query), as the paper's "
             "12·L·D_m·S assumes\n"
             "M and C are per consumed token and over consumed tokens (repeats counted); training "
             "= forward + backward (3x forward for products), forward = one pass\n");
         return 0;
       };
     }});
}  // namespace
}  // namespace moeplan::cli
