#include "moeplan/backend/checkpoint.hpp"

#include <cstring>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/sweeps/ledger_json.hpp"

namespace moeplan::backend {

namespace {

constexpr std::string_view kMagic = "MOEPCKP1";

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void put_u64(std::string& out, uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}
void put_section(std::string& out, const void* data, size_t bytes) {
  put_u64(out, bytes);
  out.append(static_cast<const char*>(data), bytes);
}

struct Reader {
  std::string_view in;
  size_t at = 0;
  const std::string& where;
  uint64_t u64() {
    if (at + 8 > in.size()) throw InputError(fmt::format("checkpoint '{}': truncated", where));
    uint64_t v;
    std::memcpy(&v, in.data() + at, 8);
    at += 8;
    return v;
  }
  std::string_view section() {
    const uint64_t n = u64();
    if (n > in.size() - at) throw InputError(fmt::format("checkpoint '{}': truncated", where));
    std::string_view s = in.substr(at, n);
    at += n;
    return s;
  }
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
          {"loss_sum_since_log", s.loss_sum_since_log},
          {"steps_since_log", s.steps_since_log},
          {"train_seconds", s.train_seconds},
          {"eval_seconds", s.eval_seconds},
          {"resumes", s.resumes},
          {"micro_batch_seqs", s.micro_batch_seqs},
          {"device", s.device}};
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
  std::string out(kMagic);
  put_section(out, head_text.data(), head_text.size());
  put_section(out, ckpt.model_state.data(), ckpt.model_state.size());
  const auto& perm = ckpt.state.order.permutation();
  put_section(out, perm.data(), perm.size() * sizeof(int32_t));
  const auto& bits = ckpt.state.tokens.touched;
  put_section(out, bits.data(), bits.size() * sizeof(uint64_t));
  put_u64(out, fnv1a(out));
  write_file_atomic(path, out);
}

Checkpoint read_checkpoint(const std::filesystem::path& path) {
  const std::string where = path.string();
  const std::string bytes = read_file(path);
  if (bytes.size() < kMagic.size() + 8 ||
      std::string_view(bytes).substr(0, kMagic.size()) != kMagic)
    throw InputError(fmt::format("checkpoint '{}' is not a moeplan checkpoint", where));
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (stored != fnv1a(std::string_view(bytes).substr(0, bytes.size() - 8)))
    throw InputError(
        fmt::format("checkpoint '{}' is corrupt (checksum mismatch); remove it to "
                    "restart the point",
                    where));
  Reader r{std::string_view(bytes).substr(0, bytes.size() - 8), kMagic.size(), where};
  Checkpoint ck;
  try {
    const nlohmann::json head = nlohmann::json::parse(r.section());
    ck.plan = head.at("plan");
    ck.train = head.value("train", nlohmann::json());
    ck.data = head.value("data", nlohmann::json());
    const nlohmann::json& s = head.at("state");
    const std::string_view model = r.section();
    ck.model_state.assign(model.begin(), model.end());
    const std::string_view perm_bytes = r.section();
    std::vector<int32_t> perm(perm_bytes.size() / sizeof(int32_t));
    std::memcpy(perm.data(), perm_bytes.data(), perm.size() * sizeof(int32_t));
    const std::string_view bit_bytes = r.section();

    RunState& st = ck.state;
    st.step = s.at("step").get<int64_t>();
    const nlohmann::json& t = s.at("tokens");
    st.tokens = TokenLedger(t.at("seq_len").get<int64_t>(), t.at("windows_total").get<int64_t>());
    st.tokens.consumed = t.at("consumed").get<int64_t>();
    st.tokens.loss_bearing = t.at("loss_bearing").get<int64_t>();
    st.tokens.windows_consumed = t.at("windows_consumed").get<int64_t>();
    st.tokens.dropped = t.at("dropped").get<int64_t>();
    st.tokens.windows_touched = t.at("windows_touched").get<int64_t>();
    if (bit_bytes.size() != st.tokens.touched.size() * sizeof(uint64_t))
      throw InputError(fmt::format("checkpoint '{}': window bitmap has the wrong size", where));
    std::memcpy(st.tokens.touched.data(), bit_bytes.data(), bit_bytes.size());
    const nlohmann::json& o = s.at("order");
    st.order = WindowOrder(int64_t(perm.size()), o.at("seed").get<uint64_t>());
    st.order.restore(o.at("epoch").get<int64_t>(), o.at("cursor").get<int64_t>(), std::move(perm));
    st.train_flops = flop_ledger_from_json(s.at("train_flops"), where + ": train_flops");
    st.eval_flops = flop_ledger_from_json(s.at("eval_flops"), where + ": eval_flops");
    st.dropped_assignments = s.at("dropped_assignments").get<int64_t>();
    st.loss_curve = s.at("loss_curve");
    st.val_curve = s.at("val_curve");
    st.loss_sum_since_log = s.at("loss_sum_since_log").get<double>();
    st.steps_since_log = s.at("steps_since_log").get<int64_t>();
    st.train_seconds = s.at("train_seconds").get<double>();
    st.eval_seconds = s.at("eval_seconds").get<double>();
    st.resumes = s.at("resumes").get<int64_t>();
    st.micro_batch_seqs = s.value("micro_batch_seqs", int64_t(0));
    st.device = s.value("device", std::string());
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("checkpoint '{}' is unreadable: {}", where, e.what()));
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const InputError*>(&e)) throw;
    throw InputError(fmt::format("checkpoint '{}': {}", where, e.what()));
  }
  return ck;
}

}  // namespace moeplan::backend
