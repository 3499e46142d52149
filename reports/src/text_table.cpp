#include "moeplan/reports/text_table.hpp"

#include <algorithm>

#include "moeplan/sweeps/escape.hpp"

namespace moeplan {

namespace {

// Display width of UTF-8 text: one per code point, combining marks (U+0300..U+036F) excluded,
// so that "D̂" and "η" line up like "D".
size_t display_width(const std::string& s) {
  size_t width = 0;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    unsigned cp = c;
    if (len == 2 && i + 1 < s.size())
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    if (!(cp >= 0x300 && cp <= 0x36F)) ++width;
    i += len;
  }
  return width;
}

std::string pad(const std::string& s, size_t width, TextTable::Align align) {
  const size_t w = display_width(s);
  const std::string fill(width > w ? width - w : 0, ' ');
  return align == TextTable::Align::left ? s + fill : fill + s;
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

}  // namespace moeplan
