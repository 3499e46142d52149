#include "moeplan/sweeps/ledger_json.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

nlohmann::json flop_count_to_json(FlopCount c) {
  if (c.fits_int64()) return c.to_int64();
  return to_string(c);
}

namespace {
std::optional<FlopCount> any_count(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {  // how a JSON reader holds a non-negative integer
    const uint64_t v = j.get<uint64_t>();
    if (v <= uint64_t(INT64_MAX)) return FlopCount(int64_t(v));
    return parse_flop_count(std::to_string(v));  // 2^63 up to 2^64 - 1, exact as digits
  }
  if (j.is_number_integer()) return FlopCount(j.get<int64_t>());
  if (j.is_string()) return parse_flop_count(j.get<std::string>());
  if (j.is_number_float()) {
    // A whole number below 2^53 ("5e5" in a hand-made record) is exact in a double; from 2^53
    // on, a double may have lost the writer's last digit (2^53 + 1 reads as 2^53).
    const double v = j.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9007199254740992.0)
      return FlopCount(int64_t(v));
  }
  return std::nullopt;
}
}  // namespace

std::optional<FlopCount> flop_count_from_json(const nlohmann::json& j) {
  // Nothing executes a negative number of FLOPs, nor 10^36 (a thousand years of a zettaFLOP/s);
  // the bound keeps the sum of a ledger's 31 counts far inside 128 bits.
  constexpr int64_t kE18 = 1'000'000'000'000'000'000;
  constexpr FlopCount kLimit = FlopCount(kE18) * kE18;
  const auto c = any_count(j);
  if (c && (*c < 0 || *c >= kLimit)) return std::nullopt;
  return c;
}

nlohmann::json flop_ledger_to_json(const FlopLedger& ledger) {
  nlohmann::json by = nlohmann::json::object();
  for (int c = 0; c < kFlopCategories; ++c) {
    nlohmann::json phases = nlohmann::json::object();
    for (int p = 0; p < kPhases; ++p)
      phases[std::string(name(Phase(p)))] =
          flop_count_to_json(ledger.at(FlopCategory(c), Phase(p)));
    by[std::string(name(FlopCategory(c)))] = phases;
  }
  return {{"by_category", by},
          {"elementwise", flop_count_to_json(ledger.elementwise)},
          {"total", flop_count_to_json(ledger.total())}};
}

std::optional<int64_t> count_from_json(const nlohmann::json& j) {
  if (j.is_number_unsigned())
    return j.get<uint64_t>() <= uint64_t(INT64_MAX) ? std::optional(int64_t(j.get<uint64_t>()))
                                                    : std::nullopt;
  if (j.is_number_integer())
    return j.get<int64_t>() >= 0 ? std::optional(j.get<int64_t>()) : std::nullopt;
  if (!j.is_number_float()) return std::nullopt;
  const double d = j.get<double>();
  if (!(d >= 0) || d >= 0x1p63 || d != std::floor(d)) return std::nullopt;
  return int64_t(d);
}

