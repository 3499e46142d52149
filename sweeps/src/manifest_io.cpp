#include "moeplan/sweeps/manifest_io.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/hyper.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/planner/family.hpp"
#include "moeplan/planner/point.hpp"
#include "moeplan/sweeps/arch_io.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "moeplan/sweeps/escape.hpp"
#include "toml_reader.hpp"

namespace moeplan {

namespace {
// A space of any width (a braille blank too): " moe", "moe\u00a0" and "moe" read alike in every
// table.
bool is_space(char32_t c) {
  return c == 0x20 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x202f ||
         c == 0x205f || c == 0x2800 || c == 0x3000;
}
}  // namespace

bool is_point_id(std::string_view id) {
  // A folder name is at most 255 bytes (NAME_MAX on Linux).
  if (id.empty() || id == "." || id == ".." || id.size() > 255) return false;
  char32_t first = 0, last = 0;
  for (size_t i = 0, n; i < id.size(); i += n) {
    // Bytes of no UTF-8 character are taken one by one (a folder name may hold them; reports
    // show them as \xNN); only '/', '\\' and the control bytes are refused among them.
    n = std::max<size_t>(1, utf8_length_at(id, i));
    const char32_t c = utf8_length_at(id, i) > 0 ? utf8_code_point_at(id, i, n) : 0xfffd;
    if (c == '/' || c == '\\' || c < 0x20 || is_hidden_character(c)) return false;
    if (i == 0) first = c;
    last = c;
  }
  return !is_space(first) && !is_space(last);
}

std::string capacity_factor_warning(const Manifest& m) {
  // A capacity factor drops routed assignments: FLOPs the plan counted and the run does not
  // spend. The sweep stays planned equal, but its points' measured C falls short by their drop
  // rate, which routing decides: said before training, not found by the audit.
  if (!(m.train.capacity_factor > 0) || !m.equal_resources) return {};
  return fmt::format(
      "capacity_factor = {:g} drops the routed assignments over an expert's capacity: their "
      "FLOPs are planned but not spent, and a point whose drops exceed the compute tolerance "
      "({:g} % of C) is not equal to the dense baseline in `moeplan report` and fails `moeplan "
      "audit`'s equal C (0 = dropless, the equal-resource setting)",
      m.train.capacity_factor, 100 * m.compute_tolerance);
}

namespace {

using detail::toml_double;
using detail::toml_string;
using detail::TomlTable;

std::string_view reuse_name(Reuse r) {
  return r == Reuse::strict ? "strict" : "loose";
}

// ---------------------------------------------------------------- writing

struct TomlOut {
  std::string s;
  void key(std::string_view k, int64_t v) { s += fmt::format("{} = {}\n", k, v); }
  void key(std::string_view k, double v) { s += fmt::format("{} = {}\n", k, toml_double(v)); }
  void key(std::string_view k, bool v) { s += fmt::format("{} = {}\n", k, v ? "true" : "false"); }
  void key(std::string_view k, const std::string& v) {
    s += fmt::format("{} = {}\n", k, toml_string(v));
  }
  void key(std::string_view k, const char* v) { key(k, std::string(v)); }
  void key(std::string_view k, std::string_view v) { key(k, std::string(v)); }
};

void write_plan(TomlOut& o, const Plan& p, const std::string& header,
                const std::string& arch_header) {
  o.s += fmt::format("\n{}\n", header);
  o.s += fmt::format("# {}\n", describe(p.arch));
  o.key("id", p.id);
  o.key("role", p.role);
  o.key("activation_rate_target", p.activation_rate_target);
  o.key("reachable", p.reachable);
  o.key("note", p.note);
  o.key("total_params", p.counts.total_params);
  o.key("active_params", p.counts.active_params);
  o.key("activation_rate", p.counts.activation_rate());
  o.key("convention", name(p.convention));
  o.key("mask", name(p.mask));
  o.key("flops_per_token", p.flops_per_token);
  o.key("compute_target", p.budget.compute_target);
  o.key("compute", p.budget.compute);
  o.key("compute_rel_diff", p.budget.compute_rel_diff);
  o.key("reuse", reuse_name(p.budget.reuse));
  o.key("tokens_consumed", p.budget.tokens_consumed);
  o.key("tokens_unique", p.budget.tokens_unique);
  o.key("epochs", p.budget.epochs);
  o.key("tokens_per_param", p.budget.tokens_per_param);
  o.key("effective_data", p.budget.effective_data);
  o.key("steps", p.budget.steps);
  o.key("batch_seqs", p.budget.batch_seqs);
  o.key("batch_tokens", p.hyper.batch_tokens);
  o.key("rule", p.hyper.rule);
  o.key("lr_peak", p.hyper.lr_peak);
  o.key("lr_min", p.hyper.lr_min);
  o.key("warmup_steps", p.hyper.warmup_steps);
  o.key("adam_beta1", p.hyper.adam_beta1);
  o.key("adam_beta2", p.hyper.adam_beta2);
  o.key("weight_decay", p.hyper.weight_decay);
  o.key("grad_clip", p.hyper.grad_clip);
  o.s += fmt::format("\n{}\n", arch_header);
  o.s += arch_to_toml_lines(p.arch);
}

void write_train(TomlOut& o, const TrainSettings& t) {
  o.s += "\n[train]\n";
  o.key("source", t.source);
  o.key("seed", int64_t(t.seed));
  o.key("data_seed", int64_t(t.data_seed));
  o.key("positions", t.positions);
  o.key("renormalize_gates", t.renormalize_gates);
  o.key("capacity_factor", t.capacity_factor);
  o.key("load_balance", t.load_balance);
  o.key("z_loss", t.z_loss);
  o.key("erc_loss", t.erc_loss);
  o.key("erc_alpha", t.erc_alpha);
  o.key("eval_every", t.eval_every);
  o.key("eval_tokens", t.eval_tokens);
  o.key("checkpoint_every", t.checkpoint_every);
  o.key("device", t.device);
}

// ---------------------------------------------------------------- reading

bool close(double a, double b, double rel = 1e-9) {
  return std::fabs(a - b) <= rel * std::max({std::fabs(a), std::fabs(b), 1e-300});
}

Arch read_manifest_arch(TomlTable& parent) {
  TomlTable t(parent.table("arch"), parent.origin(), parent.path("arch"));
  Arch a;
  const char* pos = "a non-negative integer";
  a.d_model = t.integer("d_model", pos);
  a.layers = t.integer("layers", pos);
  a.dense_layers = t.integer("dense_layers", pos);
  a.heads = t.integer("heads", pos);
  a.kv_heads = t.integer("kv_heads", pos);
  a.head_dim = t.integer("head_dim", pos);
  a.d_ffn = t.integer("d_ffn", pos);
  a.experts = t.integer("experts", pos);
  a.top_k = t.integer("top_k", pos);
  a.d_expert = t.integer("d_expert", pos);
  a.d_shared = t.integer("d_shared", pos);
  a.seq_len = t.integer("seq_len", pos);
  a.vocab = t.integer("vocab", pos);
  a.tied_embeddings = t.boolean("tied_embeddings");
  a.count_router = t.boolean("count_router");
  a.count_norms = t.boolean("count_norms");
  t.reject_unknown();
  try {
    validate(a);
  } catch (const InputError& e) {
    // "sweep.toml: points[0].arch: d_model = -16 is invalid; ..." (validate's own "arch: " off).
    std::string_view what = e.what();
    if (what.starts_with("arch: ")) what.remove_prefix(6);
    throw InputError(fmt::format("{}: {}: {}", t.origin(), parent.path("arch"), what));
  }
  return a;
}

Plan read_plan(const toml::value& v, const std::string& origin, const std::string& where) {
  TomlTable t(v, origin, where);
  Plan p;
  p.id = t.string("id", "a string (point id)");
  p.role = t.string("role", "\"moe\" or \"dense\"");
  if (p.role != "moe" && p.role != "dense") t.fail("role", "must be \"moe\" or \"dense\"");
  p.activation_rate_target = t.number("activation_rate_target");
  if (p.role == "dense" && p.activation_rate_target != 0.0)
    t.fail("activation_rate_target", fmt::format("= {} but a dense point has no r_a target: 0.0",
                                                 toml_double(p.activation_rate_target)));
  if (p.role == "moe" && !(p.activation_rate_target > 0 && p.activation_rate_target <= 1))
    t.fail("activation_rate_target", fmt::format("= {} must be in (0, 1] (r_a = N_a/N)",
                                                 toml_double(p.activation_rate_target)));
  p.reachable = t.boolean("reachable");
  p.note = t.string("note");
  const int64_t total = t.integer("total_params");
  const int64_t active = t.integer("active_params");
  const double rate = t.number("activation_rate");
  const std::string conv = t.string("convention", "\"paper\", \"exact\" or \"megatron\"");
  const auto c = parse_convention(conv);
  if (!c)
    t.fail("convention", fmt::format("= '{}' is not known; use paper, exact or megatron", conv));
  p.convention = *c;
  const std::string mask = t.string("mask", "\"causal\" or \"full\"");
  const auto m = parse_attention_mask(mask);
  if (!m) t.fail("mask", fmt::format("= '{}' is not known; use causal or full", mask));
  p.mask = *m;
  p.flops_per_token = t.number("flops_per_token");
  Budget& b = p.budget;
  b.compute_target = t.number("compute_target");
  b.compute = t.number("compute");
  b.compute_rel_diff = t.number("compute_rel_diff");
  const std::string reuse = t.string("reuse", "\"strict\" or \"loose\"");
  if (reuse != "strict" && reuse != "loose")
    t.fail("reuse", fmt::format("= '{}' is not known; use strict or loose", reuse));
  b.reuse = reuse == "strict" ? Reuse::strict : Reuse::loose;
  b.tokens_consumed = t.integer("tokens_consumed");
  b.tokens_unique = t.integer("tokens_unique");
  b.epochs = t.number("epochs");
  b.tokens_per_param = t.number("tokens_per_param");
  b.effective_data = t.number("effective_data");
  b.steps = t.integer("steps");
  b.batch_seqs = t.integer("batch_seqs");
  HyperParams& h = p.hyper;
  h.batch_seqs = b.batch_seqs;
  h.batch_tokens = t.integer("batch_tokens");
  h.rule = t.string("rule", "a string (hyper-parameter rule, e.g. \"step-law\")");
  h.lr_peak = t.number("lr_peak");
  h.lr_min = t.number("lr_min");
  h.warmup_steps = t.integer("warmup_steps");
  h.adam_beta1 = t.number("adam_beta1");
  h.adam_beta2 = t.number("adam_beta2");
  h.weight_decay = t.number("weight_decay");
  h.grad_clip = t.number("grad_clip");
  p.arch = read_manifest_arch(t);
  t.reject_unknown();

  // Everything stored must be what the arch implies: an edited arch with stale numbers is refused.
  p.counts = count_params(p.arch);
  b.seq_len = p.arch.seq_len;
  b.flops_per_token = p.flops_per_token;
  auto disagree = [&](const std::string& key, const std::string& stored,
                      const std::string& implied) {
    t.fail(key, fmt::format("= {} disagrees with its arch, which gives {}; re-plan the point or "
                            "fix the value",
                            stored, implied));
  };
  if (total != p.counts.total_params)
    disagree("total_params", std::to_string(total), std::to_string(p.counts.total_params));
  if (active != p.counts.active_params)
    disagree("active_params", std::to_string(active), std::to_string(p.counts.active_params));
  if (!close(rate, p.counts.activation_rate()))
    disagree("activation_rate", toml_double(rate), toml_double(p.counts.activation_rate()));
  const double m_arch = planned_flops_per_token(p.arch, p.convention, p.mask);
  if (!close(p.flops_per_token, m_arch))
    disagree(
        "flops_per_token", toml_double(p.flops_per_token),
        fmt::format("{} under {}", toml_double(m_arch), convention_label(p.convention, p.mask)));
  if (p.role == "dense" && !p.arch.is_dense())
    t.fail("role", "is \"dense\" but the arch has MoE layers (dense_layers < layers)");
  if (p.role == "moe" && p.arch.is_dense())
    t.fail("role", "is \"moe\" but the arch has no MoE layer (dense_layers == layers)");
  if (b.steps <= 0) t.fail("steps", fmt::format("= {} must be a positive integer", b.steps));
  if (b.batch_seqs <= 0)
    t.fail("batch_seqs", fmt::format("= {} must be a positive integer", b.batch_seqs));
  // Checked products: steps edited to 2^44 more must not wrap back onto tokens_consumed.
  int64_t batch_tokens = 0, consumed = 0;
  if (__builtin_mul_overflow(b.batch_seqs, p.arch.seq_len, &batch_tokens) ||
      __builtin_mul_overflow(b.steps, batch_tokens, &consumed))
    t.fail("steps", fmt::format("= {} with batch_seqs {} and seq_len {} is past 2^63 tokens",
                                b.steps, b.batch_seqs, p.arch.seq_len));
  if (b.tokens_consumed != consumed)
    t.fail("tokens_consumed",
           fmt::format("= {} must equal steps·batch_seqs·seq_len = {}·{}·{} = {}",
                       b.tokens_consumed, b.steps, b.batch_seqs, p.arch.seq_len, consumed));
  if (h.batch_tokens != batch_tokens)
    disagree("batch_tokens", std::to_string(h.batch_tokens), std::to_string(batch_tokens));
  if (b.tokens_unique <= 0 || b.tokens_unique > b.tokens_consumed)
    t.fail("tokens_unique", fmt::format("= {} must be in [1, tokens_consumed = {}]",
                                        b.tokens_unique, b.tokens_consumed));
  const double d = double(b.tokens_consumed);
  if (!close(b.compute, p.flops_per_token * d))
    t.fail("compute", fmt::format("= {} must equal flops_per_token·tokens_consumed = {}",
                                  toml_double(b.compute), toml_double(p.flops_per_token * d)));
  if (!(b.compute_target > 0))
    t.fail("compute_target", fmt::format("= {} must be > 0", toml_double(b.compute_target)));
  const double rel_diff = (b.compute - b.compute_target) / b.compute_target;
  if (std::fabs(b.compute_rel_diff - rel_diff) > 1e-12 + 1e-9 * std::fabs(rel_diff))
    t.fail("compute_rel_diff",
           fmt::format("= {} must equal (compute − compute_target) / compute_target = {}",
                       toml_double(b.compute_rel_diff), toml_double(rel_diff)));
  if (!close(b.epochs, d / double(b.tokens_unique)))
    t.fail("epochs", fmt::format("= {} must equal tokens_consumed / tokens_unique = {}",
                                 toml_double(b.epochs), toml_double(d / double(b.tokens_unique))));
  if (!close(b.tokens_per_param, d / double(p.counts.total_params)))
    t.fail("tokens_per_param", fmt::format("= {} must equal tokens_consumed / total_params = {}",
                                           toml_double(b.tokens_per_param),
                                           toml_double(d / double(p.counts.total_params))));
  const double eff = effective_data(double(b.tokens_unique), b.epochs);
  if (!close(b.effective_data, eff))
    t.fail("effective_data", fmt::format("= {} must equal the Muennighoff D' = {}",
                                         toml_double(b.effective_data), toml_double(eff)));
  if (h.warmup_steps < 0 || h.warmup_steps > b.steps)
    t.fail("warmup_steps", fmt::format("= {} must be in [0, steps = {}]", h.warmup_steps, b.steps));
  if (b.tokens_unique % p.arch.seq_len != 0)
    t.fail("tokens_unique",
           fmt::format("= {} must be a whole number of windows of seq_len = {} tokens",
                       b.tokens_unique, p.arch.seq_len));
  // The id names the point's run folder (runs/<id>/): `run` could not train one it cannot name.
  if (!is_point_id(p.id))
    t.fail("id", fmt::format("= {} cannot name a run folder: it must be {}", toml_string(p.id),
                             kPointIdRule));
  // The optimiser's settings, in the ranges AdamW is defined on (a hand edit outside them trains
  // nothing the sweep could compare, or diverges in its first steps).
  auto in_range = [&](const char* key, double v, bool ok, const char* valid) {
    if (!(ok && std::isfinite(v)))
      t.fail(key, fmt::format("= {} is invalid; it must be {}", toml_double(v), valid));
  };
  in_range("lr_peak", h.lr_peak, h.lr_peak > 0 && h.lr_peak <= 1,
           "in (0, 1] (AdamW's peak learning rate; `moeplan grid` plans the step law's)");
  in_range("lr_min", h.lr_min, h.lr_min >= 0 && h.lr_min <= h.lr_peak, "in [0, lr_peak]");
  in_range("adam_beta1", h.adam_beta1, h.adam_beta1 >= 0 && h.adam_beta1 < 1, "in [0, 1)");
  in_range("adam_beta2", h.adam_beta2, h.adam_beta2 >= 0 && h.adam_beta2 < 1, "in [0, 1)");
  in_range("weight_decay", h.weight_decay, h.weight_decay >= 0, "a number >= 0 (0 = none)");
  in_range("grad_clip", h.grad_clip, h.grad_clip >= 0,
           "a number >= 0 (the global norm clipped to; 0 = no clipping)");
  if (h.rule.empty()) t.fail("rule", "is empty; name the rule the hyper-parameters follow");
  return p;
}

// The equal-resource contract (ACCOUNTING.md): what makes the points comparable, checked across
// them. Each plan is consistent in itself (read_plan); an edit that keeps a plan consistent but
// moves it off the sweep (N 30 % lower, D̂ halved, another C) would train an unequal comparison
// under an equal-resource manifest.
void check_contract(const Manifest& m, const std::string& origin) {
  // What breaks the equal-resource contract (not a flag that disagrees with its own numbers)
  // gets the hint how a manifest of points that are not one sweep says so.
  auto fail = [&](const std::string& key, const std::string& what, bool hint = true) {
    throw InputError(fmt::format("{}: key '{}' {}{}", origin, key, what,
                                 hint ? " (a manifest of points that are not one sweep says "
                                        "equal_resources = false)"
                                      : ""));
  };
  std::vector<std::pair<std::string, const Plan*>> plans{{"dense", &m.dense}};
  for (size_t i = 0; i < m.points.size(); ++i)
    plans.emplace_back(fmt::format("points[{}]", i), &m.points[i]);
  const double slack = 1e-9;
  const double n_dense = double(m.dense.counts.total_params);
  // N: the baseline within n_tolerance of the ask; each point within it of the baseline (the
  // planner solves the points to the baseline's N: equal N is a claim against the baseline).
  if (std::fabs(n_dense - m.n_target) > (m.n_tolerance + slack) * m.n_target)
    fail("dense.total_params",
         fmt::format("= {} is {:+.2f}% from n_target = {}, outside n_tolerance = {:.2f}%; "
                     "re-plan the sweep with `moeplan grid` or fix the value",
                     m.dense.counts.total_params, 100 * (n_dense / m.n_target - 1),
                     toml_double(m.n_target), 100 * m.n_tolerance));
  const Budget& db = m.dense.budget;
  for (const auto& [where, p] : plans) {
    const Budget& b = p->budget;
    const double n = double(p->counts.total_params);
    // (Manifests planned before 2026-12-01 solved the points to n_target: either is the rule.)
    if (p != &m.dense && std::fabs(n - n_dense) > (m.n_tolerance + slack) * n_dense &&
        std::fabs(n - m.n_target) > (m.n_tolerance + slack) * m.n_target)
      fail(where + ".total_params",
           fmt::format("= {} is {:+.2f}% from the dense baseline's {} and {:+.2f}% from n_target "
                       "= {}, outside n_tolerance = {:.2f}%: the point is not at equal N; re-plan "
                       "it with `moeplan grid`",
                       p->counts.total_params, 100 * (n / n_dense - 1),
                       m.dense.counts.total_params, 100 * (n / m.n_target - 1),
                       toml_double(m.n_target), 100 * m.n_tolerance));
    if (!close(b.compute_target, db.compute_target))
      fail(where + ".compute_target",
           fmt::format("= {} differs from the dense baseline's {}: the points of a sweep share "
                       "one C; re-plan it with `moeplan grid`",
                       toml_double(b.compute_target), toml_double(db.compute_target)));
    // Steps are C/(M·B·S) rounded to the nearest whole step: C misses by at most half a step.
    const double half_step = 0.5 * p->flops_per_token * double(b.batch_seqs * p->arch.seq_len);
    if (std::fabs(b.compute - b.compute_target) > half_step * (1 + slack))
      fail(where + ".steps",
           fmt::format("= {} gives C = {} FLOPs, {:+.3f}% from compute_target = {}; the nearest "
                       "whole number of steps is {} (re-plan it with `moeplan grid`)",
                       b.steps, toml_double(b.compute), 100 * b.compute_rel_diff,
                       toml_double(b.compute_target),
                       std::llround(b.compute_target /
                                    (p->flops_per_token * double(b.batch_seqs * p->arch.seq_len)))));
    if (p->role == "moe") {
      const double miss = std::fabs(p->counts.activation_rate() - p->activation_rate_target);
      if (p->reachable ? miss > m.ra_tolerance + 1e-12 : miss < m.ra_tolerance - 1e-12)
        fail(where + ".reachable",
             fmt::format("= {} but its r_a {:.4f} is {:.4f} from its target {} {} ra_tolerance "
                         "= {}",
                         p->reachable ? "true" : "false", p->counts.activation_rate(), miss,
                         toml_double(p->activation_rate_target),
                         p->reachable ? "outside" : "within", toml_double(m.ra_tolerance)),
             false);
    }
    // Strict reuse: every point trains on the baseline's D̂ (fewer only where it consumes less).
    if (db.reuse == Reuse::strict) {
      const int64_t want = std::min(db.tokens_unique, b.tokens_consumed);
      if (b.tokens_unique != want)
        fail(where + ".tokens_unique",
             fmt::format("= {} but strict reuse gives every point the dense baseline's D̂ = {} "
                         "unique tokens{} ({}); re-plan it with `moeplan grid`",
                         b.tokens_unique, db.tokens_unique,
                         want < db.tokens_unique ? ", capped at what it consumes" : "", want));
    }
  }
  // Loose reuse: one number of epochs E for every point, each D̂ = D/E rounded to whole windows,
  // so E lies in [D/(D̂ + S/2), D/(D̂ − S/2)] for every plan; those ranges must meet.
  if (db.reuse == Reuse::loose) {
    double lo = 1, hi = INFINITY;
    size_t lo_at = 0, hi_at = 0;
    for (size_t i = 0; i < plans.size(); ++i) {
      const Budget& b = plans[i].second->budget;
      const double s = double(plans[i].second->arch.seq_len), u = double(b.tokens_unique),
                   d = double(b.tokens_consumed);
      const double l = d / (u + 0.5 * s), h = u > 0.5 * s ? d / (u - 0.5 * s) : INFINITY;
      if (l > lo) lo = l, lo_at = i;
      if (h < hi) hi = h, hi_at = i;
    }
    if (lo > hi * (1 + slack))
      fail(plans[hi_at].first + ".tokens_unique",
           fmt::format("= {} repeats its data {:.4g} times, {} {:.4g} times: under loose reuse "
                       "every point repeats its data the same number of epochs (up to rounding "
                       "to whole windows); re-plan it with `moeplan grid`",
                       plans[hi_at].second->budget.tokens_unique,
                       plans[hi_at].second->budget.epochs, plans[lo_at].first,
                       plans[lo_at].second->budget.epochs));
  }
}

TrainSettings read_train(TomlTable& top, TrainSettings s = {}) {
  if (!top.has("train")) return s;  // every setting as it was (the defaults)
  TomlTable t(top.table("train"), top.origin(), "train");
  s.source = t.string_or("source", s.source);
  // The form only; whether the file is there is `run`'s to check (grid may plan before the data).
  {
    const auto colon = s.source.find(':');
    const std::string kind = colon == std::string::npos ? s.source : s.source.substr(0, colon);
    const bool ok = s.source == "builtin" ||
                    (colon != std::string::npos && colon + 1 < s.source.size() &&
                     (kind == "text" || kind == "bytes" || kind == "shards"));
    if (!ok)
      t.fail("source", fmt::format("= {} is not a data source; use \"builtin\", \"text:PATH\", "
                                   "\"bytes:PATH\" or \"shards:GLOB\"",
                                   toml_string(s.source)));
  }
  const int64_t seed = t.integer_or("seed", int64_t(s.seed));
  const int64_t data_seed = t.integer_or("data_seed", int64_t(s.data_seed));
  for (const auto& [key, v] : {std::pair{"seed", seed}, {"data_seed", data_seed}})
    if (v < 0) t.fail(key, fmt::format("= {} is invalid; it must be a whole number >= 0", v));
  s.seed = uint64_t(seed);
  s.data_seed = uint64_t(data_seed);
  s.positions = t.string_or("positions", s.positions);
  if (s.positions != "alibi" && s.positions != "rope")
    t.fail("positions", fmt::format("= '{}' is not known; use \"alibi\" or \"rope\"", s.positions));
  s.renormalize_gates = t.boolean_or("renormalize_gates", s.renormalize_gates);
  s.capacity_factor = t.number_or("capacity_factor", s.capacity_factor);
  s.load_balance = t.number_or("load_balance", s.load_balance);
  s.z_loss = t.number_or("z_loss", s.z_loss);
  s.erc_loss = t.number_or("erc_loss", s.erc_loss);
  s.erc_alpha = t.number_or("erc_alpha", s.erc_alpha);
  s.eval_every = t.integer_or("eval_every", s.eval_every);
  s.eval_tokens = t.integer_or("eval_tokens", s.eval_tokens);
  s.checkpoint_every = t.integer_or("checkpoint_every", s.checkpoint_every);
  s.device = t.string_or("device", s.device);
  if (s.device != "cpu" && s.device != "cuda")
    t.fail("device", fmt::format("= '{}' is not known; use \"cpu\" or \"cuda\"", s.device));
  // Coefficients of the auxiliary losses are >= 0 (a negative one rewards what it should
  // penalise); the step counts are >= 0 (0 = automatic). NaN fails every test.
  for (const auto& [key, v] :
       {std::pair{"load_balance", s.load_balance}, {"z_loss", s.z_loss}, {"erc_loss", s.erc_loss}})
    if (!(v >= 0 && std::isfinite(v)))
      t.fail(key, fmt::format("= {} is invalid; it must be a finite number >= 0 (0 = off)",
                              toml_double(v)));
  if (!(s.erc_alpha > 0 && std::isfinite(s.erc_alpha)))
    t.fail("erc_alpha", fmt::format("= {} is invalid; it must be a finite number > 0 (default 1)",
                                    toml_double(s.erc_alpha)));
  if (!(s.capacity_factor >= 0 && std::isfinite(s.capacity_factor)))
    t.fail("capacity_factor",
           fmt::format("= {} is invalid; it must be a finite number >= 0 (0 = dropless)",
                       toml_double(s.capacity_factor)));
  for (const auto& [key, v] : {std::pair{"eval_every", s.eval_every},
                               {"eval_tokens", s.eval_tokens},
                               {"checkpoint_every", s.checkpoint_every}})
    // At most 9e15, as grid --train takes them: a held-out set near 2^63 tokens wrapped around
    // to one window in the window arithmetic.
    if (v < 0 || v > int64_t(9e15))
      t.fail(key, fmt::format("= {} is invalid; it must be within 0..9e15 (0 = automatic)", v));
  t.reject_unknown();
  return s;
}

}  // namespace

void apply_train_settings(TrainSettings& settings, const std::vector<std::string>& assignments) {
  // Each [train] key by how its value is written, in the manifest's order.
  enum class Kind { string, boolean, integer, number };
  static const std::vector<std::pair<std::string, Kind>> kKeys = {
      {"source", Kind::string},
      {"seed", Kind::integer},
      {"data_seed", Kind::integer},
      {"positions", Kind::string},
      {"renormalize_gates", Kind::boolean},
      {"capacity_factor", Kind::number},
      {"load_balance", Kind::number},
      {"z_loss", Kind::number},
      {"erc_loss", Kind::number},
      {"erc_alpha", Kind::number},
      {"eval_every", Kind::integer},
      {"eval_tokens", Kind::integer},
      {"checkpoint_every", Kind::integer},
      {"device", Kind::string}};
  std::string known;
  for (const auto& [k, kind] : kKeys) known += (known.empty() ? "" : ", ") + k;
  std::map<std::string, std::string> literal;
  std::map<std::string, std::string> given;  // key: its KEY=VALUE, for a repeat's message
  for (const std::string& a : assignments) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError(fmt::format(
          "--train '{}': write KEY=VALUE (e.g. erc_loss=0.01, source=text:book.txt)", a));
    const std::string key = a.substr(0, eq), value = a.substr(eq + 1);
    // A repeated key is refused, as a repeated flag is: the last one won in silence.
    if (const auto [at, fresh] = given.try_emplace(key, a); !fresh)
      throw InputError(fmt::format("--train {} is given twice ('{}' and '{}'); give it once", key,
                                   at->second, a));
    const std::string flag = "--train " + key;
    const auto it =
        std::find_if(kKeys.begin(), kKeys.end(), [&key](const auto& k) { return k.first == key; });
    if (it == kKeys.end())
      throw InputError(
          fmt::format("--train '{}': '{}' is not a training setting; known: {}", a, key, known));
    switch (it->second) {
      case Kind::string:
        literal[key] = toml_string(value);
        break;
      case Kind::boolean:
        if (value != "true" && value != "false")
          throw InputError(fmt::format("{} = '{}' is invalid; write true or false", flag, value));
        literal[key] = value;
        break;
      case Kind::integer: {
        const double v = parse_quantity(value, flag);
        if (v != std::floor(v) || std::fabs(v) > 9e15)
          throw InputError(fmt::format(
              "{} = '{}' is invalid; it must be a whole number of at most 9e15", flag, value));
        literal[key] = fmt::format("{}", int64_t(v));
        break;
      }
      case Kind::number:
        literal[key] = toml_double(parse_quantity(value, flag));
        break;
    }
  }
  std::string doc = "[train]\n";
  for (const auto& [k, v] : literal) doc += k + " = " + v + "\n";
  const toml::value root = detail::parse_toml(doc, "--train");
  TomlTable top(root, "--train", "");
  settings = read_train(top, settings);
}

