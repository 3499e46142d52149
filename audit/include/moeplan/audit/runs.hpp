#pragma once
// Audit of our own runs (pure): each record's measured ledgers against its plan, every residual
// explained by ledger category through accounting's lens(), and the equal-resource claims (N, C,
// D̂) across the sweep and its dense baseline. Record format (schema 1): docs/running.md,
// "runs/<point-id>/".
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/ledger.hpp"
#include "moeplan/audit/finding.hpp"
#include "moeplan/planner/plan.hpp"

namespace moeplan::audit {

// What one runs/<point>/record.json says: the plan it ran and what it measured.
struct RunRecord {
  std::string source;  // file, for messages
  // The manifest's n_tolerance and compute_tolerance, as `run` wrote them (absent in older
  // records): a runs folder audited without --plan is held to its own sweep's tolerances.
  std::optional<double> n_tolerance, compute_tolerance;
  // The manifest's equal_resources (absent in older records): false for an ablation or a test.
  std::optional<bool> equal_resources;
  std::string point_id;
  std::string status;  // "complete" | "running"
  Plan plan;           // the plan embedded in the record
  nlohmann::json plan_json;  // as written: compared whole with a manifest's point (--plan)
  bool has_measured = false;
  int64_t total_params = 0, active_params = 0;  // counted from the allocated tensors
  AttentionMask executed_mask = AttentionMask::causal;
  FlopLedger ledger;                          // training FLOPs by category and phase
  FlopCount ledger_total = 0;                 // the record's own "total" (exact)
  std::map<std::string, double> conventions;  // the record's lens() figures, by label
  // The validation passes' ledger (forward only, not part of C) and the number of passes
  // (val_curve's length); absent (false / -1) in older records.
  bool has_validation_ledger = false;
  FlopLedger validation_ledger;
  FlopCount validation_total = 0;
  int64_t evaluations = -1;
  int64_t tokens_consumed = 0, tokens_unique = 0, tokens_dropped = 0;
  double epochs = 0;
  // The record's summary of them, which `moeplan report` shows: held to the counts above.
  int64_t steps = 0;         // measured.steps
  double compute_paper = 0;  // measured.compute.paper: C [paper] of its ledger
  // What it read: the [train] source, its description and the held-out tokens each validation
  // pass scored (empty / -1 in records that do not say).
  std::string data_source, data_description;
  int64_t validation_tokens = -1;
  // Fingerprints of the tokens read (backend token_fingerprint; empty in older records).
  std::string training_fingerprint, validation_fingerprint;
  // The [train] settings it trained with, each value as JSON text ("1234", "\"alibi\""), without
  // those that change no result (checkpoint_every, device). Empty in records older than them.
  std::map<std::string, std::string> train;
  // The device it trained on ("cpu", "cuda"; empty in records that do not say): what its ledger
  // may hold beyond the model's products (the cpu engine executes no padding and no recompute).
  std::string device;
};

// Parse record.json text. Throws InputError naming the file and the missing or mistyped key.
RunRecord parse_run_record(std::string_view json_text, std::string source);

// A [train] table as JSON text (a record's "train", a manifest's) to RunRecord::train's form.
std::map<std::string, std::string> settings_from_text(std::string_view train_json_text);

struct RunsAuditOptions {
  double tolerance = 0.01;                  // relative, for planned-vs-measured FLOPs
  std::optional<double> n_tolerance;        // equal N across the sweep (manifest's, else tolerance)
  std::optional<double> compute_tolerance;  // equal C across the sweep (manifest's, else tolerance)
  std::map<std::string, std::string> manifest_train;  // the manifest's [train], as RunRecord::train
};

// `planned`: the manifest's points (dense baseline included, role "dense"), or empty to audit
// each record against the plan it carries.
AuditReport audit_runs(const std::vector<RunRecord>& records, const std::vector<Plan>& planned,
                       const RunsAuditOptions& options);

}  // namespace moeplan::audit
