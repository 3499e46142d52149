#include "moeplan/backend/corpus.hpp"

#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/backend/engine.hpp"
#include "moeplan/backend/rng.hpp"

namespace moeplan::backend {

namespace fs = std::filesystem;

namespace {

constexpr std::array<std::string_view, 12> kColours = {"red",   "blue",  "green", "amber",
                                                       "white", "black", "grey",  "violet",
                                                       "gold",  "teal",  "pink",  "brown"};
constexpr std::array<std::string_view, 16> kAnimals = {
    "fox",  "owl",  "otter", "crane", "moth", "bison", "eel",  "lynx",
    "newt", "wren", "hare",  "toad",  "yak",  "swan",  "mole", "seal"};
constexpr std::string_view kConsonants = "bdfgklmnprstvz";
constexpr std::string_view kVowels = "aeiou";

std::vector<std::string> facts_table(uint64_t data_seed) {
  SplitMix64 g(mix_seed(data_seed, 0xFAC7));
  std::set<std::string> names;
  std::vector<std::string> facts;
  while (int(facts.size()) < kBuiltinFacts) {
    std::string name;
    const int syllables = 2 + int(g.below(2));
    for (int s = 0; s < syllables; ++s) {
      name += kConsonants[g.below(kConsonants.size())];
      name += kVowels[g.below(kVowels.size())];
    }
    if (!names.insert(name).second) continue;  // names are unique: one attribute per name
    facts.push_back(fmt::format("{}: {} {} {:02}\n", name, kColours[g.below(kColours.size())],
                                kAnimals[g.below(kAnimals.size())], g.below(100)));
  }
  return facts;
}

// "a op b op c ... = value\n" with 2 or 3 operations on operands 0..20; * binds tighter.
std::string arithmetic(SplitMix64& g) {
  const int ops = 2 + int(g.below(2));
  std::vector<int64_t> operands{int64_t(g.below(21))};
  std::vector<char> operators;
  for (int i = 0; i < ops; ++i) {
    operators.push_back("+-*"[g.below(3)]);
    operands.push_back(int64_t(g.below(21)));
  }
  std::string text = std::to_string(operands[0]);
  for (int i = 0; i < ops; ++i)
    text += operators[size_t(i)] + std::to_string(operands[size_t(i) + 1]);
  // Evaluate: fold products into terms, then sum the signed terms.
  int64_t total = 0, term = operands[0];
  int sign = 1;
  for (int i = 0; i < ops; ++i) {
    const int64_t next = operands[size_t(i) + 1];
    if (operators[size_t(i)] == '*') {
      term *= next;
    } else {
      total += sign * term;
      sign = operators[size_t(i)] == '+' ? 1 : -1;
      term = next;
    }
  }
  total += sign * term;
  return text + "=" + std::to_string(total) + "\n";
}

std::string describe_count(int64_t n) {
  return fmt::format("{} tokens", n);
}

std::vector<fs::path> expand_glob(const std::string& pattern) {
  const fs::path p(pattern);
  const std::string name = p.filename().string();
  if (p.parent_path().string().find_first_of("*?[") != std::string::npos &&
      !fs::exists(p.parent_path()))
    throw InputError(fmt::format(
        "shards: '{}' has a pattern in its folder part; patterns match file names in one folder "
        "(such as 'shards/train_*.bin'): link the shards into one folder",
        pattern));
  if (name.find_first_of("*?[") == std::string::npos) {
    std::error_code ec;
    if (fs::is_directory(p, ec))
      throw InputError(
          fmt::format("shards: '{}' is a folder; give a shard file or a pattern such as '{}/*.bin'",
                      pattern, pattern));
    // A name that is no file matches nothing: the caller names the source that asked for it.
    if (!fs::exists(fs::symlink_status(p, ec))) return {};
    return {p};
  }
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::vector<fs::path> out;
  std::error_code ec;
  // As a shell matches: a leading '.' only by a leading '.' (a half-copied ".train_002.bin" is
  // not a shard), and every match a readable file (a link to nothing is named, not skipped).
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (::fnmatch(name.c_str(), e.path().filename().c_str(), FNM_PERIOD) != 0) continue;
    std::error_code ec2;
    if (!fs::is_regular_file(e.path(), ec2))
      throw InputError(fmt::format(
          "shards: '{}' matches '{}' but is not a file{}; move it away or narrow the pattern",
          e.path().string(), pattern,
          fs::is_symlink(e.symlink_status(ec2)) && !fs::exists(e.path(), ec2)
              ? fmt::format(" (a link to '{}', which does not exist)",
                            fs::read_symlink(e.path(), ec2).string())
              : ""));
    out.push_back(e.path());
  }
  if (ec) throw InputError(fmt::format("shards: cannot list '{}': {}", dir.string(), ec.message()));
  // A file whose own name holds '[' reads as a pattern: say how to name it.
  if (out.empty() && fs::exists(p, ec))
    throw InputError(fmt::format(
        "shards: '{}' is read as a pattern and matches nothing, but is a file's own name: write "
        "'[' as '\\[' (and '*' '?' as '\\*' '\\?') to name it",
        pattern));
  std::sort(out.begin(), out.end());
  return out;
}

// Every token of `s` below vocab, read in blocks (a mapped stream is streamed, not held). `s`
// starts at token `offset` of the source: a position is said in the source's numbering.
void check_vocab(const TokenStream& s, int64_t vocab, const std::string& what, int64_t offset = 0) {
  constexpr int64_t kBlock = int64_t(1) << 20;
  std::vector<uint16_t> block(size_t(std::min(kBlock, std::max<int64_t>(s.size(), 1))));
  for (int64_t at = 0; at < s.size(); at += kBlock) {
    const int64_t n = std::min(kBlock, s.size() - at);
    s.copy(at, n, block.data());
    for (int64_t i = 0; i < n; ++i)
      if (block[size_t(i)] >= vocab)
        throw InputError(fmt::format(
            "{}: token {} at position {} is outside the model's vocabulary (V = {}); {}", what,
            block[size_t(i)], offset + at + i, vocab,
            block[size_t(i)] < 256
                ? "a byte's tokens run to 255: plan with V >= 256 (grid --vocab 256)"
                : "plan with a larger vocab, or train on bytes (source=text:FILE, V >= 256)"));
  }
}

// The llm.c header of a shard of `bytes` bytes: its token count, or InputError naming the file.
int64_t shard_token_count(const fs::path& path, const char* header, int64_t bytes) {
  const std::string where = fmt::format("shard '{}'", path.string());
  if (bytes < kShardHeaderBytes)
    throw InputError(fmt::format("{}: truncated: {} bytes, shorter than the {}-byte header", where,
                                 bytes, kShardHeaderBytes));
  std::array<int32_t, 3> head{};
  std::memcpy(head.data(), header, sizeof(head));
  if (head[0] != kShardMagic)
    throw InputError(fmt::format("{}: bad magic {} (an llm.c shard starts with {})", where, head[0],
                                 kShardMagic));
  if (head[1] != kShardVersion)
    throw InputError(fmt::format("{}: version {} is not supported (expected {})", where, head[1],
                                 kShardVersion));
  if (head[2] < 0)
    throw InputError(fmt::format("{}: negative token count {} in the header", where, head[2]));
  const int64_t want = kShardHeaderBytes + 2 * int64_t(head[2]);
  if (bytes != want)
    throw InputError(
        fmt::format("{}: {}: the header says {} tokens ({} bytes) but the file has {} "
                    "bytes",
                    where, bytes < want ? "truncated" : "oversized", head[2], want, bytes));
  return head[2];
}

}  // namespace

