#include "moeplan/backend/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/sweeps/ledger_json.hpp"
#include "moeplan/sweeps/runs_folder.hpp"

// Header-only: the hash functions are compiled into this file, so no library is linked.
#define XXH_INLINE_ALL
#include <xxhash.h>
// XXH3's output is fixed from xxHash 0.8.0 on (0.7.x's differs): a checkpoint must read the same
// under any build.
static_assert(XXH_VERSION_NUMBER >= 800, "xxHash 0.8.0 or later is needed (libxxhash-dev)");

namespace moeplan::backend {

namespace fs = std::filesystem;

nlohmann::json layouts_to_json(const std::vector<Layout>& layouts) {
  nlohmann::json j = nlohmann::json::array();
  for (const Layout& l : layouts)
    j.push_back({{"from_step", l.from_step},
                 {"world_size", l.world_size},
                 {"micro_batch", l.micro_batch_seqs},
                 {"threads", l.threads},
                 {"optimizer_sharded", l.optimizer_sharded},
                 {"kernels", l.kernels}});
  return j;
}

std::vector<Layout> layouts_from_json(const nlohmann::json& j) {
  if (!j.is_array()) throw InputError("layouts: not a list");
  std::vector<Layout> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    auto field = [&](const char* key, int64_t lo) {
      if (!e.is_object() || !e.contains(key) || !e[key].is_number_integer() ||
          e[key].get<int64_t>() < lo)
        throw InputError(
            fmt::format("layouts[{}]: '{}' is not a whole number of at least {}", i, key, lo));
      return e[key].get<int64_t>();
    };
    if (!e.contains("optimizer_sharded") || !e["optimizer_sharded"].is_boolean())
      throw InputError(fmt::format("layouts[{}]: 'optimizer_sharded' is not true or false", i));
    if (!e.contains("kernels") || !e["kernels"].is_string())
      throw InputError(fmt::format("layouts[{}]: 'kernels' is not a string", i));
    out.push_back({field("from_step", 0), field("world_size", 0), field("micro_batch", 0),
                   field("threads", 0), e["optimizer_sharded"].get<bool>(),
                   e["kernels"].get<std::string>()});
  }
  return out;
}

namespace {

// The format's version is its magic. Both are read; only the newest is written.
//   MOEPCKP1: the checksum is FNV-1a, one byte at a time (about 1 GB/s: at 7B parameters, with
//             fp32 weights and Adam moments, some 100 GB and more than a minute a checkpoint).
//   MOEPCKP2: the checksum is XXH3-64 (libxxhash), tens of GB/s; the sections are unchanged.
constexpr std::string_view kMagicFnv = "MOEPCKP1";
constexpr std::string_view kMagic = "MOEPCKP2";
static_assert(kMagic.size() == kMagicFnv.size());

// The checksum over the file's bytes, fed as they are written or read.
class Checksum {
 public:
  explicit Checksum(bool fnv) : fnv_(fnv) {
    if (!fnv_ && XXH3_64bits_reset(&xxh_) != XXH_OK)
      throw std::runtime_error("XXH3_64bits_reset failed");
  }
  void add(std::string_view bytes) {
    if (fnv_) {
      for (unsigned char c : bytes) {
        fnv_h_ ^= c;
        fnv_h_ *= 0x100000001b3ull;
      }
    } else if (!bytes.empty() &&  // 0.8.0 refuses a null pointer even for no bytes
               XXH3_64bits_update(&xxh_, bytes.data(), bytes.size()) != XXH_OK) {
      throw std::runtime_error("XXH3_64bits_update failed");
    }
  }
  uint64_t value() const { return fnv_ ? fnv_h_ : uint64_t(XXH3_64bits_digest(&xxh_)); }

