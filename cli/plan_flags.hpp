#pragma once
// Flags and output handling shared by `moeplan grid` and `moeplan plan` (parsing only: the
// rules about valid values live in sweeps/request.hpp and reports/format.hpp).
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/reports/format.hpp"
#include "moeplan/sweeps/escape.hpp"
#include "moeplan/sweeps/request.hpp"

namespace moeplan::cli {

inline void add_plan_flags(CLI::App& app, PlanFlags& f, bool n_required) {
  CLI::Option* n = app.add_option("--N", f.n, "total parameters N (non-vocabulary), e.g. 2e9, 2B");
  if (n_required) n->required();
  app.add_option("--family", f.family, "shape family (paper)");
  app.add_option("--compute", f.compute, "training compute C in FLOPs (of --convention)")
      ->check(non_empty_value());
  app.add_option("--dense-tokens", f.dense_tokens, "C = dense baseline's M · this many tokens")
      ->check(non_empty_value());
  app.add_option("--dense-tpp", f.dense_tpp, "C = dense baseline's M · TPP · N (default 20)")
      ->check(non_empty_value());
  app.add_option("--unique-tokens", f.unique_tokens,
                 "strict reuse: unique tokens D̂ of every point (default: dense consumed D)")
      ->check(non_empty_value());
  app.add_option("--epochs", f.epochs, "loose reuse: every point repeats its data E times")
      ->check(non_empty_value());
  app.add_option("--convention", f.convention,
                 "FLOP convention for M and C: paper, exact, exact/full, megatron");
  app.add_option("--n-tolerance", f.n_tolerance,
                 "relative tolerance on N, in (0, 0.5) (default 0.01; or a percentage, 1%)");
  app.add_option("--ra-tolerance", f.ra_tolerance,
                 "absolute tolerance on r_a, in (0, 1) (default 0.005; or 0.5%)");
  app.add_flag("--count-router", f.count_router, "count router weights inside N and N_a");
  app.add_flag("--count-norms", f.count_norms, "count RMSNorm scales inside N and N_a");
  app.add_option("--vocab", f.vocab, "vocabulary size (default: 65536; 256 for N <= 1e7)")
      ->check(non_empty_value());
  app.add_option("--seq-len", f.seq_len, "sequence length (default: 2048; 256/128 for tiny N)")
      ->check(non_empty_value());
  app.add_option("--head-dim", f.head_dim, "attention head width (default: family rule for N)")
      ->check(non_empty_value());
  app.add_option("--alignment", f.alignment,
                 "d_expert multiple (default: 32 for d_model >= 1024, 16 from 512, else 8)")
      ->check(non_empty_value());
  app.add_option("--backbone", f.backbone,
                 "solve only the MoE layer on this backbone (TOML: Arch keys without experts)")
      ->check(non_empty_path("file name"));
  app.add_option("--dp-width", f.dp_width, "batch rounded to a multiple of this many sequences");
  app.add_option("--warmup-frac", f.warmup_frac,
                 "warm-up as this share of every point's steps (default: clip(0.01·steps, 200, "
                 "2000))")
      ->check(non_empty_value());
  app.add_option("--lr-scale", f.lr_scale,
                 "every point's peak η times this factor (default 1: the step law's); a sweep at "
                 "0.5, 1 and 2 shows whether dense and MoE each sit near their best η")
      ->check(non_empty_value());
}

// The value of an option of `app` if it was given on the command line (even as ""), else nullopt.
inline std::optional<std::string> given(const CLI::Option* option, const std::string& value) {
  return option->count() > 0 ? std::optional<std::string>(value) : std::nullopt;
}

// The command line as typed (Linux /proc), recorded in manifests as created_by.
// An argument as a POSIX shell reads it back: plain when it holds only characters no shell
// treats specially, else in single quotes ('' for an empty one, ' as '\'').
// An argument that is not UTF-8 (a file name's stray byte) as bash's $'...' with \xNN for each
// such byte: a manifest is TOML, UTF-8 throughout, and one that held the byte itself was written
// by grid and then refused by every command that reads it.
inline std::string shell_quoted(const std::string& arg) {
  const bool plain = !arg.empty() && arg.find_first_not_of(
                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                         "0123456789_./:=,+-@%") == std::string::npos;
  if (plain) return arg;
  bool utf8 = true;
  for (size_t i = 0, n = 0; i < arg.size() && utf8; i += n) utf8 = (n = utf8_length_at(arg, i)) > 0;
  if (!utf8) {
    std::string out = "$'";
    for (size_t i = 0; i < arg.size();) {
      const size_t n = utf8_length_at(arg, i);
      if (n == 0 || (unsigned char)arg[i] < 0x20 || arg[i] == 0x7f) {
        out += fmt::format("\\x{:02x}", (unsigned char)arg[i]);
        ++i;
        continue;
      }
      if (arg[i] == '\'' || arg[i] == '\\') out += '\\';
      out.append(arg, i, n);
      i += n;
    }
    return out + "'";
  }
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline std::string command_line_for_record(const char* fallback) {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // NUL-terminated arguments; the program by its name, each argument quoted as a shell reads it
  // (a path with a space pasted back was two arguments).
  std::string out;
  bool first = true;
  for (size_t start = 0; start < raw.size();) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    std::string arg = raw.substr(start, end - start);
    if (first) {
      const size_t slash = arg.rfind('/');
      if (slash != std::string::npos) arg = arg.substr(slash + 1);
      first = false;
    }
    out += (out.empty() ? "" : " ") + shell_quoted(arg);
    start = end + 1;
  }
  return out.empty() ? std::string(fallback) : out;
}

// --format wins (when given at all: --format "" is refused, not taken for absent); else -o's
// extension; else the terminal table.
inline Format output_format(const std::optional<std::string>& format, const std::string& output) {
  if (format) {
    const auto f = parse_format(*format);
    if (!f)
      throw InputError(fmt::format("--format '{}' is not known; use {}", *format, format_names()));
    // A file named for one format holding another (CSV in s.toml) reads back as garbage; .txt
    // and an extension that names no format (.out) hold what --format says.
    if (!output.empty())
      if (const auto ext = format_from_extension(output);
          ext && *ext != Format::table && *ext != *f)
        throw InputError(fmt::format(
            "--format {} contradicts -o {}, which is written as {}; leave out --format or name "
            "the file for the format",
            *format, output, name(*ext)));
    return *f;
  }
  if (output.empty()) return Format::table;
  const auto f = format_from_extension(output);
  if (!f)
    throw InputError(fmt::format(
        "-o {}: cannot tell the format from the extension; use .toml, .json, .csv, .md, .txt or "
        "give --format ({})",
        output, format_names()));
  return *f;
}

}  // namespace moeplan::cli
