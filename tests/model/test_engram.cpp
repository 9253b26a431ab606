// The Engram module (spec/MODEL.md §4.8) against the official outputs: prefill.layers.L.engram_out and
// decode.layers.L.engram_out = Engram(layer L) applied to the block input streams (= layers.(L-1).out).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "kernels/linear.h"
#include "model/engram.h"
#include "model/engram_hash.h"
#include "model/golden_tensors.h"
#include "tokenizer/engram_token_map.h"

namespace dsflash {
namespace {

using testing::read_i64;

std::vector<float> read_f32(const SafetensorsFile& file, const std::string& name) {
  const TensorView* t = file.find(name);
  EXPECT_NE(t, nullptr) << name << " missing in " << file.path();
  std::vector<float> out;
  if (t == nullptr) return out;
  EXPECT_EQ(t->dtype, DType::kBF16) << name;
  for (int64_t i = 0; i < t->num_elements(); ++i) out.push_back(bf16_to_f32(t->as<uint16_t>()[i]));
  return out;
}

// Every shard of a golden checkpoint directory, looked up by tensor name (no schema check).
struct Shards {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  const TensorView* find(const std::string& name) const {
    for (const auto& f : files) {
      if (const TensorView* t = f->find(name)) return t;
    }
    return nullptr;
  }
};

Shards open_shards(const std::string& dir) {
  Shards shards;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    auto file = SafetensorsFile::open(entry.path().string());
    EXPECT_TRUE(file.ok()) << file.status().message();
    if (file.ok()) shards.files.push_back(std::make_unique<SafetensorsFile>(std::move(file.value())));
  }
  return shards;
}

struct Comparison {
  int64_t elements = 0;
  int64_t exact = 0;
  float max_abs = 0;
};

Comparison compare(const std::vector<float>& got, const std::vector<float>& want) {
  Comparison c;
  c.elements = static_cast<int64_t>(want.size());
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (got[i] == want[i]) ++c.exact;
    c.max_abs = std::max(c.max_abs, std::fabs(got[i] - want[i]));
  }
  return c;
}

struct EngramModel {
  ModelConfig config;
  Shards shards;
  std::unique_ptr<NgramHasher> hasher;
};

EngramModel load_model(const std::string& name) {
  EngramModel m;
  const std::string dir = testing::golden_checkpoint_dir(name);
  auto config = ModelConfig::load(dir);
  EXPECT_TRUE(config.ok()) << config.status().message();
  if (!config.ok()) return m;
  m.config = *config;
  auto map = EngramTokenMap::from_tokenizer_json(dir + "/tokenizer.json", m.config.vocab_size);
  EXPECT_TRUE(map.ok()) << map.status().message();
  if (!map.ok()) return m;
  auto hasher = NgramHasher::create(m.config, map->ids(), map->compressed_vocab_size());
  EXPECT_TRUE(hasher.ok()) << hasher.status().message();
  if (hasher.ok()) m.hasher = std::make_unique<NgramHasher>(std::move(hasher.value()));
  m.shards = open_shards(dir);
  return m;
}

Result<Engram> bind_layer(const EngramModel& m, int layer) {
  return Engram::bind([&m](const std::string& n) { return m.shards.find(n); }, "golden checkpoint", m.config, layer,
                      m.hasher->layout());
}

struct EngramGoldenCase {
  std::string model;
  std::string scenario;
};

class EngramGolden : public ::testing::TestWithParam<EngramGoldenCase> {};