 private:
  bool fnv_;
  uint64_t fnv_h_ = 0xcbf29ce484222325ull;
  XXH3_state_t xxh_;
};

std::string u64_bytes(uint64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}

// Reads a checkpoint front to back, hashing every byte before the checksum: each section lands
// where it is kept (or is hashed and dropped), so reading never holds the file twice over.
class Reader {
 public:
  explicit Reader(const fs::path& path) : where_(path.string()), in_(path, std::ios::binary) {
    if (!in_) throw InputError(fmt::format("cannot read '{}': {}", where_, std::strerror(errno)));
    in_.seekg(0, std::ios::end);
    const std::streamoff size = in_.tellg();
    in_.seekg(0);
    if (size < std::streamoff(kMagic.size() + 8)) not_ours();
    left_ = uint64_t(size) - 8;  // the bytes the checksum covers
    std::string magic(kMagic.size(), '\0');
    if (!in_.read(magic.data(), std::streamsize(magic.size())))
      throw InputError(fmt::format("checkpoint '{}': read error", where_));
    if (magic != kMagic && magic != kMagicFnv) not_ours();
    hash_.emplace(magic == kMagicFnv);
    hash_->add(magic);
    left_ -= magic.size();
  }
  uint64_t u64() {
    uint64_t v;
    read(&v, 8);
    return v;
  }
  // A section's length, checked against what is left before the checksum.
  uint64_t length() {
    const uint64_t n = u64();
    if (n > left_) truncated();
    return n;
  }
  void read(void* to, uint64_t n) {
    if (n > left_) truncated();
    if (!in_.read(static_cast<char*>(to), std::streamsize(n)))
      throw InputError(fmt::format("checkpoint '{}': read error", where_));
    hash_->add(std::string_view(static_cast<const char*>(to), n));
    left_ -= n;
  }
  // A section of whole T's (the window order, the bitmap).
  template <class T>
  std::vector<T> array(const char* what) {
    const uint64_t n = length();
    if (n % sizeof(T) != 0)
      throw InputError(fmt::format("checkpoint '{}': {} has a partial entry", where_, what));
    std::vector<T> v(n / sizeof(T));
    read(v.data(), n);
    return v;
  }
  void skip(uint64_t n) {  // hashed, not kept
    std::vector<char> buf(std::min<uint64_t>(n, uint64_t(1) << 20));
    for (uint64_t done = 0; done < n; done += buf.size()) {
      const uint64_t k = std::min<uint64_t>(buf.size(), n - done);
      read(buf.data(), k);
    }
  }
  // After the last section: nothing but the checksum may follow, and it must match.
  void finish() {
    if (left_ != 0)
      throw InputError(fmt::format(
          "checkpoint '{}' is corrupt ({} bytes past its last section); remove it to restart the "
          "point",
          where_, left_));
    uint64_t stored;
    if (!in_.read(reinterpret_cast<char*>(&stored), 8))
      throw InputError(fmt::format("checkpoint '{}': read error", where_));
    if (stored != hash_->value())
      throw InputError(fmt::format(
          "checkpoint '{}' is corrupt (checksum mismatch); remove it to restart the point",
          where_));
  }
  const std::string& where() const { return where_; }

 private:
  [[noreturn]] void not_ours() const {
    throw InputError(fmt::format(
        "checkpoint '{}' is not a moeplan checkpoint (too short, or another file's first bytes); "
        "remove it to restart the point",
        where_));
  }
  [[noreturn]] void truncated() const {
    throw InputError(fmt::format(
        "checkpoint '{}' is corrupt (truncated); remove it to restart the point", where_));
  }
  std::string where_;
  std::ifstream in_;
  uint64_t left_ = 0;
  std::optional<Checksum> hash_;  // of the file's version, known once its magic is read
};

nlohmann::json state_to_json(const RunState& s) {
  const TokenLedger& t = s.tokens;
  return {{"step", s.step},
          {"tokens",
           {{"seq_len", t.seq_len},
            {"windows_total", t.windows_total},
            {"consumed", t.consumed},
            {"loss_bearing", t.loss_bearing},
            {"windows_consumed", t.windows_consumed},
            {"dropped", t.dropped},
            {"windows_touched", t.windows_touched}}},
          {"order",
           {{"seed", s.order.seed()}, {"epoch", s.order.epoch()}, {"cursor", s.order.cursor()}}},
          {"train_flops", flop_ledger_to_json(s.train_flops)},
          {"eval_flops", flop_ledger_to_json(s.eval_flops)},
          {"dropped_assignments", s.dropped_assignments},
          {"loss_curve", s.loss_curve},
          {"val_curve", s.val_curve},
          {"val_seconds", s.val_seconds},
          {"loss_sum_since_log", s.loss_sum_since_log},
          {"steps_since_log", s.steps_since_log},
          {"train_seconds", s.train_seconds},
          {"eval_seconds", s.eval_seconds},
          {"resumes", s.resumes},
          {"micro_batch_seqs", s.micro_batch_seqs},
          {"device", s.device},
          {"threads", s.threads},
          {"kernels_requested",
           s.kernels_requested ? nlohmann::json(*s.kernels_requested) : nlohmann::json()},
          {"kernels", s.kernels},
          {"world_size", s.world_size},
          {"optimizer_sharded",
           s.optimizer_sharded ? nlohmann::json(*s.optimizer_sharded) : nlohmann::json()},
          {"hardware", s.hardware},
          {"layouts", layouts_to_json(s.layouts)}};
}

}  // namespace

