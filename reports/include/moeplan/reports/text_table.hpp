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

}  // namespace moeplan
