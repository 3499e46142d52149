#pragma once
// Where a step's time goes, phase by phase (Engine::set_profiling): the times of named phases
// added up over the steps counted, each name in the order first seen. The cpu model times a
// phase on the host, the cuda model between CUDA events; both keep their totals here.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moeplan::backend {

struct PhaseTimes {
  std::vector<std::pair<std::string, double>> ms;  // milliseconds by phase, first-seen order
  int64_t steps = 0;

  void add(const char* name, double milliseconds) {
    auto it = std::find_if(ms.begin(), ms.end(), [&](const auto& p) { return p.first == name; });
    if (it == ms.end())
      ms.emplace_back(name, milliseconds);
    else
      it->second += milliseconds;
  }
  // The mean milliseconds a step by phase (the totals while no step has been counted).
  std::vector<std::pair<std::string, double>> per_step() const {
    std::vector<std::pair<std::string, double>> out = ms;
    for (auto& p : out) p.second /= double(std::max<int64_t>(1, steps));
    return out;
  }
};

}  // namespace moeplan::backend
