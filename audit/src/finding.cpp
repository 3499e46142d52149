#include "moeplan/audit/finding.hpp"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

namespace moeplan::audit {

std::string_view name(Severity s) {
  switch (s) {
    case Severity::error:
      return "error";
    case Severity::warning:
      return "warning";
    case Severity::info:
      return "info";
  }
  return "?";
}

bool AuditReport::all_hold() const {
  return std::all_of(claims.begin(), claims.end(), [](const ClaimVerdict& c) { return c.holds; });
}

void AuditReport::sort_findings() {
  std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
    return std::tie(a.severity, a.table, a.row, a.quantity) <
           std::tie(b.severity, b.table, b.row, b.quantity);
  });
}

std::string row_ref(const std::string& table, int row) {
  return fmt::format("{}:{}", table, row);
}

std::string AuditReport::label(const std::string& table, int row) const {
  const auto it = row_labels.find(table);
  if (it == row_labels.end() || row < 1 || size_t(row) > it->second.size()) return "";
  return it->second[size_t(row) - 1];
}

}  // namespace moeplan::audit
