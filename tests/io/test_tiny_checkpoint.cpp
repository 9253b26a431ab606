// make-tiny (src/tiny): the written directory loads through Checkpoint::open, its configs and tokenizer are the
// goldens' (tiny preset = goldens/tiny-a's shape), its weights are in the official formats with minimal scales,
// and the presets have the shapes they promise (real-kv: the released roles and 890 KV bytes per token; wide:
// the released widths).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "formats/formats.h"
#include "io/checkpoint.h"
#include "tiny/tiny_checkpoint.h"
#include "tiny/tiny_config.h"
#include "tiny/tiny_tokenizer.h"

namespace dsflash {
namespace {

namespace fs = std::filesystem;

const fs::path kShared = DSFLASH_SHARED_DIR;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("dsflash-tiny-" + std::to_string(rd()) + std::to_string(rd()));
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

tiny::TinyCheckpointOptions options_for(const std::string& preset, const fs::path& dir, uint64_t seed = 1) {
  tiny::TinyCheckpointOptions o;
  o.preset = preset;
  o.out_dir = dir.string();
  o.seed = seed;
  o.tokenizer_path = (kShared / "tokenizer" / "deepseek_v3_tokenizer.json").string();
  return o;
}

class TinyCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kShared / "tokenizer" / "deepseek_v3_tokenizer.json")) {
      GTEST_SKIP() << "shared/tokenizer not found under " << kShared;
    }
  }
};

TEST_F(TinyCheckpoint, TinyPresetLoadsValidatesAndMatchesTinyA) {
  TempDir dir;
  auto summary = tiny::write_tiny_checkpoint(options_for("tiny", dir.path()));
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_GT(summary->num_shards, 1);  // the index path is exercised

  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const auto expected = expected_tensors(ckpt->config());
  EXPECT_EQ(ckpt->all_tensors().size(), expected.size());
  EXPECT_EQ(static_cast<int64_t>(expected.size()), summary->num_tensors);
  EXPECT_EQ(ckpt->num_shards(), static_cast<size_t>(summary->num_shards));

  // Both config forms say the same thing, and it is goldens/tiny-a's config (Engram fields derived the same way:
  // compressed vocab 1744, table rows [1916, 2148]).
  auto root = ModelConfig::load((dir.path() / "config.json").string());
  auto flat = ModelConfig::load((dir.path() / "inference" / "config.json").string());
  auto golden = ModelConfig::load((kShared / "goldens" / "tiny-a" / "checkpoint" / "config.json").string());
  ASSERT_TRUE(root.ok()) << root.status().message();
  ASSERT_TRUE(flat.ok()) << flat.status().message();
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  EXPECT_TRUE(root.value() == flat.value());
  EXPECT_TRUE(root.value() == golden.value());
  EXPECT_EQ(root->engram_compressed_vocab_size, 1744);
  EXPECT_EQ(root->engram_num_embeddings, (std::vector<int64_t>{1916, 2148}));

  // The tokenizer is the goldens' restriction of the V3 tokenizer, byte for byte.
  EXPECT_EQ(read_file(dir.path() / "tokenizer.json"),
            read_file(kShared / "goldens" / "tiny-a" / "checkpoint" / "tokenizer.json"));
}

// Every quantised weight uses the smallest power-of-two scale its block allows (what a quantiser produces:
// the block's largest magnitude lands in the top binade of the format: >= 224 of e4m3's 448, >= 3 of e2m1's 6)
// and holds no NaN code.
TEST_F(TinyCheckpoint, WeightsAreInTheOfficialFormatsWithMinimalScales) {
  TempDir dir;
  auto summary = tiny::write_tiny_checkpoint(options_for("tiny", dir.path()));
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  int fp8_checked = 0, fp4_checked = 0, table_checked = 0;
  for (const TensorView* view : ckpt->all_tensors()) {
    const std::string& name = view->name;
    if (view->dtype == DType::kF8_E4M3) {
      const int64_t rows = view->dim(0), cols = view->dim(1);
      const bool table = name.find("engram.embed") != std::string::npos;
      const int64_t tile_rows = table ? 1 : 32;
      for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
        for (int64_t c0 = 0; c0 < cols; c0 += 32) {
          float amax = 0;
          for (int64_t r = r0; r < std::min(rows, r0 + tile_rows); ++r) {
            for (int64_t c = c0; c < std::min(cols, c0 + 32); ++c) {
              const uint8_t code = view->data[r * cols + c];
              ASSERT_NE(code & 0x7f, 0x7f) << name;
              amax = std::max(amax, std::fabs(e4m3_to_f32(code)));
            }
          }
          ASSERT_GE(amax, 224.0f) << name << " block " << r0 << "," << c0;
          ASSERT_LE(amax, 448.0f) << name;
        }
      }
      (table ? table_checked : fp8_checked)++;
    } else if (view->dtype == DType::kF4) {
      const int64_t rows = view->dim(0), cols = view->dim(1);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c0 = 0; c0 < cols; c0 += 32) {
          float amax = 0;
          for (int64_t c = c0; c < c0 + 32; c += 2) {
            const uint8_t byte = view->data[(r * cols + c) / 2];
            amax = std::max({amax, std::fabs(e2m1_to_f32(byte & 0xf)), std::fabs(e2m1_to_f32(byte >> 4))});
          }
          ASSERT_GE(amax, 3.0f) << name << " row " << r << " block " << c0;
        }
      }
      ++fp4_checked;
    }
  }
  EXPECT_GT(fp8_checked, 100);
  EXPECT_GT(fp4_checked, 100);
  EXPECT_EQ(table_checked, 2);
}

