// The data side of a run: sources, the unique window, epochs and the token ledger, checked
// against counts made here, independently of the loader.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/backend/checkpoint.hpp"
#include "moeplan/backend/corpus.hpp"
#include "moeplan/backend/data.hpp"
#include "scratch.hpp"

#define XXH_INLINE_ALL  // the library's own one-shot hash, header-only as in checkpoint.cpp
#include <xxhash.h>

namespace fs = std::filesystem;
using namespace moeplan;
using namespace moeplan::backend;

namespace {

using moeplan::test::fresh_dir;

// Three shards whose token at global position p is p (all positions < 65536).
fs::path position_shards(int64_t total, const std::string& name) {
  const fs::path d = fresh_dir(name);
  const int64_t per = (total + 2) / 3;
  for (int s = 0; s < 3; ++s) {
    std::vector<uint16_t> t;
    for (int64_t p = s * per; p < std::min(total, (s + 1) * per); ++p) t.push_back(uint16_t(p));
    write_shard(d / ("part_" + std::to_string(s) + ".bin"), t);
  }
  return d;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("position-encoded shards: the unique set is exactly D̂'s windows, each epoch once") {
  const int64_t seq_len = 16, windows = 50, batch = 7, steps = 23;  // 161 windows: 3.22 epochs
  const int64_t d_hat = windows * seq_len, val_tokens = 5 * seq_len + 1, total = 4000;
  const fs::path dir = position_shards(total, "positions");
  const DataSplit split =
      load_source("shards:" + (dir / "part_*.bin").string(), d_hat + 1, val_tokens, 1, 65536);
  REQUIRE(split.source_tokens == total);
  CHECK(split.unused_tokens == total - (d_hat + 1) - val_tokens);
  // Validation is the tail of the source: positions total-val_tokens .. total-1, never training's.
  CHECK(split.validation.tokens.front() == total - val_tokens);
  CHECK(split.validation.tokens.back() == total - 1);

  WindowOrder order(windows, 99);
  TokenLedger ledger(seq_len, windows);
  std::vector<int32_t> in(size_t(batch * seq_len)), tg(size_t(batch * seq_len));
  std::vector<int64_t> fed;  // window ids in feed order, decoded from token values
  std::set<int64_t> positions;
  for (int64_t s = 0; s < steps; ++s) {
    fill_batch(split.train, seq_len, batch, order, ledger, in.data(), tg.data());
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t start = in[size_t(b * seq_len)];
      REQUIRE(start % seq_len == 0);
      REQUIRE(start < d_hat);
      for (int64_t i = 0; i < seq_len; ++i) {
        REQUIRE(in[size_t(b * seq_len + i)] == start + i);
        REQUIRE(tg[size_t(b * seq_len + i)] == start + i + 1);  // the next position
        positions.insert(start + i);
      }
      fed.push_back(start / seq_len);
    }
  }
  // Independent count: 23 steps · 7 sequences = 161 windows = 3 full epochs of 50 + 11.
  REQUIRE(int64_t(fed.size()) == 161);
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> epoch(fed.begin() + e * windows, fed.begin() + (e + 1) * windows);
    std::sort(epoch.begin(), epoch.end());
    for (int64_t w = 0; w < windows; ++w) CHECK(epoch[size_t(w)] == w);  // each window once
  }
  std::set<int64_t> last(fed.begin() + 3 * windows, fed.end());
  CHECK(last.size() == 11);  // the partial fourth epoch repeats nothing
  // Later epochs are fresh permutations, not the first order again.
  CHECK(!std::equal(fed.begin(), fed.begin() + windows, fed.begin() + windows));
  CHECK(!std::equal(fed.begin() + windows, fed.begin() + 2 * windows, fed.begin() + 2 * windows));

