#pragma once
// An aligned plain-text table: headers, rows, right-aligned numbers, left-aligned text.
#include <string>
#include <vector>

namespace moeplan {

class TextTable {
 public:
  enum class Align { left, right };
  void add_column(std::string header, Align align = Align::right);
  void add_row(std::vector<std::string> cells);  // one cell per column
  // Columns separated by two spaces, a rule of '-' under the headers.
  std::string render() const;
  // GitHub-flavoured Markdown: | a | b |, alignment row, '|' in cells escaped.
  std::string render_markdown() const;
  // An HTML <table>: a header row of <th>, then a <tr> of <td> a row, text escaped; the cells of
  // a left-aligned column have class="l" (the page's style sets cells right-aligned).
  std::string render_html() const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;
};

// Terminal columns of UTF-8 text: one a code point, two for East Asian wide ones, none for
// combining marks ("D̂" is one column, "模型" four).
size_t display_width(const std::string& text);

// The start of `text` no wider than `width` terminal columns (a combining mark kept with its
// base, a wide character that would pass the edge left out).
std::string truncate_to_width(const std::string& text, size_t width);

// `text` for a terminal `width` display columns wide (0: all of it as it is). Each table (a
// header line, a rule of dashes under it as render() writes it, then rows up to a blank line or
// the end) wider than that is printed in parts that fit, one after another with a blank line
// between: each part repeats the key column (the first, and the second too where the first has
// no header: the grid's flag column before the ids) and takes as many of the next columns as fit,
// at least one, two columns of one quantity ("N plan", "N meas") together where they can be.
// Any other line wider than that is broken at spaces, its continuation indented as it is. A
// terminal's own wrapping breaks a table's rows into an unreadable block, and words anywhere.
std::string fit_to_width(const std::string& text, size_t width);

}  // namespace moeplan
