#include "moeplan/audit/row_checks.hpp"

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/hyper.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/audit/quantity.hpp"
#include "moeplan/audit/render.hpp"
#include "moeplan/audit/row_values.hpp"

namespace moeplan::audit {

namespace {

struct Comparison {
  double expected = 0, found = 0, rel_diff = 0;
  bool within_rounding = false, within_tolerance = false;
};

// Within rounding: the difference is no larger than the printed value's half-unit plus the
// rounding carried by the inputs of the expected value.
Comparison compare(const RowValue& found, double expected, double expected_rel_band, double tol) {
  Comparison c;
  c.expected = expected;
  c.found = found.value;
  c.rel_diff = expected != 0 ? (found.value - expected) / expected : 0;
  const double allowed =
      found.abs_band() + std::fabs(expected) * expected_rel_band + 1e-12 * std::fabs(expected);
  c.within_rounding = std::fabs(found.value - expected) <= allowed;
  // Exactly at the tolerance is within it (claims.cpp's within(): 1 % on paper is
  // 0.010000000000000009 in doubles).
  c.within_tolerance = c.within_rounding || std::fabs(c.rel_diff) <= tol * (1 + 1e-9);
  return c;
}

std::string show(const std::string& q, double v) {
  if (q == "activation_rate") return fmt::format("{:.2f}%", 100.0 * v);
  return sci(v);
}

// A row's value as the table printed it (RowValue::printed_as), else as show() gives it.
std::string shown(const std::string& q, const RowValue& v) {
  const std::string t = v.printed_as(q);
  return t.empty() ? show(q, v.value) : t;
}

class RowChecker {
 public:
  RowChecker(const ClaimTable& t, const TableSpec* spec, double tol, std::vector<Finding>& out)
      : t_(t), spec_(spec), tol_(tol), out_(out) {}

  void add(Severity s, int row, const std::string& q, std::optional<double> expected,
           std::optional<double> found, std::optional<double> rel, std::string msg) {
    out_.push_back(Finding{s, t_.name, row, q, expected, found, rel, tol_, std::move(msg)});
  }

  // A check cannot run: with a spec entry that is unusable input, without one it is skipped.
  bool need(bool have, const std::string& check, const std::string& what) {
    if (have) return true;
    // A spec entry that gives part of the shape must give all a check needs; a table with no
    // shape at all (e.g. only N and C) simply has no shape checks.
    if (spec_ && has_shape_info())
      throw InputError(
          fmt::format("table '{}' ({}): checking {} needs {}; give it as a column or under "
                      "[tables.{}.shared] in the spec",
                      t_.name, t_.source, check, what, t_.name));
    skipped_.insert(fmt::format("{} (needs {})", check, what));
    return false;
  }

  bool has_shape_info() const {
    static const char* kShape[] = {"layers",  "d_model", "heads",    "d_ffn",       "head_dim",
                                   "experts", "top_k",   "d_expert", "dense_layers"};
    for (int i = 0; i < int(t_.rows.size()); ++i) {
      const RowView r(t_, i, spec_);
      for (const char* q : kShape)
        if (r.printed(q)) return true;
    }
    return false;
  }

  // found ≈ expected, else a finding: info beyond rounding, error beyond tolerance.
  void identity(const RowView& r, const std::string& q, const RowValue& found, double expected,
                double expected_band, const std::string& formula) {
    const Comparison c = compare(found, expected, expected_band, tol_);
    if (c.within_rounding) return;
    const std::string what =
        fmt::format("{} = {}{}", symbol(q), shown(q, found),
                    found.source == "published" ? "" : " (" + found.source + ")");
    if (c.within_tolerance)
      add(Severity::info, r.row(), q, expected, found.value, c.rel_diff,
          fmt::format("{} vs {} = {}: {} — beyond the printed rounding, within tolerance", what,
                      formula, show(q, expected), pct_against(c.rel_diff, tol_)));
    else
      add(Severity::error, r.row(), q, expected, found.value, c.rel_diff,
          fmt::format("{} but {} = {}: {} off", what, formula, show(q, expected),
                      pct_against(c.rel_diff, tol_)));
  }

