#pragma once
// `moeplan run --nproc N`: this machine's data-parallel ranks started by moeplan itself, as
// torchrun would start them. Each rank is this executable again (/proc/self/exe) with WORLD_SIZE,
// RANK, LOCAL_RANK and a fresh MOEPLAN_NCCL_ID_FILE of its own job in the environment. The
// launcher forwards SIGINT/SIGTERM to every rank (they agree on the step to stop at), and when one
// rank fails it stops the others, which would otherwise wait in NCCL for it forever.
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace moeplan::backend {

struct LaunchRequest {
  int nproc = 2;
  // Empty: nproc data-parallel ranks of one job, as above. Else `moeplan run --points-at-once`:
  // one worker process each, independent of the others (no rank variables; its stdout kept),
  // with CUDA_VISIBLE_DEVICES set to its entry and MOEPLAN_POINTS_WORKER to "w/K"; a failed
  // worker does not stop the others, whose points have nothing to wait for. nproc is unused.
  std::vector<std::string> worker_devices;
  std::vector<std::string> args;           // the ranks' arguments (without the program name)
  const std::atomic<int>* stop = nullptr;  // set by the caller's signal handler: forwarded
  double grace_seconds = 10;  // after a rank fails, how long the others get to end by themselves
  std::function<void(const std::vector<pid_t>&)> on_started;  // the ranks' pids, in rank order
};

struct LaunchOutcome {
  int status = 0;        // 0; 130 when interrupted; 3 when a process left points to another;
                         // else the first failed rank's (128+signal if killed)
  int failed_rank = -1;  // the first rank (or worker) that failed (not interrupted), or -1
  std::string failure;   // one line saying so, empty when none failed
};

// "GPU 2" or "GPUs 2,3": a worker's CUDA_VISIBLE_DEVICES as its lines and failure name it.
std::string gpus_named(const std::string& devices);

// Refuses (InputError, one line) an nproc below 2 (ranks) or fewer than 2 workers, and a
// WORLD_SIZE already in the environment.
LaunchOutcome launch_ranks(const LaunchRequest& request);

}  // namespace moeplan::backend
