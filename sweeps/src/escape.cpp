#include "moeplan/sweeps/escape.hpp"

namespace moeplan {

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
        out += "\\|";
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
        out += c;
    }
  }
  return out;
}

}  // namespace moeplan