  void run() {
    duplicate_labels();
    for (int i = 0; i < int(t_.rows.size()); ++i) check_row(RowView(t_, i, spec_));
    reading_consistency();
    if (!skipped_.empty()) {
      std::string list;
      for (const std::string& s : skipped_) list += (list.empty() ? "" : "; ") + s;
      add(Severity::info, 0, "", {}, {}, {},
          spec_ ? fmt::format("skipped, the table gives no shape (no layers, d_model, ... as "
                              "columns or shared values): {}",
                              list)
                : fmt::format("skipped without a spec entry for this table: {}", list));
    }
  }

 private:
  enum class Reading { out, in, both, neither };

  // A label two rows of a table share names neither (a baseline by it is refused): one warning.
  void duplicate_labels() {
    std::map<std::string, std::vector<int>> rows_of;
    for (size_t i = 0; i < t_.labels.size(); ++i)
      if (!t_.labels[i].empty()) rows_of[t_.labels[i]].push_back(int(i) + 1);
    for (const auto& [label, rows] : rows_of) {
      if (rows.size() < 2) continue;
      std::string list;
      for (int row : rows) list += fmt::format("{}{}:{}", list.empty() ? "" : ", ", t_.name, row);
      add(Severity::warning, 0, "", {}, {}, {},
          fmt::format("label '{}' names {} rows ({}); findings name them by number, and a "
                      "baseline by this label is refused",
                      label, rows.size(), list));
    }
  }

  void check_row(const RowView& r) {
    check_dense_row(r);
    check_params(r);
    check_flops(r);
    check_simple(r);
    check_step_law(r);
  }

  // A dense row (experts printed as 0, or blank in a row whose shape is known) says nothing of
  // its own that is MoE: whatever else the table prints, with or without a shape (it was
  // checked only beside an N, N_a, r_a or D/N column and a whole shape, so a row of M with
  // top_k = 2 was read as dense in silence).
  void check_dense_row(const RowView& r) {
    const Cell* experts = r.printed("experts");
    if (experts ? experts->value != 0 : !r.shape().known()) return;
    const auto& own = t_.rows[size_t(r.row() - 1)];
    auto cell = [&](const char* q) -> const Cell* {
      const auto it = own.find(q);
      return it == own.end() ? nullptr : &it->second;
    };
    // Its own cells: what the spec shares is for the table's MoE rows.
    std::string moe_fields;
    auto say = [&](const std::string& f) { moe_fields += (moe_fields.empty() ? "" : ", ") + f; };
    for (const char* q : {"top_k", "d_expert", "d_shared"})
      if (const Cell* c = cell(q); c && c->value != 0) say(fmt::format("{} = {}", q, c->text));
    const Cell* layers = r.printed("layers");
    if (const Cell* c = cell("dense_layers"); c && layers && c->value != layers->value)
      say(fmt::format("dense_layers = {} of {} layers", c->text, layers->text));
    if (!moe_fields.empty())
      throw InputError(fmt::format(
          "table '{}' row {}: experts = {} makes it a dense model, but it gives {}; a dense row "
          "leaves the MoE fields blank (or 0) and has dense_layers = layers, an MoE row has "
          "experts >= 1",
          t_.name, r.row(), experts ? experts->text : "(not given)", moe_fields));
  }

