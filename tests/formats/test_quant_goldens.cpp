// Real data: the goldens' caches hold values the official code fake-quantised (MANIFEST.md "Tensor names"):
//   *.window_kv   FP8 e4m3, ue8m0 per 32           -> fake_quant_act_block32
//   *.compress_kv FP4 e2m1, e4m3 scale per 16      -> fake_quant_fp4_e4m3_block16
//   *.index_k     FP4 e2m1, ue8m0 per 32 (MXFP4)   -> fake_quant_fp4_ue8m0_block32
// Quantising them again with our fake quantiser must return them bit for bit. A minimal safetensors header read
// keeps this test independent of src/io.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "formats/quant.h"
#include "io/model_config.h"
#include "model/rope.h"

namespace dsflash {
namespace {

namespace fs = std::filesystem;

struct Bf16Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Every BF16 tensor of a safetensors file whose name ends with `suffix`.
std::vector<Bf16Tensor> read_bf16_tensors(const fs::path& path, const std::string& suffix) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const auto json = nlohmann::json::parse(header);
  std::vector<Bf16Tensor> out;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__" || name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    EXPECT_EQ(entry.at("dtype").get<std::string>(), "BF16") << name;
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    std::vector<uint16_t> raw((offsets[1] - offsets[0]) / 2);
    in.seekg(static_cast<std::streamoff>(8 + header_len + offsets[0]));
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size() * 2));
    Bf16Tensor tensor{name, entry.at("shape").get<std::vector<int64_t>>(), {}};
    tensor.values.reserve(raw.size());
    for (uint16_t bits : raw) tensor.values.push_back(bf16_to_f32(bits));
    out.push_back(std::move(tensor));
  }
  return out;
}

std::vector<fs::path> golden_outputs() {
  std::vector<fs::path> files;
  const fs::path root = fs::path(DSFLASH_SHARED_DIR) / "goldens";
  if (!fs::exists(root)) return files;
  for (const auto& config : fs::directory_iterator(root)) {
    const fs::path outputs = config.path() / "outputs";
    if (!fs::is_directory(outputs)) continue;
    for (const auto& file : fs::directory_iterator(outputs)) {
      if (file.path().extension() == ".safetensors") files.push_back(file.path());
    }
  }
  return files;
}