std::optional<RecordDefect> curve_defect(const nlohmann::json& record) {
  using Keys = std::array<const char*, 2>;
  for (const auto& [curve, keys] : {std::pair<const char*, Keys>{"val_curve", {"step", "val_bpc"}},
                                    {"loss_curve", {"tokens_consumed", "train_loss"}}}) {
    if (!record.is_object() || !record.contains(curve)) continue;
    const nlohmann::json& c = record.at(curve);
    if (!c.is_array()) return RecordDefect{curve, "an array"};
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string entry = fmt::format("{}[{}]", curve, i);
      if (!c[i].is_object()) return RecordDefect{entry, "an object"};
      // Steps, tokens, losses and bits are never negative: a negative loss only came from a
      // hand edit, and ±1.7e308 in one chart overflowed its axis range.
      for (const char* k : keys) {
        if (!c[i].contains(k)) return RecordDefect{entry + "." + k, "a number >= 0", true};
        if (!c[i].at(k).is_number() || !(c[i].at(k).get<double>() >= 0))
          return RecordDefect{entry + "." + k, "a number >= 0"};
      }
      if (!c[i].contains("parts")) continue;
      const nlohmann::json& parts = c[i].at("parts");
      if (!parts.is_object()) return RecordDefect{entry + ".parts", "an object"};
      for (const auto& [part, v] : parts.items())
        if (!v.is_number()) return RecordDefect{entry + ".parts." + part, "a number"};
    }
  }
  // Bits are nats over ln 2: an evaluation whose val_bpc is not its val_loss's was edited (a
  // BPC of 1.0 beside a loss of 1.42 nats, 2.05 bits).
  if (record.is_object() && record.contains("val_curve"))
    for (size_t i = 0; i < record.at("val_curve").size(); ++i) {
      const nlohmann::json& e = record.at("val_curve")[i];
      if (!e.contains("val_loss")) continue;
      if (!e.at("val_loss").is_number())
        return RecordDefect{fmt::format("val_curve[{}].val_loss", i), "a number >= 0"};
      const double bits = e.at("val_loss").get<double>() / std::numbers::ln2;
      if (std::fabs(e.at("val_bpc").get<double>() - bits) > 1e-9 * std::max(1.0, bits))
        return RecordDefect{fmt::format("val_curve[{}].val_bpc", i),
                            fmt::format("its val_loss over ln 2, {}", bits)};
      // Each part's bits are its loss's too (the report's facts and arith columns read them).
      if (!e.contains("parts_loss") || !e.contains("parts")) continue;
      if (!e.at("parts_loss").is_object())
        return RecordDefect{fmt::format("val_curve[{}].parts_loss", i), "an object"};
      for (const auto& [part, loss] : e.at("parts_loss").items()) {
        const std::string key = fmt::format("val_curve[{}].parts_loss.{}", i, part);
        if (!loss.is_number() || !(loss.get<double>() >= 0))
          return RecordDefect{key, "a number >= 0"};
        if (!e.at("parts").contains(part))
          return RecordDefect{fmt::format("val_curve[{}].parts.{}", i, part),
                              "the bits of parts_loss." + part, true};
        const double part_bits = loss.get<double>() / std::numbers::ln2;
        if (std::fabs(e.at("parts").at(part).get<double>() - part_bits) >
            1e-9 * std::max(1.0, part_bits))
          return RecordDefect{fmt::format("val_curve[{}].parts.{}", i, part),
                              fmt::format("its parts_loss over ln 2, {}", part_bits)};
      }
    }
  // The training seconds at each evaluation, where given: one a val_curve entry, never falling
  // (the clock is summed over resumes), none past the record's own training time. The report
  // reads them as the time each BPC was reached.
  if (record.is_object() && record.contains("val_curve_train_seconds")) {
    const nlohmann::json& t = record.at("val_curve_train_seconds");
    const size_t n = record.contains("val_curve") && record.at("val_curve").is_array()
                         ? record.at("val_curve").size()
                         : 0;
    if (!t.is_array() || t.size() != n)
      return RecordDefect{"val_curve_train_seconds",
                          fmt::format("a list of {} numbers, one for each val_curve entry", n)};
    const double total = record.contains("train_seconds") && record.at("train_seconds").is_number()
                             ? record.at("train_seconds").get<double>()
                             : INFINITY;
    double before = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string key = fmt::format("val_curve_train_seconds[{}]", i);
      if (!t[i].is_number() || !std::isfinite(t[i].get<double>()) || !(t[i].get<double>() >= 0))
        return RecordDefect{key, "a number >= 0"};
      const double s = t[i].get<double>();
      if (s < before)
        return RecordDefect{key, fmt::format("at least the evaluation's before it, {}", before)};
      if (s > total * (1 + 1e-12))
        return RecordDefect{key, fmt::format("at most the record's train_seconds, {}", total)};
      before = s;
    }
  }
  // A complete record was evaluated at its end (`run` does): a final BPC beside an empty list of
  // evaluations was measured by nothing. (Records written before val_curve existed have none.)
  if (record.is_object() && record.value("status", "") == "complete" &&
      record.contains("final_val_bpc") && record.contains("val_curve") &&
      record.at("val_curve").empty())
    return RecordDefect{"val_curve", "the evaluations behind final_val_bpc (none is given)"};
  // A complete record's final BPC is its last evaluation's (`run` writes it so): a
  // final_val_bpc of its own came from a hand edit, and reports would rank the point by it.
  if (record.is_object() && record.value("status", "") == "complete" &&
      record.contains("final_val_bpc") && record.at("final_val_bpc").is_number() &&
      record.contains("val_curve") && !record.at("val_curve").empty()) {
    const nlohmann::json& c = record.at("val_curve");
    const double last = c.back().at("val_bpc").get<double>();
    if (record.at("final_val_bpc").get<double>() != last)
      return RecordDefect{
          "final_val_bpc",
          fmt::format("the last evaluation's val_bpc, {} (val_curve[{}])", last, c.size() - 1)};
  }
  return std::nullopt;
}

