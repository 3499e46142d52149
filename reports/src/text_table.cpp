#include "moeplan/reports/text_table.hpp"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "moeplan/sweeps/escape.hpp"

namespace moeplan {

namespace {

// East Asian wide and fullwidth code points take two terminal columns (the main blocks of
// Unicode's EastAsianWidth W and F: Hangul Jamo, CJK, Hiragana/Katakana, Hangul syllables,
// compatibility ideographs, fullwidth forms, and the supplementary ideograph planes).
bool is_wide(unsigned cp) {
  return (cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0xA4CF && cp != 0x303F) ||
         (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xF900 && cp <= 0xFAFF) ||
         (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF60) ||
         (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x20000 && cp <= 0x3FFFD);
}

}  // namespace

// One column a code point, two for East Asian wide ones, none for combining marks (U+0300 ..
// U+036F): "D̂" and "η" line up like "D", and "模型" like "abcd".
size_t display_width(const std::string& s) {
  size_t width = 0;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    unsigned cp = len == 1 ? c : len == 2 ? c & 0x1Fu : len == 3 ? c & 0x0Fu : c & 0x07u;
    for (size_t k = 1; k < len && i + k < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
    if (!(cp >= 0x300 && cp <= 0x36F)) width += is_wide(cp) ? 2 : 1;
    i += len;
  }
  return width;
}

namespace {

std::string pad(const std::string& s, size_t width, TextTable::Align align) {
  const size_t w = display_width(s);
  const std::string fill(width > w ? width - w : 0, ' ');
  return align == TextTable::Align::left ? s + fill : fill + s;
}

// The bytes of `line` whose code points start at display columns [from, to): a cell of an
// aligned table, whose columns are display columns (a combining mark goes with its base).
std::string display_columns(const std::string& line, size_t from, size_t to) {
  std::string out;
  size_t col = 0;
  for (size_t i = 0; i < line.size();) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    const std::string cp = line.substr(i, len);
    const size_t w = display_width(cp);
    // A zero-width code point belongs to the column of the one before it.
    const size_t at = w == 0 && col > 0 ? col - 1 : col;
    if (at >= from && at < to) out += cp;
    col += w;
    i += len;
  }
  return out;
}

// A rule line as render() writes it: runs of '-' two spaces apart. Their [start, end) columns.
std::vector<std::pair<size_t, size_t>> rule_spans(const std::string& line) {
  std::vector<std::pair<size_t, size_t>> spans;
  if (line.empty() || line[0] != '-') return {};
  for (size_t i = 0; i < line.size();) {
    if (line[i] != '-') return {};
    const size_t start = i;
    while (i < line.size() && line[i] == '-') ++i;
    spans.emplace_back(start, i);
    if (i == line.size()) break;
    if (line.compare(i, 2, "  ") != 0) return {};
    i += 2;
  }
  return spans;
}

std::string trim_right(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// A line of prose wider than `width`, broken at spaces into lines that fit, each indented as the
// line is (under the text of a line marked "! " or "- ", under the last column of a line of
// columns); the spaces at a break dropped, those between words kept. A word wider than the width
// has a line of its own.
std::string wrap(const std::string& line, size_t width) {
  if (display_width(line) <= width) return line;
  const size_t indent = std::min(line.find_first_not_of(' '), line.size());
  // A marked line ("! moe-ra0.050: ...", "- ...") continues under its text, not its mark; a line
  // of columns ("  warning  moe7b  r_a  r_a counts the router ...") under the last of its columns
  // that begins in the first half of the width (two or more spaces end a column).
  const bool marked = indent + 1 < line.size() && line[indent + 1] == ' ' &&
                      std::string_view("!-*#").find(line[indent]) != std::string_view::npos;
  size_t hang_at = indent + (marked ? 2 : 0);
  for (size_t gap = line.find("  ", indent); gap != std::string::npos;
       gap = line.find("  ", gap + 1)) {
    const size_t text = std::min(line.find_first_not_of(' ', gap), line.size());
    if (text >= line.size() || display_width(line.substr(0, text)) > width / 2) break;
    hang_at = std::max(hang_at, display_width(line.substr(0, text)));
    gap = text;
  }
  const std::string hang(hang_at, ' ');
  std::string out, current = line.substr(0, indent);
  size_t current_width = indent;
  bool empty = true;  // no word on the current line yet
  for (size_t at = indent; at < line.size();) {
    const size_t gap_end = std::min(line.find_first_not_of(' ', at), line.size());
    const size_t word_end = std::min(line.find(' ', gap_end), line.size());
    if (gap_end == line.size()) break;  // trailing spaces
    const std::string gap = line.substr(at, gap_end - at),
                      word = line.substr(gap_end, word_end - gap_end);
    const size_t w = display_width(word);
    if (!empty && current_width + gap.size() + w > width) {
      out += current + '\n';
      current = hang + word;
      current_width = hang.size() + w;
    } else {
      current += (empty ? "" : gap) + word;
      current_width += (empty ? 0 : gap.size()) + w;
    }
    empty = false;
    at = word_end;
  }
  return out + current;
}

// The first word of a header cell (its columns in the header line).
std::string first_word(const std::string& header, std::pair<size_t, size_t> span) {
  const std::string cell = display_columns(header, span.first, span.second);
  const size_t from = cell.find_first_not_of(' ');
  if (from == std::string::npos) return "";
  return cell.substr(from, cell.find(' ', from) - from);
}

std::string escape_md(const std::string& s) {
  return escape_markdown(s);
}

}  // namespace

void TextTable::add_column(std::string header, Align align) {
  headers_.push_back(std::move(header));
  align_.push_back(align);
}

void TextTable::add_row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::render() const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    width[c] = display_width(headers_[c]);
    for (const auto& row : rows_) width[c] = std::max(width[c], display_width(row[c]));
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c) out += "  ";
      out += pad(cells[c], width[c], align_[c]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(headers_);
  std::vector<std::string> rule;
  for (size_t w : width) rule.emplace_back(w, '-');
  out += line(rule);
  for (const auto& row : rows_) out += line(row);
  return out;
}

