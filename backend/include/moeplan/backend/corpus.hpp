#pragma once
// Token sources (BACKEND.md "Data"): the built-in seeded corpus, plain text/bytes files (byte
// tokens, V = 256) and llm.c .bin shards. A source is split into a training region (what the
// unique windows of D̂ are cut from) and a held-out validation region training never reads.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace moeplan::backend {

// A run of tokens with an optional part tag per position (the built-in corpus: facts / arith).
struct TokenStream {
  std::vector<uint16_t> tokens;
  std::vector<uint8_t> part;  // empty when the source has no parts; else part[i] for tokens[i]
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
