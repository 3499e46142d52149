#include "moeplan/backend/record.hpp"

#include <cmath>

#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/sweeps/ledger_json.hpp"

namespace moeplan::backend {

nlohmann::json make_record(const RecordInputs& in) {
  const Plan& plan = *in.plan;
  const RunState& st = *in.state;
  const Arch& arch = plan.arch;
  const FlopLedger& ledger = st.train_flops;
  const double consumed = double(st.tokens.consumed);
  auto per_token = [&](double v) { return consumed > 0 ? v / consumed : 0.0; };

  const std::string exact_label = convention_label(Convention::exact, AttentionMask::causal);
  // C [exact/causal]: the useful products as executed (padding and recompute are in the ledger's
  // total, which the time table's executed rate reads, not in C).
  const double exact_total = lens(arch, Convention::exact, AttentionMask::causal).apply(ledger);
  const double paper = lens(arch, Convention::paper, AttentionMask::causal).apply(ledger);
  const double megatron = lens(arch, Convention::megatron, AttentionMask::causal).apply(ledger);
  // exact/full: the causal attention core counted at S keys a query (an exact/full plan's C).
  const std::string full_label = convention_label(Convention::exact, AttentionMask::full);
  const double exact_full =
      lens(arch, Convention::exact, AttentionMask::causal, AttentionMask::full).apply(ledger);

  nlohmann::json flops = flop_ledger_to_json(ledger);
  flops["executed_mask"] = std::string(name(AttentionMask::causal));
  flops["conventions"] = {{exact_label, exact_total},
                          {full_label, exact_full},
                          {"paper", paper},
                          {"megatron", megatron}};
  flops["per_token"] = {{exact_label, per_token(exact_total)},
                        {full_label, per_token(exact_full)},
                        {"paper", per_token(paper)},
                        {"megatron", per_token(megatron)}};
  flops["validation"] = flop_ledger_to_json(st.eval_flops);  // not part of C

  // The plan's C in the paper convention, whatever convention it was planned in.
  const double planned_paper_per_token = plan.convention == Convention::paper
                                             ? plan.flops_per_token
                                             : flops_per_token(arch, Convention::paper).total;
  const double plan_paper = planned_paper_per_token * double(plan.budget.tokens_consumed);
  const double target_paper =
      plan.convention == Convention::paper ? plan.budget.compute_target : plan_paper;
  const bool complete = in.status == "complete";

  const TokenLedger& t = st.tokens;
  nlohmann::json tokens = {{"consumed", t.consumed},
                           {"loss_bearing", t.loss_bearing},
                           {"unique", t.unique()},
                           {"epochs", t.epochs()},
                           {"epoch_index", st.order.epoch()},
                           {"epoch_cursor", st.order.cursor()},
                           {"dropped", t.dropped},
                           {"windows", t.windows_consumed},
                           {"windows_unique", t.windows_touched},
                           {"windows_total", t.windows_total},
                           {"dropped_assignments", st.dropped_assignments}};
  nlohmann::json matches = {
      {"steps", st.step == plan.budget.steps},
      {"tokens_consumed", t.consumed == plan.budget.tokens_consumed},
      {"tokens_unique", t.unique() == plan.budget.tokens_unique},
      {"epochs", t.consumed * plan.budget.tokens_unique ==
                     plan.budget.tokens_consumed * t.unique()},  // exact, in integers
  };

  nlohmann::json rec = {
      {"schema", 1},
      {"point_id", plan.id},
      {"status", in.status},
      {"device", in.device},
      {"kernels", in.kernels},
      {"kernels_requested", in.kernels_requested},
      {"threads_requested", in.threads_requested},
      {"plan", *in.plan_json},
      {"measured",
       {{"total_params", in.params.total_params},
        {"active_params", in.params.active_params},
        {"trainable_params", in.params.trainable},
        {"flops", flops},
        {"tokens", tokens},
        {"steps", st.step},
        {"compute",
         {{"paper", paper},
          {"plan_paper", plan_paper},
          {"target_paper", target_paper},
          {"rel_diff", plan_paper > 0 ? (paper - plan_paper) / plan_paper : 0.0},
          {"within_rounding", complete && within_rounding(paper, target_paper, plan_paper)}}},
        {"matches_plan", matches}}},
      {"data", in.data},
      {"train", in.train},
      {"loss_curve", st.loss_curve},
      {"val_curve", st.val_curve},
      {"checkpoint_every", in.checkpoint_every},
      {"eval_every", in.eval_every},
      {"eval_tokens", in.eval_tokens},
      {"resumes", st.resumes},
  };
  rec["sweep_equal_resources"] = in.equal_resources;
  if (in.n_tolerance > 0 && in.compute_tolerance > 0)
    rec["sweep_tolerances"] = {{"n", in.n_tolerance}, {"compute", in.compute_tolerance}};
  if (!st.val_curve.empty()) {
    rec["final_val_loss"] = st.val_curve.back().at("val_loss");
    rec["final_val_bpc"] = st.val_curve.back().at("val_bpc");
  }
  // The training seconds (evaluations not counted, summed over resumes) at each evaluation, in
  // val_curve's order: what the report's BPC-against-time chart and time to the dense
  // baseline's BPC read. Left out where a resume began from a checkpoint that had none.
  if (!st.val_curve.empty() && st.val_seconds.size() == st.val_curve.size())
    rec["val_curve_train_seconds"] = st.val_seconds;
  const double wall = st.train_seconds + st.eval_seconds;
  rec["wall_seconds"] = wall;
  rec["train_seconds"] = st.train_seconds;
  rec["eval_seconds"] = st.eval_seconds;
  rec["tokens_per_second"] = st.train_seconds > 0 ? consumed / st.train_seconds : 0.0;
  rec["achieved_flops_per_second"] = st.train_seconds > 0 ? exact_total / st.train_seconds : 0.0;
  rec["achieved_flops_convention"] = exact_label;
  // The rates above are the job's; a data-parallel job ran on world_size devices at once.
  rec["world_size"] = in.world_size;
  // Gradient accumulation: each step ran in passes of at most this many sequences per rank.
  rec["pass_seqs"] = in.pass_seqs;
  rec["optimizer_sharded"] = in.optimizer_sharded;
  // The most memory moeplan's buffers held on the device at once (rank 0's device, this
  // session; not the CUDA context's, nor cuBLAS's or NCCL's own), and the device's size.
  if (in.device_memory_peak > 0)
    rec["device_memory"] = {{"peak_bytes", in.device_memory_peak},
                            {"device_bytes", in.device_memory_total}};
  const double per_device =
      st.train_seconds > 0 ? exact_total / st.train_seconds / double(in.world_size) : 0.0;
  rec["achieved_flops_per_second_per_device"] = per_device;
  // What trained it, each session's hardware in order (RunState::hardware); and, where all of it
  // ran on one kind whose peak is known, the model FLOP utilisation: the rate above (exact/causal,
  // padding and recompute left out) over the maker's dense peak of one device, or the peak the
  // run was given (--peak-tflops): peak_source says which.
  rec["hardware"] = st.hardware;
  // Resumed in other layouts (--elastic): each, from the step it began at. Over other rank
  // counts, the seconds above were not spent on world_size devices throughout: no MFU.
  bool one_world = true;
  if (!st.layouts.empty()) {
    rec["layouts"] = layouts_to_json(st.layouts);
    for (const Layout& l : st.layouts) one_world = one_world && l.world_size == in.world_size;
  }
  if (in.peak_flops_per_second > 0 && st.hardware.size() == 1 && one_world) {
    rec["peak_flops_per_second_per_device"] = in.peak_flops_per_second;
    rec["peak_source"] = in.peak_given ? "given" : "built-in";
    rec["mfu"] = per_device / in.peak_flops_per_second;
  }
  return rec;
}

}  // namespace moeplan::backend