std::string manifest_to_toml(const Manifest& m) {
  TomlOut o;
  o.s += "# moeplan sweep manifest (schema 1): the contract of an experiment.\n";
  o.s +=
      "# FLOP figures use each point's `convention`; tokens_consumed counts repeats, "
      "tokens_unique does not.\n";
  // The key stays the bare convention (what readers parse); the reading is the arch's flags.
  if (const std::string l = flops_label(m.dense.arch, m.dense.convention, m.dense.mask);
      l != convention_label(m.dense.convention, m.dense.mask))
    o.s += fmt::format(
        "# M and C read {}: the arch's count_router / count_norms put those weights in N_a, so in "
        "6·N_a.\n",
        l);
  o.s +=
      "# Hand edits are welcome, but every stored count must still match its arch "
      "(moeplan checks on read).\n";
  o.key("schema", int64_t(m.schema));
  o.key("family", m.family);
  o.key("created_by", m.created_by);
  o.key("n_target", m.n_target);
  o.key("n_tolerance", m.n_tolerance);
  o.key("ra_tolerance", m.ra_tolerance);
  o.key("compute_tolerance", m.compute_tolerance);
  if (!m.equal_resources) {
    o.s += "# Not an equal-resource sweep: its points are not held to one N, C and D̂.\n";
    o.key("equal_resources", false);
  }
  write_train(o, m.train);
  write_plan(o, m.dense, "[dense]", "[dense.arch]");
  for (const Plan& p : m.points) write_plan(o, p, "[[points]]", "[points.arch]");
  return o.s;
}