  // N, N_a, r_a (and D/N when N is not printed) against the shape, router out and in.
  void check_params(const RowView& r) {
    static const char* kParams[] = {"total_params", "active_params", "activation_rate",
                                    "tokens_per_param"};
    bool any = false;
    for (const char* q : kParams) any = any || r.has(q);
    if (!any) return;
    const auto published_n = r.value("total_params", {"activation_rate"});
    // r_a against printed N_a / N (N printed or derived from D and D/N, never from r_a itself):
    // a check of the printed values alone, with or without a shape.
    if (const auto ra = r.value("activation_rate"); ra && ra->source == "published") {
      const auto na = r.value("active_params");
      if (na && na->source == "published" && published_n)
        identity(r, "activation_rate", *ra, na->value / published_n->value,
                 na->rel_band + published_n->rel_band,
                 fmt::format("N_a / N (N {})", published_n->source == "published"
                                                   ? "printed"
                                                   : "from " + published_n->source));
    }
    // N_a is part of N: a row of more active than total parameters (beyond both roundings) has
    // an r_a above 1, which no claim on r_a may take as a value.
    if (const auto na = r.value("active_params", {"activation_rate"}); na && published_n) {
      const double band = na->rel_band + published_n->rel_band;
      if (na->value > published_n->value * (1 + band))
        add(Severity::error, r.row(), "active_params", published_n->value, na->value,
            na->value / published_n->value - 1,
            fmt::format(
                "N_a = {} is above N = {}{}: the active parameters are part of the total "
                "(r_a = N_a / N is at most 1)",
                show("active_params", na->value), show("total_params", published_n->value),
                published_n->source == "published" ? "" : " (" + published_n->source + ")"));
    }
    const ShapeResolution& sh = r.shape();
    std::string missing;
    for (const std::string& m : sh.missing) missing += (missing.empty() ? "" : ", ") + m;
    if (!need(sh.known(), "N, N_a, r_a against the shape", missing)) return;
    // Parameter counts do not read S or V: a table that prints neither is still checked.
    Arch shape = sh.arch;
    if (!sh.has_seq_len) shape.seq_len = 1;
    if (!sh.has_vocab) shape.vocab = 2;
    try {
      validate(shape);
    } catch (const InputError& e) {
      throw InputError(fmt::format("table '{}' row {}: {}", t_.name, r.row(), e.what()));
    }
    Arch out = shape, in = shape;
    in.count_router = true;
    const ParamCounts po = count_params(out), pi = count_params(in);
    for (const char* q : kParams) {
      if (!r.printed(q)) continue;
      const auto found = r.value(q);
      double eo = 0, ei = 0, band = 0;
      const std::string sq = q;
      if (sq == "total_params")
        eo = double(po.total_params), ei = double(pi.total_params);
      else if (sq == "active_params")
        eo = double(po.active_params), ei = double(pi.active_params);
      else if (sq == "activation_rate")
        eo = po.activation_rate(), ei = pi.activation_rate();
      else {  // D/N: only against the shape when N itself is not printed
        if (r.printed("total_params")) continue;
        const Cell* d = r.printed("tokens_consumed");
        if (!d) continue;
        eo = d->value / double(po.total_params), ei = d->value / double(pi.total_params);
        band = d->rel_half_width();
      }
      const Comparison co = compare(*found, eo, band, tol_), ci = compare(*found, ei, band, tol_);
      Reading reading = co.within_rounding && ci.within_rounding ? Reading::both
                        : co.within_rounding                     ? Reading::out
                        : ci.within_rounding                     ? Reading::in
                                                                 : Reading::neither;
      // D/N inherits D's wide rounding: it never decides which reading a table uses.
      if (sq != "tokens_per_param") readings_[sq][r.row()] = {reading, *found, eo, ei, band};
      const bool in_nearer = std::fabs(ci.rel_diff) < std::fabs(co.rel_diff);
      const Comparison& near = in_nearer ? ci : co;
      const char* near_name = in_nearer ? "router in" : "router out";
      if (reading != Reading::neither) continue;
      const std::string head =
          fmt::format("{} = {}; the shape gives {} (router out) or {} (router in)", symbol(sq),
                      shown(sq, *found), show(sq, eo), show(sq, ei));
      if (near.within_tolerance)
        add(Severity::info, r.row(), sq, near.expected, found->value, near.rel_diff,
            fmt::format("{}: nearest {} at {}, beyond the printed rounding, within tolerance", head,
                        near_name, pct_against(near.rel_diff, tol_)));
      else
        add(Severity::error, r.row(), sq, near.expected, found->value, near.rel_diff,
            fmt::format("{}: no reading fits; nearest {} is {} off", head, near_name,
                        pct_against(near.rel_diff, tol_)));
    }
  }

