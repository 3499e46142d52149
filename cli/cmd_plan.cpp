// `moeplan plan`: one point in full (parameters per component, FLOPs per category under every
// convention, budget), either solved from --N/--ra or read from --arch arch.toml.
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/planner/point.hpp"
#include "moeplan/reports/plan_report.hpp"
#include "moeplan/sweeps/arch_io.hpp"
#include "moeplan/sweeps/grid.hpp"
#include "plan_flags.hpp"

namespace moeplan::cli {
namespace {

struct PlanCmdFlags {
  PlanFlags plan;
  std::string ra;
  std::string arch;
  std::string tokens;
  std::string tokens_unique;
  std::string format = "table";
};

// --tokens D, refused past what moeplan counts in the unit given (tokens, not as a FLOP budget).
double tokens_flag(const PlanCmdFlags& f) {
  const double tokens = parse_positive(f.tokens, "--tokens");
  if (tokens > kMaxTokens)
    throw InputError(fmt::format(
        "--tokens = {} is above the {:.3g} tokens moeplan counts (64-bit integers); give at "
        "most {:.3g}",
        f.tokens, kMaxTokens, kMaxTokens));
  return tokens;
}

// A budget refused for a point given --tokens names the flag: the budget's own line speaks of
// the compute the tokens make.
template <class F>
Plan with_flag_named(const PlanCmdFlags& f, F&& make) {
  try {
    return make();
  } catch (const InputError& e) {
    if (f.tokens.empty() || std::string_view(e.what()).starts_with("--tokens")) throw;
    throw InputError(fmt::format("--tokens {}: {}", f.tokens, e.what()));
  }
}

// --tokens D: C = M·D of this point; otherwise the C the equal-resource rules gave it.
Plan rebudget(const Plan& p, const PlanCmdFlags& f, const PointBudget& base) {
  PointBudget pb = base;
  if (!f.tokens.empty()) pb.compute = p.flops_per_token * tokens_flag(f);
  if (!f.tokens_unique.empty()) {
    pb.reuse = Reuse::strict;
    pb.tokens_unique = parse_positive(f.tokens_unique, "--tokens-unique");
  }
  Plan out = plan_for_arch(p.arch, pb);
  out.id = p.id;
  out.role = p.role;
  out.activation_rate_target = p.activation_rate_target;
  out.reachable = p.reachable;
  out.note = p.note;
  return out;
}

// Flags that steer the solver from --N/--ra: with --arch the file fixes the architecture and
// they would change nothing, so a given one is refused rather than ignored.
const char* const kSolveOnlyFlags[] = {"--family",      "--dense-tokens", "--dense-tpp",
                                       "--n-tolerance", "--ra-tolerance", "--vocab",
                                       "--seq-len",     "--head-dim",     "--alignment",
                                       "--backbone"};

int run(const PlanCmdFlags& f, const CLI::App& app) {
  if (f.format != "table" && f.format != "json")
    throw InputError(
        fmt::format("--format '{}' is not known for plan; use table or json", f.format));
  if (!f.tokens.empty() && !f.plan.compute.empty())
    throw InputError("give at most one of --tokens and --compute (each fixes C)");
  if (!f.tokens_unique.empty() && (!f.plan.unique_tokens.empty() || !f.plan.epochs.empty()))
    throw InputError("give at most one of --tokens-unique, --unique-tokens and --epochs");
  // As grid and plan --N refuse it (sweeps/request.cpp): with --arch the epochs won in silence.
  if (!f.plan.unique_tokens.empty() && !f.plan.epochs.empty())
    throw InputError(
        "give at most one of --unique-tokens (strict reuse) and --epochs (loose reuse)");
  Plan plan;
  std::string context;
  // What the JSON says of the point's budget, as the table's closing lines say it.
  nlohmann::json budget_from, baseline = nullptr;
  if (!f.arch.empty()) {
    if (!f.plan.n.empty() || !f.ra.empty())
      throw InputError("give either --arch FILE or --N and --ra, not both");
    for (const char* name : kSolveOnlyFlags)
      if (app.get_option(name)->count() > 0)
        throw InputError(fmt::format(
            "{} applies when plan solves the point from --N and --ra; with --arch {} the file "
            "fixes the architecture{}",
            name, f.arch,
            std::string_view(name).starts_with("--dense-")
                ? " (set its budget with --compute or --tokens; default 20 tokens per parameter)"
                : " (edit the file, or drop the flag)"));
    Arch arch = read_arch(f.arch);
    arch.count_router = arch.count_router || f.plan.count_router;
    arch.count_norms = arch.count_norms || f.plan.count_norms;
    const ConventionChoice conv = parse_convention_flag(f.plan.convention);
    PointBudget pb;
    pb.convention = conv.convention;
    pb.mask = conv.mask;
    pb.dp_width = parse_positive_integer(f.plan.dp_width, "--dp-width");
    pb.warmup_fraction = parse_warmup_fraction(f.plan.warmup_frac);
    pb.lr_scale = parse_lr_scale(f.plan.lr_scale);
    const double m = planned_flops_per_token(arch, conv.convention, conv.mask);
    // Default budget: 20 consumed tokens per total parameter of this model.
    const double tokens = !f.tokens.empty() ? tokens_flag(f) : 0;
    pb.compute = !f.plan.compute.empty() ? parse_positive(f.plan.compute, "--compute")
                 : !f.tokens.empty()     ? m * tokens
                                         : m * 20.0 * double(count_params(arch).total_params);
    if (!f.plan.epochs.empty()) {
      pb.reuse = Reuse::loose;
      pb.epochs = parse_quantity(f.plan.epochs, "--epochs");
      if (!(pb.epochs >= 1))
        throw InputError(fmt::format("--epochs = {} is invalid; it must be >= 1", f.plan.epochs));
    }
    const bool by_alias = !f.tokens_unique.empty();
    const std::string& unique = by_alias ? f.tokens_unique : f.plan.unique_tokens;
    if (!unique.empty())
      pb.tokens_unique = parse_positive(unique, by_alias ? "--tokens-unique" : "--unique-tokens");
    plan = with_flag_named(f, [&] { return plan_for_arch(arch, pb); });
    budget_from = !f.plan.compute.empty() ? "--compute"
                  : !f.tokens.empty()     ? "--tokens"
                                          : "20 consumed tokens per parameter (the default)";
    plan.id = f.arch;
    plan.role = arch.is_dense() ? "dense" : "moe";
  } else {
    if (f.plan.n.empty() || f.ra.empty())
      throw InputError("plan needs --N and --ra (e.g. --N 2e9 --ra 0.2), or --arch FILE");
    if (f.ra.find_first_of(":,") != std::string::npos)
      throw InputError(fmt::format(
          "--ra '{}': plan takes one activation rate, e.g. 0.2 (use moeplan grid for a range)",
          f.ra));
    const std::vector<double> ra = parse_ra_spec(f.ra);
    const PlanRequest req = make_plan_request(f.plan);
    const EqualResourcePlanner planner(req);
    plan = planner.plan_point(ra[0]);
    const Plan& d = planner.dense();
    context = fmt::format(
        "equal-resource dense baseline: {}  N {}  C {} [{}]  D̂ {} unique tokens\n",
        describe(d.arch), human(double(d.counts.total_params)), human(planner.compute_target()),
        flops_label(d.arch, d.convention, d.mask), human(double(d.budget.tokens_unique)));
    if (!d.note.empty()) context += fmt::format("  {}: {}\n", d.id, d.note);
    budget_from = "the equal-resource dense baseline";
    baseline = {{"arch", describe(d.arch)},
                {"total_params", d.counts.total_params},
                {"compute", planner.compute_target()},
                {"convention", flops_label(d.arch, d.convention, d.mask)},
                {"tokens_unique", d.budget.tokens_unique},
                {"note", d.note}};
    if (!f.tokens.empty() || !f.tokens_unique.empty()) {
      const PointBudget base{planner.compute_target(),
                             req.convention,
                             req.mask,
                             req.budget.reuse,
                             planner.tokens_unique(),
                             req.budget.epochs,
                             req.dp_width,
                             req.warmup_fraction,
                             req.lr_scale};
      plan = with_flag_named(f, [&] { return rebudget(plan, f, base); });
      context += "budget of this point set by --tokens / --tokens-unique (not equal-resource)\n";
      budget_from = "--tokens / --tokens-unique (not equal-resource)";
    }
  }
  // D̂ asked for beyond what the point consumes is capped to it (one epoch): said, as grid says it.
  const std::string& unique_flag =
      !f.tokens_unique.empty() ? f.tokens_unique : f.plan.unique_tokens;
  if (!unique_flag.empty() && plan.budget.reuse == Reuse::strict &&
      plan.budget.tokens_unique == plan.budget.tokens_consumed &&
      parse_positive(unique_flag, "--tokens-unique") > double(plan.budget.tokens_consumed)) {
    const std::string note = fmt::format(
        "unique tokens {} are more than this point consumes ({} tokens): D̂ is capped to them "
        "(one epoch, no repetition)",
        unique_flag, human(double(plan.budget.tokens_consumed)));
    plan.note += (plan.note.empty() ? "" : "; ") + note;  // shown once, as the plan's note
  }
  if (f.format == "json") {
    nlohmann::json j = plan_breakdown_json(plan);
    j["budget_from"] = budget_from;
    j["dense_baseline"] = baseline;
    // A file name need not be UTF-8 (JSON text must be): such bytes become U+FFFD, not exit 70.
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("{}", for_terminal(render_plan_breakdown(plan)));
    if (!context.empty()) fmt::print("\n{}", context);
  }
  return kExitOk;
}

const bool registered = register_command(
    {"plan", "One point in full: parameters, FLOPs per category under each convention, budget", 20,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<PlanCmdFlags>();
       add_plan_flags(app, f->plan, false);
       app.add_option("--ra", f->ra, "target activation rate r_a in (0, 1], e.g. 0.2")
           ->check(non_empty_value());
       app.add_option("--arch", f->arch, "plan this architecture (TOML with the Arch keys)")
           ->check(non_empty_path("file name"));
       app.add_option("--tokens", f->tokens, "consumed tokens D of this point (C = M·D)")
           ->check(non_empty_value());
       app.add_option("--tokens-unique", f->tokens_unique, "unique tokens D̂ of this point")
           ->check(non_empty_value());
       app.add_option("--format", f->format, "table or json");
       return [f, &app] { return run(*f, app); };
     }});

}  // namespace
}  // namespace moeplan::cli
