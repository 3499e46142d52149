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
// DEL and bytes of no UTF-8 character as \xNN; the characters is_hidden_character names as
// \uNNNN. A file name or id in an error message cannot move the cursor, recolour the
// terminal, break the line or hide in it.
std::string printable(std::string_view s);

// The length of the well-formed UTF-8 character at s[i] (1 to 4), or 0 where the bytes there are
// not one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
size_t utf8_length_at(std::string_view s, size_t i);
// The code point of the well-formed UTF-8 character of `n` bytes (utf8_length_at's) at s[i].
char32_t utf8_code_point_at(std::string_view s, size_t i, size_t n);

// Characters that draw nothing, break the line or reorder the text around them (an id that looks
// like another's, or shows its text backwards): DEL and the C1 controls U+007F..U+009F; the soft
// hyphen U+00AD; U+034F, U+115F/1160, U+17B4/17B5, U+180B..U+180F, U+3164, U+FFA0 (joiners,
// fillers, Mongolian selectors); U+200B..U+200F (zero-width, LRM, RLM); U+2028..U+202E (line and
// paragraph separators, bidirectional embeddings and overrides); U+2060..U+206F (word joiner,
// invisible operators, isolates, deprecated format controls); U+FE00..U+FE0F and
// U+E0000..U+E0FFF (variation selectors, tags); U+FEFF; U+FFF9..U+FFFB (annotation controls);
// U+1BCA0..U+1BCA3 and U+1D173..U+1D17A (format controls). printable() shows them as \uNNNN
// (\UNNNNNNNN above U+FFFF).
bool is_hidden_character(char32_t c);

}  // namespace moeplan