  // The rows of one table should count the router the same way; the paper's convention says out.
  void reading_consistency() {
    for (const auto& [q, rows] : readings_) {
      std::vector<int> in_rows, out_rows;
      for (const auto& [row, rd] : rows) {
        if (rd.reading == Reading::in) in_rows.push_back(row);
        if (rd.reading == Reading::out) out_rows.push_back(row);
      }
      auto list = [](const std::vector<int>& v) {
        std::string s;
        for (int x : v) s += fmt::format("{}{}", s.empty() ? "" : ", ", x);
        return s;
      };
      if (!in_rows.empty() && !out_rows.empty()) {
        // The minority reading is the odd one out; on a tie, flag the rows that count the router.
        const bool flag_in = in_rows.size() <= out_rows.size();
        for (int row : flag_in ? in_rows : out_rows) {
          const ReadingRow& rd = rows.at(row);
          const double expected = flag_in ? rd.expected_out : rd.expected_in;
          add(Severity::error, row, q, expected, rd.found.value,
              (rd.found.value - expected) / expected,
              fmt::format("{} = {} counts the router {} (fits {}), but rows {} count it {}: the "
                          "rows are not comparable as printed",
                          symbol(q), show(q, rd.found.value), flag_in ? "in" : "out",
                          show(q, flag_in ? rd.expected_in : rd.expected_out),
                          list(flag_in ? out_rows : in_rows), flag_in ? "out" : "in"));
        }
      } else if (!in_rows.empty()) {
        add(Severity::warning, 0, q, {}, {}, {},
            fmt::format("{} counts the router weights (D_m·E per MoE layer) in rows {}; the paper "
                        "convention leaves them out — compare {} across tables under one reading",
                        symbol(q), list(in_rows), symbol(q)));
      }
    }
  }

