// ModelConfig: both config forms agree, roles match spec/MODEL.md §4.5 and the goldens' MANIFEST tables,
// and every validation error names its field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "io_test_util.h"

namespace dsflash {
namespace {

using ::testing::HasSubstr;
using testing::golden_checkpoint;
using testing::load_config;
using testing::read_text;
using testing::ScratchDir;
using testing::spec_path;

TEST(ModelConfig, RealRootConfigFields) {
  ModelConfig c = load_config(spec_path("config_v41_flash.json"));
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.moe_inter_dim, 2304);
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_activated_experts, 6);
  EXPECT_DOUBLE_EQ(c.route_scale, 1.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-20);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.window_size, 128);
  EXPECT_EQ(c.compress_ratios.size(), 43u);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_DOUBLE_EQ(c.rope_factor, 16);
  EXPECT_DOUBLE_EQ(c.compress_rope_theta, 160000);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.candidate_topk_blocks, 2048);
  EXPECT_EQ(c.candidate_block_size, 8);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1, 14}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(c.engram_pad_id, 2);
  EXPECT_EQ(c.dspark_n_activated_experts, 3);
  EXPECT_EQ(c.dspark_noise_token_id, 128799);
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_EQ(c.vision_n_layers, 32);
  EXPECT_TRUE(c.vision_enabled());
  EXPECT_EQ(c.dtype, "fp8");
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.weight_block_size, 32);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.dspark_stages(), 3);
  EXPECT_EQ(c.routed_experts(39), 384);
  EXPECT_EQ(c.routed_experts(40), 128);
  EXPECT_EQ(c.activated_experts(42), 3);
}

TEST(ModelConfig, RootAndFlatFormsAreEqualOnTheRealConfig) {
  ModelConfig root = load_config(spec_path("config_v41_flash.json"));
  ModelConfig flat = load_config(spec_path("inference_config_v41_flash.json"));
  EXPECT_TRUE(root == flat);
  // A difference is detected (the comparison is not vacuous).
  flat.index_topk += 1;
  EXPECT_FALSE(root == flat);
}

class GoldenConfig : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenConfig, RootAndFlatFormsAreEqual) {
  const std::string dir = golden_checkpoint(GetParam());
  ModelConfig root = load_config(dir + "/config.json");
  ModelConfig flat = load_config(dir + "/inference/config.json");
  EXPECT_TRUE(root == flat) << GetParam();
  EXPECT_FALSE(root.vision_enabled());
  // A directory loads its root config.json.
  EXPECT_TRUE(load_config(dir) == root);
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenConfig, ::testing::Values("tiny-a", "tiny-b", "tiny-c"));

TEST(ModelConfig, DirectoryWithOnlyInferenceConfig) {
  ScratchDir dir;
  dir.write("inference/config.json", read_text(golden_checkpoint("tiny-c") + "/inference/config.json"));
  ModelConfig c = load_config(dir.path());
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.max_position_embeddings, 256);  // original_seq_len 64 x rope_factor 4
}

// The spec/MODEL.md §4.5 table on the real config.
TEST(ModelConfig, RealRolesMatchTheSpecTable) {
  ModelConfig c = load_config(spec_path("config_v41_flash.json"));
  ASSERT_EQ(c.roles.size(), 43u);
  EXPECT_EQ(c.ced_decoder_start(), 20);
  for (int l = 0; l < 43; ++l) {
    const LayerRole& r = c.roles[static_cast<size_t>(l)];
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_EQ(r.layer, l);
    EXPECT_EQ(r.dspark, l >= 40);
    EXPECT_EQ(r.decoder, l >= 20 && l < 40);
    EXPECT_EQ(r.engram, l == 1 || l == 14);
    if (l < 2 || l >= 40) {
      EXPECT_EQ(r.attention, AttentionKind::kWindowOnly);
      EXPECT_EQ(r.kv_source_layer, -1);
      EXPECT_EQ(r.index_source_layer, -1);
      EXPECT_FALSE(r.kv_source || r.index_source);
      continue;
    }
    EXPECT_EQ(r.compress_ratio, l < 20 ? 2 : 1);
    const int kv = l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
    EXPECT_EQ(r.kv_source_layer, kv);
    const int index = l < 20 ? kv : 20 + (l - 20) / 4 * 4;
    EXPECT_EQ(r.index_source_layer, index);
    const bool full = l == 2 || l == 8 || l == 14 || l == 20;
    const bool reindex = l == 24 || l == 28 || l == 32 || l == 36;
    EXPECT_EQ(r.attention, full ? AttentionKind::kFull : reindex ? AttentionKind::kReindex : AttentionKind::kReuse);
    EXPECT_EQ(r.kv_source, full);
    EXPECT_EQ(r.index_source, full || reindex);
    EXPECT_EQ(r.candidate_source, l == 20);
    EXPECT_EQ(r.candidate_restricted, reindex);
  }
}

