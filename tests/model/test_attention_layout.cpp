// Attention on a synthetic model with a window and a top-k long enough that the kernel's 64-entry blocks
// matter (the goldens' lists never exceed one block): the window layout rules of AttentionLayer::forward,
// chunked prefill against one prefill, single-token steps against one prefill, the window floor, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "io/model_config.h"
#include "kernels/linear.h"
#include "model/attention.h"
#include "model/csa2.h"
#include "model/test_sequences.h"

namespace dsflash {
using testing::TestKv;
namespace {

// A model with layers: 0 window only, 1 KV source (ratio 1, index source), 2 Reuse.
ModelConfig synthetic_config() {
  ModelConfig c;
  c.vocab_size = 16;
  c.dim = 64;
  c.n_layers = 3;
  c.n_mtp_layers = 0;
  c.n_heads = 2;
  c.q_lora_rank = 32;
  c.head_dim = 64;
  c.rope_head_dim = 16;
  c.norm_eps = 1e-20;
  c.o_groups = 1;
  c.o_lora_rank = 32;
  c.window_size = 96;
  c.compress_ratios = {0, 1, 1};
  c.kv_source_layers = {1};
  c.index_source_layers = {1};
  c.compress_rope_theta = 160000.0;
  c.original_seq_len = 65536;
  c.rope_theta = 10000.0;
  c.rope_factor = 16;
  c.index_n_heads = 2;
  c.index_head_dim = 32;
  c.index_topk = 80;
  c.candidate_source_layer = -1;
  return c;
}

class SyntheticWeights {
 public:
  explicit SyntheticWeights(const ModelConfig& c) : rng_(5) {
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const std::string p = "layers." + std::to_string(layer) + ".attn.";
      fp8(p + "wq_a", c.q_lora_rank, c.dim);
      ones(p + "q_norm.weight", c.q_lora_rank);
      fp8(p + "wq_b", c.n_heads * c.head_dim, c.q_lora_rank);
      fp8(p + "wkv", c.head_dim, c.dim);
      ones(p + "kv_norm.weight", c.head_dim);
      fp8(p + "wo_a", c.o_groups * c.o_lora_rank, c.n_heads * c.head_dim / c.o_groups);
      fp8(p + "wo_b", c.dim, c.o_groups * c.o_lora_rank);
      std::vector<float> sink(static_cast<size_t>(c.n_heads));
      for (float& v : sink) v = normal_(rng_);
      add(p + "attn_sink", DType::kF32, {c.n_heads}, sink.data(), sink.size() * 4);
      if (layer == 1) {
        bf16(p + "compressor.wkv.weight", c.head_dim, c.dim, 0.15f);
        ones(p + "compressor.norm.weight", c.head_dim);
        bf16(p + "indexer.wk.weight", c.index_head_dim, c.head_dim, 0.15f);
        ones(p + "indexer.k_norm.weight", c.index_head_dim);
        fp8(p + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
        bf16(p + "indexer.weights_proj.weight", c.index_n_heads, c.dim, 0.15f);
      }
    }
  }
  AttentionLayer::TensorLookup lookup() const {
    return [this](const std::string& name) -> const TensorView* {
      auto it = views_.find(name);
      return it == views_.end() ? nullptr : &it->second;
    };
  }

 private:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes) {
    auto& buf = storage_[name];
    buf.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.data = buf.data();
    v.num_bytes = bytes;
    views_[name] = v;
  }
  void fp8(const std::string& prefix, int64_t out, int64_t in) {
    std::vector<uint8_t> codes(static_cast<size_t>(out * in));
    for (uint8_t& c : codes) c = f32_to_e4m3(normal_(rng_) * 16.0f);
    std::vector<uint8_t> scales(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32)), 127 - 6);  // 2^-6
    add(prefix + ".weight", DType::kF8_E4M3, {out, in}, codes.data(), codes.size());
    add(prefix + ".scale", DType::kF8_E8M0, {(out + 31) / 32, (in + 31) / 32}, scales.data(), scales.size());
  }
  void bf16(const std::string& name, int64_t out, int64_t in, float spread) {
    std::vector<uint16_t> w(static_cast<size_t>(out * in));
    for (uint16_t& v : w) v = f32_to_bf16(normal_(rng_) * spread);
    add(name, DType::kBF16, {out, in}, w.data(), w.size() * 2);
  }
  void ones(const std::string& name, int64_t n) {
    std::vector<uint16_t> w(static_cast<size_t>(n), f32_to_bf16(1.0f));
    add(name, DType::kBF16, {n}, w.data(), w.size() * 2);
  }
  std::mt19937 rng_;
  std::normal_distribution<float> normal_;
  std::map<std::string, std::vector<uint8_t>> storage_;
  std::map<std::string, TensorView> views_;
};

class AttentionLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = synthetic_config();
    weights_ = std::make_unique<SyntheticWeights>(config_);
    for (int layer = 0; layer < config_.n_layers; ++layer) {
      auto bound = AttentionLayer::bind(weights_->lookup(), "synthetic", config_, layer);
      ASSERT_TRUE(bound.ok()) << bound.status().message();
      layers_.push_back(std::move(bound.value()));
    }
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    inputs_.resize(static_cast<size_t>(config_.n_layers));
    for (auto& x : inputs_) {
      x.resize(static_cast<size_t>(kTokens * config_.dim));
      for (float& v : x) v = round_to_bf16(normal(rng));
    }
    ctx_ = ComputeContext::for_backend(reference_backend());
    kv_ = std::make_unique<TestKv>(config_);
  }

  // Runs all layers over rows [0, kTokens) in the given chunks; returns each layer's outputs.
  std::vector<std::vector<float>> run(const std::vector<int64_t>& chunks, int64_t window_floor = 0,
                                      kv::SequenceLease* state_out = nullptr, int64_t prefill_end = 0) {
    auto state = kv_->open();
    std::vector<std::vector<float>> outs(inputs_.size(), std::vector<float>(inputs_[0].size()));
    Csa2Shared shared;
    int64_t start = 0;
    for (int64_t n : chunks) {
      shared.reset(start, n, window_floor);
      shared.prefill_end = prefill_end;
      for (size_t layer = 0; layer < layers_.size(); ++layer) {
        const Status s = layers_[layer]->forward(&inputs_[layer][static_cast<size_t>(start * config_.dim)], n, start,
                                                 *state, shared, ctx_, &outs[layer][static_cast<size_t>(start * config_.dim)]);
        EXPECT_TRUE(s.ok()) << s.message();
      }
      start += n;
    }
    if (state_out != nullptr) *state_out = std::move(state);
    return outs;
  }

  // Rows [first, last) of every layer identical?
  int64_t differing_rows(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, int64_t first,
                         int64_t last) const {
    EXPECT_TRUE(0 <= first && first <= last && last <= kTokens) << "rows [" << first << ", " << last << ") out of range";
    last = std::min(last, kTokens);
    int64_t bad = 0;
    for (size_t layer = 0; layer < a.size(); ++layer) {
      for (int64_t r = first; r < last; ++r) {
        for (int64_t d = 0; d < config_.dim; ++d) {
          const size_t i = static_cast<size_t>(r * config_.dim + d);
          if (a[layer][i] != b[layer][i]) {
            ++bad;
            break;
          }
        }
      }
    }
    return bad;
  }

  static constexpr int64_t kTokens = 200;
  ModelConfig config_;
  std::unique_ptr<SyntheticWeights> weights_;
  std::vector<std::unique_ptr<AttentionLayer>> layers_;
  std::vector<std::vector<float>> inputs_;
  ComputeContext ctx_;
  std::unique_ptr<TestKv> kv_;  // declared last: leases in a test body go before it
};

TEST_F(AttentionLayout, ChunkedPrefillEqualsOnePrefill) {
  const auto whole = run({kTokens});
  // The first chunk reaches the window (end >= 96): every row has the one-prefill layout.
  EXPECT_EQ(differing_rows(whole, run({100, 60, 40}), 0, kTokens), 0);
  EXPECT_EQ(differing_rows(whole, run({96, 1, 1, 102}), 0, 96), 0);
  // Rows from the window on do not depend on the chunking at all.
  const auto early = run({30, 170});
  EXPECT_EQ(differing_rows(whole, early, config_.window_size - 1, kTokens), 0);
  EXPECT_GT(differing_rows(whole, early, 0, 30), 0) << "a 30-row first chunk lists 30 window entries, not 96";
  // Told the prompt's end, a short first chunk lists what one prefill lists: every row equal.
  EXPECT_EQ(differing_rows(whole, run({30, 170}, 0, nullptr, kTokens), 0, kTokens), 0);
  EXPECT_EQ(differing_rows(whole, run({5, 7, 60, 128}, 0, nullptr, kTokens), 0, kTokens), 0);
  std::vector<int64_t> ones{10};
  for (int64_t i = 10; i < kTokens; ++i) ones.push_back(1);
  EXPECT_EQ(differing_rows(whole, run(ones, 0, nullptr, kTokens), 0, kTokens), 0);
}