// What every point of a sweep shares with its dense baseline, or the comparison is not at equal
// resources (N under another reading, C in another convention, other windows or vocabulary).
void check_like_dense(const Plan& p, const Plan& dense, const std::string& origin,
                      const std::string& where) {
  auto differ = [&](const char* key, const std::string& mine, const std::string& theirs) {
    if (mine == theirs) return;
    throw InputError(fmt::format(
        "{}: key '{}.{}' = {} differs from the dense baseline's {}; the points of a sweep share "
        "seq_len, vocab, tied embeddings, the counting readings, the FLOP convention and the reuse "
        "rule (re-plan "
        "it with `moeplan grid`)",
        origin, where, key, mine, theirs));
  };
  const Arch &a = p.arch, &d = dense.arch;
  differ("arch.seq_len", std::to_string(a.seq_len), std::to_string(d.seq_len));
  differ("arch.vocab", std::to_string(a.vocab), std::to_string(d.vocab));
  differ("arch.count_router", a.count_router ? "true" : "false", d.count_router ? "true" : "false");
  differ("arch.count_norms", a.count_norms ? "true" : "false", d.count_norms ? "true" : "false");
  // Tied or not changes the LM head's weights (trained scalars, outside N) and the first layer's
  // input gradient: one point tied and another not compare two model families.
  differ("arch.tied_embeddings", a.tied_embeddings ? "true" : "false",
         d.tied_embeddings ? "true" : "false");
  differ("convention", fmt::format("\"{}\"", name(p.convention)),
         fmt::format("\"{}\"", name(dense.convention)));
  differ("mask", fmt::format("\"{}\"", name(p.mask)), fmt::format("\"{}\"", name(dense.mask)));
  auto reuse = [](Reuse r) { return std::string(r == Reuse::strict ? "\"strict\"" : "\"loose\""); };
  differ("reuse", reuse(p.budget.reuse), reuse(dense.budget.reuse));
}

