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
}

TEST_CASE("printable: control characters in an error message are shown, not obeyed") {
  CHECK(printable("runs/moe\x1b[31mred/record.json") == "runs/moe\\x1b[31mred/record.json");
  CHECK(printable("a\nb\tc\x7f") == "a\\x0ab\\x09c\\x7f");
  CHECK(printable("moe\xC2\x85nel") == "moe\\u0085nel");
  CHECK(printable("D̂ é ±1.0%") == "D̂ é ±1.0%");  // other UTF-8 as written
}