TokenStream builtin_corpus(uint64_t data_seed, int stream, int64_t tokens) {
  const std::vector<std::string> facts = facts_table(data_seed);
  SplitMix64 g(mix_seed(data_seed, 0x5EED0000ull + uint64_t(stream)));
  TokenStream out;
  out.tokens.reserve(size_t(tokens));
  out.part.reserve(size_t(tokens));
  while (int64_t(out.tokens.size()) < tokens) {
    const bool fact = g.below(2) == 0;
    const std::string record = fact ? facts[g.below(facts.size())] : arithmetic(g);
    for (char c : record) {
      if (int64_t(out.tokens.size()) == tokens) break;
      out.tokens.push_back(uint16_t(static_cast<unsigned char>(c)));
      out.part.push_back(fact ? 0 : 1);
    }
  }
  return out;
}

std::vector<uint16_t> read_shard(const fs::path& path) {
  const MappedShards shard({path});
  std::vector<uint16_t> tokens(static_cast<size_t>(shard.size()));
  shard.copy(0, shard.size(), tokens.data());
  return tokens;
}

namespace {

// A mapped file cut shorter while it is mapped turns a read past its new end into SIGBUS, which
// killed the process with "Bus error" and no word of why. Mapped shards are moeplan's only
// mappings of files: the handler says what most likely happened and exits 70 (the last
// checkpoint is intact: checkpoints are written whole or not at all).
void on_sigbus(int) {
  static const char msg[] =
      "moeplan: error: SIGBUS reading a memory-mapped shard: a source file was most likely cut "
      "shorter (truncated, rewritten) while the run read it; the files of a running sweep must "
      "not change: rerun the same command to resume from the last checkpoint once they are "
      "whole\n";
  [[maybe_unused]] const ssize_t w = ::write(2, msg, sizeof msg - 1);
  ::_exit(70);
}

void say_why_on_sigbus() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  });
}

}  // namespace

