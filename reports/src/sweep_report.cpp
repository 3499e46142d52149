#include "moeplan/reports/sweep_report.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/units.hpp"
#include "moeplan/planner/equal_resource.hpp"
#include "moeplan/reports/text_table.hpp"
#include "moeplan/sweeps/escape.hpp"
#include "moeplan/sweeps/grid.hpp"
#include "moeplan/sweeps/manifest_io.hpp"

namespace moeplan {

namespace {

std::string pct(double fraction) {
  return fmt::format("{:.2f}%", 100 * fraction);
}

// The convention with the counting readings that change M: "paper (router in)" under
// --count-router. The readings are the sweep's (every point shares the dense baseline's).
std::string label_of(const Plan& p) {
  return flops_label(p.arch, p.convention, p.mask);
}

TextTable sweep_table(const Manifest& m) {
  const std::string conv = label_of(m.dense);
  TextTable t;
  using A = TextTable::Align;
  t.add_column("", A::left);
  t.add_column("id", A::left);
  t.add_column("architecture", A::left);
  t.add_column("N");
  t.add_column("N_a");
  t.add_column("r_a");
  t.add_column("target");
  t.add_column(fmt::format("M [{}]", conv));
  t.add_column(fmt::format("C [{}]", conv));
  t.add_column("D consumed");
  t.add_column("D̂ unique");
  t.add_column("epochs");
  t.add_column("TPP consumed");
  t.add_column("D' effective");
  t.add_column("η");
  t.add_column("batch (seqs)");
  t.add_column("steps");
  auto row = [&](const Plan& p) {
    // A point planned under another convention than the dense baseline says so in its cell.
    const std::string own = label_of(p) == conv ? "" : fmt::format(" [{}]", label_of(p));
    t.add_row({p.reachable ? "" : "!", p.id, describe(p.arch), human(double(p.counts.total_params)),
               human(double(p.counts.active_params)), pct(p.counts.activation_rate()),
               p.role == "dense" ? "dense" : pct(p.activation_rate_target),
               human(p.flops_per_token) + own, human(p.budget.compute) + own,
               human(double(p.budget.tokens_consumed)), human(double(p.budget.tokens_unique)),
               ratio(p.budget.epochs, 2), ratio(p.budget.tokens_per_param, 1), human(p.budget.effective_data),
               fmt::format("{:.3g}", p.hyper.lr_peak), std::to_string(p.budget.batch_seqs),
               std::to_string(p.budget.steps)});
  };
  row(m.dense);
  for (const Plan& p : m.points) row(p);
  return t;
}

std::string preamble(const Manifest& m, const char* bullet) {
  const Plan& d = m.dense;
  int short_of_unique = 0;  // strict reuse points that consume fewer tokens than D̂ (notes say)
  for (const Plan& p : m.points)
    short_of_unique += p.budget.tokens_unique != d.budget.tokens_unique;
  const std::string reuse =
      d.budget.reuse == Reuse::strict
          ? fmt::format("strict reuse: {} trains on the same {} unique tokens{}",
                        short_of_unique
                            ? fmt::format("every point but {} (see the notes)", short_of_unique)
                            : std::string("every point"),
                        human(double(d.budget.tokens_unique)),
                        // a --unique-tokens above what the baseline consumes, capped
                        notes_unique_tokens_cap(d) ? " (see the dense baseline's note)" : "")
          : fmt::format(
                "loose reuse: every point sees its own unique data {:.3g} times (epochs = D "
                "/ D̂; D̂ differs per point, as D does)",
                d.budget.epochs);
  int flagged = 0, standing_for = 0;
  for (const Plan& p : m.points) {
    flagged += !p.reachable;
    standing_for += stands_for_unreachable_rates(p);
  }
  std::string out =
      m.equal_resources
          ? std::string()
          : fmt::format("{}NOT an equal-resource sweep (equal_resources = false): its points "
                        "are not held to one N, C or D̂; compare them with `moeplan audit`\n",
                        bullet);
  out += fmt::format(
      "{}family {}, N target {} ({}), r_a within ±{} points; {} point{} + dense "
      "baseline{}{}\n",
      bullet, m.family, human(m.n_target),
      // The bound the contract holds an equal-resource manifest to (not a sweep of unequal
      // points, which is held to none).
      m.equal_resources ? fmt::format("every point within ±{}% of the dense baseline's N",
                                      percent_text(m.n_tolerance, 1))
                        : fmt::format("n_tolerance ±{}%, not held", percent_text(m.n_tolerance, 1)),
      percent_text(m.ra_tolerance), m.points.size(), m.points.size() == 1 ? "" : "s",
      flagged ? fmt::format(", {} flagged (!)", flagged) : "",
      standing_for
          ? fmt::format("; {} point{} also stand{} for asked rates not reachable (see "
                        "the notes)",
                        standing_for, standing_for == 1 ? "" : "s", standing_for == 1 ? "s" : "")
          : "");
  const double spread = compute_spread(m);
  // Few, large steps round coarsely; say so where the rounding alone breaks the C tolerance.
  const std::string over =
      m.compute_tolerance > 0 && spread > m.compute_tolerance
          ? fmt::format(", ABOVE the sweep's tolerance of {:.1f}%: too few steps to round finely",
                        100 * m.compute_tolerance)
          : "";
  if (m.equal_resources)
    out += fmt::format(
        "{}compute C target = {} FLOPs [{}] for every point (each point's C rounds to whole "
        "steps: spread {:.3f}%{}); {}\n",
        bullet, human(d.budget.compute_target), label_of(d), 100 * spread, over, reuse);
  else
    out += fmt::format(
        "{}compute C target of the dense baseline = {} FLOPs [{}]; C spread "
        "{:.3f}%\n",
        bullet, human(d.budget.compute_target), label_of(d), 100 * spread);
  // A learning-rate sweep's manifest (grid --lr-scale) says so where its η column is shown: the
  // column alone reads as the step law's.
  std::vector<std::string> rules{d.hyper.rule};
  for (const Plan& p : m.points)
    if (std::find(rules.begin(), rules.end(), p.hyper.rule) == rules.end())
      rules.push_back(p.hyper.rule);
  if (rules != std::vector<std::string>{"step-law"}) {
    std::string text;  // from a hand-editable file: shown as text
    for (const std::string& r : rules) text += (text.empty() ? "" : ", ") + printable(r);
    out += fmt::format("{}η rule: {}\n", bullet, text);
  }
  return out;
}

// The plans' notes, one line each: a manifest is a hand-editable file, so its ids and notes are
// shown as text, control characters as \xNN (and in Markdown, escaped).
std::string notes(const Manifest& m, const char* bullet, bool markdown) {
  auto text = [&](const std::string& s) {
    return markdown ? escape_markdown(printable(s)) : printable(s);
  };
  std::string out;
  if (!m.dense.note.empty())
    out += fmt::format("{}  {}: {}\n", bullet, text(m.dense.id), text(m.dense.note));
  for (const Plan& p : m.points)
    if (!p.reachable || !p.note.empty())
      out +=
          fmt::format("{}{} {}: {}\n", bullet, p.reachable ? " " : "!", text(p.id), text(p.note));
  return out;
}

std::string num(double v) {
  return fmt::format("{}", v);
}

}  // namespace

std::string manifest_to_csv(const Manifest& m) {
  std::string out =
      "id,role,description,total_params,active_params,activation_rate,activation_rate_target,"
      "convention,flops_per_token,compute,compute_rel_diff,tokens_consumed,tokens_unique,epochs,"
      "tokens_per_param,effective_data,lr_peak,batch_seqs,steps,warmup_steps,reachable,note\n";
  auto row = [&](const Plan& p) {
    out += fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(p.id),
        p.role, csv_field(describe(p.arch)), p.counts.total_params, p.counts.active_params,
        num(p.counts.activation_rate()), num(p.activation_rate_target), csv_field(label_of(p)),
        num(p.flops_per_token), num(p.budget.compute), num(p.budget.compute_rel_diff),
        p.budget.tokens_consumed, p.budget.tokens_unique, num(p.budget.epochs),
        num(p.budget.tokens_per_param), num(p.budget.effective_data), num(p.hyper.lr_peak),
        p.budget.batch_seqs, p.budget.steps, p.hyper.warmup_steps, p.reachable ? "true" : "false",
        csv_field(p.note));
  };
  row(m.dense);
  for (const Plan& p : m.points) row(p);
  return out;
}

std::string render_manifest(const Manifest& m, Format f) {
  switch (f) {
    case Format::table: {
      std::string out = preamble(m, "");
      out += "\n";
      out += sweep_table(m).render();
      const std::string n = notes(m, "", false);
      if (!n.empty()) {
        out += "\n";
        out += n;
      }
      return out;
    }
    case Format::md: {
      std::string out = preamble(m, "- ");
      out += "\n";
      out += sweep_table(m).render_markdown();
      const std::string n = notes(m, "- ", true);
      if (!n.empty()) {
        out += "\nNotes:\n\n";
        out += n;
      }
      return out;
    }
    case Format::csv:
      return manifest_to_csv(m);
    case Format::json:
      // created_by may hold a file name that is not UTF-8: U+FFFD for such bytes, not exit 70.
      return manifest_to_json(m).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
             "\n";
    case Format::toml:
      return manifest_to_toml(m);
  }
  return "";
}

}  // namespace moeplan
