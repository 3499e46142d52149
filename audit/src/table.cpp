#include "moeplan/audit/table.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/audit/quantity.hpp"

namespace moeplan::audit {

namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// A table's records, in one pass: commas separate fields and a line end records; a field that
// starts (after blanks) with a double quote may hold commas and line breaks (spreadsheets write
// a multi-line cell so), and "" inside it is one quote (RFC 4180); a quote elsewhere is a
// character (the 7" of `small 7" run`). Unquoted fields are trimmed. Lines end as the file's
// first line end outside quotes says ('\n', its "\r\n" too, or a bare '\r'). Each record keeps the
// physical line it starts on, for messages, and whether it is blank: nothing but blanks and commas
// (spreadsheets save empty rows as ",,,"), `empty` if not even a comma.
struct CsvRecord {
  std::vector<std::string> fields;
  size_t line = 1;
  bool blank = true, empty = true;
};

std::vector<CsvRecord> split_records(std::string_view text, const std::string& source) {
  std::vector<CsvRecord> out;
  CsvRecord rec;
  std::string f;
  bool quoted = false, was_quoted = false;
  size_t physical = 1;
  // The file's line end is its first one outside quotes: '\n' (and "\r\n"), or a bare '\r'
  // (classic Mac, Excel for Mac's "CSV (Macintosh)"), which then ends lines even where a
  // multi-line cell holds a '\n'. 0 until one is met.
  char eol = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    const bool end = i == text.size();
    if (!end && !quoted && eol == 0 && (text[i] == '\n' || text[i] == '\r'))
      eol = text[i] == '\r' && (i + 1 == text.size() || text[i + 1] != '\n') ? '\r' : '\n';
    const char c = end ? (eol ? eol : '\n') : text[i];
    if (quoted) {
      if (end)
        throw InputError(fmt::format("{} line {}: a quoted field is not closed (a \" is missing)",
                                     source, rec.line));
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        f += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == (eol ? eol : '\n')) ++physical;
        f += c;
      }
      continue;
    }
    if (c == '\r' && eol == '\n' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    if (c == '"' && trim(f).empty() && !was_quoted) {
      quoted = was_quoted = true;
      rec.blank = rec.empty = false;
      f.clear();
    } else if (c == ',' || c == eol) {
      rec.fields.push_back(was_quoted ? f : trim(f));
      f.clear();
      was_quoted = false;
      if (c == ',') rec.empty = false;
      if (c == eol) {
        out.push_back(std::move(rec));
        rec = CsvRecord{};
        rec.line = ++physical;
      }
    } else {
      if (c != ' ' && c != '\t' && c != '\r') rec.blank = rec.empty = false;
      if (!was_quoted || c != ' ') f += c;
    }
  }
  return out;
}

// Half a unit of the last printed digit: "5.85e8" -> 5e5, "92.88" -> 0.005, "1512" -> 0.5.
double printed_half_width(const std::string& text) {
  std::string s = trim(text);
  double suffix = 1.0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k':
      case 'K':
        suffix = 1e3;
        break;
      case 'M':
        suffix = 1e6;
        break;
      case 'B':
      case 'G':
        suffix = 1e9;
        break;
      case 'T':
        suffix = 1e12;
        break;
      default:
        break;
    }
    if (suffix != 1.0) s.pop_back();
  }
  int exponent = 0;
  const size_t e = s.find_first_of("eE");
  if (e != std::string::npos) {
    exponent = std::atoi(s.c_str() + e + 1);
    s = s.substr(0, e);
  }
  const size_t dot = s.find('.');
  // A plain integer (no point, exponent or suffix) is a count: exact.
  if (dot == std::string::npos && e == std::string::npos && suffix == 1.0) return 0.0;
  const int decimals = dot == std::string::npos ? 0 : int(s.size() - dot - 1);
  return 0.5 * std::pow(10.0, exponent - decimals) * suffix;
}

}  // namespace

Cell parse_cell(std::string_view text, std::string_view what, double scale) {
  Cell c;
  c.text = trim(text);
  try {
    c.value = parse_quantity(c.text, what) * scale;
  } catch (const InputError& e) {
    // What a paper's table prints for a missing value, a thousands separator or a percent sign:
    // the message says what to write instead.
    const std::string& t = c.text;
    const bool missing = t == "-" || t == "\xE2\x80\x94" || t == "\xE2\x80\x93" || t == "n/a" ||
                         t == "N/A" || t == "NA" || t == "na" || t == "?" || t == "nan" ||
                         t == "NaN";
    const bool thousands = t.find(',') != std::string::npos;
    const bool percent = !t.empty() && t.back() == '%';
    if (!missing && !thousands && !percent) throw;
    throw InputError(fmt::format(
        "{}; {}", e.what(),
        missing     ? "leave the cell blank if the value is not published"
        : thousands ? "write it without thousands separators (1234000000 or 1.234e9)"
                    : "write it without the '%' (a percent column's header says the unit, e.g. "
                      "ra_pct)"));
  }
  // The sign is the quantity's business (check_quantity_value): a shape count has a range, most
  // others must be above 0.
  c.half_width = printed_half_width(c.text) * scale;
  return c;
}