// Applies `fake` row by row and counts the elements that changed; returns the number of rows checked.
int64_t check_idempotent(const std::string& suffix, const std::function<void(float*, int64_t)>& fake) {
  int64_t rows_checked = 0;
  int64_t nonzero_rows = 0;
  int64_t mismatches = 0;
  for (const auto& file : golden_outputs()) {
    for (const auto& tensor : read_bf16_tensors(file, suffix)) {
      EXPECT_EQ(tensor.shape.size(), 2u) << tensor.name;
      const int64_t width = tensor.shape.back();
      const int64_t rows = static_cast<int64_t>(tensor.values.size()) / width;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> row(tensor.values.begin() + r * width, tensor.values.begin() + (r + 1) * width);
        const std::vector<float> before = row;
        fake(row.data(), width);
        bool nonzero = false;
        for (int64_t i = 0; i < width; ++i) {
          nonzero |= before[i] != 0.0f;
          if (std::memcmp(&row[i], &before[i], 4) != 0 && ++mismatches <= 5) {
            ADD_FAILURE() << file << " " << tensor.name << " row " << r << " col " << i << ": " << before[i]
                          << " -> " << row[i];
          }
        }
        nonzero_rows += nonzero;
        ++rows_checked;
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << suffix;
  EXPECT_GT(nonzero_rows, 0) << "no non-zero rows found for " << suffix;
  return rows_checked;
}

class GoldenCaches : public ::testing::Test {
 protected:
  void SetUp() override {
    if (golden_outputs().empty()) GTEST_SKIP() << "goldens not found under " << DSFLASH_SHARED_DIR;
  }
};

TEST_F(GoldenCaches, WindowKvIsFp8FakeQuantised) {
  EXPECT_GT(check_idempotent(".window_kv", fake_quant_act_block32), 500);
}

TEST_F(GoldenCaches, CompressKvIsFp4E4m3Block16FakeQuantised) {
  EXPECT_GT(check_idempotent(".compress_kv", fake_quant_fp4_e4m3_block16), 500);
}

TEST_F(GoldenCaches, IndexKIsMxfp4FakeQuantised) {
  EXPECT_GT(check_idempotent(".index_k", fake_quant_fp4_ue8m0_block32), 500);
}

// The check above must be able to fail: the caches are NOT invariant under the other formats' quantisers.
TEST_F(GoldenCaches, OtherFormatsWouldChangeThem) {
  int64_t changed = 0;
  for (const auto& file : golden_outputs()) {
    for (const auto& tensor : read_bf16_tensors(file, ".window_kv")) {
      std::vector<float> values = tensor.values;
      fake_quant_fp4_ue8m0_block32(values.data(), static_cast<int64_t>(values.size()));
      for (size_t i = 0; i < values.size(); ++i) changed += values[i] != tensor.values[i];
    }
  }
  EXPECT_GT(changed, 0);
}

// A stronger real-data check of the FP4 e4m3-block-16 quantiser (scale rounding, true division, e2m1 ties): the
// goldens record the compressor's latents before RoPE and FP4 (prefill + decode) and the compressed KV cache
// after both. RoPE (src/model/rope.h) at position j * ratio, then our fake quantiser, must give every cache row
// bit for bit.
TEST_F(GoldenCaches, CompressKvIsTheRopedLatentThroughOurFp4Quantiser) {
  int64_t rows_checked = 0, mismatches = 0;
  const fs::path root = fs::path(DSFLASH_SHARED_DIR) / "goldens";
  for (const char* name : {"tiny-a", "tiny-b", "tiny-c"}) {
    const fs::path outputs = root / name / "outputs" / "rand.safetensors";
    if (!fs::exists(outputs)) continue;
    auto config = ModelConfig::load((root / name / "checkpoint").string());
    ASSERT_TRUE(config.ok()) << config.status().message();
    std::map<std::string, Bf16Tensor> latents, caches;
    for (auto& t : read_bf16_tensors(outputs, ".compressor_latent")) latents[t.name] = std::move(t);
    for (auto& t : read_bf16_tensors(outputs, ".compress_kv")) caches[t.name] = std::move(t);
    for (int layer : config->kv_source_layers) {
      const std::string l = "layers." + std::to_string(layer);
      const auto prefill = latents.find("prefill." + l + ".compressor_latent");
      const auto decode = latents.find("decode." + l + ".compressor_latent");
      const auto cache = caches.find("cache_final." + l + ".compress_kv");
      ASSERT_TRUE(prefill != latents.end() && decode != latents.end() && cache != caches.end()) << name << " " << l;
      std::vector<float> all = prefill->second.values;
      all.insert(all.end(), decode->second.values.begin(), decode->second.values.end());
      const int64_t width = config->head_dim;
      const int64_t rows = static_cast<int64_t>(all.size()) / width;
      ASSERT_EQ(static_cast<int64_t>(cache->second.values.size()), rows * width) << name << " " << l;
      const Rope rope = Rope::for_layer(config.value(), layer);
      const int ratio = config->compress_ratio(layer);
      for (int64_t j = 0; j < rows; ++j) {
        std::vector<float> row(all.begin() + j * width, all.begin() + (j + 1) * width);
        rope.rotate(row.data() + width - config->rope_head_dim, j * ratio);
        fake_quant_fp4_e4m3_block16(row.data(), width);
        for (int64_t i = 0; i < width; ++i) {
          const float expected = cache->second.values[static_cast<size_t>(j * width + i)];
          if (std::memcmp(&row[i], &expected, 4) != 0 && ++mismatches <= 5) {
            ADD_FAILURE() << name << " " << l << " row " << j << " col " << i << ": " << row[i] << " vs " << expected;
          }
        }
        ++rows_checked;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(rows_checked, 300);
}

}  // namespace
}  // namespace dsflash