std::optional<RecordDefect> run_facts_defect(const nlohmann::json& record) {
  if (!record.is_object()) return RecordDefect{"(the whole record)", "a JSON object"};
  for (const char* k : {"device", "kernels"})
    if (record.contains(k) && !record.at(k).is_string()) return RecordDefect{k, "a string"};
  for (const char* k : {"world_size", "pass_seqs"})
    if (record.contains(k)) {
      const auto c = count_from_json(record.at(k));
      if (!c || *c < 1) return RecordDefect{k, "a whole number >= 1"};
    }
  if (record.contains("optimizer_sharded") && !record.at("optimizer_sharded").is_boolean())
    return RecordDefect{"optimizer_sharded", "true or false"};
  for (const char* k : {"train_seconds", "wall_seconds"})
    if (record.contains(k) && !(record.at(k).is_number() && record.at(k).get<double>() >= 0))
      return RecordDefect{k, "a number >= 0"};
  // Bits per byte of a held-out set are never 0: a model that predicts real text perfectly does
  // not exist, and 0 would be the "best point" of every report.
  if (record.contains("final_val_bpc") &&
      !(record.at("final_val_bpc").is_number() && record.at("final_val_bpc").get<double>() > 0))
    return RecordDefect{"final_val_bpc", "a number > 0"};
  return std::nullopt;
}

std::optional<RecordDefect> plan_defect(const nlohmann::json& record) {
  if (!record.is_object() || !record.contains("plan") || !record.at("plan").is_object())
    return std::nullopt;  // the readers name a missing plan themselves
  const nlohmann::json& p = record.at("plan");
  // The plan a record ran is its point's: one run copied under another point id counts twice.
  if (p.contains("id") && record.contains("point_id") && record.at("point_id").is_string() &&
      p.at("id") != record.at("point_id"))
    return RecordDefect{"plan.id",
                        fmt::format("the record's point_id, {}", record.at("point_id").dump())};
  auto number = [&](const char* k) -> std::optional<double> {
    if (p.contains(k) && p.at(k).is_number()) return p.at(k).get<double>();
    return std::nullopt;
  };
  auto count = [&](const nlohmann::json& j, const char* k) -> std::optional<int64_t> {
    return j.is_object() && j.contains(k) ? count_from_json(j.at(k)) : std::nullopt;
  };
  auto close = [](double a, double b) {
    return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
  };
  const auto rate = number("activation_rate");
  const auto n = count(p, "total_params"), na = count(p, "active_params");
  if (rate && !(*rate > 0 && *rate <= 1)) return RecordDefect{"plan.activation_rate", "in (0, 1]"};
  if (rate && n && na && *n > 0 && !close(*rate, double(*na) / double(*n)))
    return RecordDefect{"plan.activation_rate",
                        fmt::format("active_params / total_params = {} / {} = {:.6g}", *na, *n,
                                    double(*na) / double(*n))};
  const auto m = number("flops_per_token"), c = number("compute");
  const auto d = count(p, "tokens_consumed"), du = count(p, "tokens_unique");
  if (m && c && d && !close(*c, *m * double(*d)))
    return RecordDefect{"plan.compute",
                        fmt::format("flops_per_token · tokens_consumed = {:.6g}", *m * double(*d))};
  const auto steps = count(p, "steps"), batch = count(p, "batch_seqs");
  const auto seq = p.contains("arch") ? count(p.at("arch"), "seq_len") : std::nullopt;
  if (d && steps && batch && seq && *steps <= INT64_MAX / std::max<int64_t>(1, *batch) &&
      *steps * *batch <= INT64_MAX / std::max<int64_t>(1, *seq) && *d != *steps * *batch * *seq)
    return RecordDefect{"plan.tokens_consumed",
                        fmt::format("steps · batch_seqs · seq_len = {} · {} · {} = {}", *steps,
                                    *batch, *seq, *steps * *batch * *seq)};
  if (d && du && !(*du >= 1 && *du <= *d))
    return RecordDefect{"plan.tokens_unique", fmt::format("in [1, tokens_consumed = {}]", *d)};
  const auto epochs = number("epochs");
  if (epochs && d && du && !close(*epochs, double(*d) / double(*du)))
    return RecordDefect{"plan.epochs", fmt::format("tokens_consumed / tokens_unique = {:.6g}",
                                                   double(*d) / double(*du))};
  return std::nullopt;
}