void write_checkpoint(const std::filesystem::path& path, const Checkpoint& ckpt) {
  nlohmann::json head = {{"format", "moeplan-checkpoint"},
                         {"schema", 1},
                         {"plan", ckpt.plan},
                         {"train", ckpt.train},
                         {"data", ckpt.data},
                         {"state", state_to_json(ckpt.state)}};
  const std::string head_text = head.dump();
  const auto& perm = ckpt.state.order.permutation();
  const auto& bits = ckpt.state.tokens.touched;
  const std::string_view sections[] = {
      head_text,
      {ckpt.model_state.data(), ckpt.model_state.size()},
      {reinterpret_cast<const char*>(perm.data()), perm.size() * sizeof(int32_t)},
      {reinterpret_cast<const char*>(bits.data()), bits.size() * sizeof(uint64_t)}};
  // The parts are written from where they lie: the model state is not copied.
  std::vector<std::string> lengths;
  lengths.reserve(std::size(sections));
  std::vector<std::string_view> parts{kMagic};
  Checksum hash(false);
  hash.add(kMagic);
  for (const std::string_view section : sections) {
    lengths.push_back(u64_bytes(section.size()));
    for (const std::string_view part : {std::string_view(lengths.back()), section}) {
      parts.push_back(part);
      hash.add(part);
    }
  }
  const std::string checksum = u64_bytes(hash.value());
  parts.push_back(checksum);
  write_file_atomic(path, std::span<const std::string_view>(parts));
}

namespace {

// The sections as read, the checksum verified; nothing parsed yet.
struct Sections {
  std::string head;
  std::vector<char> model_state;
  std::vector<int32_t> perm;
  std::vector<uint64_t> bits;
};

Sections read_sections(Reader& r, bool body) {
  Sections s;
  s.head.resize(r.length());
  r.read(s.head.data(), s.head.size());
  const uint64_t model = r.length();
  if (body) {
    s.model_state.resize(model);
    r.read(s.model_state.data(), model);
  } else {
    r.skip(model);
  }
  s.perm = r.array<int32_t>("the window order");
  s.bits = r.array<uint64_t>("the window bitmap");
  r.finish();
  return s;
}

template <class F>
auto parsed(const std::string& where, F&& f) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("checkpoint '{}' is unreadable: {}", where, json_error_text(e)));
  } catch (const InputError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw InputError(fmt::format("checkpoint '{}': {}", where, e.what()));
  }
}

}  // namespace