TEST_F(TinyCheckpoint, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir a, b, c;
  ASSERT_TRUE(tiny::write_tiny_checkpoint(options_for("tiny", a.path(), 7)).ok());
  ASSERT_TRUE(tiny::write_tiny_checkpoint(options_for("tiny", b.path(), 7)).ok());
  ASSERT_TRUE(tiny::write_tiny_checkpoint(options_for("tiny", c.path(), 8)).ok());
  const std::string shard = "model-00001-of-00004.safetensors";
  ASSERT_TRUE(fs::exists(a.path() / shard));
  EXPECT_EQ(read_file(a.path() / shard), read_file(b.path() / shard));
  EXPECT_NE(read_file(a.path() / shard), read_file(c.path() / shard));
  EXPECT_EQ(read_file(a.path() / "model.safetensors.index.json"), read_file(c.path() / "model.safetensors.index.json"));
}

TEST_F(TinyCheckpoint, RefusesANonEmptyDirectoryUnlessForced) {
  TempDir dir;
  fs::create_directories(dir.path());
  std::ofstream(dir.path() / "keep.txt") << "x";
  auto options = options_for("tiny", dir.path());
  auto refused = tiny::write_tiny_checkpoint(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not empty"), std::string::npos);
  options.overwrite = true;
  EXPECT_TRUE(tiny::write_tiny_checkpoint(options).ok());
  EXPECT_TRUE(Checkpoint::open(dir.path().string()).ok());
}

TEST_F(TinyCheckpoint, RealKvPresetHasTheReleasedRolesAndKvBytes) {
  TempDir dir;
  auto summary = tiny::write_tiny_checkpoint(options_for("real-kv", dir.path()));
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  EXPECT_DOUBLE_EQ(summary->kv_bytes_per_token, 890.0);
  auto ckpt = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();

  auto real = ModelConfig::load((kShared / "spec" / "config_v41_flash.json").string());
  ASSERT_TRUE(real.ok()) << real.status().message();
  const ModelConfig& ours = ckpt->config();
  ASSERT_EQ(ours.roles.size(), real->roles.size());
  for (size_t l = 0; l < ours.roles.size(); ++l) {
    EXPECT_TRUE(ours.roles[l] == real->roles[l]) << "layer " << l;
  }
  EXPECT_EQ(ours.compress_ratios, real->compress_ratios);
  EXPECT_EQ(ours.head_dim, real->head_dim);
  EXPECT_EQ(ours.index_head_dim, real->index_head_dim);
  EXPECT_EQ(ours.rope_head_dim, real->rope_head_dim);
  EXPECT_EQ(ours.window_size, real->window_size);
  EXPECT_EQ(ours.index_topk, real->index_topk);
  EXPECT_EQ(ours.candidate_topk_blocks, real->candidate_topk_blocks);
  EXPECT_EQ(ours.candidate_block_size, real->candidate_block_size);
  EXPECT_DOUBLE_EQ(tiny::global_kv_bytes_per_token(real.value()), 890.0);
}

TEST(TinyPresets, WideHasTheReleasedWidthsAndEveryRole) {
  auto wide = tiny::preset("wide");
  ASSERT_TRUE(wide.ok());
  auto real = ModelConfig::load((kShared / "spec" / "config_v41_flash.json").string());
  if (!real.ok()) GTEST_SKIP() << real.status().message();
  const ModelConfig& w = wide->config;
  EXPECT_EQ(w.dim, real->dim);
  EXPECT_EQ(w.n_heads, real->n_heads);
  EXPECT_EQ(w.head_dim, real->head_dim);
  EXPECT_EQ(w.q_lora_rank, real->q_lora_rank);
  EXPECT_EQ(w.o_groups, real->o_groups);
  EXPECT_EQ(w.o_lora_rank, real->o_lora_rank);
  EXPECT_EQ(w.index_n_heads, real->index_n_heads);
  EXPECT_EQ(w.index_head_dim, real->index_head_dim);
  EXPECT_EQ(w.moe_inter_dim, real->moe_inter_dim);
  EXPECT_EQ(w.engram_head_dim, real->engram_head_dim);
  EXPECT_EQ(w.engram_n_heads, real->engram_n_heads);
  std::set<std::pair<int, AttentionKind>> kinds;  // (ratio, kind) pairs present
  bool candidate_source = false, restricted = false, engram_on_kv_source = false, engram_on_window = false;
  for (const auto& role : w.roles) {
    if (role.dspark) continue;
    kinds.insert({role.compress_ratio, role.attention});
    candidate_source |= role.candidate_source;
    restricted |= role.candidate_restricted;
    engram_on_kv_source |= role.engram && role.kv_source;
    engram_on_window |= role.engram && role.attention == AttentionKind::kWindowOnly;
  }
  EXPECT_TRUE(kinds.count({0, AttentionKind::kWindowOnly}));
  EXPECT_TRUE(kinds.count({2, AttentionKind::kFull}));
  EXPECT_TRUE(kinds.count({2, AttentionKind::kReuse}));
  EXPECT_TRUE(kinds.count({1, AttentionKind::kFull}));
  EXPECT_TRUE(kinds.count({1, AttentionKind::kReindex}));
  EXPECT_TRUE(candidate_source && restricted && engram_on_kv_source && engram_on_window);
  // A balanced CED split like the released 20/20 (spec/MODEL.md §5): half the backbone is decoder, so bounded
  // replay prefill can skip about half the work; the decoder holds the ratio-1 KV source, a Reuse and a Reindex.
  EXPECT_EQ(w.n_layers, 8);
  EXPECT_EQ(w.ced_decoder_start() * 2, w.n_layers);
  EXPECT_EQ(real->ced_decoder_start() * 2, real->n_layers);
  std::set<AttentionKind> decoder_kinds;
  for (const auto& role : w.roles) {
    if (role.decoder) decoder_kinds.insert(role.attention);
  }
  EXPECT_EQ(decoder_kinds, (std::set<AttentionKind>{AttentionKind::kFull, AttentionKind::kReindex,
                                                    AttentionKind::kReuse}));
  // A few GB: the tensor bytes the config implies (Engram rows estimated from the walk's start, ~primes).
  ModelConfig sized = w;
  sized.engram_num_embeddings.assign(sized.engram_layer_ids.size(),
                                     sized.engram_vocab_size * sized.engram_n_heads * (sized.engram_max_ngram_size - 1));
  double bytes = 0;
  for (const auto& t : expected_tensors(sized)) bytes += static_cast<double>(t.num_bytes());
  EXPECT_LT(bytes, 4e9);
  EXPECT_GT(bytes, 1e9);
}

TEST(TinyTokenizer, RestrictionKeepsIdsBelowTheVocabAndTheirMerges) {
  const std::string text = R"({"added_tokens":[{"id":0,"content":"<s>"},{"id":9,"content":"<big>"}],
    "model":{"type":"BPE","vocab":{"<s>":0,"a":1,"b":2,"c":3,"ab":4,"abc":5,"bc":6},
             "merges":["a b","ab c","b c"]}})";
  auto cut = tiny::restrict_tokenizer_json(text, 5, "test");
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  auto json = nlohmann::json::parse(cut.value());
  EXPECT_EQ(json["model"]["vocab"].size(), 5u);
  EXPECT_EQ(json["model"]["merges"], nlohmann::json::array({"a b"}));
  EXPECT_EQ(json["added_tokens"].size(), 1u);
  // Covering every id returns the text unchanged; a non-BPE file is an error naming the origin.
  EXPECT_EQ(tiny::restrict_tokenizer_json(text, 10, "test").value(), text);
  auto bad = tiny::restrict_tokenizer_json(R"({"model":{}})", 5, "some.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("some.json"), std::string::npos);
}

TEST(TinyPresets, UnknownPresetIsAnError) {
  auto p = tiny::preset("huge");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("huge"), std::string::npos);
}

}  // namespace
}  // namespace dsflash