  CHECK(int64_t(positions.size()) == d_hat);  // every input position of D̂, nothing outside
  CHECK(*positions.rbegin() == d_hat - 1);
  CHECK(ledger.consumed == steps * batch * seq_len);  // 2576
  CHECK(ledger.consumed == 2576);
  CHECK(ledger.loss_bearing == 2576);
  CHECK(ledger.unique() == int64_t(positions.size()));
  CHECK(ledger.windows_consumed == 161);
  CHECK(ledger.dropped == 0);
  CHECK(order.epoch() == 3);
  CHECK(order.cursor() == 11);
  CHECK(ledger.epochs() == doctest::Approx(2576.0 / 800.0));
}

TEST_CASE("shards are memory-mapped: windows across shard boundaries read the right tokens") {
  // Three shards of 40 tokens (token = global position); windows of 8 + 1 cross 40 and 80.
  const int64_t seq_len = 8, windows = 12, total = 120;
  const fs::path dir = position_shards(total, "mapped");
  const DataSplit split = load_source("shards:" + (dir / "part_*.bin").string(),
                                      windows * seq_len + 1, 16, 1, 65536);
  CHECK(split.train.mapped != nullptr);  // nothing copied into process memory
  CHECK(split.train.tokens.empty());
  CHECK(split.train.size() == windows * seq_len + 1);
  CHECK(split.description.find("memory-mapped") != std::string::npos);
  std::vector<uint16_t> got(30);
  split.train.copy(25, 30, got.data());  // shard 0's last 15, shard 1's first 15
  for (int i = 0; i < 30; ++i) CHECK(got[size_t(i)] == 25 + i);
  CHECK_THROWS_AS(split.train.copy(90, 10, got.data()), std::out_of_range);  // past D̂ + 1 = 97
  WindowOrder order(windows, 5);
  TokenLedger ledger(seq_len, windows);
  std::vector<int32_t> in(size_t(windows * seq_len)), tg(size_t(windows * seq_len));
  fill_batch(split.train, seq_len, windows, order, ledger, in.data(), tg.data());  // one epoch
  std::set<int64_t> starts;
  for (int64_t b = 0; b < windows; ++b) {
    const int64_t start = in[size_t(b * seq_len)];
    starts.insert(start);
    for (int64_t i = 0; i < seq_len; ++i) {
      CHECK(in[size_t(b * seq_len + i)] == start + i);
      CHECK(tg[size_t(b * seq_len + i)] == start + i + 1);
    }
  }
  CHECK(starts.size() == size_t(windows));
  CHECK(starts.count(32) == 1);  // its target at 40 is shard 1's first token
  CHECK(starts.count(72) == 1);  // its inputs cross into shard 2 at 80
  // Validation is the source's tail, copied out of the mapping.
  CHECK(split.validation.tokens.size() == 16);
  CHECK(split.validation.tokens.front() == total - 16);
  CHECK(split.validation.tokens.back() == total - 1);
}

TEST_CASE("first epoch only: unique counts exactly the windows touched so far") {
  const int64_t seq_len = 8, windows = 20;
  TokenStream s;
  for (int p = 0; p < windows * seq_len + 1; ++p) s.tokens.push_back(uint16_t(p));
  WindowOrder order(windows, 5);
  TokenLedger ledger(seq_len, windows);
  std::vector<int32_t> in(3 * seq_len), tg(3 * seq_len);
  std::set<int32_t> starts;
  for (int k = 0; k < 4; ++k) {  // 12 of 20 windows
    fill_batch(s, seq_len, 3, order, ledger, in.data(), tg.data());
    for (int b = 0; b < 3; ++b) starts.insert(in[size_t(b * seq_len)]);
  }
  CHECK(starts.size() == 12);
  CHECK(ledger.unique() == 12 * seq_len);
  for (int32_t st : starts) CHECK(ledger.was_touched(st / seq_len));
  CHECK(order.epoch() == 0);
  CHECK(order.cursor() == 12);
}

