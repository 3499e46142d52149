#pragma once
// An audit report as text: a terminal summary (verdict per claim, then findings by severity),
// JSON ({"schema":1, "claims":[...], "findings":[...]}) and Markdown.
#include <string>
#include <string_view>

#include "moeplan/audit/finding.hpp"

namespace moeplan::audit {

enum class ReportFormat { table, json, md };
// "table" (terminal), "json", "md"; throws InputError otherwise.
ReportFormat parse_report_format(std::string_view s);
// The format of a report written to `output` ("" = the terminal): the extension says it (.json,
// .md, .txt = terminal text); `format_flag` ("" = not given) must agree with it, and decides for a
// name without an extension. Without -o, the flag or the terminal table. Throws InputError for an
// unknown extension or a contradiction.
ReportFormat report_format_for(std::string_view format_flag, std::string_view output);

std::string render_terminal(const AuditReport& report);
std::string render_json(const AuditReport& report);
std::string render_markdown(const AuditReport& report);
std::string render(const AuditReport& report, ReportFormat format);

// A number as the tables print them: 4.717e9, 6.48e9, 92.88, 8.44e-4 (4 significant digits).
std::string sci(double v);
// A relative difference as a signed percentage, "+0.62%"; one beyond `tol` gets the decimals it
// takes to print beyond it (a 1.0035 % gap against 1 % is "+1.004%", not "+1.00%").
std::string pct_against(double rel, double tol);

}  // namespace moeplan::audit