// tiny-a's MANIFEST.md "Layers" table.
TEST(ModelConfig, TinyARolesMatchTheManifest) {
  ModelConfig c = load_config(golden_checkpoint("tiny-a"));
  ASSERT_EQ(c.roles.size(), 13u);
  const AttentionKind W = AttentionKind::kWindowOnly, F = AttentionKind::kFull, R = AttentionKind::kReuse,
                      X = AttentionKind::kReindex;
  const AttentionKind kinds[] = {W, W, F, R, F, R, F, R, X, R, X, R, W};
  const int kv[] = {-1, -1, 2, 2, 4, 4, 6, 6, 6, 6, 6, 6, -1};
  const int index[] = {-1, -1, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, -1};
  for (int l = 0; l < 13; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerRole& r = c.roles[static_cast<size_t>(l)];
    EXPECT_EQ(r.attention, kinds[l]);
    EXPECT_EQ(r.kv_source_layer, kv[l]);
    EXPECT_EQ(r.index_source_layer, index[l]);
    EXPECT_EQ(r.engram, l == 1 || l == 4);
    EXPECT_EQ(r.candidate_source, l == 6);
    EXPECT_EQ(r.decoder, l >= 6 && l < 12);
    EXPECT_EQ(r.dspark, l == 12);
  }
  // tiny-b: 11 layers, the decoder starts at its last KV source L6 (not at 11/2).
  ModelConfig b = load_config(golden_checkpoint("tiny-b"));
  EXPECT_EQ(b.ced_decoder_start(), 6);
  EXPECT_EQ(b.roles.size(), 14u);
  EXPECT_EQ(b.roles[10].attention, AttentionKind::kReindex);
  EXPECT_EQ(b.dspark_stages(), 3);
  ModelConfig tc = load_config(golden_checkpoint("tiny-c"));
  EXPECT_EQ(tc.dspark_stages(), 0);
  EXPECT_TRUE(tc.engram_layer_ids.empty());
}

// One mutation of the real flat config per validation rule; the error must name the field.
struct Mutation {
  const char* field;  // expected in the message
  std::function<void(nlohmann::json&)> apply;
};

