#pragma once
// Text a user wrote (point ids, row labels, claim names, data sources) placed into HTML and
// Markdown outputs: escaped, so that it reads as text and cannot become markup.
#include <string>
#include <string_view>

namespace moeplan {

// HTML text and attribute values: & < > and " as entities; a control character that XML does not
// allow (C0 but tab, LF, CR) as U+FFFD, so that an inline SVG stays well-formed.
std::string escape_html(std::string_view s);

// Markdown: '|' (it would end a table cell), '\\', '*', '_' outside a word, '~' (emphasis,
// strikethrough), a '`' that opens no code span, a ']' before '(' or '[' (a link) and '#'
// backslash-escaped (a code span closed on its line is kept as written, its '|' escaped in a
// cell); '<',
// '>' and '&' (raw HTML to a Markdown renderer) as entities; in paragraphs, a line's leading
// spaces dropped and a block marker at its start escaped ('-', '+', '=', '[', "1." before a
// space); a line break (CR or LF) becomes
// `newline`: " " inside a table cell, "\n\n" where each line is its own paragraph; the control
// characters escape_html replaces, as U+FFFD.
std::string escape_markdown(std::string_view s, std::string_view newline = " ");

// One line a terminal shows as written: C0 control characters (line breaks and tab included),
// DEL and bytes of no UTF-8 character as \xNN; the C1 controls U+0080..U+009F and the characters
// that draw nothing or reorder the text (U+200B..U+200F, U+202A..U+202E, U+2060..U+2069, U+FEFF)
// as \uNNNN. A file name or id in an error message cannot move the cursor, recolour the
// terminal, break the line or hide in it.
std::string printable(std::string_view s);

// The length of the well-formed UTF-8 character at s[i] (1 to 4), or 0 where the bytes there are
// not one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
size_t utf8_length_at(std::string_view s, size_t i);

}  // namespace moeplan