TEST_CASE("window order depends on the seed and is reproducible") {
  CHECK(WindowOrder::permutation_for(100, 1, 0) == WindowOrder::permutation_for(100, 1, 0));
  CHECK(WindowOrder::permutation_for(100, 1, 0) != WindowOrder::permutation_for(100, 2, 0));
  CHECK(WindowOrder::permutation_for(100, 1, 0) != WindowOrder::permutation_for(100, 1, 1));
}

TEST_CASE("corrupt shards and small sources fail with one line naming the problem") {
  const fs::path dir = fresh_dir("corrupt");
  std::vector<uint16_t> t(100, 7);
  write_shard(dir / "good.bin", t);
  std::string bytes = read_file(dir / "good.bin");

  std::string bad = bytes;
  bad[0] = 'X';
  write_file_atomic(dir / "magic.bin", bad);
  std::string e = error_of([&] { read_shard(dir / "magic.bin"); });
  CHECK(e.find("bad magic") != std::string::npos);
  CHECK(e.find("20240520") != std::string::npos);

  write_file_atomic(dir / "short.bin", bytes.substr(0, bytes.size() - 10));
  e = error_of([&] { read_shard(dir / "short.bin"); });
  CHECK(e.find("truncated") != std::string::npos);
  CHECK(e.find("100 tokens") != std::string::npos);
  write_file_atomic(dir / "tiny.bin", bytes.substr(0, 100));
  CHECK(error_of([&] { read_shard(dir / "tiny.bin"); }).find("truncated") != std::string::npos);

  // 100 tokens cannot hold D̂ + 1 = 97 training plus 17 validation tokens.
  e = error_of([&] { load_source("shards:" + (dir / "good.bin").string(), 97, 17, 1, 256); });
  CHECK(e.find("has 100 tokens") != std::string::npos);
  CHECK(e.find("= 114") != std::string::npos);
  // A token outside the vocabulary is refused before training.
  e = error_of([&] { load_source("shards:" + (dir / "good.bin").string(), 50, 10, 1, 5); });
  CHECK(e.find("outside the model's vocabulary") != std::string::npos);
  // In the held-out tail, at its position in the source: 150 bytes with byte 200 at 140; the
  // tail of 20 starts at 130. It was said as position 10, counted from the tail's start.
  std::string text(150, 'a');
  text[140] = char(200);
  write_file_atomic(dir / "tail.txt", text);
  e = error_of([&] { load_source("text:" + (dir / "tail.txt").string(), 50, 20, 1, 128); });
  CHECK_MESSAGE(
      e.find("(held-out tail, from position 130): token 200 at position 140 is outside") !=
          std::string::npos,
      e);
  // A byte source with V under 256 is told the V bytes need, not to "use byte data".
  write_file_atomic(dir / "bytes.txt", std::string(200, '\xC3'));
  e = error_of([&] { load_source("text:" + (dir / "bytes.txt").string(), 50, 10, 1, 128); });
  CHECK_MESSAGE(e.find("token 195 at position 0 is outside the model's vocabulary (V = 128); a "
                       "byte's tokens run to 255: plan with V >= 256") != std::string::npos,
                e);
  CHECK(error_of([&] { load_source("nonsense", 10, 10, 1, 256); }).find("is not one of") !=
        std::string::npos);
  CHECK(error_of([&] { load_source("text:/no/such/file", 10, 10, 1, 256); }).find("cannot read") !=
        std::string::npos);
  for (const char* line : {"bad magic", "truncated"})
    CHECK(std::string(line).find('\n') == std::string::npos);
}

