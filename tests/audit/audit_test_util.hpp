#pragma once
// Helpers shared by the audit tests: find a finding, load a fixture.
#include <algorithm>
#include <string>
#include <vector>

#include "moeplan/audit/finding.hpp"

namespace moeplan::audit::test {

inline std::string fixture(const std::string& name) {
  return std::string(MOEPLAN_SOURCE_DIR) + "/tests/audit/fixtures/" + name;
}

inline std::vector<const Finding*> matching(const std::vector<Finding>& fs, Severity s,
                                            const std::string& table, int row,
                                            const std::string& quantity) {
  std::vector<const Finding*> out;
  for (const Finding& f : fs)
    if (f.severity == s && f.table == table && f.row == row && f.quantity == quantity)
      out.push_back(&f);
  return out;
}

inline size_t count(const std::vector<Finding>& fs, Severity s) {
  return size_t(
      std::count_if(fs.begin(), fs.end(), [&](const Finding& f) { return f.severity == s; }));
}

inline const ClaimVerdict* claim(const AuditReport& r, const std::string& name) {
  for (const ClaimVerdict& c : r.claims)
    if (c.name == name) return &c;
  return nullptr;
}

}  // namespace moeplan::audit::test
