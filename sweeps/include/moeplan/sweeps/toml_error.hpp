#pragma once
// toml11's parse errors span several lines (the message, then the file, line number and a caret
// under the place): moeplan's errors are one line.
#include <string>
#include <string_view>

namespace moeplan {

// `what` with every run of whitespace (line breaks included) made one space: "[error] toml::
// insert_value: value ("name") already exists. --> s.toml | 3 | name = "a" | ~~~ ...", the
// line numbers kept.
std::string toml_error_one_line(std::string_view what);

// Refuses (InputError naming `origin` and the key) a number toml11 reads as another: an integer
// past 64 bits (read as the nearest limit) or a float below a double's range (read as 0), as
// every TOML file moeplan reads through its own reader is checked. For readers of their own
// (the audit's spec). Text that is not valid TOML passes: its reader says so.
void refuse_out_of_range_toml_numbers(const std::string& text, const std::string& origin);

}  // namespace moeplan
