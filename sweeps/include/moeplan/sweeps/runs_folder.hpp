#pragma once
// A runs folder (`moeplan run --out DIR`) as `audit` and `report` read it: DIR/<point>/record.json.
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

namespace moeplan {

// The record.json of every folder entry of `dir` that holds one, sorted. Entries that are not
// folders (files, dangling or looping links) are no point's and are passed over. Throws
// InputError (one line) when `dir` or a point folder cannot be read (permissions): a record that
// cannot be seen is not taken for one that is not there.
std::vector<std::filesystem::path> point_record_files(const std::filesystem::path& dir);

// A JSON library error's text without its "[json.exception.parse_error.101] " tag: "parse error
// at line 2, column 1: syntax error while parsing value - unexpected end of input; ...".
std::string json_error_text(const std::exception& e);

// What to do about the damaged record `record` (runs/<point>/record.json), for the end of an
// error line: "move the point's folder away and run it again", preceded, when the point's
// checkpoint is there to rebuild it from, by "remove only record.json and run the sweep again,
// which resumes from the point's checkpoint and rebuilds the record, or ".
std::string damaged_record_remedy(const std::filesystem::path& record);

}  // namespace moeplan
