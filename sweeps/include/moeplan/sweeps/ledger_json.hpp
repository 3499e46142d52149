#pragma once
// A FLOP ledger in records and checkpoints (docs/running.md: measured.flops). A count is a JSON
// integer while it fits 64 bits and a string of decimal digits beyond (a run past 9.2e18 FLOPs):
// a JSON reader turns a longer integer into a double and would lose the exactness the ledger
// exists for. Readers take either form.
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "moeplan/accounting/ledger.hpp"

namespace moeplan {

// What a reader takes, for messages.
inline constexpr const char* kFlopCountForms =
    "0 to 10^36 - 1, as a JSON integer below 2^64 or a string of decimal digits";

nlohmann::json flop_count_to_json(FlopCount c);
// A count from 0 to 10^36 − 1: an integer, a whole number below 2^53 written as a float ("5e5"),
// or a string of digits; nullopt for anything else (a negative count; a fraction; a float from
// 2^53 on, whose last digit a double may have lost; 10^36 or more, which no run executes).
std::optional<FlopCount> flop_count_from_json(const nlohmann::json& j);
// A record's other counts (tokens, steps, parameters): a whole number in [0, 2^63), as an
// integer or a whole float (1e3); nullopt for a fraction, a negative, past int64 or not a number.
std::optional<int64_t> count_from_json(const nlohmann::json& j);

// A record's curves, as `run` writes them and `audit` and `report` read them: `val_curve` an array
// of objects with numbers `step` and `val_bpc` (and `parts`, if given, an object of numbers),
// `loss_curve` an array of objects with numbers `tokens_consumed` and `train_loss`; either may be
// absent. The first key that is not so, by its full path ("val_curve[3].val_bpc"), with what it
// should be ("a number") and whether it is missing; nullopt when both curves are sound. Of a
// complete record with evaluations, also `final_val_bpc` its last `val_bpc`.
struct RecordDefect {
  std::string key;
  std::string want;
  bool missing = false;
};
std::optional<RecordDefect> curve_defect(const nlohmann::json& record);
// A record's facts of how it ran, where given: `device` and `kernels` strings, `world_size` and
// `pass_seqs` whole numbers >= 1, `optimizer_sharded` true or false, `train_seconds`,
// `wall_seconds` numbers >= 0 and `final_val_bpc` a number > 0. The first that is not so; nullopt
// when all are.
std::optional<RecordDefect> run_facts_defect(const nlohmann::json& record);
// A record's plan against itself, where the keys are given: activation_rate = active_params /
// total_params (in (0, 1]), compute = flops_per_token · tokens_consumed, tokens_consumed =
// steps · batch_seqs · arch.seq_len, 1 <= tokens_unique <= tokens_consumed, epochs =
// tokens_consumed / tokens_unique (relative 1e-9: `run` writes them from one another). A hand
// edit that breaks one would put a point at another r_a or C in the report and the audit.
std::optional<RecordDefect> plan_defect(const nlohmann::json& record);
// `moeplan run` writes and finds a point's record at runs/<point_id>/record.json: a record in
// another folder (copied or renamed) would be shown, audited or skipped as another point. Throws
// InputError naming the file, its point_id and the folder.
void check_point_folder(const std::string& point_id, const std::filesystem::path& record_file);

// {"by_category": {category: {phase: count}}, "elementwise": count, "total": count}
nlohmann::json flop_ledger_to_json(const FlopLedger& ledger);
// Every category and phase must be present, and no other (elementwise, informational, may be
// left out); throws InputError naming `where` (the file) and the key after `prefix` (the
// ledger's place in the file, e.g. "measured.flops.").
FlopLedger flop_ledger_from_json(const nlohmann::json& j, const std::string& where,
                                 const std::string& prefix = "");

}  // namespace moeplan
