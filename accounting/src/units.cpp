#include "moeplan/accounting/units.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

double parse_quantity(std::string_view text, std::string_view what) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t lead = 0;
  while (lead < s.size() && std::isspace(static_cast<unsigned char>(s[lead]))) ++lead;
  s = s.substr(lead);
  auto fail = [&]() -> double {
    throw InputError(
        fmt::format("{}: '{}' is not a number (write e.g. 2e9, 2.15B, 346M, 0.2)", what, text));
  };
  if (s.empty()) return fail();
  double scale = 1.0;
  switch (s.back()) {
    case 'k':
    case 'K':
      scale = 1e3;
      break;
    case 'M':
      scale = 1e6;
      break;
    case 'B':
    case 'G':
      scale = 1e9;
      break;
    case 'T':
      scale = 1e12;
      break;
    default:
      break;
  }
  if (scale != 1.0) s.pop_back();
  if (s.empty()) return fail();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  const bool range_error = errno == ERANGE;
  // strtod accepts "nan", "inf", hex: refuse anything that is not plain decimal.
  for (char ch : s)
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '.' || ch == 'e' || ch == 'E' ||
          ch == '+' || ch == '-'))
      return fail();
  if (end != s.c_str() + s.size()) return fail();
  // A number, but past what a double holds: said so ("1e400 is not a number" read as a typo).
  if (!std::isfinite(v * scale))
    throw InputError(
        fmt::format("{}: '{}' is beyond the largest number a double holds (1.8e308)", what, text));
  // Below what a double holds, strtod gives 0 (or a denormal): 1e-400 read as 0 in silence.
  if (range_error && std::fabs(v) < std::numeric_limits<double>::min())
    throw InputError(fmt::format(
        "{}: '{}' is below the smallest number a double holds (2.2e-308); write 0 if 0 is "
        "meant",
        what, text));
  // "2e9k" would read as 2e12: one way of writing the scale, never both multiplied.
  if (scale != 1.0 && s.find_first_of("eE") != std::string::npos)
    throw InputError(fmt::format(
        "{}: '{}' has both an exponent and a suffix; write one of them (e.g. 2e9 or 2B)", what,
        text));
  return v * scale;
}

double percent_to_fraction(double v) {
  if (!std::isfinite(v) || v == 0) return v / 100;
  // The shortest decimal that reads back as v, its exponent lowered by 2, read once.
  const std::string d = fmt::format("{}", v);
  const size_t e = d.find_first_of("eE");
  const int exponent = e == std::string::npos ? 0 : std::stoi(d.substr(e + 1));
  const std::string mantissa = d.substr(0, e);
  return std::strtod(fmt::format("{}e{}", mantissa, exponent - 2).c_str(), nullptr);
}

double parse_quantity_or_percent(std::string_view text, std::string_view what) {
  const bool percent = !text.empty() && text.back() == '%';
  const double v = parse_quantity(percent ? text.substr(0, text.size() - 1) : text, what);
  return percent ? percent_to_fraction(v) : v;
}

std::string bytes_text(double bytes) {
  if (bytes >= double(1ull << 40)) return fmt::format("{:.2f} TiB", bytes / double(1ull << 40));
  if (bytes >= double(1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
}

std::string human(double v, int digits) {
  // Round to the digits shown before choosing the unit, so 999.99e12 reads 1.00e+15, not 1e+03T.
  const double a = std::fabs(std::stod(fmt::format("{:.{}e}", v, std::max(0, digits - 1))));
  struct S {
    double f;
    const char* s;
  };
  static constexpr S kSteps[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}};
  if (a >= 1e15 || (a > 0 && a < 1e-3)) return fmt::format("{:.{}e}", v, std::max(0, digits - 1));
  for (const S& st : kSteps)
    if (a >= st.f) return fmt::format("{:.{}g}{}", v / st.f, digits, st.s);
  return fmt::format("{:.{}g}", v, digits);
}

std::string ratio(double v, int decimals) {
  return std::fabs(v) < 1e5 ? fmt::format("{:.{}f}", v, decimals) : human(v);
}

std::string percent_text(double fraction, int decimals) {
  const double pct = 100 * fraction;
  for (int d = decimals; d < 6; ++d) {
    const std::string s = fmt::format("{:.{}f}", pct, d);
    if (std::fabs(std::stod(s) - pct) <= 1e-9 * std::max(1.0, std::fabs(pct))) return s;
  }
  return fmt::format("{:.6f}", pct);
}

}  // namespace moeplan
