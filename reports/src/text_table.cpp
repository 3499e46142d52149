#include "moeplan/reports/text_table.hpp"

#include <algorithm>

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

// Display width of UTF-8 text: one column per code point, two for East Asian wide ones, none
// for combining marks (U+0300..U+036F), so that "D̂" and "η" line up like "D" and "模型" like "ab".
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