Manifest manifest_from_toml_string(const std::string& text, const std::string& origin) {
  const toml::value root = detail::parse_toml(text, origin);
  TomlTable top(root, origin, "");
  Manifest m;
  m.schema = int(top.integer("schema", "the integer 1"));
  if (m.schema != 1)
    top.fail("schema",
             fmt::format("= {} is not supported; this moeplan reads schema = 1", m.schema));
  m.family = top.string("family", "a family name (e.g. \"paper\")");
  m.created_by = top.string_or("created_by", "");
  m.n_target = top.number("n_target", "a positive number (requested N)");
  if (!(m.n_target > 0))
    top.fail("n_target", fmt::format("= {} must be > 0 (the N the sweep was planned for)",
                                     toml_double(m.n_target)));
  m.n_tolerance = top.number("n_tolerance", "a relative tolerance (e.g. 0.01)");
  m.ra_tolerance = top.number("ra_tolerance", "an absolute tolerance (e.g. 0.005)");
  m.compute_tolerance = top.number("compute_tolerance", "a relative tolerance (e.g. 0.01)");
  for (const char* k : {"n_tolerance", "ra_tolerance", "compute_tolerance"}) {
    const double v = k[0] == 'n'   ? m.n_tolerance
                     : k[0] == 'r' ? m.ra_tolerance
                                   : m.compute_tolerance;
    const double top_v = k[0] == 'n' ? 0.5 : 1;  // grid's --n-tolerance is below 0.5
    if (!(v > 0 && v < top_v))
      top.fail(k, fmt::format("= {} must be in (0, {})", toml_double(v), top_v));
  }
  m.equal_resources = top.boolean_or("equal_resources", true);
  if (!family_by_name(m.family))
    top.fail("family", fmt::format("= {} is not a family moeplan plans; known: {}",
                                   toml_string(m.family), family_names()));
  m.train = read_train(top);
  m.dense = read_plan(top.table("dense"), origin, "dense");
  if (m.dense.role != "dense")
    throw InputError(fmt::format("{}: key 'dense.role' must be \"dense\"", origin));
  const toml::array& points = top.array("points", "an array of tables ([[points]])");
  std::set<std::string> ids{m.dense.id};
  for (size_t i = 0; i < points.size(); ++i) {
    const std::string where = fmt::format("points[{}]", i);
    Plan p = read_plan(points[i], origin, where);
    if (!ids.insert(p.id).second)
      throw InputError(fmt::format(
          "{}: key '{}.id' = '{}' repeats an earlier id; ids must be unique", origin, where, p.id));
    if (p.role != "moe")
      throw InputError(fmt::format(
          "{}: key '{}.role' = \"{}\": a sweep has one dense baseline, in [dense]; each "
          "[[points]] entry is an MoE point (role = \"moe\")",
          origin, where, p.role));
    check_like_dense(p, m.dense, origin, where);
    m.points.push_back(std::move(p));
  }
  top.reject_unknown();
  check_train_fits_points(m, origin);
  if (m.equal_resources) check_contract(m, origin);
  return m;
}

