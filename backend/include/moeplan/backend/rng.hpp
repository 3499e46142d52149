#pragma once
// A small, portable, seedable generator (SplitMix64). The standard distributions are not
// specified bit for bit across library versions, so data order and the corpus use this instead.
#include <cstdint>

namespace moeplan::backend {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) without modulo bias (rejection of the short top range).
  uint64_t below(uint64_t bound) {
    const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % bound);
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % bound;
  }
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

// Derive an independent seed from a base seed and a stream number (e.g. the epoch index).
inline uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  SplitMix64 g(seed ^ (0xD1B54A32D192ED03ull * (stream + 1)));
  g.next();
  return g.next();
}

}  // namespace moeplan::backend