TEST_CASE("shard patterns match as a shell does: no hidden files, no silent skips") {
  const fs::path dir = fresh_dir("globs");
  std::vector<uint16_t> t(100, 7);
  write_shard(dir / "s_000.bin", t);
  write_shard(dir / "s_001.bin", t);
  // A half-copied hidden file is no shard (ls s_*.bin and *.bin list 2 files).
  write_shard(dir / ".s_002.bin", std::vector<uint16_t>(50, 9));
  CHECK(source_token_count("shards:" + (dir / "*.bin").string()) == 200);
  CHECK(source_token_count("shards:" + (dir / ".s_*.bin").string()) == 50);  // asked by name
  // A link to nothing that the pattern matches is named, not skipped.
  fs::create_symlink(dir / "gone.bin", dir / "s_003.bin");
  const std::string dangling =
      error_of([&] { source_token_count("shards:" + (dir / "s_*.bin").string()); });
  CHECK_MESSAGE(dangling.find("s_003.bin' matches") != std::string::npos, dangling);
  CHECK_MESSAGE(dangling.find("which does not exist") != std::string::npos, dangling);
  fs::remove(dir / "s_003.bin");
  // A pattern in the folder part is said to be one, not "cannot read".
  CHECK(error_of([&] {
          source_token_count("shards:" + (dir / "s*" / "x.bin").string());
        }).find("has a pattern in its folder part") != std::string::npos);
  // A file whose own name has a bracket: told how to escape it.
  write_shard(dir / "b[1].bin", t);
  CHECK(error_of([&] {
          source_token_count("shards:" + (dir / "b[1].bin").string());
        }).find("write '[' as '\\['") != std::string::npos);
  CHECK(source_token_count("shards:" + (dir / "b\\[1].bin").string()) == 100);
}

TEST_CASE("a shard cut shorter while mapped: one line on stderr and exit 70, not 'Bus error'") {
  const fs::path dir = fresh_dir("sigbus");
  write_shard(dir / "s.bin", std::vector<uint16_t>(100000, 7));
  const fs::path err = dir / "stderr";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(e, 2);
    const MappedShards shards({dir / "s.bin"});
    std::error_code ec;
    fs::resize_file(dir / "s.bin", 1024, ec);  // as `truncate -s 1024` beside a run
    std::vector<uint16_t> out(1000);
    shards.copy(90000, 1000, out.data());  // past the new end: SIGBUS
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 70);
  const std::string said = read_file(err);
  CHECK(said.rfind("moeplan: error: SIGBUS reading a memory-mapped shard", 0) == 0);
  CHECK(std::count(said.begin(), said.end(), '\n') == 1);
}

TEST_CASE("text files are byte tokens; validation is the file's tail") {
  const fs::path dir = fresh_dir("text");
  std::string text;
  for (int i = 0; i < 300; ++i) text += char('a' + i % 26);
  write_file_atomic(dir / "t.txt", text);
  const DataSplit s = load_source("text:" + (dir / "t.txt").string(), 101, 33, 1, 256);
  CHECK(s.train.tokens.size() == 101);
  CHECK(s.train.tokens[27] == 'b');
  CHECK(s.validation.tokens.size() == 33);
  CHECK(s.validation.tokens.back() == uint16_t('a' + 299 % 26));
  CHECK(s.unused_tokens == 300 - 101 - 33);
}

namespace {
// An evaluator written for the test: left to right, * before + and -.
int64_t eval_expr(const std::string& e) {
  std::vector<int64_t> terms;
  std::vector<char> signs{'+'};
  size_t i = 0;
  auto number = [&] {
    int64_t v = 0;
    while (i < e.size() && std::isdigit(static_cast<unsigned char>(e[i])))
      v = v * 10 + (e[i++] - '0');
    return v;
  };
  int64_t term = number();
  while (i < e.size()) {
    const char op = e[i++];
    const int64_t v = number();
    if (op == '*') {
      term *= v;
    } else {
      terms.push_back(term);
      signs.push_back(op);
      term = v;
    }
  }
  terms.push_back(term);
  int64_t total = 0;
  for (size_t k = 0; k < terms.size(); ++k) total += signs[k] == '+' ? terms[k] : -terms[k];
  return total;
}
}  // namespace

