#include "moeplan/sweeps/escape.hpp"

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

}  // namespace moeplan
