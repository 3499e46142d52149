#include "moeplan/sweeps/ledger_json.hpp"

#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

nlohmann::json flop_count_to_json(FlopCount c) {
  if (c.fits_int64()) return c.to_int64();
  return to_string(c);
}

std::optional<FlopCount> flop_count_from_json(const nlohmann::json& j) {
  if (j.is_number_integer() && !j.is_number_unsigned()) return FlopCount(j.get<int64_t>());
  if (j.is_number_unsigned()) {  // 2^63 up to 2^64 - 1: exact as digits
    return parse_flop_count(std::to_string(j.get<uint64_t>()));
  }
  if (j.is_string()) return parse_flop_count(j.get<std::string>());
  if (j.is_number_float()) {
    // A whole number below 2^63 ("5e5" in a hand-made record) is exact in a double; past it a
    // double has lost the writer's digits.
    const double v = j.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9223372036854775808.0)
      return FlopCount(int64_t(v));
  }
  return std::nullopt;
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

FlopLedger flop_ledger_from_json(const nlohmann::json& j, const std::string& where) {
  auto count = [&](const nlohmann::json& obj, const std::string& key, const std::string& path) {
    const auto c =
        obj.is_object() && obj.contains(key) ? flop_count_from_json(obj.at(key)) : std::nullopt;
    if (!c)
      throw InputError(
          fmt::format("{}: FLOP count '{}' is missing or not an integer (valid: a JSON integer "
                      "below 2^64, or a "
                      "string of decimal digits)",
                      where, path));
    return *c;
  };
  if (!j.is_object() || !j.contains("by_category") || !j.at("by_category").is_object())
    throw InputError(fmt::format("{}: 'by_category' is missing or not an object", where));
  FlopLedger l;
  for (int c = 0; c < kFlopCategories; ++c) {
    const std::string cat(name(FlopCategory(c)));
    const auto& by = j.at("by_category");
    if (!by.contains(cat) || !by.at(cat).is_object())
      throw InputError(fmt::format("{}: 'by_category.{}' is missing or not an object", where, cat));
    for (int p = 0; p < kPhases; ++p) {
      const std::string phase(name(Phase(p)));
      l.flops[size_t(c)][size_t(p)] = count(by.at(cat), phase, "by_category." + cat + "." + phase);
    }
  }
  l.elementwise = count(j, "elementwise", "elementwise");
  return l;
}

}  // namespace moeplan