TEST_CASE("built-in corpus: deterministic, correct arithmetic, consistent facts, parts tagged") {
  const TokenStream a = builtin_corpus(3, 0, 20000);
  CHECK(a.tokens == builtin_corpus(3, 0, 20000).tokens);
  CHECK(a.tokens != builtin_corpus(4, 0, 20000).tokens);
  CHECK(a.tokens != builtin_corpus(3, 1, 20000).tokens);  // validation is another stream
  // A run's split: training from stream 0, the held-out set from stream 1 (not the training
  // stream's first tokens, which the model trains on), each with its part tags.
  const DataSplit split = load_source("builtin", 5000, 700, 3, 256);
  CHECK(split.train.tokens == builtin_corpus(3, 0, 5000).tokens);
  CHECK(split.validation.tokens == builtin_corpus(3, 1, 700).tokens);
  CHECK(split.validation.part == builtin_corpus(3, 1, 700).part);
  CHECK(split.part_names == std::vector<std::string>{"facts", "arith"});
  REQUIRE(a.part.size() == a.tokens.size());
  std::string text(a.tokens.begin(), a.tokens.end());
  std::map<std::string, std::string> facts;
  int arith = 0, fact_lines = 0;
  size_t begin = 0, pos = 0;
  while ((pos = text.find('\n', begin)) != std::string::npos) {
    const std::string line = text.substr(begin, pos - begin);
    const auto eq = line.find('='), colon = line.find(": ");
    if (eq != std::string::npos) {
      ++arith;
      CHECK(eval_expr(line.substr(0, eq)) == std::stoll(line.substr(eq + 1)));
      CHECK(a.part[begin] == 1);
    } else {
      REQUIRE(colon != std::string::npos);
      ++fact_lines;
      auto [it, inserted] = facts.emplace(line.substr(0, colon), line.substr(colon + 2));
      CHECK(it->second == line.substr(colon + 2));  // one attribute per name, always
      CHECK(a.part[begin] == 0);
    }
    begin = pos + 1;
  }
  CHECK(arith > 500);
  CHECK(fact_lines > 500);
  CHECK(int(facts.size()) <= kBuiltinFacts);
  CHECK(facts.size() > 300);  // many distinct facts appear
}

TEST_CASE(
    "layouts from JSON: each entry's four whole numbers and sharding, or a refusal naming it") {
  const auto back = layouts_from_json(
      nlohmann::json::parse(R"([{"from_step":0,"world_size":2,"micro_batch":0,"threads":1,
                                 "optimizer_sharded":true,"kernels":"k"},
                                {"from_step":9,"world_size":1,"micro_batch":3,"threads":1,
                                 "optimizer_sharded":true,"kernels":"k"}])"));
  REQUIRE(back.size() == 2);
  CHECK(back[1] == Layout{9, 1, 3, 1, true, "k"});
  CHECK(layouts_to_json(back)[1] ==
        nlohmann::json::parse(R"({"from_step":9,"world_size":1,"micro_batch":3,"threads":1,
                                  "optimizer_sharded":true,"kernels":"k"})"));
  CHECK_THROWS_WITH_AS(layouts_from_json(nlohmann::json::object()), "layouts: not a list",
                       moeplan::InputError);
  CHECK_THROWS_WITH_AS(layouts_from_json(nlohmann::json::parse(
                           R"([{"from_step":0,"world_size":2,"micro_batch":0,"threads":0,
               "optimizer_sharded":true,"kernels":"k"},
              {"from_step":3,"world_size":1,"micro_batch":0,"threads":0}])")),
                       "layouts[1]: 'optimizer_sharded' is not true or false", moeplan::InputError);
  CHECK_THROWS_WITH_AS(layouts_from_json(nlohmann::json::parse(
                           R"([{"from_step":0,"world_size":2,"micro_batch":0,"threads":0,
                               "optimizer_sharded":true,"kernels":7}])")),
                       "layouts[0]: 'kernels' is not a string", moeplan::InputError);
  CHECK_THROWS_WITH_AS(layouts_from_json(nlohmann::json::parse(
                           R"([{"from_step":-2,"world_size":2,"micro_batch":0,"threads":0,
                               "optimizer_sharded":false,"kernels":""}])")),
                       "layouts[0]: 'from_step' is not a whole number of at least 0",
                       moeplan::InputError);
}