MappedShards::MappedShards(const std::vector<fs::path>& files) {
  say_why_on_sigbus();
  try {
    for (const fs::path& f : files) {
      const int fd = ::open(f.c_str(), O_RDONLY);
      if (fd < 0)
        throw InputError(fmt::format("cannot read '{}': {}", f.string(), std::strerror(errno)));
      struct stat sb {};
      if (::fstat(fd, &sb) != 0) {
        ::close(fd);
        throw InputError(fmt::format("cannot read '{}': {}", f.string(), std::strerror(errno)));
      }
      void* map = nullptr;
      const size_t bytes = size_t(sb.st_size);
      if (bytes > 0) {
        map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
          ::close(fd);
          throw InputError(
              fmt::format("cannot map '{}': {}", f.string(), std::strerror(errno)));
        }
      }
      ::close(fd);
      Part& q = parts_.emplace_back();  // kept (and unmapped) even if its header is refused
      q.map = map;
      q.bytes = bytes;
      std::string header(size_t(kShardHeaderBytes), '\0');
      if (map) std::memcpy(header.data(), map, std::min(bytes, header.size()));
      q.count = shard_token_count(f, header.data(), int64_t(bytes));
      q.tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(q.map) +
                                                   kShardHeaderBytes);
      q.start = size_;
      size_ += q.count;
      // Read in order once, then dropped by the kernel as it needs the memory.
      if (q.map) ::madvise(q.map, q.bytes, MADV_SEQUENTIAL);
    }
  } catch (...) {
    for (const Part& p : parts_)
      if (p.map) ::munmap(p.map, p.bytes);
    throw;
  }
}

MappedShards::~MappedShards() {
  for (const Part& p : parts_)
    if (p.map) ::munmap(p.map, p.bytes);
}

void MappedShards::copy(int64_t begin, int64_t n, uint16_t* out) const {
  if (begin < 0 || n < 0 || begin + n > size_)
    throw std::out_of_range("MappedShards::copy past the end");
  // The first part holding `begin`, then on across boundaries.
  auto it = std::upper_bound(parts_.begin(), parts_.end(), begin,
                             [](int64_t at, const Part& p) { return at < p.start + p.count; });
  while (n > 0) {
    const int64_t off = begin - it->start, take = std::min(n, it->count - off);
    std::memcpy(out, it->tokens + off, size_t(take) * 2);
    out += take;
    begin += take;
    n -= take;
    ++it;
  }
}

