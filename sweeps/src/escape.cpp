#include "moeplan/sweeps/escape.hpp"

#include <fmt/format.h>

namespace moeplan {

namespace {

// A control character XML 1.0 does not allow (all of C0 but tab, LF and CR): no escape makes
// it valid in an SVG or XHTML document, and in a terminal it is a command.
bool forbidden_control(char c) {
  const auto u = (unsigned char)c;
  return u < 0x20 && c != '\t' && c != '\n' && c != '\r';
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

std::string escape_html(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (forbidden_control(c))
          out += kReplacement;
        else
          out += c;
    }
  }
  return out;
}

std::string escape_markdown(std::string_view s, std::string_view newline) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '|':
      case '\\':
      case '*':
        out += '\\';
        out += c;
        break;
      case '\n':
      case '\r':
        out += newline;
        break;
      case '<':
      case '>':
      case '&':
        out += escape_html(std::string_view(&c, 1));
        break;
      default:
        if (forbidden_control(c))
          out += kReplacement;
        else
          out += c;
    }
  }
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto u = (unsigned char)s[i];
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else if (u == 0xc2 && i + 1 < s.size() && (unsigned char)s[i + 1] >= 0x80 &&
               (unsigned char)s[i + 1] <= 0x9f) {
      out += fmt::format("\\u00{:02x}", (unsigned char)s[++i]);
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace moeplan
