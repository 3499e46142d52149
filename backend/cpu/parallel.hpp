#pragma once
// Below this many scalar operations a loop runs on one thread: waking the team costs more than
// the work, and much more on a loaded machine. Chunks are static, so results never depend on it.
#include <cstdint>

namespace moeplan::backend::cpu {
inline constexpr int64_t kParallelWork = int64_t(1) << 15;

// A model whose residual stream (tokens × d_model) is smaller than this runs its whole step on
// one thread: even Eigen's products would otherwise split work of a few microseconds.
inline constexpr int64_t kParallelStream = int64_t(1) << 16;

// Caps OpenMP and Eigen at one thread for the lifetime of the guard when `serial`. Both: once
// --threads has called Eigen::setNbThreads, Eigen no longer reads the OpenMP count, and a small
// model's products ran threaded (~190x slower a step at 2 threads, and other bits).
class SerialScope {
 public:
  explicit SerialScope(bool serial);
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int previous_ = 0, previous_eigen_ = 0;
};
}  // namespace moeplan::backend::cpu
