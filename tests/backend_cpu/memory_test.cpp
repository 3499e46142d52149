// Model::memory_need against what the model really allocates: glibc's own count of the bytes
// malloc has given out (mallinfo2: in-use heap plus mmap'd blocks) before and after a model is
// built, a count the model's code has no part in.
#include <doctest/doctest.h>
#include <malloc.h>

#include <cstddef>

#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

using namespace moeplan;
using namespace moeplan::backend;

namespace {

std::size_t malloc_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Large enough that every activation buffer is its own mmap'd block and the bookkeeping beside
// them (tensor names, small vectors) is a fraction of a percent: one dense layer, one MoE layer
// with a shared expert, RoPE.
Arch measured_arch() {
  Arch a = test::tiny_moe();
  a.d_model = 64;
  a.heads = 4;
  a.kv_heads = 4;
  a.head_dim = 16;
  a.d_ffn = 96;
  a.experts = 8;
  a.top_k = 2;
  a.d_expert = 32;
  a.d_shared = 32;
  a.seq_len = 128;
  a.vocab = 256;
  return a;
}

}  // namespace

TEST_CASE("memory_need: what a cpu model allocates, as malloc counts it") {
  const Arch a = measured_arch();
  ModelOptions o;
  o.positions = "rope";
  for (const int64_t pass : {int64_t{0}, int64_t{3}}) {
    CAPTURE(pass);
    o.micro_batch_seqs = pass;
    const Model<float>::MemoryNeed need = Model<float>::memory_need(a, o, 8);
    // The state by hand: 4 fp32 scalars (weights, gradients, m, v) a parameter, the parameters
    // counted by the accounting library, not the model.
    CHECK(need.state == 16 * std::size_t(count_params(a).trainable()));
    const std::size_t before = malloc_in_use();
    std::size_t held = 0;
    {
      const Model<float> m(a, o, 7, 8);
      held = malloc_in_use() - before;
      CHECK(m.pass_seqs() == (pass > 0 ? pass : 8));
    }
    const double counted = double(need.state + need.activations);
    CAPTURE(held);
    CAPTURE(counted);
    // Everything the model allocates is in the count but its bookkeeping and malloc's page
    // rounding of each block: within 2 %, never more than it holds.
    CHECK(counted <= double(held));
    CHECK(counted >= 0.98 * double(held));
  }
  // One pass's activations: smaller passes hold fewer.
  o.micro_batch_seqs = 2;
  const auto two = Model<float>::memory_need(a, o, 8);
  o.micro_batch_seqs = 4;
  const auto four = Model<float>::memory_need(a, o, 8);
  CHECK(two.state == four.state);
  CHECK(two.activations < four.activations);
}