void check_train_fits_points(const Manifest& m, const std::string& origin) {
  std::vector<const Plan*> plans{&m.dense};
  for (const Plan& p : m.points) plans.push_back(&p);
  // Byte sources (the built-in corpus, text:, bytes:) read tokens 0..255: `run` refused a plan
  // of a smaller vocabulary that grid had written without a word.
  const std::string& src = m.train.source;
  if (src == "builtin" || src.starts_with("text:") || src.starts_with("bytes:"))
    for (const Plan* p : plans)
      if (p->arch.vocab < 256)
        throw InputError(fmt::format(
            "{}: point '{}' has vocab = {}, but train.source = \"{}\" reads bytes, tokens 0 to "
            "255: plan with --vocab 256 or more, or train on shards of a smaller vocabulary",
            origin, p->id, p->arch.vocab, src));
  // RoPE rotates pairs of a head's dimensions.
  if (m.train.positions != "rope") return;
  for (const Plan* p : plans)
    if (p->arch.head_dim % 2 != 0)
      throw InputError(fmt::format(
          "{}: point '{}' has head_dim = {}, but train.positions = \"rope\" needs an even "
          "head_dim: use positions = \"alibi\", or plan with an even --head-dim",
          origin, p->id, p->arch.head_dim));
}

Manifest read_manifest(const std::filesystem::path& path) {
  // grid writes csv, json and md too; only the TOML manifest reads back (it is the contract).
  const std::string ext = extension_lower(path);
  if (ext == ".json" || ext == ".csv" || ext == ".md")
    throw InputError(fmt::format(
        "'{}' is grid's {} output, not a manifest: manifests are TOML (moeplan grid ... -o "
        "sweep.toml)",
        path.string(), ext.substr(1)));
  // A folder opens as an empty stream on Linux and would read as a manifest missing 'schema'.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(fmt::format(
        "'{}' is a folder, not a manifest: give the sweep.toml of moeplan grid ... -o sweep.toml",
        path.string()));
  return manifest_from_toml_string(read_input_file(path, "manifest"), path.string());
}