void TokenStream::copy(int64_t begin, int64_t n, uint16_t* out) const {
  if (begin < 0 || n < 0 || begin + n > size())
    throw std::out_of_range("TokenStream::copy past the end");
  if (mapped)
    mapped->copy(mapped_begin + begin, n, out);
  else
    std::memcpy(out, tokens.data() + begin, size_t(n) * 2);
}

void check_builtin_fits(int64_t train_tokens, int64_t validation_tokens) {
  // Generated in memory: a uint16 token and a uint8 part label each.
  const double need = 3.0 * (double(train_tokens) + double(validation_tokens));
  const std::size_t host = host_memory_bytes();
  if (host > 0 && need > 0.5 * double(host))
    throw InputError(fmt::format(
        "source builtin: {} training + {} validation tokens are generated in memory ({} at 3 "
        "bytes a token, this machine has {}); {}",
        train_tokens, validation_tokens, bytes_text(need), bytes_text(double(host)),
        validation_tokens > train_tokens
            ? "the held-out set is most of it: lower [train] eval_tokens"
            : "the built-in corpus is for small sweeps: set [train] source = \"shards:GLOB\" "
              "(llm.c token shards, memory-mapped)"));
}

std::optional<SourceFile> source_file(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos || colon + 1 == spec.size()) return std::nullopt;
  SourceFile f{spec.substr(0, colon), spec.substr(colon + 1)};
  if (f.kind != "text" && f.kind != "bytes" && f.kind != "shards") return std::nullopt;
  return f;
}

fs::path source_base_of(const fs::path& manifest) {
  std::error_code ec;
  return fs::weakly_canonical(fs::absolute(manifest), ec).parent_path();
}

std::string source_from(const std::string& spec, const fs::path& base) {
  const auto f = source_file(spec);
  if (base.empty() || !f || f->path.is_absolute()) return spec;
  return f->kind + ":" + (base / f->path).lexically_normal().string();
}

int64_t source_token_count(const std::string& spec) {
  if (spec == "builtin") return -1;
  const auto f = source_file(spec);
  const std::string kind = f ? f->kind : "", arg = f ? f->path.string() : "";
  if (kind == "text" || kind == "bytes") {
    std::error_code ec;
    if (fs::is_directory(arg, ec))
      throw InputError(fmt::format("source '{}': '{}' is a folder; give a file", spec, arg));
    const auto bytes = fs::file_size(arg, ec);
    if (ec)
      throw InputError(fmt::format("source '{}': cannot read '{}' ({})", spec, arg, ec.message()));
    return int64_t(bytes);
  }
  if (kind == "shards") {
    const std::vector<fs::path> files = expand_glob(arg);
    if (files.empty())
      throw InputError(fmt::format("source '{}': no shard matches '{}'", spec, arg));
    return MappedShards(files).size();  // headers checked against sizes; nothing read
  }
  throw InputError(
      fmt::format("source '{}' is not one of: builtin, text:PATH, bytes:PATH, shards:GLOB", spec));
}