TEST(ModelConfig, ValidationErrorsNameTheField) {
  const std::string text = read_text(spec_path("inference_config_v41_flash.json"));
  using J = nlohmann::json;
  const std::vector<Mutation> mutations = {
      {"compress_ratios", [](J& j) { j["compress_ratios"].erase(0); }},
      {"compress_ratios[41]", [](J& j) { j["compress_ratios"][41] = 2; }},
      {"compress_ratios[3]", [](J& j) { j["compress_ratios"][3] = 1; }},  // reads a ratio-2 source
      {"kv_source_layers", [](J& j) { j["kv_source_layers"] = {2, 8, 14, 40}; }},
      {"kv_source_layers", [](J& j) { j["kv_source_layers"] = {2, 14, 8, 20}; }},
      {"kv_source_layers", [](J& j) { j["kv_source_layers"] = {1, 2, 8, 14, 20}; }},  // ratio 0
      {"index_source_layers", [](J& j) { j["index_source_layers"] = {2, 8, 14, 20, 24, 28, 32, 36, 99}; }},
      {"kv_source_layers", [](J& j) { j["index_source_layers"] = {2, 8, 20, 24, 28, 32, 36}; }},
      {"candidate_source_layer", [](J& j) { j["candidate_source_layer"] = 21; }},
      {"candidate_topk_blocks", [](J& j) { j["candidate_topk_blocks"] = 0; }},
      {"dim", [](J& j) { j["dim"] = 5130; }},
      {"q_lora_rank", [](J& j) { j["q_lora_rank"] = 1290; }},
      {"moe_inter_dim", [](J& j) { j["moe_inter_dim"] = 2300; }},
      {"head_dim", [](J& j) { j["head_dim"] = 500; }},
      {"rope_head_dim", [](J& j) { j["rope_head_dim"] = 1024; }},
      {"rope_head_dim", [](J& j) { j["rope_head_dim"] = 63; }},
      {"o_groups", [](J& j) { j["o_groups"] = 7; }},
      {"n_heads", [](J& j) { j["n_heads"] = 0; }},
      {"n_activated_experts", [](J& j) { j["n_activated_experts"] = 400; }},
      {"n_shared_experts", [](J& j) { j["n_shared_experts"] = 2; }},
      {"score_func", [](J& j) { j["score_func"] = "relu"; }},
      {"index_head_dim", [](J& j) { j["index_head_dim"] = 100; }},
      {"engram_layer_ids", [](J& j) { j["engram_layer_ids"] = {1, 41}; }},
      {"engram_num_embeddings", [](J& j) { j["engram_num_embeddings"] = {384006168}; }},
      {"engram_head_dim", [](J& j) { j["engram_head_dim"] = 250; }},
      {"dspark_target_layer_ids", [](J& j) { j["dspark_target_layer_ids"] = {37, 38, 40}; }},
      {"dspark_noise_token_id", [](J& j) { j["dspark_noise_token_id"] = 200000; }},
      {"image_token_id", [](J& j) { j["image_token_id"] = 129280; }},
      {"dtype", [](J& j) { j["dtype"] = "int4"; }},
      {"expert_dtype", [](J& j) { j["expert_dtype"] = "fp8"; }},
      {"dim", [](J& j) { j["dim"] = "5120"; }},  // wrong JSON type
      {"compress_ratios", [](J& j) { j["compress_ratios"] = "0,0,2"; }},
      {"n_layers", [](J& j) { j.erase("n_layers"); }},  // required field missing
  };
  for (const Mutation& m : mutations) {
    J j = J::parse(text);
    m.apply(j);
    auto c = ModelConfig::from_json_text(j.dump(), "cfg.json");
    ASSERT_FALSE(c.ok()) << "mutation of " << m.field << " was accepted";
    EXPECT_THAT(c.status().message(), HasSubstr(m.field)) << c.status().message();
    EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
  }
  // Unmutated: valid.
  EXPECT_TRUE(ModelConfig::from_json_text(text, "cfg.json").ok());
}

TEST(ModelConfig, RootFormErrorsNameTheNestedField) {
  using J = nlohmann::json;
  const std::string text = read_text(spec_path("config_v41_flash.json"));
  J j = J::parse(text);
  j["text_config"]["hidden_size"] = -5;
  auto c = ModelConfig::from_json_text(j.dump(), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("dim"));
  EXPECT_THAT(c.status().message(), HasSubstr("text_config.hidden_size"));
  j = J::parse(text);
  j["text_config"]["num_key_value_heads"] = 8;
  c = ModelConfig::from_json_text(j.dump(), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("text_config.num_key_value_heads"));
  j = J::parse(text);
  j["quantization_config"]["weight_block_size"] = {128, 128};
  c = ModelConfig::from_json_text(j.dump(), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("weight_block_size"));
  j = J::parse(text);
  j["text_config"]["qk_rope_head_dim"] = 64.5;
  c = ModelConfig::from_json_text(j.dump(), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("text_config.qk_rope_head_dim"));
  c = ModelConfig::from_json_text("{\"text_config\": ", "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("malformed JSON"));
  c = ModelConfig::from_json_text("{\"foo\": 1}", "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("neither"));
  auto missing = ModelConfig::load("/nonexistent-dsflash-dir/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent-dsflash-dir/config.json"));
}

TEST(ModelConfig, TokenIdsAtTheRootOrInTextConfig) {
  using J = nlohmann::json;
  J j = J::parse(read_text(spec_path("config_v41_flash.json")));
  j.erase("eos_token_id");
  j["text_config"]["eos_token_id"] = 7;
  auto c = ModelConfig::from_json_text(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->eos_token_id, 7);
  j["eos_token_id"] = 9;  // the root wins
  c = ModelConfig::from_json_text(j.dump(), "config.json");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->eos_token_id, 9);
}

TEST(ModelConfig, NoQuantizationConfigMeansBf16Linears) {
  using J = nlohmann::json;
  J j = J::parse(read_text(spec_path("config_v41_flash.json")));
  j.erase("quantization_config");
  auto c = ModelConfig::from_json_text(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->dtype, "bf16");
  EXPECT_EQ(c->expert_dtype, "");
}

}  // namespace
}  // namespace dsflash