// Prefill rows in one call, decode rows one call per step; the official values must come out bit for bit.
// (The gate's sums are accumulated in double, not in torch's fp32 order; on the goldens that never shows
// through the sigmoid and the bf16 rounding of the streams.)
TEST_P(EngramGolden, MatchesOfficialEngramOut) {
  const EngramGoldenCase& c = GetParam();
  EngramModel m = load_model(c.model);
  ASSERT_NE(m.hasher, nullptr);
  auto file = SafetensorsFile::open(testing::golden_output_path(c.model, c.scenario));
  ASSERT_TRUE(file.ok()) << file.status().message();
  const int64_t row = m.config.hc_mult * m.config.dim;
  ThreadPool pool(2);
  const ComputeContext reference_ctx = ComputeContext::for_backend(reference_backend());
  const ComputeContext best_ctx = ComputeContext::for_backend(best_backend(), &pool);

  for (int layer : m.config.engram_layer_ids) {
    auto engram = bind_layer(m, layer);
    ASSERT_TRUE(engram.ok()) << engram.status().message();
    for (const std::string phase : {"prefill", "decode"}) {
      const auto hash = read_i64(*file, phase + ".engram_hash");
      const auto input = read_f32(*file, phase + ".layers." + std::to_string(layer - 1) + ".out");
      const auto want = read_f32(*file, phase + ".layers." + std::to_string(layer) + ".engram_out");
      ASSERT_FALSE(input.empty());
      ASSERT_EQ(input.size(), want.size());
      const int64_t tokens = static_cast<int64_t>(input.size()) / row;
      const int64_t hash_row = m.hasher->num_layers() * m.hasher->columns();
      ASSERT_EQ(static_cast<int64_t>(hash.size()), tokens * hash_row);

      std::vector<float> got = input;
      if (phase == "prefill") {
        ASSERT_TRUE(engram->forward(got.data(), tokens, hash.data(), reference_ctx).ok());
      } else {
        for (int64_t t = 0; t < tokens; ++t) {
          ASSERT_TRUE(engram->forward(got.data() + t * row, 1, hash.data() + t * hash_row, reference_ctx).ok());
        }
      }
      const Comparison cmp = compare(got, want);
      std::printf("[engram] %s/%s layer %d %s: %lld/%lld exact, max |diff| %.3g\n", c.model.c_str(),
                  c.scenario.c_str(), layer, phase.c_str(), static_cast<long long>(cmp.exact),
                  static_cast<long long>(cmp.elements), cmp.max_abs);
      EXPECT_EQ(cmp.exact, cmp.elements) << phase << " layer " << layer << ", max |diff| " << cmp.max_abs;
      // The Engram changed the streams (the test would notice a no-op module).
      EXPECT_LT(compare(input, want).exact, cmp.exact) << phase << " layer " << layer;

      // Fastest kernels on two threads, all rows at once: the same values as the reference path.
      std::vector<float> fast = input;
      ASSERT_TRUE(engram->forward(fast.data(), tokens, hash.data(), best_ctx).ok());
      std::vector<float> ref_all = input;
      ASSERT_TRUE(engram->forward(ref_all.data(), tokens, hash.data(), reference_ctx).ok());
      EXPECT_EQ(compare(fast, ref_all).exact, static_cast<int64_t>(ref_all.size())) << phase << " layer " << layer;
      if (phase == "decode") {
        EXPECT_EQ(compare(ref_all, got).exact, static_cast<int64_t>(got.size())) << "batched decode rows";
      }
    }
    // Prefill and decode rows in one call (85 rows for rand: more than one internal block of 64 tokens).
    std::vector<float> all_in, all_want;
    std::vector<int64_t> all_hash;
    for (const std::string phase : {"prefill", "decode"}) {
      const auto in = read_f32(*file, phase + ".layers." + std::to_string(layer - 1) + ".out");
      const auto want = read_f32(*file, phase + ".layers." + std::to_string(layer) + ".engram_out");
      const auto hash = read_i64(*file, phase + ".engram_hash");
      all_in.insert(all_in.end(), in.begin(), in.end());
      all_want.insert(all_want.end(), want.begin(), want.end());
      all_hash.insert(all_hash.end(), hash.begin(), hash.end());
    }
    const int64_t all_tokens = static_cast<int64_t>(all_in.size()) / row;
    ASSERT_TRUE(engram->forward(all_in.data(), all_tokens, all_hash.data(), best_ctx).ok());
    EXPECT_EQ(compare(all_in, all_want).exact, static_cast<int64_t>(all_want.size())) << "all rows, layer " << layer;
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, EngramGolden,
                         ::testing::Values(EngramGoldenCase{"tiny-a", "rand"}, EngramGoldenCase{"tiny-a", "short"},
                                           EngramGoldenCase{"tiny-b", "rand"}),
                         [](const auto& info) {
                           return std::string(info.param.model == "tiny-a" ? "TinyA_" : "TinyB_") +
                                  info.param.scenario;
                         });

TEST(Engram, DeadTokensPassThroughAndOutOfTableIdsReadZero) {
  EngramModel m = load_model("tiny-a");
  ASSERT_NE(m.hasher, nullptr);
  auto engram = bind_layer(m, 1);
  ASSERT_TRUE(engram.ok()) << engram.status().message();
  const int64_t row = m.config.hc_mult * m.config.dim;
  const int64_t hash_row = m.hasher->num_layers() * m.hasher->columns();
  std::vector<float> streams(static_cast<size_t>(2 * row));
  for (size_t i = 0; i < streams.size(); ++i) streams[i] = round_to_bf16(std::sin(0.37f * static_cast<float>(i)));
  std::vector<int64_t> ids(static_cast<size_t>(2 * hash_row));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 17 % 1900);
  const ComputeContext ctx = ComputeContext::for_backend(reference_backend());

  const std::vector<uint8_t> dead = {1, 0};
  std::vector<float> got = streams;
  ASSERT_TRUE(engram->forward(got.data(), 2, ids.data(), ctx, dead.data()).ok());
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + row, streams.begin())) << "dead token changed";
  EXPECT_FALSE(std::equal(got.begin() + row, got.end(), streams.begin() + row)) << "live token unchanged";

  // Ids past the table read a zero row (model.py masks them); a zero embedding gives a zero key/value,
  // so the stream is unchanged by value 0 (gate * 0).
  std::vector<int64_t> outside(static_cast<size_t>(hash_row), 1 << 30);
  std::vector<float> same = std::vector<float>(streams.begin(), streams.begin() + row);
  ASSERT_TRUE(engram->forward(same.data(), 1, outside.data(), ctx).ok());
  EXPECT_TRUE(std::equal(same.begin(), same.end(), streams.begin()));
}