TEST_F(AttentionLayout, SingleTokenStepsEqualOnePrefillFromTheWindowOn) {
  std::vector<int64_t> chunks{10};
  for (int64_t i = 10; i < kTokens; ++i) chunks.push_back(1);
  const auto whole = run({kTokens});
  const auto steps = run(chunks);
  // model.py's decode layout lists the ring oldest slot first: before the ring is full the -1 entries lead
  // and move rows across the 64-entry blocks; from position window-1 on both layouts are the same list.
  EXPECT_EQ(differing_rows(whole, steps, config_.window_size - 1, kTokens), 0);
  EXPECT_GT(differing_rows(whole, steps, 10, config_.window_size - 1), 0)
      << "the decode layout was expected to change some early rows (blocks of 64)";
}

TEST_F(AttentionLayout, WindowFloorHidesRowsBelowIt) {
  const auto whole = run({kTokens});
  // floor + window - 1 < kTokens, so both ranges below are inside the 200 rows.
  const int64_t floor = 80;
  const auto floored = run({kTokens}, floor);
  // Queries whose window starts at or after the floor see no difference.
  EXPECT_EQ(differing_rows(whole, floored, floor + config_.window_size - 1, kTokens), 0);
  // Queries whose window reaches below it do.
  EXPECT_GT(differing_rows(whole, floored, floor, floor + config_.window_size - 1), 0);
  // Rows below the floor see no window row at all (only compressed rows and the sink): differ as well.
  EXPECT_GT(differing_rows(whole, floored, 0, floor), 0);
}

TEST_F(AttentionLayout, StateBytesAreTheCacheFormats) {
  kv::SequenceLease state(nullptr, nullptr);
  run({kTokens}, 0, &state);
  const CompressedKv* kv = state->compressed(1);
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->num_entries(), kTokens);
  EXPECT_EQ(CompressedKv::kv_bytes(512), 288);
  EXPECT_EQ(CompressedKv::index_key_bytes(128), 68);
  EXPECT_EQ(WindowRing::row_bytes(512), 528);
  EXPECT_EQ(state->global_kv_bytes(),
            static_cast<int64_t>(kTokens * (CompressedKv::kv_bytes(64) + CompressedKv::index_key_bytes(32))));
  for (int layer = 0; layer < 3; ++layer) {
    for (int s = 0; s < config_.window_size; ++s) {
      // ring slot s holds the latest position p with p % window == s
      const int64_t want = ((kTokens - 1 - s) / config_.window_size) * config_.window_size + s;
      EXPECT_EQ(state->window(layer).slot_position(s), want);
    }
  }
}

