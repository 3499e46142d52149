#pragma once
// runs/<point-id>/record.json, schema 1 (the contract in the project notes RECORD.md): the plan
// it ran, the measured FLOP and token ledgers, loss curves, time. Built here, written atomically.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "moeplan/backend/checkpoint.hpp"
#include "moeplan/planner/plan.hpp"

namespace moeplan::backend {

// Non-vocabulary parameters counted from the tensors the engine allocated, under the Arch's
// counting readings (router / norms inside N or not).
struct MeasuredParams {
  int64_t total_params = 0;
  int64_t active_params = 0;
  int64_t trainable = 0;  // every allocated scalar, vocabulary included
};

struct RecordInputs {
  const Plan* plan = nullptr;
  const nlohmann::json* plan_json = nullptr;
  const RunState* state = nullptr;
  std::string status;  // "running" | "complete"
  std::string device;
  std::string kernels;  // Engine::kernels() of the run that wrote the record
  // What that run asked for: --kernels as given ("" for auto, which resolves per point: head
  // width, experts, GPU) and --threads (0: the default, which resolves per point on the cpu).
  // Points run under one request are timed against each other whatever each resolved to.
  std::string kernels_requested;
  int threads_requested = 0;
  int world_size = 1;   // data-parallel ranks (devices) of the run that wrote the record
  int64_t pass_seqs = 0;  // sequences of one forward/backward pass on a rank (Engine::pass_seqs)
  bool optimizer_sharded = false;  // AdamW moments split over the data-parallel ranks
  // Engine::memory_use() of the run that wrote the record (rank 0's; 0: none, as on a cpu):
  // the most its buffers held at once in this session so far, and its device's size.
  std::size_t device_memory_peak = 0, device_memory_total = 0;
  // Engine::peak_flops_per_second() of the run that wrote the record, or the peak that run was
  // given (RunOptions::peak_tflops; peak_given), 0: not known. With the state's hardware one
  // kind, the record gives its MFU against it and says which (peak_source).
  double peak_flops_per_second = 0;
  bool peak_given = false;
  MeasuredParams params;
  nlohmann::json data;  // source description and split sizes
  nlohmann::json train;  // the manifest's [train] settings the point ran with (seed, aux losses)
  int64_t checkpoint_every = 0, eval_every = 0, eval_tokens = 0;
  // The manifest's n_tolerance and compute_tolerance (0: not known): what the sweep calls equal
  // N and C, so that report and audit judge a folder of records as the manifest would.
  double n_tolerance = 0, compute_tolerance = 0;
  // The manifest's equal_resources (false: not planned as one equal-resource sweep).
  bool equal_resources = true;
};

nlohmann::json make_record(const RecordInputs& in);

}  // namespace moeplan::backend
