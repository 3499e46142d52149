#pragma once
// A FLOP ledger in records and checkpoints (docs/running.md: measured.flops). A count is a JSON
// integer while it fits 64 bits and a string of decimal digits beyond (a run past 9.2e18 FLOPs):
// a JSON reader turns a longer integer into a double and would lose the exactness the ledger
// exists for. Readers take either form.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "moeplan/accounting/ledger.hpp"

namespace moeplan {

nlohmann::json flop_count_to_json(FlopCount c);
// An integer, a whole number below 2^63 written as a float ("5e5"), or a string of digits;
// nullopt for anything else (a fraction; a float past 2^63, whose digits a double has lost).
std::optional<FlopCount> flop_count_from_json(const nlohmann::json& j);

// {"by_category": {category: {phase: count}}, "elementwise": count, "total": count}
nlohmann::json flop_ledger_to_json(const FlopLedger& ledger);
// Every category and phase must be present; throws InputError naming `where` and the key.
FlopLedger flop_ledger_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace moeplan
