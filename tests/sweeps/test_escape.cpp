// The user's text (point ids, labels, sources) in HTML and Markdown outputs, and what may be a
// point id: each expected string written out by hand.
#include <doctest/doctest.h>

#include <string>

#include "moeplan/sweeps/escape.hpp"
#include "moeplan/sweeps/manifest.hpp"

using namespace moeplan;

TEST_CASE("escape_html: markup as entities, XML's forbidden control characters as U+FFFD") {
  CHECK(escape_html("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c'");
  CHECK(escape_html("t\tn\nr\r") == "t\tn\nr\r");  // allowed in XML: kept
  CHECK(escape_html(std::string("a\x01"
                                "b\x1b"
                                "c\x1f",
                                6)) ==
        "a\xEF\xBF\xBD"
        "b\xEF\xBF\xBD"
        "c\xEF\xBF\xBD");
  CHECK(escape_html(std::string("a\0b", 3)) ==
        "a\xEF\xBF\xBD"
        "b");
}

TEST_CASE("escape_markdown: cell ends, backslashes and emphasis escaped; line breaks as asked") {
  CHECK(escape_markdown("a|b") == "a\\|b");
  CHECK(escape_markdown("a\\|b") == "a\\\\\\|b");  // a\|b: the backslash would eat the escape
  CHECK(escape_markdown("**x**") == "\\*\\*x\\*\\*");
  CHECK(escape_markdown("<i>&") == "&lt;i&gt;&amp;");
  CHECK(escape_markdown("a\nb\r\nc") == "a b  c");
  CHECK(escape_markdown("a\nb", "\n\n") == "a\n\nb");
  CHECK(escape_markdown("a\x1b[1mb") == "a\xEF\xBF\xBD[1mb");
  CHECK(escape_markdown("moe-ra0.200 text:my_file") == "moe-ra0.200 text:my_file");
}

TEST_CASE("escape_markdown: links, code, emphasis and block markers in user text stay text") {
  // A point id "[click](http:x.com)" became a link, "_em_" emphasis, "`a*b`" a code span (with
  // a stray backslash shown inside it), "# head" at a verdict line's start a heading.
  CHECK(escape_markdown("[click](http:x.com)") == "[click\\](http:x.com)");
  CHECK(escape_markdown("![i][r]") == "![i\\][r]");
  CHECK(escape_markdown("M [paper]") == "M [paper]");  // no link: kept as written
  // A code span is kept as written (its content is no markup, and an escape in it would show);
  // a backtick that closes nothing is escaped; in a cell the span's '|' is escaped (GFM).
  CHECK(escape_markdown("_em_ `a*b`") == "\\_em\\_ `a*b`");
  CHECK(escape_markdown("see `moeplan audit` <x>", "\n\n") == "see `moeplan audit` &lt;x&gt;");
  CHECK(escape_markdown("a ` b *c*") == "a \\` b \\*c\\*");
  CHECK(escape_markdown("``a`b`` x`") == "``a`b`` x\\`");
  CHECK(escape_markdown("`a|b`") == "`a\\|b`");
  CHECK(escape_markdown("`a|b`", "\n\n") == "`a|b`");
  CHECK(escape_markdown("`a\nb`", "\n\n") == "\\`a\n\nb\\`");  // a span ends with its line
  CHECK(escape_markdown("~~x~~") == "\\~\\~x\\~\\~");
  CHECK(escape_markdown("a # b") == "a \\# b");
  // Inside a word '_' opens no emphasis, and stays as written.
  CHECK(escape_markdown("my_file_2 _x") == "my_file_2 \\_x");
  // In paragraphs (a line break makes a new one) a line's leading spaces go, and a list or
  // heading marker at its start is escaped; "1.5" is no list, "1. x" is.
  CHECK(escape_markdown("v\n  # head: x", "\n\n") == "v\n\n\\# head: x");
  CHECK(escape_markdown("v\n[r]: http://x", "\n\n") == "v\n\n\\[r]: http://x");
  CHECK(escape_markdown("  - a\n+ b\n1. c\n2) d\n1.5 e\n=", "\n\n") ==
        "\\- a\n\n\\+ b\n\n1\\. c\n\n2\\) d\n\n1.5 e\n\n\\=");
  // In a table cell (inline) a leading sign is kept: "-0.120" is a margin, not a list.
  CHECK(escape_markdown("-0.120") == "-0.120");
  CHECK(escape_markdown("  +0.5") == "  +0.5");
}

TEST_CASE("point ids: a run folder's name on one line") {
  for (const char* ok : {"moe-ra0.200", "dense", "a b", "x`y", "é"}) CHECK(is_point_id(ok));
  for (const char* bad : {"", ".", "..", "a/b", "a\\b", "a\nb", "a\tb", "a\x7f", "\x1b[31m"}) {
    CAPTURE(bad);
    CHECK_FALSE(is_point_id(bad));
  }
  CHECK_FALSE(is_point_id(std::string("a\0b", 3)));
  // The C1 controls (U+0080..U+009F): NEL drew nothing and misaligned the report's row.
  CHECK_FALSE(is_point_id("moe\xC2\x85nel"));
  CHECK_FALSE(is_point_id("moe\xC2\x9Fx"));
  CHECK(is_point_id("moe\xC2\xA0x"));  // U+00A0, a no-break space, is text
  // Ids that look like another's or show their text reordered: leading or trailing spaces, a
  // zero-width space (U+200B), a right-to-left override (U+202E), a word joiner (U+2060), an
  // isolate (U+2069), a zero-width no-break space (U+FEFF).
  for (const char* bad : {" moe", "moe ", "moe-ra0.400\xE2\x80\x8B",
                          "a\xE2\x80\xAE"
                          "b",
                          "a\xE2\x81\xA0"
                          "b",
                          "a\xE2\x81\xA9"
                          "b",
                          "\xEF\xBB\xBFmoe"}) {
    CAPTURE(bad);
    CHECK_FALSE(is_point_id(bad));
  }
  // Their neighbours are text: U+2010 (a hyphen), U+2030 (per mille), U+2070 (superscript 0).
  for (const char* ok : {"a\xE2\x80\x90"
                         "b",
                         "a\xE2\x80\xB0"
                         "b",
                         "a\xE2\x81\xB0"
                         "b"}) {
    CAPTURE(ok);
    CHECK(is_point_id(ok));
  }
  // A line or paragraph separator (U+2028/2029), U+2065 and the deprecated format controls
  // (U+206A..U+206F) draw nothing too; a space of another width at either end reads as none
  // (U+00A0 no-break space, U+3000 ideographic space); inside an id it is text.
  for (const char* bad : {"a\xE2\x80\xA8"
                          "b",
                          "a\xE2\x80\xA9"
                          "b",
                          "a\xE2\x81\xA5"
                          "b",
                          "a\xE2\x81\xAF"
                          "b",
                          "\xC2\xA0moe", "moe\xC2\xA0", "moe\xE3\x80\x80"}) {
    CAPTURE(bad);
    CHECK_FALSE(is_point_id(bad));
  }
  // More that draw nothing: a soft hyphen (U+00AD), a variation selector (U+FE0F), a Hangul
  // filler (U+3164), a tag (U+E0001, four bytes); a braille blank (U+2800) at the end.
  for (const char* bad :
       {"mo\xC2\xAD"
        "e",
        "moe\xEF\xB8\x8F", "moe\xE3\x85\xA4", "moe-ra0.200\xF3\xA0\x80\x81", "moe\xE2\xA0\x80"}) {
    CAPTURE(bad);
    CHECK_FALSE(is_point_id(bad));
  }
  CHECK(is_point_id("moe\xF0\x92\x80\xAA"));  // U+1202A, a cuneiform sign: not U+202A
  CHECK(printable("moe-ra0.200\xF3\xA0\x80\x81") == "moe-ra0.200\\U000e0001");
  CHECK(
      is_point_id("a\xE2\x80\xA7"
                  "b"));  // U+2027, a hyphenation point
  CHECK(is_point_id("moe\xE3\x80\x80x"));
  CHECK(
      is_point_id("a\xFF"
                  "b"));  // a byte of no character: a folder may be named so; shown as \xff
  CHECK(printable("a\xE2\x80\xA8"
                  "b") == "a\\u2028b");
  // A folder name is at most 255 bytes.
  CHECK(is_point_id(std::string(255, 'x')));
  CHECK_FALSE(is_point_id(std::string(256, 'x')));
}

TEST_CASE("printable: control characters in an error message are shown, not obeyed") {
  CHECK(printable("runs/moe\x1b[31mred/record.json") == "runs/moe\\x1b[31mred/record.json");
  CHECK(printable("a\nb\tc\x7f") == "a\\x0ab\\x09c\\x7f");
  CHECK(printable("moe\xC2\x85nel") == "moe\\u0085nel");
  CHECK(printable("D̂ é ±1.0%") == "D̂ é ±1.0%");  // other UTF-8 as written
  // A byte-order mark inside a line, a zero-width space and a right-to-left override are shown
  // by number ("unknown column 'N'" hid a second BOM); a byte of no character as \xNN (a binary
  // file's bytes went to the terminal as they were).
  CHECK(printable("\xEF\xBB\xBFN") == "\\ufeffN");
  CHECK(printable("a\xE2\x80\x8B"
                  "b\xE2\x80\xAE"
                  "c") == "a\\u200bb\\u202ec");
  CHECK(printable("a\xFF\xC3") == "a\\xff\\xc3");
  CHECK(printable("\xF0\x9F\x98\x80") == "\xF0\x9F\x98\x80");  // U+1F600 as written
}

TEST_CASE("utf8_length_at: well-formed sequences only (Unicode table 3-7)") {
  CHECK(utf8_length_at("a", 0) == 1);
  CHECK(utf8_length_at("\xC3\xA9", 0) == 2);          // é
  CHECK(utf8_length_at("\xE2\x80\x8B", 0) == 3);      // U+200B
  CHECK(utf8_length_at("\xF0\x9F\x98\x80", 0) == 4);  // U+1F600
  for (const char* bad : {"\xFF", "\x80", "\xC0\xAF", "\xC3", "\xE0\x80\xAF", "\xED\xA0\x80",
                          "\xF4\x90\x80\x80", "\xF0\x9F\x98"}) {
    CAPTURE(bad);
    CHECK(utf8_length_at(bad, 0) == 0);
  }
  CHECK(utf8_length_at("ab", 2) == 0);  // past the end
}
