#pragma once
// Training one sweep point end to end: data, engine, ledgers, checkpoints, the run record.
// The CLI (`moeplan run`) loops over a manifest's points and prints the progress this reports.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeplan/backend/engine.hpp"
#include "moeplan/backend/model.hpp"
#include "moeplan/planner/plan.hpp"
#include "moeplan/sweeps/manifest.hpp"

namespace moeplan::backend {

struct Progress {
  std::string point_id;
  int64_t step = 0, steps = 0;
  int64_t tokens_consumed = 0;
  double train_loss = 0;  // latest step
  double tokens_per_second = 0;   // consumed tokens over this session's training time (its wall
                                  // time less its evaluations)
  double flops_per_second = 0;    // the training ledger (exact/causal) over the same time
  // The maker's dense peak of the job's devices together (Engine::peak_flops_per_second() times
  // the ranks), or the one RunOptions::peak_tflops gave (peak_given); 0 when not known:
  // flops_per_second over it is the session's MFU.
  double peak_flops_per_second = 0;
  bool peak_given = false;
  double eta_seconds = 0;
  bool evaluated = false;  // a validation pass just finished
  double val_bpc = 0;
};

struct RunOptions {
  std::filesystem::path out_dir = "runs";
  std::string device = "cpu";
  int64_t checkpoint_every = 0;  // 0: the manifest's [train] value, else about 20 per run
  int threads = 0;
  std::filesystem::path source_base;  // relative source paths are read from here (source_from)
  std::string kernels;                               // EngineRequest::kernels
  int64_t micro_batch_seqs = 0;  // ModelOptions::micro_batch_seqs (0: one pass a step)
  bool shard_optimizer = false;  // EngineRequest::shard_optimizer
  // A checkpoint made with other data-parallel ranks, --micro-batch passes, optimizer sharding,
  // kernels or CPU threads resumes (RunState::layouts keeps each layout; not the bit-for-bit
  // continuation) instead of being refused.
  bool elastic = false;
  // The data-parallel ranks the run will have, where known before an engine is built (the
  // launcher's --nproc, a rank's WORLD_SIZE, else 1): a checkpoint of another count is refused
  // with its other checks (check_resumable). 0: not known; the engine's count is checked.
  int64_t ranks = 0;
  // > 0: one device's peak in TFLOP/s that MFU is measured against (`--peak-tflops`), in place of
  // Engine::peak_flops_per_second(): for a CPU or a GPU whose peak moeplan does not know, or a
  // device run below its maker's clocks. The record says the peak was given.
  double peak_tflops = 0;
  // The manifest's n_tolerance and compute_tolerance, written into each record (0: not known).
  double n_tolerance = 0, compute_tolerance = 0;
  // The manifest's equal_resources: false for an ablation or a test, which report says.
  bool equal_resources = true;
  std::function<void(const Progress&)> on_progress;  // called after every step
  std::function<void(const std::string&)> on_engine;  // once a point's engine is built: describe()
  // A line the user should read before the point trains (on rank 0): e.g. that an interrupted
  // point's checkpoint is gone and it trains again from step 0.
  std::function<void(const std::string&)> on_notice;
  const std::atomic<int>* stop = nullptr;  // non-zero: checkpoint at the next step and return
  // > 0: do not train the point; time this many steps (after one warm-up step, on the point's
  // first batches) and one evaluation on a fresh model, write nothing, and return the projected
  // time of the point's remaining steps (PointStatus::estimated).
  int64_t estimate_steps = 0;
  // With estimate_steps: then time as many steps again phase by phase (Engine::set_profiling),
  // into Estimate::phases. Needs an engine with phases (Engine::has_phases: cpu and cuda have).
  bool profile = false;
};

// What run_point measured for RunOptions::estimate_steps.
struct Estimate {
  bool interrupted = false;     // Ctrl-C before the timing ended: nothing else is set
  int64_t steps_timed = 0;      // at most the plan's steps
  int64_t steps_remaining = 0;  // the plan's steps less those a record says are done
  int64_t evals_remaining = 0;  // evaluations those steps will run
  double step_seconds = 0;      // median of the timed steps
  double eval_seconds = 0;      // one evaluation
  int64_t tokens_per_step = 0;  // consumed
  double flops_per_step = 0;    // the step's ledger, [exact/causal] as the progress line
  double peak_flops_per_second = 0;  // as Progress's: the job's devices together, 0 unknown
  bool peak_given = false;           // as Progress's
  // Engine::memory_use() after the timed steps and the evaluation (0: a device without memory of
  // its own): the most its buffers held, and the device's size, in bytes.
  std::size_t memory_peak = 0, memory_device = 0;
  // RunOptions::profile: the mean milliseconds a step by phase over steps_profiled more steps (on
  // cuda the phases then run one after another, without the step's overlaps, so their sum may
  // exceed step_seconds).
  std::vector<std::pair<std::string, double>> phases;
  int64_t steps_profiled = 0;
  double seconds() const {
    return double(steps_remaining) * step_seconds + double(evals_remaining) * eval_seconds;
  }
};

// busy: another process holds the point's lock (is training it); this run left it alone.
enum class PointStatus { completed, skipped, interrupted, estimated, busy };
struct PointOutcome {
  PointStatus status = PointStatus::completed;
  int64_t resumed_from_step = -1;  // -1: started fresh
  std::filesystem::path record_path;
  nlohmann::json record;  // the record as written (or as found, when skipped)
  bool wrote_files = true;  // false on data-parallel ranks other than 0 (rank 0 writes)
  Estimate estimate;        // PointStatus::estimated
  // PointStatus::interrupted: the step of the point's checkpoint (-1: none yet, stopped before
  // its first step; a stop right after a checkpoint writes none again).
  int64_t checkpoint_step = -1;
};

// The training loss became NaN or infinite. what() is one line naming the point and the step.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The CPU threads a point's products run on under these options (cpu_threads_for on its pass
// of --micro-batch sequences, or its whole batch): what its checkpoint records.
int cpu_threads_of(const Plan& plan, const RunOptions& options);

// The WORLD_SIZE of a data-parallel job this process is a rank of (torchrun's variable, or
// --nproc's), or nullopt when it runs alone (unset, empty or "1").
std::optional<std::string> data_parallel_world();

// Throws InputError (one line) when the plan is internally inconsistent: counts that do not
// follow from the Arch, M that does not follow from Arch + convention, D ≠ steps·B·S, ...
void check_plan_consistent(const Plan& plan);

// The record an earlier run left in out_dir/<point>/record.json, or null when there is none.
// Throws InputError (one line) when it is unreadable or was made from another plan, other
// [train] settings or other sweep-wide settings (opt's tolerances and equal_resources): run_point
// refuses such a folder rather than mix two runs in it.
nlohmann::json existing_record(const Plan& plan, const nlohmann::json& plan_json,
                               const TrainSettings& train, const RunOptions& opt);
// What to do about a point's record that cannot stand: "remove only record.json to resume from
// '<checkpoint>' (step N), which rebuilds it, or move the point's folder away ..." when its
// checkpoint is readable and made for this plan and settings, else the move alone.
std::string record_remedy(const Plan& plan, const nlohmann::json& plan_json,
                          const TrainSettings& train, const std::filesystem::path& out_dir);

// Throws InputError (one line) when what is at out_dir/<id> would stop the point when its turn
// comes: its folder or checkpoint/ a file or one this process cannot write into, its .lock a
// folder or a file it cannot open, an id too long to be a folder name. Checked before any point
// trains.
void check_point_folder(const std::filesystem::path& out_dir, const std::string& id);

// For a point of the sweep that this run does not train (`--point` chose another): throws
// InputError (one line) when its record was trained with other [train] settings or written under
// other sweep-wide settings (opt's tolerances, equal_resources), or another process holds its
// lock training under other [train] settings (another plan for that point alone is its own
// run's to refuse). `run --point` of a sweep with another seed trained into a folder another
// seed's run was using, and the folder held two sweeps. A damaged record is left to the run
// that trains the point.
void check_sibling_point(const Plan& plan, const TrainSettings& train, const RunOptions& opt);

// Throws InputError (one line) when another process holds the point's lock training another
// plan or other [train] settings (a second sweep started into the same --out before the first
// wrote a record); the same point of the same sweep is left to it, as before.
void check_point_lock(const Plan& plan, const nlohmann::json& plan_json, const TrainSettings& train,
                      const std::filesystem::path& out_dir);

// The correctness ladder's rung 3, every step (BACKEND.md): a step's FLOP ledger equals the
// analytic `exact` count of the same routing (the routed assignments the step reports, the ERC
// products when on), category by category and phase by phase, to the FLOP. `padding` and
// `recompute` (what a device executes beyond the model's products) are left aside. Throws
// std::logic_error naming the step, the first category and phase that differ and both counts: a
// mismatch is a bug in the backend, not noise.
void check_step_ledger(const Arch& arch, int64_t batch_seqs, bool erc_loss, const StepResult& r,
                       int64_t step);

// Throws InputError (one line, as the point's resume would) when the point's checkpoint was made
// under another plan, [train] settings, --device or --micro-batch, or is damaged (checksum). The
// source's fingerprints are compared when the point resumes.
void check_resumable(const Plan& plan, const nlohmann::json& plan_json, const TrainSettings& train,
                     const RunOptions& options);

// `plan_json` is the manifest's JSON form of the plan; it is stored in the record and in the
// checkpoint, and a record or checkpoint made for a different plan is refused, never mixed.
PointOutcome run_point(const Plan& plan, const nlohmann::json& plan_json,
                       const TrainSettings& train, const RunOptions& options);

// Throws InputError (one line, the same as the point's own start would) when the [train] source
// holds fewer tokens than the plan's D̂ + 1 and its validation set: run before any point trains,
// so that a later point the source cannot feed does not fail after earlier ones have trained.
void check_source_fits(const Plan& plan, const TrainSettings& train,
                       const std::filesystem::path& source_base = {});

// Throws InputError (one line, exit 2) when a pending point's model does not fit the device in
// its passes (check_fit: the cuda device builds each model as its engine would, then frees it),
// naming each point that does not, the most sequences a pass that fit it, and the --micro-batch
// under which every point fits; run before the first point trains. Returns each point's fit by
// its id, with an estimate's (options.estimate_steps) most that fit up to the rank's share;
// nothing for a device with no fit check (cpu, whose memory is checked otherwise).
std::map<std::string, PassFit> check_points_fit(const std::vector<const Plan*>& pending,
                                                const TrainSettings& train,
                                                const RunOptions& options);

// Throws InputError (as a point's own start would) when a file source holds a token outside a
// pending point's vocabulary in the tokens it would read, run before the first trains, so that a
// bad token in a later point's longer region does not stop the sweep after earlier points
// trained. `pending` in training order: what the first point reads it checks itself, first
// thing; of the rest each region is read once (the largest covers the others).
void check_source_tokens(const std::vector<const Plan*>& pending, const TrainSettings& train,
                         const std::filesystem::path& source_base = {});

// Validation set size and cadence actually used for a plan (auto rules when the manifest says 0).
int64_t eval_windows_for(const Plan& plan, const TrainSettings& train);
int64_t eval_every_for(const Plan& plan, const TrainSettings& train);

}  // namespace moeplan::backend
