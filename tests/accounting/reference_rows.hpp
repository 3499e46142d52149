#pragma once
// Minimal reader for the published reference CSVs (numbers only, header row first).
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace moeplan::test {

using Row = std::map<std::string, double>;

inline std::vector<Row> read_reference(const std::string& file) {
  std::ifstream in(std::string(MOEPLAN_REFERENCE_DIR) + "/" + file);
  if (!in) throw std::runtime_error("cannot open reference file " + file);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  for (std::stringstream ss(line); std::getline(ss, line, ',');) header.push_back(line);
  std::vector<Row> rows;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    Row row;
    std::stringstream ss(line);
    for (const std::string& h : header) {
      std::string cell;
      std::getline(ss, cell, ',');
      row[h] = std::stod(cell);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace moeplan::test
