#pragma once
// Data parallelism across the GPUs of one machine: one process per GPU, NCCL underneath. Ranks
// find each other as torchrun users expect: RANK, WORLD_SIZE and LOCAL_RANK from the environment,
// and a shared file through which rank 0 hands out the NCCL unique id.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moeplan/accounting/ledger.hpp"

namespace moeplan::backend::cuda {

struct RankInfo {
  int rank = 0, world_size = 1, local_rank = 0;
  bool local_rank_given = false;  // LOCAL_RANK was set (else local_rank is RANK, one machine)
};
// Reads RANK / WORLD_SIZE / LOCAL_RANK (all absent: a single process, rank 0 of 1). Throws
// InputError on a malformed or inconsistent value, naming it: RANK or LOCAL_RANK without
// WORLD_SIZE, or WORLD_SIZE above 1 without RANK.
RankInfo rank_from_env();

// Windows of the unique budget that a rank reads: r, r+W, r+2W, ... (no window read twice across
// ranks). Returns how many of `windows` fall to `rank`.
int64_t windows_of_rank(int64_t windows, int rank, int world_size);
inline int64_t window_of_rank(int64_t i, int rank, int world_size) {
  return int64_t(rank) + i * int64_t(world_size);
}
// Sequences of `rank`: those of rank, rank+W, rank+2W, … below batch (ranks below batch mod W
// hold one more than the others; the model weighs each rank by its share). Throws InputError
// when the batch has fewer sequences than there are ranks.
int64_t rank_batch(int64_t batch, const RankInfo& rank);
// A rank's share of a global batch of `batch` sequences of `seq_len` tokens (row-major): the
// sequences rank, rank+W, rank+2W, … copied into out (windows_of_rank of them; none when the
// batch has fewer sequences than the rank's number).
void take_rank_share(std::vector<int32_t>& out, const int32_t* global, int64_t batch,
                     int64_t seq_len, const RankInfo& rank);

class Communicator {
 public:
  // Rank 0 writes the unique id to `id_file` atomically; the others wait for it (up to
  // timeout_seconds). Once all have joined, rank 0 removes the file (the next communicator of
  // the job cannot pick up this one's id); a file left by a crashed job can still mislead a rank
  // that starts before rank 0, so give each job its own MOEPLAN_NCCL_ID_FILE or MASTER_PORT.
  // Binds the process to GPU local_rank.
  Communicator(const RankInfo& info, const std::string& id_file, double timeout_seconds = 120);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const RankInfo& info() const;
  // In place on device memory, ordered by NCCL (deterministic for a fixed world size).
  void all_reduce_sum(float* device_data, int64_t n);
  // On `stream` (a cudaStream_t; the default stream when null): the gradients' all-reduce beside
  // the backward runs on a stream of its own (Model::set_reduce_overlap).
  void all_reduce_mean(float* device_data, int64_t n, void* stream = nullptr);
  void all_reduce_sum(double* device_data, int64_t n);
  void all_reduce_sum(int64_t* device_data, int64_t n);
  // In place over W·chunk floats: this rank's chunk (elements rank·chunk …) becomes the mean
  // over ranks of that chunk; the rest is left undefined.
  void reduce_scatter_mean(float* device_data, int64_t chunk);
  // In place over W·chunk floats: every rank's chunk (at rank·chunk) is copied to all ranks.
  void all_gather(float* device_data, int64_t chunk);
  // `root`'s n floats at device_data are copied to every rank's device_data.
  void broadcast(float* device_data, int64_t n, int root);
  // Host convenience for small counters (token ledger, FLOP ledger): copies through the device.
  void all_reduce_sum_host(int64_t* host_data, int64_t n);
  void all_reduce_sum_host(double* host_data, int64_t n);
  // The ledger summed over ranks, with `extra` counters in the same all-reduce.
  void all_reduce_sum_host(FlopLedger& ledger, std::vector<int64_t*> extra = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::backend::cuda