void write_manifest_atomic(const Manifest& m, const std::filesystem::path& path) {
  write_file_atomic(path, manifest_to_toml(m));
}

nlohmann::json plan_to_json(const Plan& p) {
  const Budget& b = p.budget;
  const HyperParams& h = p.hyper;
  return nlohmann::json{{"id", p.id},
                        {"role", p.role},
                        {"activation_rate_target", p.activation_rate_target},
                        {"reachable", p.reachable},
                        {"note", p.note},
                        {"description", describe(p.arch)},
                        {"total_params", p.counts.total_params},
                        {"active_params", p.counts.active_params},
                        {"activation_rate", p.counts.activation_rate()},
                        {"convention", convention_label(p.convention, p.mask)},
                        {"mask", name(p.mask)},
                        {"flops_per_token", p.flops_per_token},
                        {"compute_target", b.compute_target},
                        {"compute", b.compute},
                        {"compute_rel_diff", b.compute_rel_diff},
                        {"reuse", reuse_name(b.reuse)},
                        {"tokens_consumed", b.tokens_consumed},
                        {"tokens_unique", b.tokens_unique},
                        {"epochs", b.epochs},
                        {"tokens_per_param", b.tokens_per_param},
                        {"effective_data", b.effective_data},
                        {"steps", b.steps},
                        {"batch_seqs", b.batch_seqs},
                        {"batch_tokens", h.batch_tokens},
                        {"rule", h.rule},
                        {"lr_peak", h.lr_peak},
                        {"lr_min", h.lr_min},
                        {"warmup_steps", h.warmup_steps},
                        {"adam_beta1", h.adam_beta1},
                        {"adam_beta2", h.adam_beta2},
                        {"weight_decay", h.weight_decay},
                        {"grad_clip", h.grad_clip},
                        {"arch", arch_to_json(p.arch)}};
}

