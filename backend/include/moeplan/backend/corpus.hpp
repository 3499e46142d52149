#pragma once
// Token sources (BACKEND.md "Data"): the built-in seeded corpus, plain text/bytes files (byte
// tokens, V = 256) and llm.c .bin shards. A source is split into a training region (what the
// unique windows of D̂ are cut from) and a held-out validation region training never reads.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moeplan::backend {

// llm.c shards, memory-mapped read-only and seen as one run of tokens (their concatenation in
// the given order). Nothing is copied: the tokens stay in the page cache, which the processes
// of a data-parallel job on one machine share, so a training region of tens of billions of
// tokens costs no process memory. Every header is checked on opening (InputError, one line).
class MappedShards {
 public:
  explicit MappedShards(const std::vector<std::filesystem::path>& files);
  ~MappedShards();
  MappedShards(const MappedShards&) = delete;
  MappedShards& operator=(const MappedShards&) = delete;
  int64_t size() const { return size_; }
  // Tokens [begin, begin + n) of the concatenation, across shard boundaries.
  void copy(int64_t begin, int64_t n, uint16_t* out) const;

 private:
  struct Part {
    void* map = nullptr;
    size_t bytes = 0;
    const uint16_t* tokens = nullptr;
    int64_t start = 0, count = 0;  // position of its first token in the concatenation
  };
  std::vector<Part> parts_;
  int64_t size_ = 0;
};

// A run of tokens with an optional part tag per position (the built-in corpus: facts / arith):
// in memory (`tokens`), or a range of memory-mapped shards (`mapped`, then `tokens` is empty).
struct TokenStream {
  std::vector<uint16_t> tokens;
  std::vector<uint8_t> part;  // empty when the source has no parts; else part[i] for tokens[i]
  std::shared_ptr<const MappedShards> mapped;
  int64_t mapped_begin = 0, mapped_size = 0;  // the range of `mapped` this stream is

  int64_t size() const { return mapped ? mapped_size : int64_t(tokens.size()); }
  // Tokens [begin, begin + n) of this stream.
  void copy(int64_t begin, int64_t n, uint16_t* out) const;
};

struct DataSplit {
  TokenStream train;                    // exactly train_tokens positions, starting at source 0
  TokenStream validation;               // exactly validation_tokens positions, held out
  std::vector<std::string> part_names;  // {"facts", "arith"} for the built-in corpus; else empty
  int64_t source_tokens = 0;            // tokens the source holds (built-in: what was generated)
  int64_t unused_tokens = 0;            // source tokens neither trained on nor validated on
  std::string description;              // one line: what was read
  bool byte_tokens = false;             // tokens are bytes (loss in bits per byte is BPC)
};

// A fingerprint of a stream's tokens: FNV-1a (64 bits, 16 hex digits) over its length and its
// tokens, all of them when it holds at most `samples`, else `samples` positions spread evenly
// over it. Records carry one of the training region and one of the held-out set, so the audit
// can tell that two points read the same tokens (a cheap check, not a proof) even when a file
// under the same path changed between their runs.
std::string token_fingerprint(const TokenStream& stream, int64_t samples = int64_t(1) << 20);

// How many tokens a source holds, without reading them (file sizes; shard headers), or -1 for the
// built-in corpus, which generates what it is asked for. Throws InputError as load_source does
// for a missing or unreadable source. For refusing, before any point trains, a point that the
// source cannot feed.
int64_t source_token_count(const std::string& spec);
// The built-in corpus is generated in memory (3 bytes a token): throws InputError, naming the
// sizes and the machine's memory, when they would take more than half of it.
void check_builtin_fits(int64_t train_tokens, int64_t validation_tokens);

// A file source's kind ("text", "bytes" or "shards") and its PATH (or glob); nullopt for
// builtin, or a spec of no known kind or without a path.
struct SourceFile {
  std::string kind;
  std::filesystem::path path;
};
std::optional<SourceFile> source_file(const std::string& spec);

// The folder a manifest's relative source paths are read from: its own, symlinks resolved
// (a manifest linked from elsewhere reads beside the file it links to).
std::filesystem::path source_base_of(const std::filesystem::path& manifest);

// `spec` with a relative PATH read from `base` (source_base_of a manifest: `moeplan run` reads a
// sweep's source from where its sweep.toml is, not from the folder it runs in). Unchanged for
// builtin, an absolute path, or an empty base.
std::string source_from(const std::string& spec, const std::filesystem::path& base);

// `spec`: "builtin", "text:PATH", "bytes:PATH", "shards:PATH-OR-GLOB" (glob in the file name part,
// matches sorted by name and concatenated). Training takes the first `train_tokens` positions,
// validation the last `validation_tokens` (so it never depends on D̂). Throws InputError with one
// line when the source is missing, corrupt, too small, or holds a token >= vocab.
DataSplit load_source(const std::string& spec, int64_t train_tokens, int64_t validation_tokens,
                      uint64_t data_seed, int64_t vocab);

// The built-in corpus, `tokens` bytes of stream `stream` (0 = training, 1 = validation): records
// "name: colour animal NN\n" drawn from a fixed seeded table of facts, and multi-step arithmetic
// "12+7*3=33\n" with the usual precedence, about half each. Deterministic in (data_seed, stream).
TokenStream builtin_corpus(uint64_t data_seed, int stream, int64_t tokens);
inline constexpr int kBuiltinFacts = 1024;  // size of the facts table

// llm.c shard format: 256 int32 header (magic 20240520, version 1, token count), uint16 tokens.
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderBytes = 256 * 4;
std::vector<uint16_t> read_shard(const std::filesystem::path& path);
// Writes a shard (used by tests and by users converting data); atomic.
void write_shard(const std::filesystem::path& path, const std::vector<uint16_t>& tokens);

}  // namespace moeplan::backend
