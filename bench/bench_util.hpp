#pragma once
// What the benchmarks share: their positional arguments, read whole or refused with the usage
// line (exit 2; atoi read "abc" as 0 and a repeat count of 0 crashed on an empty median), and
// the median.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace moeplan::bench {

// The median: the middle value, or the mean of the two middle values of an even count.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Positional arguments of `usage` ("bench_x [points=10000] [repeats=7]"): --help prints it and
// exits 0; more arguments than `count`, or one that is not a number in its range, print one line
// naming it and the usage, and exit 2.
class Args {
 public:
  Args(int argc, char** argv, std::string usage, int count)
      : argc_(argc), argv_(argv), usage_(std::move(usage)) {
    for (int i = 1; i < argc; ++i)
      if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
        std::printf("usage: %s\n", usage_.c_str());
        std::exit(0);
      }
    if (argc - 1 > count)
      refuse(fmt::format("{} arguments given, it takes at most {}", argc - 1, count));
  }
  [[noreturn]] void refuse(const std::string& why) const {
    std::fprintf(stderr, "%s: %s (usage: %s)\n", argv_[0], why.c_str(), usage_.c_str());
    std::exit(2);
  }
  // Argument i (1-based), a whole number in [lo, hi], or `dflt` when not given.
  int64_t integer(int i, int64_t dflt, int64_t lo, int64_t hi) const {
    if (i >= argc_) return dflt;
    const std::string_view s(argv_[i]);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi)
      refuse(fmt::format("argument {} is '{}'; give a whole number from {} to {}", i, s, lo, hi));
    return v;
  }
  // Argument i, a number in [lo, hi] ("2e9" allowed), or `dflt`.
  double real(int i, double dflt, double lo, double hi) const {
    if (i >= argc_) return dflt;
    char* end = nullptr;
    const double v = std::strtod(argv_[i], &end);
    if (end == argv_[i] || *end != '\0' || !(v >= lo && v <= hi))
      refuse(fmt::format("argument {} is '{}'; give a number from {} to {}", i, argv_[i], lo, hi));
    return v;
  }
  std::string text(int i, std::string dflt) const { return i < argc_ ? argv_[i] : dflt; }

 private:
  int argc_;
  char** argv_;
  std::string usage_;
};

}  // namespace moeplan::bench
