#pragma once
// A run's checkpoint: everything needed to continue bit for bit. One file, written atomically:
//   "MOEPCKP2" | u64 n | run-state JSON (n bytes) | u64 n | model state | u64 n | window
//   permutation (int32) | u64 n | touched-window bitmap (uint64) | u64 XXH3-64 of all before
// "MOEPCKP1" files (the same sections, FNV-1a as the checksum) are still read.
// The model state (weights, Adam moments and step, RNG) is the engine's save_state() verbatim.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeplan/accounting/ledger.hpp"
#include "moeplan/backend/data.hpp"
#include "moeplan/backend/token_ledger.hpp"

namespace moeplan::backend {

// How a run's steps were laid out over devices and passes from one step on: the data-parallel
// ranks, the --micro-batch asked for (0: one pass), the CPU threads (0: not a CPU run, or not
// recorded), whether the AdamW state was sharded over the ranks (--shard-optimizer: the
// gradient norm then sums per chunk) and the kernels the engine chose (Engine::kernels(); "" not
// recorded). They change only at a resume under `moeplan run --elastic`; RunState::layouts keeps
// each, the first from step 0.
struct Layout {
  int64_t from_step = 0;
  int64_t world_size = 0;
  int64_t micro_batch_seqs = 0;
  int64_t threads = 0;
  bool optimizer_sharded = false;
  std::string kernels;
  bool operator==(const Layout&) const = default;
};

// The run loop's position and everything it has measured so far.
struct RunState {
  int64_t step = 0;  // optimizer steps completed
  TokenLedger tokens;
  WindowOrder order;
  FlopLedger train_flops;  // sum of the steps' measured products
  FlopLedger eval_flops;   // validation passes (not part of C)
  int64_t dropped_assignments = 0;
  nlohmann::json loss_curve = nlohmann::json::array();
  nlohmann::json val_curve = nlohmann::json::array();
  // train_seconds when each val_curve entry was taken: kept apart from the curve, which is the
  // same bits run to run where the clock is not. Shorter than val_curve after a resume from a
  // checkpoint written before it was kept (its evaluations have no time; the record then gives
  // none).
  std::vector<double> val_seconds;
  double loss_sum_since_log = 0;  // for the mean train loss of the next loss_curve entry
  int64_t steps_since_log = 0;
  double train_seconds = 0, eval_seconds = 0;  // wall clock, summed over resumes
  int64_t resumes = 0;
  // --micro-batch of the run (0: one pass a step; also what checkpoints written before passes
  // existed read as, since they ran one pass). A resume must run the same passes.
  int64_t micro_batch_seqs = 0;
  // The --device that trained it ("" in checkpoints written before it was kept). A point's
  // times and throughput are one device's, so a resume runs on the same device.
  std::string device;
  // CPU threads its products ran with (0: not recorded, or not a CPU run): another count may
  // sum in another order, so a resume keeps it.
  int64_t threads = 0;
  // --kernels as asked for (nullopt in checkpoints written before it was kept) and as the engine
  // chose them (Engine::kernels()): a resume runs the same kernels, or the record's `kernels`
  // would name only the last part's.
  std::optional<std::string> kernels_requested;
  std::string kernels;
  // Data-parallel ranks that trained it (0 in checkpoints written before it was kept): a step's
  // passes and the record's rates are that many devices', so a resume runs on as many.
  int64_t world_size = 0;
  // --shard-optimizer (nullopt in checkpoints written before it was kept): the sharded step sums
  // the gradient norm in another order, so a resume keeps it.
  std::optional<bool> optimizer_sharded;
  // The hardware each session trained on (Engine::hardware(), "unknown" where the engine could
  // not tell), in order, a session on the same hardware as the one before not repeated; empty in
  // checkpoints written before it was kept. A resume on other hardware adds it: the record's
  // times are then a mix, and the report says so and compares them with no other point's.
  std::vector<std::string> hardware;
  // Each layout the run trained in, in order: empty while it is the one it started in (the
  // fields above), else every one from step 0 on (Layout). The steps after an elastic resume sum
  // in another order, so the run is not the bit-for-bit continuation of an uninterrupted one.
  std::vector<Layout> layouts;
};

struct Checkpoint {
  nlohmann::json plan;   // the plan it was made for (a resume under another plan is refused)
  nlohmann::json train;  // the [train] settings it trained with (null in older checkpoints)
  nlohmann::json data;   // fingerprints of the tokens it trained on (null in older checkpoints)
  RunState state;
  std::vector<char> model_state;
};

// What a resume must match, read without the model state.
struct CheckpointHead {
  nlohmann::json plan, train;
  int64_t step = 0;
  int64_t micro_batch_seqs = 0;
  std::string device;
  int64_t threads = 0;
  std::optional<std::string> kernels_requested;
  std::optional<bool> optimizer_sharded;
  int64_t world_size = 0;
};

// Layouts as JSON objects {from_step, world_size, micro_batch, threads, optimizer_sharded,
// kernels}, as checkpoints and records keep them; from_json refuses what is not that (InputError
// naming the entry).
nlohmann::json layouts_to_json(const std::vector<Layout>& layouts);
std::vector<Layout> layouts_from_json(const nlohmann::json& j);

// Written from where the parts lie (the model state is not copied), atomically.
void write_checkpoint(const std::filesystem::path& path, const Checkpoint& ckpt);
// Throws InputError naming the file when it is unreadable, corrupt (checksum, truncated) or of
// another format. Holds the file's bytes once: each section is read into where it is kept.
Checkpoint read_checkpoint(const std::filesystem::path& path);
// The same checks over the whole file (every byte read and checksummed, every section's length),
// keeping only the head: what `moeplan run` checks of every point before the first trains, in
// memory of the head's size rather than the weights' and optimizer's.
CheckpointHead read_checkpoint_head(const std::filesystem::path& path);

}  // namespace moeplan::backend
