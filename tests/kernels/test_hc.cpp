// mHC and RMSNorm against the goldens, layer by layer (spec/MODEL.md §4.2): from each block's recorded input
// streams and the recorded sublayer outputs, recompute attn_in, ffn_in, the block output streams and the
// FFN-site pre_mix. The statistics use the reference's cascade sum (kernels/reduce.h), the fn product a plain
// K-order sum (what the reference's BLAS did: this reproduces every bf16 output bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "kernels/hc.h"
#include "kernels/rmsnorm.h"
#include "model/golden_tensors.h"

namespace dsflash {
namespace {

using testing::count_mismatches;
using testing::max_abs_diff;
using testing::to_f32;

struct SiteResult {
  std::vector<float> pre, post, comb;
};

// All shards of a golden checkpoint, searched by tensor name.
struct Shards {
  std::vector<SafetensorsFile> files;
  const TensorView* find(const std::string& name) const {
    for (const auto& f : files)
      if (const TensorView* t = f.find(name)) return t;
    return nullptr;
  }
};

SiteResult mixes(const std::vector<float>& streams, int64_t tokens, const Shards& weights,
                 const std::string& prefix, const HcShape& shape) {
  // hc_*_scale is stored BF16 in the goldens (F32 in the spec's schema); the reference uses it in fp32.
  static thread_local std::vector<float> scale;
  scale = to_f32(weights.find(prefix + "_scale"));
  HcSiteWeights site{weights.find(prefix + "_fn")->as<float>(), weights.find(prefix + "_base")->as<float>(),
                     scale.data()};
  SiteResult r;
  r.pre.resize(static_cast<size_t>(tokens * shape.hc));
  r.post.resize(static_cast<size_t>(tokens * shape.hc));
  r.comb.resize(static_cast<size_t>(tokens * shape.hc * shape.hc));
  hc_mixes(streams.data(), tokens, site, shape, r.pre.data(), r.post.data(), r.comb.data());
  return r;
}

std::vector<float> collapse_and_norm(const std::vector<float>& streams, int64_t tokens, const HcShape& shape,
                                     const float* pre, const uint16_t* norm_weight) {
  std::vector<float> x(static_cast<size_t>(tokens * shape.dim));
  hc_pre(streams.data(), tokens, shape.hc, shape.dim, pre, x.data());
  rmsnorm_bf16(x.data(), tokens, shape.dim, norm_weight, shape.norm_eps, x.data());
  return x;
}

void check_model(const std::string& model) {
  if (!testing::goldens_present()) GTEST_SKIP() << "goldens not found under " << testing::goldens_dir();
  auto config = ModelConfig::load(testing::golden_checkpoint_dir(model));
  ASSERT_TRUE(config.ok()) << config.status().message();
  Shards shards;
  for (const auto& entry : std::filesystem::directory_iterator(testing::golden_checkpoint_dir(model))) {
    if (entry.path().extension() != ".safetensors") continue;
    auto file = SafetensorsFile::open(entry.path().string());
    ASSERT_TRUE(file.ok()) << file.status().message();
    shards.files.push_back(std::move(*file));
  }
  const Shards* weights = &shards;
  auto golden = SafetensorsFile::open(testing::golden_output_path(model, "rand"));
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  HcShape shape;
  shape.hc = config->hc_mult;
  shape.dim = config->dim;
  shape.sinkhorn_iters = config->hc_sinkhorn_iters;
  shape.hc_eps = static_cast<float>(config->hc_eps);
  shape.norm_eps = static_cast<float>(config->norm_eps);
  if (golden->find("prefill.layers.0.attn_out") == nullptr) GTEST_SKIP() << model << " rand has no sublayer outputs";
  const int64_t tokens = golden->find("prompt_ids")->dim(0);
  const int64_t hc_elems = tokens * shape.hc * shape.dim;

  int64_t total = 0, bad_attn_in = 0, bad_ffn_in = 0, bad_out = 0, bad_pre = 0;
  float worst_pre = 0.0f;
  for (int layer = 0; layer < config->n_layers; ++layer) {
    const std::string l = "prefill.layers." + std::to_string(layer) + ".";
    std::vector<float> input;
    if (golden->find(l + "engram_out") != nullptr) {
      input = to_f32(golden->find(l + "engram_out"));
    } else if (layer == 0) {
      const auto embed = to_f32(golden->find("prefill.embed"));
      input.resize(static_cast<size_t>(hc_elems));
      for (int64_t t = 0; t < tokens; ++t)
        for (int j = 0; j < shape.hc; ++j)
          for (int64_t i = 0; i < shape.dim; ++i)
            input[static_cast<size_t>((t * shape.hc + j) * shape.dim + i)] =
                embed[static_cast<size_t>(t * shape.dim + i)];
    } else {
      input = to_f32(golden->find("prefill.layers." + std::to_string(layer - 1) + ".out"));
    }
    ASSERT_EQ(static_cast<int64_t>(input.size()), hc_elems) << l;
    std::vector<float> prev_pre(static_cast<size_t>(tokens * shape.hc), 0.0f);
    if (layer == 0) {
      for (int64_t t = 0; t < tokens; ++t) prev_pre[static_cast<size_t>(t * shape.hc)] = 1.0f;
    } else {
      prev_pre = to_f32(golden->find("prefill.layers." + std::to_string(layer - 1) + ".pre_mix"));
    }
    const std::string w = "layers." + std::to_string(layer) + ".";
    const auto attn_in = collapse_and_norm(input, tokens, shape, prev_pre.data(),
                                           weights->find(w + "attn_norm.weight")->as<uint16_t>());
    bad_attn_in += count_mismatches(attn_in, to_f32(golden->find(l + "attn_in")));

    const auto a = mixes(input, tokens, *weights, w + "hc_attn", shape);
    const auto attn_out = to_f32(golden->find(l + "attn_out"));
    std::vector<float> mid(static_cast<size_t>(hc_elems));
    hc_post(attn_out.data(), input.data(), tokens, shape.hc, shape.dim, a.post.data(), a.comb.data(), mid.data());
    const auto f = mixes(mid, tokens, *weights, w + "hc_ffn", shape);
    const auto ffn_in = collapse_and_norm(mid, tokens, shape, a.pre.data(),
                                          weights->find(w + "ffn_norm.weight")->as<uint16_t>());
    bad_ffn_in += count_mismatches(ffn_in, to_f32(golden->find(l + "ffn_in")));
    const auto ffn_out = to_f32(golden->find(l + "ffn_out"));
    std::vector<float> out(static_cast<size_t>(hc_elems));
    hc_post(ffn_out.data(), mid.data(), tokens, shape.hc, shape.dim, f.post.data(), f.comb.data(), out.data());
    const auto golden_out = to_f32(golden->find(l + "out"));
    bad_out += count_mismatches(out, golden_out);
    const auto golden_pre = to_f32(golden->find(l + "pre_mix"));
    bad_pre += count_mismatches(f.pre, golden_pre);
    worst_pre = std::max(worst_pre, max_abs_diff(f.pre, golden_pre));
    // Streams: values of magnitude ~1 in bf16; a 1-ulp flip is <= 2^-7 relative.
    EXPECT_LE(max_abs_diff(out, golden_out), 0.07f) << l;
    total += tokens * shape.dim;
  }
  std::printf("[%s] elements per site %lld: attn_in mismatches %lld, ffn_in %lld, out %lld (of x%d), pre_mix %lld "
              "(max |d| %.3g)\n",
              model.c_str(), static_cast<long long>(total), static_cast<long long>(bad_attn_in),
              static_cast<long long>(bad_ffn_in), static_cast<long long>(bad_out), shape.hc,
              static_cast<long long>(bad_pre), worst_pre);
  // With the reference's reduction order, SLEEF-style exp and no FMA contraction every bf16 output is bit exact;
  // the fp32 pre gates may differ in the last ulp in a handful of elements (exp of the reference's vector path).
  EXPECT_EQ(bad_attn_in, 0);
  EXPECT_EQ(bad_ffn_in, 0);
  EXPECT_EQ(bad_out, 0);
  EXPECT_LE(bad_pre, 16);
  EXPECT_LT(worst_pre, 2.5e-7f);
}

TEST(HcGolden, TinyA) { check_model("tiny-a"); }
TEST(HcGolden, TinyB) { check_model("tiny-b"); }

TEST(HcSinkhorn, CombIsNearlyDoublyStochastic) {
  HcShape shape;
  shape.dim = 32;
  std::vector<float> mixes(static_cast<size_t>(shape.mix_count()));
  for (size_t i = 0; i < mixes.size(); ++i) mixes[i] = std::sin(static_cast<float>(i) * 1.7f) * 3.0f;
  const float scale[3] = {0.5f, 0.7f, 1.3f};
  std::vector<float> base(mixes.size(), 0.1f);
  float pre[4], post[4], comb[16];
  hc_split_sinkhorn(mixes.data(), scale, base.data(), shape, pre, post, comb);
  for (int k = 0; k < 4; ++k) {
    float col = 0.0f, row = 0.0f;
    for (int j = 0; j < 4; ++j) {
      col += comb[j * 4 + k];
      row += comb[k * 4 + j];
    }
    EXPECT_NEAR(col, 1.0f, 1e-5f);  // ends on a column normalisation
    EXPECT_NEAR(row, 1.0f, 1e-3f);
    EXPECT_GT(pre[k], 0.0f);
    EXPECT_LT(post[k], 2.0f);
  }
}

}  // namespace
}  // namespace dsflash