bool ClaimTable::has_column(std::string_view quantity) const {
  for (const std::string& q : quantities)
    if (q == quantity) return true;
  return false;
}

namespace {

// The offset of the first byte that does not belong to a well-formed UTF-8 sequence (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF), or npos.
size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return i;
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
    }
    i += n + 1;
  }
  return std::string_view::npos;
}

}  // namespace

ClaimTable parse_claim_table(std::string_view text, std::string name, std::string source,
                             const std::set<std::string>& ignore) {
  ClaimTable t;
  t.name = std::move(name);
  t.source = std::move(source);
  // Excel's "CSV UTF-8" starts with a byte-order mark: invisible, it would glue onto the first
  // header.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  // Labels reach the JSON report, which holds UTF-8 only: a spreadsheet's Latin-1 export is
  // refused here, naming the line, rather than failing when the report is written.
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos)
    throw InputError(fmt::format(
        "{} line {}: byte 0x{:02X} is not UTF-8; save the table as UTF-8 (Excel: CSV UTF-8)",
        t.source, 1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(bad), '\n'),
        static_cast<unsigned char>(text[bad])));
  std::vector<CsvRecord> records = split_records(text, t.source);
  while (!records.empty() && records.back().empty) records.pop_back();
  if (records.empty())
    throw InputError(fmt::format("{}: empty table (expected a header line)", t.source));
  t.headers = records[0].fields;
  std::vector<double> scales;
  int label_col = -1;
  for (size_t c = 0; c < t.headers.size(); ++c) {
    const std::string& h = t.headers[c];
    if (h.empty())
      throw InputError(fmt::format(
          "{}: column {} has an empty header{}", t.source, c + 1,
          c == 0 ? " (pandas writes its row index so: save with to_csv(index=False), or head the "
                   "column id)"
                 : "; give it a header, or remove the column"));
    if (ignore.count(h)) {
      t.quantities.emplace_back();
      scales.push_back(1.0);
      continue;
    }
    if (is_label_column(h)) {
      // Two columns of row names (model and run): --baseline would match one of them only.
      if (label_col >= 0)
        throw InputError(fmt::format(
            "{}: columns '{}' and '{}' both name the rows; keep one as the label and list the "
            "other under the table's ignore = [...] in a spec, or rename it",
            t.source, t.headers[size_t(label_col)], h));
      label_col = int(c);
      t.quantities.emplace_back();
      scales.push_back(1.0);
      continue;
    }
    const auto meaning = column_meaning(h);
    if (!meaning)
      throw InputError(fmt::format(
          "{}: unknown column '{}' (use a paper header such as N, Na, ra_pct, M, D, C or a code "
          "name such as total_params; a column of row names is headed label, id, name, run or "
          "model; or list it under the table's ignore = [...] in the spec)",
          t.source, h));
    if (t.has_column(meaning->quantity))
      throw InputError(
          fmt::format("{}: column '{}' repeats quantity {}", t.source, h, meaning->quantity));
    t.quantities.push_back(meaning->quantity);
    scales.push_back(meaning->scale);
  }
  for (size_t li = 1; li < records.size(); ++li) {
    if (records[li].blank) continue;
    const std::vector<std::string>& fields = records[li].fields;
    const size_t row_number = t.rows.size() + 1;
    if (fields.size() != t.headers.size())
      throw InputError(fmt::format("{}: data row {} (line {}) has {} fields, the header has {}",
                                   t.source, row_number, records[li].line, fields.size(),
                                   t.headers.size()));
    std::map<std::string, Cell> row;
    // A row's name is one line: a multi-line label cell (a spreadsheet's wrapped text) has its
    // line breaks as spaces, as the Markdown report shows it, so the terminal's lines stay one
    // finding each.
    if (label_col >= 0) {
      const std::string& cell = fields[size_t(label_col)];
      std::string label;
      for (size_t k = 0; k < cell.size(); ++k) {
        if (cell[k] == '\r' && k + 1 < cell.size() && cell[k + 1] == '\n') continue;
        label += cell[k] == '\n' || cell[k] == '\r' ? ' ' : cell[k];
      }
      t.labels.push_back(std::move(label));
    }
    for (size_t c = 0; c < fields.size(); ++c) {
      if (t.quantities[c].empty() || fields[c].empty()) continue;  // blank = not published
      const std::string what =
          fmt::format("{} data row {} column {}", t.source, row_number, t.headers[c]);
      const Cell& cell = row[t.quantities[c]] = parse_cell(fields[c], what, scales[c]);
      check_quantity_value(t.quantities[c], cell.value, cell.text, what);
    }
    t.rows.push_back(std::move(row));
  }
  if (t.rows.empty()) throw InputError(fmt::format("{}: no data rows", t.source));
  return t;
}

}  // namespace moeplan::audit
