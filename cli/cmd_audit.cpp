// `moeplan audit`: check published claim tables (--claims, --spec) or our own runs (runs/).
#include <algorithm>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/audit/audit_tables.hpp"
#include "moeplan/audit/io.hpp"
#include "moeplan/audit/quantity.hpp"
#include "moeplan/audit/render.hpp"
#include "moeplan/audit/runs_io.hpp"

namespace moeplan::cli {
namespace {

struct AuditFlags {
  std::string runs_dir;
  std::string plan;
  std::vector<std::string> claims;
  std::string spec;
  std::string format;  // "" = from -o's extension, else the terminal table
  std::string out;
  std::string tolerance;           // "" = the spec's or 0.01; "0.01" or "1%"
  std::vector<std::string> equal;  // a claim from the command line: these equal across the rows
                                   // (each given --equal may hold a comma-separated list)
  std::string baseline;            // ... measured against this row ("table:3" or a row label)
  bool strict_reuse = false;
  std::vector<std::string> where;  // Q=V or Q=LO:HI: the claim keeps only rows that match
  std::vector<std::string> rows;   // table, table:3 or table:2-5: the claim covers only these
};

// "--where compute=2.86e21" or "--where ra_pct=5:25": a spec's `where`, from the command line.
audit::WhereClause parse_where_flag(const std::string& text) {
  const size_t eq = text.find('=');
  const auto meaning =
      eq == std::string::npos ? std::nullopt : audit::column_meaning(text.substr(0, eq));
  if (!meaning)
    throw InputError(fmt::format(
        "--where '{}' is not QUANTITY=VALUE or QUANTITY=LOW:HIGH with a quantity moeplan knows "
        "(e.g. --where ra_pct=5:25 or --where compute=2.86e21)",
        text));
  const std::string value = text.substr(eq + 1);
  audit::WhereClause w{meaning->quantity, {}, {}, {}};
  const std::string what = fmt::format("--where {}", text);
  if (const size_t colon = value.find(':'); colon != std::string::npos) {
    w.lower = meaning->scale * parse_quantity(value.substr(0, colon), what);
    w.upper = meaning->scale * parse_quantity(value.substr(colon + 1), what);
    if (*w.lower > *w.upper)
      throw InputError(
          fmt::format("--where '{}': the low bound is above the high one; write "
                      "LOW:HIGH",
                      text));
  } else {
    w.equals = meaning->scale * parse_quantity(value, what);
  }
  return w;
}

// The command line's claim (--equal, --baseline, --strict-reuse) over every row of every table:
// the common question "do these rows really share N and C?" without writing a spec.
audit::ClaimSpec command_line_claim(const AuditFlags& f) {
  using namespace moeplan::audit;
  ClaimSpec c;
  std::string names;
  std::vector<std::string> items;
  for (const std::string& given : f.equal) {
    // Split here, not by CLI11, which drops an empty item ("N," reads as "N").
    for (size_t start = 0;;) {
      const size_t comma = given.find(',', start);
      std::string item = given.substr(start, comma - start);  // to the end when there is none
      const size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
      items.push_back(a == std::string::npos ? "" : item.substr(a, b - a + 1));  // "N, C" reads
      if (items.back().empty())
        throw InputError(fmt::format(
            "--equal '{}' has an empty item; give quantities separated by commas, e.g. --equal N,C",
            given));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  for (const std::string& item : items) {
    const auto meaning = column_meaning(item);
    if (!meaning)
      throw InputError(fmt::format(
          "--equal {}: not a quantity moeplan knows; give paper headers or code names, e.g. "
          "--equal N,C,D_hat or --equal total_params,compute,tokens_unique",
          item));
    if (std::find(c.equal.begin(), c.equal.end(), meaning->quantity) != c.equal.end())
      throw InputError(fmt::format("--equal names {} twice ({}); give each quantity once",
                                   meaning->quantity, item));
    c.equal.push_back(meaning->quantity);
    names += fmt::format("{}{}", names.empty() ? "" : ", ", item);
  }
  c.strict_reuse = f.strict_reuse;
  std::string filters;
  for (const std::string& given : f.rows)
    for (size_t start = 0;;) {
      const size_t comma = given.find(',', start);
      c.rows.push_back(parse_row_selector(given.substr(start, comma - start), "--rows"));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  if (!f.rows.empty()) filters += fmt::format(" of {}", fmt::join(f.rows, ","));
  for (const std::string& w : f.where) {
    c.where.push_back(parse_where_flag(w));
    filters += fmt::format(" where {}", w);
  }
  if (!f.baseline.empty()) c.baseline = parse_baseline(f.baseline, "--baseline");
  if (c.strict_reuse && !c.baseline)
    throw InputError("--strict-reuse needs --baseline ROW (the dense run whose D̂ every row uses)");
  c.name =
      fmt::format("every row{} {}{}{}", filters, names.empty() ? "" : "equal in " + names,
                  c.strict_reuse ? (names.empty() ? "" : ", ") + std::string("strict reuse") : "",
                  c.baseline ? fmt::format(" (baseline {})", f.baseline) : "");
  return c;
}

int run_audit(const AuditFlags& f) {
  namespace fs = std::filesystem;
  using namespace moeplan::audit;
  const ReportFormat format = report_format_for(f.format, f.out);  // refuse a bad -o first
  const std::optional<double> tolerance =
      f.tolerance.empty() ? std::nullopt
                          : std::optional(parse_tolerance(f.tolerance, "--tolerance"));
  AuditReport report;
  const bool cli_claim = !f.equal.empty() || !f.baseline.empty() || f.strict_reuse ||
                         !f.where.empty() || !f.rows.empty();
  if (!f.runs_dir.empty()) {
    if (!f.claims.empty() || !f.spec.empty())
      throw InputError("give either a runs folder or --claims/--spec, not both");
    if (cli_claim)
      throw InputError(
          "--equal, --baseline, --strict-reuse, --where and --rows go with --claims tables; a runs "
          "folder is audited for equal N, C and D̂ against its dense baseline already");
    RunsAuditOptions opt;
    // Given, it is every tolerance of the audit: the manifest's n_tolerance and
    // compute_tolerance (which --plan brings in otherwise) do not quietly replace it.
    if (tolerance) opt.tolerance = *tolerance, opt.n_tolerance = opt.compute_tolerance = *tolerance;
    report = audit_runs_dir(f.runs_dir, f.plan, opt);
  } else {
    if (!f.plan.empty())
      throw InputError("--plan goes with a runs folder: moeplan audit runs/ --plan sweep.toml");
    if (f.claims.empty() && f.spec.empty())
      throw InputError(
          "nothing to audit: give a runs folder, --claims TABLE.csv or --spec claims.toml");
    AuditSpec spec;
    fs::path spec_dir = ".";
    if (!f.spec.empty()) {
      spec = load_spec(f.spec);
      spec_dir =
          fs::path(f.spec).has_parent_path() ? fs::path(f.spec).parent_path() : fs::path(".");
    } else {
      spec.source = "(no spec)";
    }
    // Given, it is every tolerance of the audit, as for runs: a claim's or a table's own
    // tolerance in the spec does not quietly keep a looser one (--tolerance 0.5% left a claim
    // of tolerance = 0.02 holding at +1 %).
    if (tolerance) {
      spec.tolerance = *tolerance;
      for (ClaimSpec& c : spec.claims) c.tolerance.reset();
      for (TableSpec& t : spec.tables) t.tolerance.reset();
    }
    std::vector<fs::path> files(f.claims.begin(), f.claims.end());
    const std::vector<ClaimTable> tables = load_claim_tables(files, spec, spec_dir);
    if (cli_claim) {
      if (f.equal.empty() && !f.strict_reuse)
        throw InputError(fmt::format("{} needs a claim: --equal N,C (or --strict-reuse)",
                                     !f.baseline.empty() ? "--baseline"
                                     : !f.where.empty()  ? "--where"
                                                         : "--rows"));
      spec.claims.push_back(command_line_claim(f));
    }
    report = audit_tables(tables, spec);
    // Equal N and C without D̂ is two of the three resources: the verdict says which it tested,
    // and this says what it did not, and whether the tables could tell. For the command line's
    // claim whatever it tests; for a spec's, where it claims equal N or C.
    const bool readable =
        std::any_of(tables.begin(), tables.end(),
                    [](const ClaimTable& t) {
                      return t.has_column("tokens_unique") || t.has_column("epochs");
                    }) ||
        std::any_of(spec.tables.begin(), spec.tables.end(), [](const TableSpec& t) {
          return t.shared.count("tokens_unique") > 0 || t.shared.count("epochs") > 0;
        });
    bool noted = false;
    for (size_t i = 0; i < spec.claims.size(); ++i) {
      const ClaimSpec& c = spec.claims[i];
      const bool from_cli = cli_claim && i + 1 == spec.claims.size();
      auto claims = [&](const char* q) {
        return std::find(c.equal.begin(), c.equal.end(), q) != c.equal.end();
      };
      if (c.strict_reuse || claims("tokens_unique")) continue;
      if (!from_cli && !claims("total_params") && !claims("compute")) continue;
      const std::string remedy =
          !readable  ? "no table prints D̂ (a D_hat column, or Epoch beside D) and no spec states "
                       "it, so these tables cannot show it; a spec's [tables.NAME.shared] can state "
                       "a value the paper gives in its text"
          : from_cli ? "add --strict-reuse (every row's D̂ the baseline's) or --equal D_hat to "
                       "test it"
                     : "add strict_reuse = true (every row's D̂ the baseline's) or \"D_hat\" to "
                       "its equal list to test it";
      report.findings.push_back(
          {Severity::info,
           "",
           0,
           "tokens_unique",
           {},
           {},
           {},
           0,
           fmt::format("claim '{}' does not test equal unique data D̂, the third equal resource: {}",
                       c.name, remedy)});
      noted = true;
    }
    if (noted) report.sort_findings();
  }
  const std::string text = render(report, format);
  if (f.out.empty()) {
    fmt::print("{}", format == ReportFormat::table ? for_terminal(text) : text);
  } else {
    write_file_atomic(f.out, text);
    fmt::print("{}: {} claims, {}; written to {}\n",
               report.all_hold() ? "all claims hold" : "a claim fails", report.claims.size(),
               fmt::format("{} findings", report.findings.size()), f.out);
  }
  return exit_status(report);
}

const bool registered = register_command(
    {"audit", "Verify equal-resource claims: published tables (--claims) or our own runs", 40,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<AuditFlags>();
       app.add_option("runs", f->runs_dir, "Folder of run records (runs/<point>/record.json)")
           ->check(non_empty_path("folder name"));
       app.add_option("--plan", f->plan, "Manifest (sweep.toml) the runs were planned from")
           ->check(non_empty_path("file name"));
       app.add_option("--claims", f->claims, "Claim table (CSV); repeat for several tables")
           ->check(non_empty_path("file name"));
       app.add_option("--spec", f->spec, "Claim spec (TOML, schema = 1): shared values and claims")
           ->check(non_empty_path("file name"));
       app.add_option("--format", f->format,
                      "Output: table (terminal, the default), json or md; with -o, the extension "
                      "says it");
       app.add_option("-o,--out,--output", f->out,
                      "Write the report to this file (atomically): .json, .md or .txt")
           ->check(non_empty_path("file name"));
       app.add_option("--tolerance", f->tolerance,
                      "Relative tolerance, 0.01 or 1% (default 0.01, or the spec's; for runs/, "
                      "equal N and C default to the manifest's n_tolerance and "
                      "compute_tolerance, from --plan or else as the records carry them); "
                      "given, every tolerance of the audit, the spec's per-claim and per-table "
                      "ones included")
           ->check(non_empty_value());
       app.add_option("--equal", f->equal,
                      "Claim: these quantities are equal across every row (N,C,D_hat or "
                      "total_params,compute,...)");
       app.add_option("--baseline", f->baseline,
                      "The row --equal is measured against: a row label or table:row")
           ->check(non_empty_value());
       app.add_flag("--strict-reuse", f->strict_reuse,
                    "Claim: every row's unique data D̂ is the baseline's (data reuse)");
       app.add_option("--where", f->where,
                      "Claim over the rows whose quantity matches: Q=VALUE (within tolerance) "
                      "or Q=LOW:HIGH (repeatable), e.g. compute=2.86e21 with --equal N; not a "
                      "quantity the claim tests");
       app.add_option("--rows", f->rows,
                      "Claim over these rows only: TABLE, TABLE:ROW or TABLE:FIRST-LAST, "
                      "comma-separated (the table name is its file name without .csv)");
       app.footer(
           "Exit status: 0 every claim holds, 1 a claim fails, 2 unusable input.\n"
           "Examples: moeplan audit --spec examples/audit-paper/claims.toml\n"
           "          moeplan audit --claims table.csv --equal N,C --baseline dense-1b");
       CLI::Option* format = app.get_option("--format");
       return [f, format] {
         if (format->count() > 0 && f->format.empty())
           throw InputError("--format '' is not known; use table, json or md");
         return run_audit(*f);
       };
     }});

}  // namespace
}  // namespace moeplan::cli
