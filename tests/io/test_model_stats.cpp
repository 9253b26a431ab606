// The figures `dsflash inspect` prints: KV bytes (spec/MODEL.md §6), parameter counts against the
// report's headline numbers, tensor totals against spec/CHECKPOINT.md and the goldens, JSON keys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/model_stats.h"
#include "io_test_util.h"

namespace dsflash {
namespace {

using ::testing::HasSubstr;
using testing::golden_checkpoint;
using testing::spec_path;

ModelConfig real_config() {
  auto c = ModelConfig::load(spec_path("config_v41_flash.json"));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? c.value() : ModelConfig{};
}

TEST(ModelStats, RealKvFiguresReproduceTheReport) {
  const KvFigures k = kv_figures(real_config());
  EXPECT_EQ(k.main_entry_bytes, 288);
  EXPECT_EQ(k.indexer_entry_bytes, 68);
  EXPECT_DOUBLE_EQ(k.global_main_bytes_per_token, 288 + 3 * 288 / 2.0);  // L20 + L2/L8/L14 at 1/2
  EXPECT_DOUBLE_EQ(k.global_indexer_bytes_per_token, 68 + 3 * 68 / 2.0);
  EXPECT_DOUBLE_EQ(k.global_kv_bytes_per_token, 890);
  EXPECT_EQ(k.window_bytes_per_row, 528);
  EXPECT_EQ(k.window_rows, 128);
  EXPECT_EQ(k.window_bytes_per_sequence, 2703360);  // 40 x 128 x 528 (spec §6)
  EXPECT_EQ(k.dspark_window_bytes_per_sequence, 3 * 128 * 528);
  EXPECT_DOUBLE_EQ(k.persistent_bytes_per_token, 890);
}

TEST(ModelStats, RealParameterCountsMatchTheReportHeadlines) {
  const ParameterCounts p = count_parameters(real_config());
  EXPECT_EQ(p.total, p.backbone + p.engram + p.dspark + p.vision);
  // Independent sums over spec/gen_tensor_list.py's list (logical elements, scales excluded).
  EXPECT_EQ(p.backbone, 551566180464);
  EXPECT_EQ(p.engram, 196928504320);
  EXPECT_EQ(p.dspark, 14225362530);
  EXPECT_EQ(p.vision, 485268480);
  EXPECT_EQ(p.total, 763205315794);
  // Report: 552B backbone, +196B Engram (2 x ~98B), 763B stored (HF docstring).
  EXPECT_NEAR(p.backbone / 1e9, 552, 1);
  EXPECT_NEAR(p.engram / 1e9, 196, 1);
  EXPECT_NEAR(p.total / 1e9, 763, 0.5);
  // Report: 8B activated per token in prefill, 16B in decode (definitions in model_stats.h).
  EXPECT_EQ(p.activated_decode, 16130590832);
  EXPECT_EQ(p.activated_prefill, 7895577912);
  EXPECT_NEAR(p.activated_decode / 1e9, 16, 0.25);
  EXPECT_NEAR(p.activated_prefill / 1e9, 8, 0.25);
  // Of which MXFP4 (routed experts: w1, w2, w3 of dim x moe_inter_dim, top-6): every layer in decode, the 20 encoder
  // layers in prefill.
  const ModelConfig c = real_config();
  const int64_t expert = 3 * c.dim * c.moe_inter_dim;
  EXPECT_EQ(p.activated_decode_fp4, int64_t{40} * 6 * expert);
  EXPECT_EQ(p.activated_prefill_fp4, int64_t{20} * 6 * expert);
}

TEST(ModelStats, RealExpectedTensorTotals) {
  const ModelStats s = compute_model_stats(real_config());
  EXPECT_EQ(s.expected.num_tensors, 96085);
  EXPECT_EQ(s.expected.num_bytes, 510286023000);
  int64_t tensors = 0, bytes = 0;
  for (const auto& d : s.expected.by_dtype) {
    tensors += d.num_tensors;
    bytes += d.num_bytes;
  }
  EXPECT_EQ(tensors, 96085);
  EXPECT_EQ(bytes, 510286023000);
  EXPECT_FALSE(s.has_checkpoint);
}

TEST(ModelStats, JsonCarriesTheAgreedKeys) {
  const ModelConfig c = real_config();
  const ModelStats s = compute_model_stats(c);
  auto j = nlohmann::json::parse(model_stats_json(c, s, true));
  EXPECT_EQ(j["global_kv_bytes_per_token"], 890);
  EXPECT_TRUE(j["global_kv_bytes_per_token"].is_number_integer());
  EXPECT_EQ(j["window_bytes_per_row"], 528);
  EXPECT_EQ(j["persistent_bytes_per_token"], 890);
  EXPECT_EQ(j["num_tensors_expected"], 96085);
  EXPECT_EQ(j["bytes_expected"], 510286023000);
  EXPECT_EQ(j["activated_params_prefill"], s.params.activated_prefill);
  EXPECT_EQ(j["activated_params_decode"], s.params.activated_decode);
  EXPECT_EQ(j["activated_params_decode_fp4"], s.params.activated_decode_fp4);
  ASSERT_EQ(j["roles"].size(), 43u);
  EXPECT_EQ(j["roles"][24]["attention"], "reindex");
  EXPECT_EQ(j["roles"][24]["index_source_layer"], 24);
  EXPECT_EQ(j["roles"][25]["kv_source_layer"], 20);
  EXPECT_EQ(j["roles"][42]["layer"], "mtp.2");
  ASSERT_EQ(j["expected_tensors"].size(), 96085u);
  EXPECT_EQ(j["expected_tensors"][0]["name"], "embed.weight");
  EXPECT_EQ(j["expected_tensors"][0]["shape"], nlohmann::json::array({129280, 5120}));
  // Without the list the figures are still there.
  auto bare = nlohmann::json::parse(model_stats_json(c, s, false));
  EXPECT_FALSE(bare.contains("expected_tensors"));
  EXPECT_EQ(bare["num_tensors_expected"], 96085);
  EXPECT_EQ(bare["global_kv_bytes_per_token"], 890);

  const std::string text = model_stats_text(c, s, false);
  EXPECT_THAT(text, HasSubstr("global total        890 B/token"));
  EXPECT_THAT(text, HasSubstr("96,085 tensors, 510,286,023,000 bytes"));
  EXPECT_THAT(text, HasSubstr("L20     1     full     L20    L20     decoder kv-source index-source candidate-source"));
}

TEST(ModelStats, GoldenCheckpointTotalsAndKv) {
  auto ckpt = Checkpoint::open(golden_checkpoint("tiny-a"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const ModelStats s = compute_model_stats(ckpt.value());
  ASSERT_TRUE(s.has_checkpoint);
  EXPECT_EQ(s.stored.num_tensors, 1028);
  EXPECT_EQ(s.stored.num_bytes, 6463260);
  EXPECT_EQ(s.expected.num_tensors, s.stored.num_tensors);
  EXPECT_EQ(s.expected.num_bytes, s.stored.num_bytes);
  ASSERT_EQ(s.stored.by_dtype.size(), s.expected.by_dtype.size());
  for (size_t i = 0; i < s.stored.by_dtype.size(); ++i) {
    EXPECT_EQ(s.stored.by_dtype[i].dtype, s.expected.by_dtype[i].dtype);
    EXPECT_EQ(s.stored.by_dtype[i].num_tensors, s.expected.by_dtype[i].num_tensors);
    EXPECT_EQ(s.stored.by_dtype[i].num_bytes, s.expected.by_dtype[i].num_bytes);
  }
  // tiny-a: head_dim 128 -> 64 + 8 = 72 B entries; index_head_dim 64 -> 32 + 2 = 34 B;
  // sources L2, L4 (ratio 2) and L6 (ratio 1): 2 x 1/2 + 1 = 2 entries per token.
  EXPECT_EQ(s.kv.main_entry_bytes, 72);
  EXPECT_EQ(s.kv.indexer_entry_bytes, 34);
  EXPECT_DOUBLE_EQ(s.kv.global_kv_bytes_per_token, 2 * (72 + 34));
  EXPECT_EQ(s.kv.window_bytes_per_row, 128 + 4);
  EXPECT_EQ(s.kv.window_bytes_per_sequence, 12 * 8 * 132);
  // Prefill activates a strict subset of decode; decode is below the total.
  EXPECT_LT(s.params.activated_prefill, s.params.activated_decode);
  EXPECT_LT(s.params.activated_decode, s.params.total);
}

}  // namespace
}  // namespace dsflash