std::string token_fingerprint(const TokenStream& s, int64_t samples) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t v, int bytes) {  // little-endian bytes: the same on every machine
    for (int b = 0; b < bytes; ++b) {
      h ^= (v >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  };
  const int64_t n = s.size();
  mix(uint64_t(n), 8);
  if (n <= samples) {
    std::vector<uint16_t> buf(size_t(std::min<int64_t>(n, 1 << 16)));
    for (int64_t at = 0; at < n; at += int64_t(buf.size())) {
      const int64_t k = std::min<int64_t>(int64_t(buf.size()), n - at);
      s.copy(at, k, buf.data());
      for (int64_t i = 0; i < k; ++i) mix(buf[size_t(i)], 2);
    }
  } else {
    const int64_t q = n / samples, r = n % samples;  // position i·n/samples without overflow
    for (int64_t i = 0; i < samples; ++i) {
      uint16_t t = 0;
      s.copy(i * q + i * r / samples, 1, &t);
      mix(t, 2);
    }
  }
  return fmt::format("{:016x}", h);
}

void write_shard(const fs::path& path, const std::vector<uint16_t>& tokens) {
  std::string bytes(size_t(kShardHeaderBytes) + tokens.size() * 2, '\0');
  std::array<int32_t, 3> head{kShardMagic, kShardVersion, int32_t(tokens.size())};
  std::memcpy(bytes.data(), head.data(), sizeof(head));
  std::memcpy(bytes.data() + kShardHeaderBytes, tokens.data(), tokens.size() * 2);
  write_file_atomic(path, bytes);
}

DataSplit load_source(const std::string& spec, int64_t train_tokens, int64_t validation_tokens,
                      uint64_t data_seed, int64_t vocab) {
  DataSplit split;
  if (spec == "builtin") {
    check_builtin_fits(train_tokens, validation_tokens);
    split.train = builtin_corpus(data_seed, 0, train_tokens);
    split.validation = builtin_corpus(data_seed, 1, validation_tokens);
    split.part_names = {"facts", "arith"};
    split.source_tokens = train_tokens + validation_tokens;
    split.byte_tokens = true;
    split.description = fmt::format(
        "builtin corpus v1 (data_seed {}, {} facts): {} training + {} "
        "validation tokens",
        data_seed, kBuiltinFacts, train_tokens, validation_tokens);
    if (vocab < 256)
      throw InputError(
          fmt::format("source builtin: byte tokens need vocab >= 256, the plan has {}", vocab));
    return split;
  }
  const auto f = source_file(spec);
  const std::string kind = f ? f->kind : "", arg = f ? f->path.string() : "";
  std::vector<uint16_t> all;
  std::shared_ptr<const MappedShards> shards;
  if (kind == "text" || kind == "bytes") {
    std::error_code ec;
    if (fs::is_directory(arg, ec))
      throw InputError(fmt::format("source '{}': '{}' is a folder; give a file", spec, arg));
    const std::string bytes = read_file(arg);
    all.reserve(bytes.size());
    for (char c : bytes) all.push_back(uint16_t(static_cast<unsigned char>(c)));
    split.byte_tokens = true;
    split.description = fmt::format("{} file '{}'", kind, arg);
  } else if (kind == "shards") {
    const std::vector<fs::path> files = expand_glob(arg);
    if (files.empty())
      throw InputError(fmt::format("source '{}': no shard matches '{}'", spec, arg));
    shards = std::make_shared<const MappedShards>(files);
    split.description = fmt::format("{} llm.c shard(s) '{}', memory-mapped", files.size(), arg);
  } else {
    throw InputError(
        fmt::format("source '{}' is not one of: builtin, text:PATH, bytes:PATH, "
                    "shards:GLOB",
                    spec));
  }
  const int64_t have = shards ? shards->size() : int64_t(all.size());
  split.source_tokens = have;
  if (have < train_tokens + validation_tokens)
    throw InputError(
        fmt::format("source '{}' has {} tokens; the plan needs {} for training "
                    "(D̂ + 1 target) plus {} held-out validation tokens = {}",
                    spec, have, train_tokens, validation_tokens, train_tokens + validation_tokens));
  if (shards) {  // training stays mapped; the (small) validation tail is copied out
    split.train.mapped = shards;
    split.train.mapped_size = train_tokens;
    split.validation.tokens.resize(size_t(validation_tokens));
    shards->copy(have - validation_tokens, validation_tokens, split.validation.tokens.data());
  } else {
    split.train.tokens.assign(all.begin(), all.begin() + train_tokens);
    split.validation.tokens.assign(all.end() - validation_tokens, all.end());
  }
  // Every token the run can read, training and validation (unused tokens in between may be
  // anything: they are never read).
  check_vocab(split.train, vocab, fmt::format("source '{}'", spec));
  check_vocab(
      split.validation, vocab,
      fmt::format("source '{}' (held-out tail, from position {})", spec, have - validation_tokens),
      have - validation_tokens);
  split.unused_tokens = have - train_tokens - validation_tokens;
  split.description += ": " + describe_count(have);
  return split;
}

}  // namespace moeplan::backend
