#pragma once
// Text helpers the test programs share.
#include <cstddef>
#include <string>

namespace moeplan::test {

// How often `needle` occurs in `hay` (overlapping occurrences each counted).
inline size_t occurrences(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace moeplan::test