TEST(Engram, BindErrorsNameTheTensor) {
  EngramModel m = load_model("tiny-a");
  ASSERT_NE(m.hasher, nullptr);
  // Layer 2 has no Engram.
  EXPECT_FALSE(bind_layer(m, 2).ok());
  // A lookup that hides one tensor, and one that reports a wrong shape.
  const auto missing = Engram::bind(
      [&m](const std::string& n) { return n == "layers.4.engram.wkv.scale" ? nullptr : m.shards.find(n); }, "x.st",
      m.config, 4, m.hasher->layout());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("layers.4.engram.wkv.scale"), std::string::npos)
      << missing.status().message();
  TensorView wrong = *m.shards.find("layers.1.engram.q_weight");
  wrong.shape = {1, wrong.shape[1] * 4};
  const auto bad_shape = Engram::bind(
      [&](const std::string& n) { return n == "layers.1.engram.q_weight" ? &wrong : m.shards.find(n); }, "x.st",
      m.config, 1, m.hasher->layout());
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_NE(bad_shape.status().message().find("q_weight has shape [1, 512]"), std::string::npos)
      << bad_shape.status().message();
}

TEST(Engram, BindsFromCheckpoint) {
  const std::string dir = testing::golden_checkpoint_dir("tiny-b");
  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().message();
  auto map = EngramTokenMap::from_tokenizer_json(dir + "/tokenizer.json", checkpoint->config().vocab_size);
  ASSERT_TRUE(map.ok());
  auto layout = EngramHashLayout::create(checkpoint->config(), map->compressed_vocab_size());
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  for (int layer : checkpoint->config().engram_layer_ids) {
    auto engram = Engram::bind(*checkpoint, layer, *layout);
    ASSERT_TRUE(engram.ok()) << engram.status().message();
    EXPECT_EQ(engram->layer(), layer);
  }
}

}  // namespace
}  // namespace dsflash