void check_point_folder(const std::string& point_id, const std::filesystem::path& record_file) {
  const std::string folder = record_file.parent_path().filename().string();
  if (folder != point_id)
    throw InputError(fmt::format(
        "{}: 'point_id' is \"{}\" but the record lies in folder '{}' (`moeplan run` keeps a "
        "point's record in runs/<point_id>/); move it back or fix the folder's name",
        record_file.string(), point_id, folder));
}

FlopLedger flop_ledger_from_json(const nlohmann::json& j, const std::string& where,
                                 const std::string& prefix) {
  auto missing = [&](const std::string& key, const char* want) {
    return InputError(fmt::format("{}: '{}{}' is missing or not {}", where, prefix, key, want));
  };
  auto count = [&](const nlohmann::json& obj, const std::string& key, const std::string& path) {
    const auto c =
        obj.is_object() && obj.contains(key) ? flop_count_from_json(obj.at(key)) : std::nullopt;
    if (!c) throw missing(path, fmt::format("a FLOP count ({})", kFlopCountForms).c_str());
    return *c;
  };
  if (!j.is_object() || !j.contains("by_category") || !j.at("by_category").is_object())
    throw missing("by_category", "an object");
  const nlohmann::json& by = j.at("by_category");
  // A name the ledger does not have is a typo or another tool's ledger, not a count to drop.
  for (const auto& [cat, phases] : by.items()) {
    if (!parse_flop_category(cat))
      throw InputError(
          fmt::format("{}: unknown FLOP category '{}' under {}by_category", where, cat, prefix));
    if (!phases.is_object()) throw missing("by_category." + cat, "an object");
    for (const auto& [phase, v] : phases.items())
      if (!parse_phase(phase))
        throw InputError(fmt::format("{}: unknown phase '{}' under {}by_category.{}", where, phase,
                                     prefix, cat));
  }
  FlopLedger l;
  for (int c = 0; c < kFlopCategories; ++c) {
    const std::string cat(name(FlopCategory(c)));
    if (!by.contains(cat)) throw missing("by_category." + cat, "an object");
    for (int p = 0; p < kPhases; ++p) {
      const std::string phase(name(Phase(p)));
      l.flops[size_t(c)][size_t(p)] = count(by.at(cat), phase, "by_category." + cat + "." + phase);
    }
  }
  if (j.contains("elementwise")) l.elementwise = count(j, "elementwise", "elementwise");
  return l;
}

}  // namespace moeplan
