#pragma once
// Manifest I/O: sweep.toml (schema = 1) and JSON. Reading checks every key's presence and type
// and that each point's stored counts, M and budget agree with what its arch implies.
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeplan/planner/plan.hpp"
#include "moeplan/sweeps/manifest.hpp"

namespace moeplan {

// Throws InputError naming the file, the key and what is expected (missing or mistyped key,
// unknown key, inconsistent values such as a total_params that its arch does not give).
Manifest read_manifest(const std::filesystem::path& path);
Manifest manifest_from_toml_string(const std::string& text, const std::string& origin);

// The [train] settings against every point's shape (positions = "rope" needs an even head_dim):
// what the manifest reader and grid check, so that `run` does not find it out only when the
// point's model is built, after the points before it trained. InputError names the point.
void check_train_fits_points(const Manifest& m, const std::string& origin);

// `moeplan grid --train KEY=VALUE ...`: the [train] settings of a manifest from the command line,
// checked as the manifest reader checks them (strings as written; numbers as parse_quantity
// reads them, 64k and 1e-2 included; a later KEY=VALUE replaces an earlier one). InputError
// names the assignment and what would be valid.
void apply_train_settings(TrainSettings& settings, const std::vector<std::string>& assignments);

// Temp file in the same folder, fsync, rename: a crash never leaves a half-written manifest.
void write_manifest_atomic(const Manifest& manifest, const std::filesystem::path& path);
std::string manifest_to_toml(const Manifest& manifest);

// JSON with the code names of ACCOUNTING.md (total_params, activation_rate, flops_per_token, ...).
nlohmann::json plan_to_json(const Plan& plan);
nlohmann::json manifest_to_json(const Manifest& manifest);
// The [train] settings (the manifest's JSON and each run record carry them).
nlohmann::json train_to_json(const TrainSettings& train);
// Those of a [train] JSON object that decide what training computes: all but where checkpoints
// fall and the manifest's default device. What a record or checkpoint must match to count as
// trained under a manifest's settings, and what the audit compares across points.
nlohmann::json result_settings(nlohmann::json train_json);
// Empty when `stored` (a record's or checkpoint's plan JSON) is `wanted` (the manifest's
// plan_to_json), else the first value that differs by its key, "plan.arch.d_model = 8.5 (the
// manifest: 96)" (a value past 80 characters cut short), and " and N more" when others do. The
// plan's note (the planner's words about it) is not compared.
std::string plan_differ(const nlohmann::json& stored, const nlohmann::json& wanted);

}  // namespace moeplan