Checkpoint read_checkpoint(const std::filesystem::path& path) {
  Reader r(path);
  Sections sec = read_sections(r, true);
  const std::string& where = r.where();
  return parsed(where, [&] {
    const nlohmann::json head = nlohmann::json::parse(sec.head);
    Checkpoint ck;
    ck.plan = head.at("plan");
    ck.train = head.value("train", nlohmann::json());
    ck.data = head.value("data", nlohmann::json());
    const nlohmann::json& s = head.at("state");
    ck.model_state = std::move(sec.model_state);

    RunState& st = ck.state;
    st.step = s.at("step").get<int64_t>();
    const nlohmann::json& t = s.at("tokens");
    st.tokens = TokenLedger(t.at("seq_len").get<int64_t>(), t.at("windows_total").get<int64_t>());
    st.tokens.consumed = t.at("consumed").get<int64_t>();
    st.tokens.loss_bearing = t.at("loss_bearing").get<int64_t>();
    st.tokens.windows_consumed = t.at("windows_consumed").get<int64_t>();
    st.tokens.dropped = t.at("dropped").get<int64_t>();
    st.tokens.windows_touched = t.at("windows_touched").get<int64_t>();
    if (sec.bits.size() != st.tokens.touched.size())
      throw InputError(fmt::format("checkpoint '{}': window bitmap has the wrong size", where));
    st.tokens.touched = std::move(sec.bits);
    const nlohmann::json& o = s.at("order");
    st.order = WindowOrder(int64_t(sec.perm.size()), o.at("seed").get<uint64_t>());
    st.order.restore(o.at("epoch").get<int64_t>(), o.at("cursor").get<int64_t>(),
                     std::move(sec.perm));
    st.train_flops = flop_ledger_from_json(s.at("train_flops"), where + ": train_flops");
    st.eval_flops = flop_ledger_from_json(s.at("eval_flops"), where + ": eval_flops");
    st.dropped_assignments = s.at("dropped_assignments").get<int64_t>();
    st.loss_curve = s.at("loss_curve");
    st.val_curve = s.at("val_curve");
    // Checkpoints written before the evaluations' times were kept have none.
    if (const auto v = s.find("val_seconds"); v != s.end())
      st.val_seconds = v->get<std::vector<double>>();
    st.loss_sum_since_log = s.at("loss_sum_since_log").get<double>();
    st.steps_since_log = s.at("steps_since_log").get<int64_t>();
    st.train_seconds = s.at("train_seconds").get<double>();
    st.eval_seconds = s.at("eval_seconds").get<double>();
    st.resumes = s.at("resumes").get<int64_t>();
    st.micro_batch_seqs = s.value("micro_batch_seqs", int64_t(0));
    st.device = s.value("device", std::string());
    st.threads = s.value("threads", int64_t(0));
    if (const auto k = s.find("kernels_requested"); k != s.end() && k->is_string())
      st.kernels_requested = k->get<std::string>();
    st.kernels = s.value("kernels", std::string());
    st.world_size = s.value("world_size", int64_t(0));
    if (const auto o = s.find("optimizer_sharded"); o != s.end() && o->is_boolean())
      st.optimizer_sharded = o->get<bool>();
    if (const auto h = s.find("hardware"); h != s.end())
      st.hardware = h->get<std::vector<std::string>>();
    if (const auto l = s.find("layouts"); l != s.end()) try {
        st.layouts = layouts_from_json(*l);
      } catch (const InputError& e) {
        throw InputError(fmt::format("checkpoint '{}': {}", where, e.what()));
      }
    return ck;
  });
}

CheckpointHead read_checkpoint_head(const std::filesystem::path& path) {
  Reader r(path);
  const Sections sec = read_sections(r, false);
  return parsed(r.where(), [&] {
    const nlohmann::json head = nlohmann::json::parse(sec.head);
    CheckpointHead h;
    h.plan = head.at("plan");
    h.train = head.value("train", nlohmann::json());
    const nlohmann::json& s = head.at("state");
    h.step = s.at("step").get<int64_t>();
    h.micro_batch_seqs = s.value("micro_batch_seqs", int64_t(0));
    h.device = s.value("device", std::string());
    h.threads = s.value("threads", int64_t(0));
    if (const auto k = s.find("kernels_requested"); k != s.end() && k->is_string())
      h.kernels_requested = k->get<std::string>();
    if (const auto o = s.find("optimizer_sharded"); o != s.end() && o->is_boolean())
      h.optimizer_sharded = o->get<bool>();
    h.world_size = s.value("world_size", int64_t(0));
    return h;
  });
}

}  // namespace moeplan::backend