TEST_F(AttentionLayout, ErrorsAreValues) {
  auto state = kv_->open();
  std::vector<float> out(static_cast<size_t>(4 * config_.dim));
  Csa2Shared shared;
  shared.reset(0, 3);  // wrong token count
  Status s = layers_[0]->forward(inputs_[0].data(), 4, 0, *state, shared, ctx_, out.data());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Csa2Shared"), std::string::npos) << s.message();
  shared.reset(0, 4);
  s = layers_[2]->forward(inputs_[2].data(), 4, 0, *state, shared, ctx_, out.data());  // Reuse before its source
  EXPECT_FALSE(s.ok());
  shared.reset(8, 4);  // KV source state out of step with start_pos
  s = layers_[1]->forward(inputs_[1].data(), 4, 8, *state, shared, ctx_, out.data());
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(layers_[0]->forward_global_kv(inputs_[0].data(), 4, 0, *state, ctx_).ok());  // not a KV source
  // a missing tensor names itself
  auto bad = AttentionLayer::bind([](const std::string&) -> const TensorView* { return nullptr; }, "nowhere", config_, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layers.1.attn.wq_a.weight"), std::string::npos) << bad.status().message();
}

TEST_F(AttentionLayout, GlobalKvPathThenTailEqualsFullCaches) {
  kv::SequenceLease full(nullptr, nullptr);
  run({kTokens}, 0, &full);
  auto state = kv_->open();
  ASSERT_TRUE(layers_[1]->forward_global_kv(inputs_[1].data(), 150, 0, *state, ctx_).ok());
  Csa2Shared shared;
  shared.reset(150, 50);
  std::vector<float> out(static_cast<size_t>(50 * config_.dim));
  ASSERT_TRUE(layers_[1]->forward(&inputs_[1][static_cast<size_t>(150 * config_.dim)], 50, 150, *state, shared, ctx_, out.data()).ok());
  const CompressedKv* a = full->compressed(1);
  const CompressedKv* b = state->compressed(1);
  ASSERT_EQ(a->num_entries(), b->num_entries());
  std::vector<float> ra(64), rb(64);
  for (int64_t e = 0; e < a->num_entries(); ++e) {
    a->read_kv(e, ra.data());
    b->read_kv(e, rb.data());
    ASSERT_EQ(ra, rb) << e;
  }
}

// A replayed prefix (rows whose compressed entries are already stored, spec §7) in one call behind another
// sequence's prefill rows: the compressor projects only the rows after the stored ones, so both sequences' caches
// and the rows past the replay are those of one whole prefill.
TEST_F(AttentionLayout, ReplayBatchedBehindAnotherSequenceEqualsWholePrefills) {
  kv::SequenceLease full(nullptr, nullptr);
  const auto whole = run({kTokens}, 0, &full);
  constexpr int64_t kOther = 20, kStored = 150, kFrom = 54;  // rows >= kStored see only replayed window rows
  const int64_t dim = config_.dim, replay_rows = kTokens - kFrom;
  auto replayed = kv_->open();
  ASSERT_TRUE(layers_[1]->forward_global_kv(inputs_[1].data(), kStored, 0, *replayed, ctx_).ok());
  auto other = kv_->open();
  // x: the other sequence's rows [0, kOther), then the replay's [kFrom, kTokens).
  std::vector<float> x(inputs_[1].begin(), inputs_[1].begin() + kOther * dim);
  x.insert(x.end(), inputs_[1].begin() + kFrom * dim, inputs_[1].end());
  Csa2Shared other_shared, replay_shared;
  other_shared.reset(0, kOther);
  other_shared.prefill_end = kTokens;  // the layout of the whole prefill
  replay_shared.reset(kFrom, replay_rows);
  const AttentionSegment segments[2] = {{&*other, &other_shared, 0, kOther, nullptr},
                                        {&*replayed, &replay_shared, kFrom, replay_rows, nullptr}};
  std::vector<float> out(x.size());
  ASSERT_TRUE(layers_[1]->forward(x.data(), segments, 2, ctx_, out.data()).ok());

  const CompressedKv* reference = full->compressed(1);
  ASSERT_EQ(replayed->compressed(1)->num_entries(), kTokens);
  ASSERT_EQ(other->compressed(1)->num_entries(), kOther);
  std::vector<float> want(static_cast<size_t>(config_.head_dim)), got(want.size());
  for (int64_t e = 0; e < kTokens; ++e) {
    reference->read_kv(e, want.data());
    replayed->compressed(1)->read_kv(e, got.data());
    ASSERT_EQ(got, want) << "replayed sequence, entry " << e;
    if (e >= kOther) continue;
    other->compressed(1)->read_kv(e, got.data());
    ASSERT_EQ(got, want) << "other sequence, entry " << e;
  }
  auto same_rows = [&](int64_t out_row, int64_t whole_row, int64_t n) {
    return std::equal(out.begin() + out_row * dim, out.begin() + (out_row + n) * dim,
                      whole[1].begin() + whole_row * dim);
  };
  EXPECT_TRUE(same_rows(0, 0, kOther));
  EXPECT_TRUE(same_rows(kOther + kStored - kFrom, kStored, kTokens - kStored));
}

}  // namespace
}  // namespace dsflash
