#pragma once
// Numbers as people write them: "2e9", "2.15e9", "2B", "346M", "65B", "1.5k", "0.2".
#include <string>
#include <string_view>

namespace moeplan {

// Throws InputError("<what>: '<text>' is not a number (e.g. 2e9, 2.15B, 346M)"); an exponent
// and a suffix together ("2e9k") are refused, not multiplied.
double parse_quantity(std::string_view text, std::string_view what);
// v percent as a fraction, the decimal the percentage says rounded once: 1.1 (%) is 0.011, where
// v / 100 is 0.011000000000000001 (and a manifest written from it differs from one of 0.011).
double percent_to_fraction(double v);
// A quantity, or a percentage of one ("1%" is 0.01, through percent_to_fraction): the tolerances
// of `grid` and `audit` take both. Throws parse_quantity's InputError.
double parse_quantity_or_percent(std::string_view text, std::string_view what);
// Compact human form: 2.15e9 -> "2.15B", 3.46e8 -> "346M", 1.64e21 -> "1.64e21".
std::string human(double value, int digits = 3);
// A ratio (tokens per parameter, epochs) with `decimals` places while it reads at a glance
// (below 10^5), in human() form beyond: 20.4 -> "20.40", 4.98e13 -> "49.8T".
std::string ratio(double value, int decimals);
// A tolerance in percentage points (or percent) with `decimals` places, and more where those
// would not show it (up to six): 0.005 -> "0.50", 0.00001 -> "0.001", not "0.00".
std::string percent_text(double fraction, int decimals = 2);
// A byte count as moeplan writes memory: "12.30 GiB", or "38.0 MiB" below a GiB (GiB = 2^30).
std::string bytes_text(double bytes);

}  // namespace moeplan