  // M against every convention, training and forward.
  void check_flops(const RowView& r) {
    const auto m = r.value("flops_per_token");
    if (!m) return;
    const ShapeResolution& sh = r.shape();
    std::string missing;
    for (const std::string& x : sh.missing) missing += (missing.empty() ? "" : ", ") + x;
    if (!sh.has_seq_len) missing += std::string(missing.empty() ? "" : ", ") + "seq_len";
    if (!sh.has_vocab) missing += std::string(missing.empty() ? "" : ", ") + "vocab";
    if (!need(missing.empty(), "M against the FLOP conventions", missing)) return;
    struct Candidate {
      std::string label;
      Convention conv;
      AttentionMask mask;
      FlopsKind kind;
      double value;
    };
    std::vector<Candidate> cands;
    auto add_conv = [&](const Arch& a, Convention c, AttentionMask mk, const std::string& extra) {
      const FlopsPerToken f = flops_per_token(a, c, mk);
      const std::string label = convention_label(c, mk) + extra;
      cands.push_back({label + " training", c, mk, FlopsKind::training, f.total});
      cands.push_back({label + " forward", c, mk, FlopsKind::forward, f.forward});
    };
    Arch out = sh.arch, in = sh.arch;
    in.count_router = true;
    const bool moe = sh.arch.moe_layers() > 0;
    add_conv(out, Convention::paper, AttentionMask::full, moe ? " (router out)" : "");
    if (moe) add_conv(in, Convention::paper, AttentionMask::full, " (router in)");
    add_conv(out, Convention::exact, AttentionMask::full, "");
    add_conv(out, Convention::exact, AttentionMask::causal, "");
    add_conv(out, Convention::megatron, AttentionMask::causal, "");
    const Convention claimed = spec_ ? spec_->convention : Convention::paper;
    const AttentionMask claimed_mask =
        claimed == Convention::exact && spec_ ? spec_->mask : AttentionMask::full;
    const FlopsKind claimed_kind = spec_ ? spec_->flops : FlopsKind::training;
    const Candidate* best_claimed = nullptr;
    const Candidate* best = nullptr;
    std::vector<const Candidate*> others;  // readings other than the claimed one
    auto rel = [&](const Candidate& c) { return std::fabs((m->value - c.value) / c.value); };
    // Under the paper convention the router is part of 6·N_a only if N_a counts it: when this
    // row's N_a fits one reading, the claimed M is read the same way.
    std::optional<bool> router_in;
    if (const auto it = readings_.find("active_params"); it != readings_.end())
      if (const auto rr = it->second.find(r.row()); rr != it->second.end()) {
        if (rr->second.reading == Reading::in) router_in = true;
        if (rr->second.reading == Reading::out) router_in = false;
      }
    for (const Candidate& c : cands) {
      if (router_in && moe && c.conv == Convention::paper &&
          (c.label.find("router in") != std::string::npos) != *router_in && c.conv == claimed &&
          c.kind == claimed_kind) {
        if (!best || rel(c) < rel(*best)) best = &c;
        others.push_back(&c);
        continue;
      }
      const bool is_claimed = c.conv == claimed && c.kind == claimed_kind &&
                              (claimed != Convention::exact || c.mask == claimed_mask);
      if (is_claimed && (!best_claimed || rel(c) < rel(*best_claimed))) best_claimed = &c;
      if (!is_claimed) others.push_back(&c);
      if (!best || rel(c) < rel(*best)) best = &c;
    }
    const Comparison cc = compare(*m, best_claimed->value, 0, tol_);
    const Comparison cb = compare(*m, best->value, 0, tol_);
    const std::string found = fmt::format("M = {}{}", shown("flops_per_token", *m),
                                          m->source == "published" ? "" : " (" + m->source + ")");
    if (cc.within_rounding) return;
    // Within tolerance of the claimed reading but beyond its rounding, while another reading
    // fits inside the rounding: the table's convention is that other one (paper and megatron
    // M differ by 0.7 % at 2B, inside a 1 % tolerance, so the tolerance alone cannot tell them).
    const Candidate* fits = nullptr;
    for (const Candidate* c : others)
      if (compare(*m, c->value, 0, tol_).within_rounding && (!fits || rel(*c) < rel(*fits)))
        fits = c;
    if (cc.within_tolerance && fits) {
      add(Severity::error, r.row(), "flops_per_token", cc.expected, m->value, cc.rel_diff,
          fmt::format("{} matches {} = {} inside the printed rounding, not the claimed {} = {} "
                      "({}, within tolerance but beyond the rounding): is the table's FLOP "
                      "convention {}?",
                      found, fits->label, show("flops_per_token", fits->value), best_claimed->label,
                      show("flops_per_token", cc.expected), pct_against(cc.rel_diff, tol_),
                      fits->label));
    } else if (cc.within_tolerance) {
      add(Severity::info, r.row(), "flops_per_token", cc.expected, m->value, cc.rel_diff,
          fmt::format("{} vs {} = {}: {} — beyond the printed rounding, within tolerance", found,
                      best_claimed->label, show("flops_per_token", cc.expected),
                      pct_against(cc.rel_diff, tol_)));
    } else if (cb.within_tolerance) {
      add(Severity::error, r.row(), "flops_per_token", cc.expected, m->value, cc.rel_diff,
          fmt::format("{} matches {} = {} ({}), not the claimed {} = {} ({:.3f}x)", found,
                      best->label, show("flops_per_token", best->value),
                      pct_against(cb.rel_diff, tol_), best_claimed->label,
                      show("flops_per_token", cc.expected), m->value / cc.expected));
    } else if (best->label == best_claimed->label) {
      // The claimed convention is itself the nearest: the value is off, not another reading.
      add(Severity::error, r.row(), "flops_per_token", cc.expected, m->value, cc.rel_diff,
          fmt::format("{} is {} from the claimed {} = {}, outside the tolerance of {}%; no other "
                      "convention comes nearer",
                      found, pct_against(cc.rel_diff, tol_), best_claimed->label,
                      show("flops_per_token", cc.expected), percent_text(tol_)));
    } else {
      add(Severity::error, r.row(), "flops_per_token", cc.expected, m->value, cc.rel_diff,
          fmt::format("{} matches no convention: claimed {} gives {} ({}); nearest is {} = {} ({})",
                      found, best_claimed->label, show("flops_per_token", cc.expected),
                      pct_against(cc.rel_diff, tol_), best->label,
                      show("flops_per_token", best->value), pct_against(cb.rel_diff, tol_)));
    }
  }