nlohmann::json train_to_json(const TrainSettings& t) {
  return nlohmann::json{{"source", t.source},
                        {"seed", t.seed},
                        {"data_seed", t.data_seed},
                        {"positions", t.positions},
                        {"renormalize_gates", t.renormalize_gates},
                        {"capacity_factor", t.capacity_factor},
                        {"load_balance", t.load_balance},
                        {"z_loss", t.z_loss},
                        {"erc_loss", t.erc_loss},
                        {"erc_alpha", t.erc_alpha},
                        {"eval_every", t.eval_every},
                        {"eval_tokens", t.eval_tokens},
                        {"checkpoint_every", t.checkpoint_every},
                        {"device", t.device}};
}

nlohmann::json result_settings(nlohmann::json train) {
  if (train.is_object()) {
    train.erase("checkpoint_every");
    train.erase("device");
  }
  return train;
}

nlohmann::json manifest_to_json(const Manifest& m) {
  nlohmann::json points = nlohmann::json::array();
  for (const Plan& p : m.points) points.push_back(plan_to_json(p));
  return nlohmann::json{{"schema", m.schema},
                        {"family", m.family},
                        {"created_by", m.created_by},
                        {"n_target", m.n_target},
                        {"n_tolerance", m.n_tolerance},
                        {"ra_tolerance", m.ra_tolerance},
                        {"compute_tolerance", m.compute_tolerance},
                        {"equal_resources", m.equal_resources},
                        {"train", train_to_json(m.train)},
                        {"dense", plan_to_json(m.dense)},
                        {"points", points}};
}