TEST_CASE("checkpoint round trip; a flipped byte is detected") {
  const fs::path dir = fresh_dir("ckpt");
  Checkpoint ck;
  ck.plan = {{"id", "p"}, {"steps", 3}};
  ck.state.step = 7;
  ck.state.tokens = TokenLedger(4, 130);
  ck.state.order = WindowOrder(130, 11);
  for (int k = 0; k < 200; ++k) ck.state.tokens.record_window(ck.state.order.next());
  ck.state.train_flops.add_gemm(FlopCategory::expert, Phase::forward, 3, 5, 7);
  // A long run's cumulative count: 16 products of 2^20 cubed, 2 · 2^60 each, are 2^65 =
  // 36893488147419103232 FLOPs, past 64 bits; kept to the FLOP.
  const int64_t n = int64_t(1) << 20;
  for (int i = 0; i < 16; ++i)
    ck.state.train_flops.add_gemm(FlopCategory::projection, Phase::weight_grad, n, n, n);
  ck.state.loss_curve.push_back({{"step", 1}, {"train_loss", 0.1 + 0.2}});
  ck.state.loss_sum_since_log = 1.0 / 3.0;
  ck.model_state = {'a', 'b', '\0', 'c'};
  ck.state.threads = 3;
  // Every other field of the state, each a value of its own, so a field read into another, or
  // not read, shows.
  ck.state.eval_flops.add_gemm(FlopCategory::lm_head, Phase::forward, 2, 3, 11);
  ck.state.dropped_assignments = 41;
  ck.state.val_curve.push_back({{"step", 7}, {"val_bpc", 1.5}});
  ck.state.val_seconds = {0.5, 11.75};
  ck.state.steps_since_log = 5;
  ck.state.train_seconds = 12.25;
  ck.state.eval_seconds = 0.75;
  ck.state.resumes = 2;
  ck.state.micro_batch_seqs = 6;
  ck.state.device = "cuda";
  ck.state.kernels_requested = "experts=tiled";
  ck.state.kernels = "attention=fused_mma,experts=tiled";
  ck.state.world_size = 4;
  ck.state.hardware = {"GPU A", "GPU B"};
  ck.state.layouts = {{0, 8, 0, 0, true, "a"}, {5, 4, 6, 0, false, "b"}};
  ck.state.optimizer_sharded = false;
  write_checkpoint(dir / "s.ckpt", ck);
  const Checkpoint back = read_checkpoint(dir / "s.ckpt");
  CHECK(back.state.threads == 3);
  CHECK(back.state.step == 7);
  CHECK(back.state.eval_flops == ck.state.eval_flops);
  CHECK(back.state.dropped_assignments == 41);
  CHECK(back.state.val_curve == ck.state.val_curve);
  CHECK(back.state.val_seconds == std::vector<double>{0.5, 11.75});
  CHECK(back.state.steps_since_log == 5);
  CHECK(back.state.train_seconds == 12.25);
  CHECK(back.state.eval_seconds == 0.75);
  CHECK(back.state.resumes == 2);
  CHECK(back.state.micro_batch_seqs == 6);
  CHECK(back.state.device == "cuda");
  CHECK(back.state.kernels_requested == std::optional<std::string>("experts=tiled"));
  CHECK(back.state.kernels == "attention=fused_mma,experts=tiled");
  CHECK(back.state.world_size == 4);
  CHECK(back.state.hardware == ck.state.hardware);
  CHECK(back.state.layouts == ck.state.layouts);
  CHECK(back.state.optimizer_sharded == std::optional<bool>(false));
  const CheckpointHead hd = read_checkpoint_head(dir / "s.ckpt");
  CHECK(hd.step == 7);
  CHECK(hd.micro_batch_seqs == 6);
  CHECK(hd.device == "cuda");
  CHECK(hd.threads == 3);
  CHECK(hd.kernels_requested == std::optional<std::string>("experts=tiled"));
  CHECK(hd.optimizer_sharded == std::optional<bool>(false));
  CHECK(hd.world_size == 4);
  CHECK(back.plan == ck.plan);
  CHECK(back.model_state == ck.model_state);
  CHECK(back.state.tokens == ck.state.tokens);
  CHECK(back.state.order == ck.state.order);
  CHECK(back.state.train_flops == ck.state.train_flops);
  CHECK(to_string(back.state.train_flops.at(FlopCategory::projection, Phase::weight_grad)) ==
        "36893488147419103232");
  CHECK(back.state.loss_curve == ck.state.loss_curve);
  CHECK(back.state.loss_sum_since_log == 1.0 / 3.0);  // bit for bit through JSON
  CHECK(back.state.loss_curve[0]["train_loss"].get<double>() == 0.1 + 0.2);

  // The layout, by hand (checkpoint.hpp): "MOEPCKP2" | u64 n | head | u64 4 | "ab\0c" | u64 520 |
  // 130 int32 | u64 24 | 3 uint64 | u64 XXH3-64 of all before.
  std::string bytes = read_file(dir / "s.ckpt");
  auto u64_at = [&](const std::string& b, size_t at) {
    uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  REQUIRE(bytes.substr(0, 8) == "MOEPCKP2");
  const size_t head = u64_at(bytes, 8);
  const size_t model = 16 + head;
  CHECK(u64_at(bytes, model) == 4);
  CHECK(bytes.substr(model + 8, 4) == std::string("ab\0c", 4));
  CHECK(u64_at(bytes, model + 12) == 130 * 4);
  CHECK(u64_at(bytes, model + 20 + 520) == 3 * 8);
  REQUIRE(bytes.size() == model + 20 + 520 + 8 + 24 + 8);
  // The checksum is libxxhash's one-shot XXH3-64 of every byte before it (the writer feeds its
  // streaming form part by part). The library itself against its published value for no input:
  CHECK(XXH3_64bits("", 0) == 0x2d06800538d394c2ull);
  CHECK(u64_at(bytes, bytes.size() - 8) == XXH3_64bits(bytes.data(), bytes.size() - 8));
  // A checkpoint of the first format (same sections, "MOEPCKP1", FNV-1a 64 over every byte
  // before the checksum: offset 0xcbf29ce484222325, prime 0x100000001b3) still reads, whole.
  std::string v1 = "MOEPCKP1" + bytes.substr(8, bytes.size() - 16);
  uint64_t fnv = 0xcbf29ce484222325ull;
  for (unsigned char c : v1) fnv = (fnv ^ c) * 0x100000001b3ull;
  v1.append(reinterpret_cast<const char*>(&fnv), 8);
  write_file_atomic(dir / "v1.ckpt", v1);
  const Checkpoint old = read_checkpoint(dir / "v1.ckpt");
  CHECK(old.plan == ck.plan);
  CHECK(old.model_state == ck.model_state);
  CHECK(old.state.tokens == ck.state.tokens);
  CHECK(old.state.order == ck.state.order);
  CHECK(read_checkpoint_head(dir / "v1.ckpt").step == 7);
  // Each format's checksum is its own: the new one under the old magic fails, and the old one
  // damaged fails.
  write_file_atomic(dir / "v1.ckpt", "MOEPCKP1" + bytes.substr(8));
  CHECK(error_of([&] { read_checkpoint(dir / "v1.ckpt"); }).find("checksum mismatch") !=
        std::string::npos);
  v1[model + 8] ^= 0x40;
  write_file_atomic(dir / "v1.ckpt", v1);
  CHECK(error_of([&] { read_checkpoint_head(dir / "v1.ckpt"); }).find("checksum mismatch") !=
        std::string::npos);
  fs::remove(dir / "v1.ckpt");
  // The head alone (what `run` checks of every point before the first trains).
  const CheckpointHead h = read_checkpoint_head(dir / "s.ckpt");
  CHECK(h.plan == ck.plan);
  CHECK(h.step == 7);
  // Damage anywhere is found by both readers, the weights' section included.
  auto damaged = [&](const std::string& b) {
    write_file_atomic(dir / "bad.ckpt", b);
    const std::string full = error_of([&] { read_checkpoint(dir / "bad.ckpt"); });
    const std::string head_only = error_of([&] { read_checkpoint_head(dir / "bad.ckpt"); });
    CHECK(full == head_only);
    return full;
  };
  std::string bad = bytes;
  bad[model + 8] ^= 0x40;  // 'a' of the model state
  CHECK(damaged(bad).find("is corrupt (checksum mismatch)") != std::string::npos);
  bad = bytes;
  bad[bytes.size() / 2] ^= 0x40;
  CHECK(damaged(bad).find("is corrupt (checksum mismatch)") != std::string::npos);
  CHECK(damaged(bytes.substr(0, bytes.size() - 5)).find("is corrupt (truncated)") !=
        std::string::npos);
  CHECK(damaged(bytes + "xy").find("is corrupt (2 bytes past its last section)") !=
        std::string::npos);
  bad = bytes;
  bad[model] = 0x7f;  // a model section longer than the file
  CHECK(damaged(bad).find("is corrupt (truncated)") != std::string::npos);
  CHECK(damaged("MOEPCKP").find("is not a moeplan checkpoint") != std::string::npos);
  CHECK(damaged("MOEPCKP").find("remove it to restart the point") != std::string::npos);
  CHECK(damaged(std::string("MOEPCKP3") + bytes.substr(8)).find("is not a moeplan checkpoint") !=
        std::string::npos);
  // Atomic writes leave no temp files behind.
  for (const auto& e : fs::directory_iterator(dir))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
}

TEST_CASE("token fingerprints: FNV-1a over the length and the tokens, sampled when long") {
  // By hand (FNV-1a 64: offset 0xcbf29ce484222325, prime 0x100000001b3) over the bytes
  // 02 00 00 00 00 00 00 00 | 01 00 | 02 01 (length 2 as 8 little-endian bytes, then tokens 1
  // and 258 as 2 each), worked in a separate script: 9eed41127c7154c7. The empty stream hashes
  // its 8 zero length bytes alone: a8c7f832281a39c5.
  TokenStream s;
  s.tokens = {1, 258};
  CHECK(token_fingerprint(s) == "9eed41127c7154c7");
  CHECK(token_fingerprint(TokenStream{}) == "a8c7f832281a39c5");
  // Ten tokens with 4 samples read positions i·10/4 = 0, 2, 5, 7: a change elsewhere is not
  // seen (it is a check, not a proof), a change at a sampled position is.
  TokenStream t;
  for (uint16_t v = 100; v < 110; ++v) t.tokens.push_back(v);
  CHECK(token_fingerprint(t, 4) == "6bc1e862f56555c7");
  t.tokens[1] = 999;
  CHECK(token_fingerprint(t, 4) == "6bc1e862f56555c7");
  t.tokens[2] = 999;
  CHECK(token_fingerprint(t, 4) == "038fc0e5cf3eb437");
  // The same tokens memory-mapped from a shard give the same fingerprint as in memory.
  const fs::path dir = fresh_dir("fingerprint");
  std::vector<uint16_t> toks(5000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint16_t((i * 7919) % 50000);
  write_shard(dir / "a.bin", toks);
  const DataSplit mapped = load_source("shards:" + (dir / "a.bin").string(), 4001, 999, 1, 65536);
  REQUIRE(mapped.train.mapped);
  TokenStream plain;
  plain.tokens.assign(toks.begin(), toks.begin() + 4001);
  CHECK(token_fingerprint(mapped.train) == token_fingerprint(plain));
  CHECK(token_fingerprint(mapped.train, 64) == token_fingerprint(plain, 64));
  CHECK(token_fingerprint(mapped.train) != token_fingerprint(mapped.validation));
}
