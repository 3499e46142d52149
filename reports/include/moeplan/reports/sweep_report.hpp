#pragma once
// A manifest rendered for people (terminal table, Markdown) or programs (CSV, JSON, TOML).
// Columns: architecture, N, N_a, r_a, M (convention named), C, consumed D, unique D̂, epochs,
// TPP, effective data D', η, batch, steps; flagged points are marked and their notes listed.
#include <string>

#include "moeplan/reports/format.hpp"
#include "moeplan/sweeps/manifest.hpp"

namespace moeplan {

std::string render_manifest(const Manifest& manifest, Format format);

// CSV: a header of code names, then the dense baseline and one row per point; full precision.
std::string manifest_to_csv(const Manifest& manifest);

}  // namespace moeplan
