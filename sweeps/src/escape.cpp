#include "moeplan/sweeps/escape.hpp"

#include <cstdint>

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
  auto alnum = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  };
  // Block markers matter only where a line break starts a block (paragraphs); a table cell or a
  // heading's text is inline, so its "-0.12" keeps its sign as written.
  const bool paragraphs = newline.find('\n') != std::string_view::npos;
  std::string out;
  bool line_start = paragraphs;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (line_start) {
      // A block's marker is read at a line's start, after up to three spaces (four make code):
      // the spaces go, and a list's '-' or '+' and a setext or rule's '=' are escaped ('#'
      // always is).
      if (c == ' ' || c == '\t') continue;
      line_start = false;
      if (c == '-' || c == '+' || c == '=' || c == '[') {  // '[': a link reference definition
        out += '\\';
        out += c;
        continue;
      }
      // An ordered list's "1." or "1)" before a space or the end.
      size_t j = i;
      while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
      if (j > i && j < s.size() && (s[j] == '.' || s[j] == ')') &&
          (j + 1 == s.size() || s[j + 1] == ' ' || s[j + 1] == '\t')) {
        out.append(s.substr(i, j - i));
        out += '\\';
        out += s[j];
        i = j;
        continue;
      }
    }
    switch (c) {
      case '`': {
        // A code span (a run of backticks closed by one as long before the line ends) is kept
        // as written: inside it nothing is markup, and an escape would show ("`moeplan audit`"
        // in a verdict; a user's "`a*b`"). In a table cell its '|' is still escaped, GFM's
        // rule. A backtick run left unclosed is escaped.
        size_t run = 0;
        while (i + run < s.size() && s[i + run] == '`') ++run;
        size_t close = std::string_view::npos;
        for (size_t k = i + run; k < s.size() && s[k] != '\n' && s[k] != '\r';) {
          size_t r = 0;
          while (k + r < s.size() && s[k + r] == '`') ++r;
          if (r == run) {
            close = k;
            break;
          }
          k += r > 0 ? r : 1;
        }
        if (close == std::string_view::npos) {
          for (size_t r = 0; r < run; ++r) out += "\\`";
          i += run - 1;
          break;
        }
        for (size_t k = i; k < close + run; ++k) {
          if (s[k] == '|' && !paragraphs) out += '\\';
          out += forbidden_control(s[k]) ? std::string(kReplacement) : std::string(1, s[k]);
        }
        i = close + run - 1;
        break;
      }
      case '|':
      case '\\':
      case '*':
      case '~':
      case '#':
        out += '\\';
        out += c;
        break;
      case ']':
        // "](" and "][" make a link (or an image); a "[paper]" alone does not, and keeps its
        // brackets as written.
        if (i + 1 < s.size() && (s[i + 1] == '(' || s[i + 1] == '[')) out += '\\';
        out += c;
        break;
      case '_':
        // Inside a word ("my_file") it cannot open or close emphasis; elsewhere it can.
        if (i > 0 && i + 1 < s.size() && alnum(s[i - 1]) && alnum(s[i + 1])) {
          out += c;
        } else {
          out += "\\_";
        }
        break;
      case '\n':
      case '\r':
        out += newline;
        line_start = paragraphs;
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
  for (size_t i = 0; i < s.size();) {
    const auto u = (unsigned char)s[i];
    const size_t n = utf8_length_at(s, i);
    if (n == 0 || (n == 1 && (u < 0x20 || u == 0x7f))) {  // a control, or a byte of no character
      out += fmt::format("\\x{:02x}", u);
      ++i;
      continue;
    }
    const uint32_t cp = utf8_code_point_at(s, i, n);
    if (is_hidden_character(cp))
      out += cp > 0xffff ? fmt::format("\\U{:08x}", cp) : fmt::format("\\u{:04x}", cp);
    else
      out.append(s, i, n);
    i += n;
  }
  return out;
}

char32_t utf8_code_point_at(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return char32_t((unsigned char)s[i + k]); };
  if (n == 1) return b(0);
  if (n == 2) return (b(0) & 0x1f) << 6 | (b(1) & 0x3f);
  if (n == 3) return (b(0) & 0x0f) << 12 | (b(1) & 0x3f) << 6 | (b(2) & 0x3f);
  return (b(0) & 0x07) << 18 | (b(1) & 0x3f) << 12 | (b(2) & 0x3f) << 6 | (b(3) & 0x3f);
}

bool is_hidden_character(char32_t c) {
  return (c >= 0x7f && c <= 0x9f) || c == 0xad || c == 0x34f || c == 0x115f || c == 0x1160 ||
         c == 0x17b4 || c == 0x17b5 || (c >= 0x180b && c <= 0x180f) ||
         (c >= 0x200b && c <= 0x200f) || (c >= 0x2028 && c <= 0x202e) ||
         (c >= 0x2060 && c <= 0x206f) || c == 0x3164 || (c >= 0xfe00 && c <= 0xfe0f) ||
         c == 0xfeff || c == 0xffa0 || (c >= 0xfff9 && c <= 0xfffb) ||
         (c >= 0x1bca0 && c <= 0x1bca3) || (c >= 0x1d173 && c <= 0x1d17a) ||
         (c >= 0xe0000 && c <= 0xe0fff);
}

size_t utf8_length_at(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return i + k < s.size() ? (unsigned char)s[i + k] : 0u; };
  const unsigned b = at(0);
  if (i >= s.size()) return 0;
  if (b < 0x80) return 1;
  const auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) {
    return at(k) >= lo && at(k) <= hi;
  };
  // The table of well-formed sequences (Unicode 15, table 3-7).
  if (b >= 0xc2 && b <= 0xdf) return cont(1) ? 2 : 0;
  if (b == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (b == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (b == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (b >= 0xf1 && b <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (b == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

}  // namespace moeplan
