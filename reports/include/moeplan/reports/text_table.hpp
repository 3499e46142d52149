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

 private:
  std::vector<std::string> headers_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;
};

// Each table of `text` (a header line, a rule of dashes under it as render() writes it, then
// rows up to a blank line or the end) wider than `width` display columns, printed in parts that
// fit, one after another with a blank line between: each part repeats the key column (the
// first, and the second too where the first has no header: the grid's flag column before the
// ids) and takes as many of the next columns as fit, at least one. Everything else of `text` as
// it is, and all of it where width is 0. For a terminal: a wrapped line of a table is unreadable.
std::string fit_tables(const std::string& text, size_t width);

}  // namespace moeplan