  void check_simple(const RowView& r) {
    auto pub = [&](const char* q) -> std::optional<RowValue> {
      const Cell* c = r.printed(q);
      if (!c) return std::nullopt;
      return RowValue{c->value, c->rel_half_width(), "published", {}, {}, c->text};
    };
    const auto C = pub("compute"), M = pub("flops_per_token"), D = pub("tokens_consumed");
    if (C && M && D)
      identity(r, "compute", *C, M->value * D->value, M->rel_band + D->rel_band, "M · D");
    const auto ep = pub("epochs"), Du = pub("tokens_unique");
    if (ep && D && Du)
      identity(r, "epochs", *ep, D->value / Du->value, D->rel_band + Du->rel_band, "D / D̂");
    // D̂ counts the distinct positions training read: never more than the D it consumed.
    const auto Dv = r.value("tokens_consumed"), Duv = r.value("tokens_unique");
    if (Dv && Duv && Duv->low() > Dv->high()) {
      auto from = [](const RowValue& v) {
        return v.source == "published" ? std::string() : " (" + v.source + ")";
      };
      add(Severity::error, r.row(), "tokens_unique", Dv->value, Duv->value,
          Duv->value / Dv->value - 1,
          fmt::format("D̂ = {} unique tokens{} is above D = {} consumed{}: training cannot read "
                      "more distinct tokens than it reads (epochs D/D̂ = {:.3g}, below 1); are "
                      "the unique and consumed columns swapped?",
                      shown("tokens_unique", *Duv), from(*Duv), shown("tokens_consumed", *Dv),
                      from(*Dv), Dv->value / Duv->value));
    } else if (ep && ep->high() < 1) {
      add(Severity::error, r.row(), "epochs", 1.0, ep->value, ep->value - 1,
          fmt::format("epochs = {} is below 1: a run reads each of its D̂ unique tokens at least "
                      "once (epochs = D/D̂, consumed over unique); is it the unique-to-consumed "
                      "ratio?",
                      shown("epochs", *ep)));
    }
    const auto N = pub("total_params"), dn = pub("tokens_per_param");
    if (dn && D && N)
      identity(r, "tokens_per_param", *dn, D->value / N->value, D->rel_band + N->rel_band, "D / N");
    const auto it = pub("steps"), B = pub("batch_seqs");
    if (it && D && B && need(r.shape().has_seq_len, "iters = D/(B·S)", "seq_len"))
      identity(r, "steps", *it, D->value / (B->value * double(r.shape().arch.seq_len)),
               D->rel_band + B->rel_band,
               fmt::format("D / (B·S) with S = {}", r.shape().arch.seq_len));
    const auto mu = pub("mu"), E = pub("experts"), De = pub("d_expert"), Dm = pub("d_model");
    if (mu && E && De && Dm) {
      const auto Dse = pub("d_shared");
      identity(r, "mu", *mu, ((Dse ? Dse->value : 0) + E->value * De->value) / Dm->value, 0,
               "(D_se + E·D_e) / D_m");
    }
  }

  // Information only: how far η and B sit from the step-law rule.
  void check_step_law(const RowView& r) {
    const auto D = r.value("tokens_consumed");
    if (!D) return;
    if (const Cell* eta = r.printed("lr_peak")) {
      const auto N = r.value_or_shape("total_params");
      if (need(N.has_value(), "η against the step-law value", "N or the shape")) {
        const double law = step_law_lr(N->value, D->value);
        add(Severity::info, r.row(), "lr_peak", law, eta->value, eta->value / law - 1,
            fmt::format("η = {} is {:.2f}x the step-law value {} (N = {}, D = {} consumed)",
                        sci(eta->value), eta->value / law, sci(law), human(N->value),
                        human(D->value)));
      }
    }
    if (const Cell* B = r.printed("batch_seqs");
        B && need(r.shape().has_seq_len, "B against the step-law batch", "seq_len")) {
      const double law_tokens = step_law_batch_tokens(D->value);
      const double tokens = B->value * double(r.shape().arch.seq_len);
      add(Severity::info, r.row(), "batch_seqs", law_tokens / double(r.shape().arch.seq_len),
          B->value, tokens / law_tokens - 1,
          fmt::format("B = {:g} sequences ({} tokens) is {:.2f}x the step-law batch {} tokens",
                      B->value, human(tokens), tokens / law_tokens, human(law_tokens)));
    }
  }

  struct ReadingRow {
    Reading reading;
    RowValue found;
    double expected_out, expected_in, band;
  };

  const ClaimTable& t_;
  const TableSpec* spec_;
  double tol_;
  std::vector<Finding>& out_;
  std::set<std::string> skipped_;
  std::map<std::string, std::map<int, ReadingRow>> readings_;
};

}  // namespace

std::vector<Finding> check_table_rows(const ClaimTable& table, const TableSpec* spec,
                                      double tolerance) {
  std::vector<Finding> out;
  RowChecker(table, spec, tolerance, out).run();
  return out;
}

}  // namespace moeplan::audit