std::string truncate_to_width(const std::string& text, size_t width) {
  std::string out = display_columns(text, 0, width);
  while (display_width(out) > width) {  // a wide character begun in the last column
    size_t last = out.size() - 1;
    while (last > 0 && (static_cast<unsigned char>(out[last]) & 0xC0) == 0x80) --last;
    out.erase(last);
  }
  return out;
}

std::string fit_to_width(const std::string& text, size_t width) {
  if (width == 0) return text;
  std::vector<std::string> lines;
  for (size_t at = 0; at <= text.size();) {
    const size_t nl = text.find('\n', at);
    lines.push_back(text.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto spans = i + 1 < lines.size() ? rule_spans(lines[i + 1]) : decltype(rule_spans("")){};
    if (spans.empty()) {
      out += wrap(lines[i], width);
      if (i + 1 < lines.size()) out += '\n';
      continue;
    }
    // The table: its header, rule and rows, up to a blank line or a line wider than its rule (no
    // row of render()'s is: prose that follows it at once).
    size_t end = i + 2;
    while (end < lines.size() && !lines[end].empty() &&
           display_width(lines[end]) <= spans.back().second)
      ++end;
    const bool blank_first = trim_right(display_columns(lines[i], 0, spans[0].second)).empty();
    const size_t keys = blank_first && spans.size() > 2 ? 2 : 1;
    if (spans.back().second <= width || spans.size() <= keys) {  // it fits, or has no columns
      for (size_t l = i; l < end; ++l) out += lines[l] + '\n';   // to spare: as it is
      i = end - 1;
      continue;
    }
    const size_t key_end = spans[keys - 1].second;
    for (size_t first = keys; first < spans.size();) {
      size_t last = first + 1;  // columns [first, last) in this part: at least one
      while (last < spans.size() &&
             key_end + 2 + (spans[last].second - spans[first].first) <= width)
        ++last;
      // Two columns of one quantity ("N plan" and "N meas", "r_a" and "r_a target") stay
      // together where the part holds others: the pair is read side by side.
      if (last < spans.size() && last - 1 > first &&
          first_word(lines[i], spans[last - 1]) == first_word(lines[i], spans[last]))
        --last;
      if (first > keys) out += '\n';
      for (size_t l = i; l < end; ++l)
        out += trim_right(display_columns(lines[l], 0, key_end) + "  " +
                          display_columns(lines[l], spans[first].first, spans[last - 1].second)) +
               '\n';
      first = last;
    }
    i = end - 1;  // the line after the table (blank, or the text's end) as any other
  }
  return out;
}

std::string TextTable::render_markdown() const {
  std::string out = "|";
  for (const auto& h : headers_) {
    out += ' ';
    out += escape_md(h);
    out += " |";
  }
  out += "\n|";
  for (Align a : align_) out += a == Align::right ? " ---: |" : " :--- |";
  out += "\n";
  for (const auto& row : rows_) {
    out += "|";
    for (const auto& cell : row) {
      out += ' ';
      out += escape_md(cell);
      out += " |";
    }
    out += "\n";
  }
  return out;
}

std::string TextTable::render_html() const {
  auto cell = [&](const std::string& tag, size_t column, const std::string& text) {
    return "<" + tag + (align_[column] == Align::left ? " class=\"l\"" : "") + ">" +
           escape_html(text) + "</" + tag + ">";
  };
  std::string out = "<table>\n<tr>";
  for (size_t c = 0; c < headers_.size(); ++c) out += cell("th", c, headers_[c]);
  out += "</tr>\n";
  for (const auto& row : rows_) {
    out += "<tr>";
    for (size_t c = 0; c < row.size(); ++c) out += cell("td", c, row[c]);
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace moeplan