// Empty when `stored` (a record's or checkpoint's plan) is the manifest's, else the first value
// that differs as "plan.arch.d_model = 8.5 (the manifest: 96)", and how many more do: the user
// learns which edit (theirs or the file's) made the point another one.
std::string plan_differ(const nlohmann::json& stored_plan, const nlohmann::json& wanted_plan) {
  if (stored_plan == wanted_plan) return {};
  if (!stored_plan.is_object())
    return fmt::format("plan = {} (the manifest: an object)",
                       stored_plan.is_null() ? std::string("unset") : stored_plan.dump());
  // The note is the planner's words about the point, not what it trains: an edit to it is no
  // other plan.
  nlohmann::json stored = stored_plan, wanted = wanted_plan;
  stored.erase("note");
  if (wanted.is_object()) wanted.erase("note");
  if (stored == wanted) return {};
  const nlohmann::json patch = nlohmann::json::diff(stored, wanted);
  const std::string pointer = patch.at(0).at("path").get<std::string>();
  const nlohmann::json::json_pointer at(pointer);
  std::string key = "plan";  // "/arch/d_model" as "plan.arch.d_model" (~1 is '/', ~0 is '~')
  for (size_t i = 0; i < pointer.size(); ++i) {
    if (pointer[i] == '~' && i + 1 < pointer.size()) {
      key += pointer[++i] == '1' ? '/' : '~';
    } else {
      key += pointer[i] == '/' ? '.' : pointer[i];
    }
  }
  auto value = [&](const nlohmann::json& j) {
    if (!j.contains(at)) return std::string("unset");
    std::string v = j.at(at).dump();
    if (v.size() <= 80) return v;
    size_t cut = 77;  // a whole UTF-8 character: not inside one
    while (cut > 0 && ((unsigned char)v[cut] & 0xc0) == 0x80) --cut;
    return v.substr(0, cut) + "...";
  };
  std::string out = fmt::format("{} = {} (the manifest: {})", key, value(stored), value(wanted));
  if (patch.size() > 1) out += fmt::format(" and {} more", patch.size() - 1);
  return out;
}

}  // namespace moeplan
