#pragma once
// Text a user wrote (point ids, row labels, claim names, data sources) placed into HTML and
// Markdown outputs: escaped, so that it reads as text and cannot become markup.
#include <string>
#include <string_view>

namespace moeplan {

// HTML text and attribute values: & < > and " as entities; a control character that XML does not
// allow (C0 but tab, LF, CR) as U+FFFD, so that an inline SVG stays well-formed.
std::string escape_html(std::string_view s);

// Markdown: '|' (it would end a table cell), '\\' and '*' (emphasis) backslash-escaped; '<', '>'
// and '&' (raw HTML to a Markdown renderer) as entities; a line break (CR or LF) becomes
// `newline`: " " inside a table cell, "\n\n" where each line is its own paragraph; the control
// characters escape_html replaces, as U+FFFD.
std::string escape_markdown(std::string_view s, std::string_view newline = " ");

}  // namespace moeplan
