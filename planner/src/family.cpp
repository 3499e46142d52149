#include "moeplan/planner/family.hpp"

#include <algorithm>
#include <cmath>

namespace moeplan {

std::optional<FamilyRules> family_by_name(std::string_view name) {
  if (name == "paper") return FamilyRules{};
  return std::nullopt;
}

std::string family_names() {
  return "paper";
}

double aspect_ratio_for(const FamilyRules& f, double n) {
  if (n >= f.full_scale_params) return f.aspect_ratio;
  return f.aspect_ratio * std::pow(n / f.full_scale_params, f.aspect_exponent);
}

namespace {
int64_t pow2_floor(double x) {
  int64_t p = 1;
  while (double(p * 2) <= x) p *= 2;
  return p;
}
}  // namespace

int64_t head_dim_for(const FamilyRules& f, double d_model) {
  return std::clamp(pow2_floor(d_model / 4.0), f.min_head_dim, f.max_head_dim);
}

int64_t alignment_for(int64_t d_model) {
  return std::clamp<int64_t>(pow2_floor(double(d_model) / 32.0), 8, 32);
}

int64_t default_vocab(const FamilyRules& f, double n) {
  return n <= f.tiny_params ? 256 : 65536;
}

int64_t default_seq_len(const FamilyRules& f, double n) {
  if (n > f.tiny_params) return 2048;
  return n < 1e6 ? 128 : 256;
}

}  // namespace moeplan
