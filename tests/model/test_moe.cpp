// MoE layer by layer against the goldens (spec/MODEL.md §4.7): from each layer's recorded ffn_in, the gate
// must choose the recorded experts with the recorded weights, and the output must reproduce ffn_out.
// The gate's fp32 product is a BLAS sum in the reference and a K-order sum here, so weights may differ in
// the last ulp; the FP8/FP4 GEMMs follow the reference's own kernels.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/golden_tensors.h"
#include "model/moe.h"

namespace dsflash {
namespace {

using testing::count_mismatches;
using testing::max_abs_diff;
using testing::to_f32;
using testing::to_i64;

void check_moe(const std::string& model, const std::string& phase, bool reference) {
  if (!testing::goldens_present()) GTEST_SKIP() << "goldens not found under " << testing::goldens_dir();
  auto checkpoint = Checkpoint::open(testing::golden_checkpoint_dir(model));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().message();
  auto golden = SafetensorsFile::open(testing::golden_output_path(model, "rand"));
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  const ModelConfig& config = checkpoint->config();
  const ComputeContext ctx = ComputeContext::for_backend(reference ? reference_backend() : best_backend());
  int64_t elements = 0, bad_out = 0, bad_experts = 0, bad_weights = 0, rows = 0;
  float worst_out = 0.0f, worst_weight = 0.0f;
  for (int layer = 0; layer < config.n_layers; ++layer) {
    const std::string l = phase + ".layers." + std::to_string(layer) + ".";
    if (golden->find(l + "ffn_in") == nullptr) GTEST_SKIP() << model << " has no " << l << "ffn_in";
    auto moe = MoeLayer::bind(*checkpoint, "layers." + std::to_string(layer) + ".ffn", layer);
    ASSERT_TRUE(moe.ok()) << moe.status().message();
    const auto x = to_f32(golden->find(l + "ffn_in"));
    const int64_t tokens = static_cast<int64_t>(x.size()) / config.dim;
    std::vector<float> out(x.size());
    MoeRouting routing;
    moe->forward(x.data(), tokens, ctx, out.data(), &routing);
    const auto golden_out = to_f32(golden->find(l + "ffn_out"));
    const auto golden_experts = to_i64(golden->find(l + "moe_experts"));
    const auto golden_weights = to_f32(golden->find(l + "moe_weights"));
    ASSERT_EQ(routing.experts.size(), golden_experts.size()) << l;
    for (size_t i = 0; i < golden_experts.size(); ++i) bad_experts += routing.experts[i] != golden_experts[i];
    bad_weights += count_mismatches(routing.weights, golden_weights);
    worst_weight = std::max(worst_weight, max_abs_diff(routing.weights, golden_weights));
    bad_out += count_mismatches(out, golden_out);
    worst_out = std::max(worst_out, max_abs_diff(out, golden_out));
    elements += static_cast<int64_t>(out.size());
    rows += tokens;
  }
  std::printf("[%s %s %s] %lld rows: expert mismatches %lld, weight mismatches %lld (max |d| %.3g), ffn_out "
              "mismatches %lld of %lld (max |d| %.3g)\n",
              model.c_str(), phase.c_str(), reference ? "reference" : "best", static_cast<long long>(rows),
              static_cast<long long>(bad_experts), static_cast<long long>(bad_weights), worst_weight,
              static_cast<long long>(bad_out), static_cast<long long>(elements), worst_out);
  EXPECT_EQ(bad_experts, 0);
  EXPECT_LT(worst_weight, 1e-5f);
  // MoE outputs are ~0.05 in magnitude (tamed branch gain); a flipped e4m3 activation moves an element by a
  // few bf16 ulps at most.
  EXPECT_LE(bad_out, elements / 200);
  EXPECT_LT(worst_out, 0.01f);
}

// The element-wise steps (SwiGLU, the sum into the output) split one token's row over the pool's threads, and up
// to a few hundred expert rows the experts run grouped (MoeLayer::run_grouped), past that one after another: any
// pool gives the bits of no pool, for one token (decode), several (prefill), and the prefill's rows repeated to
// 300 tokens (past the grouped bound whatever the top-k).
void check_pool_bits(const std::string& model, const std::string& phase, int64_t repeat_to = 0) {
  if (!testing::goldens_present()) GTEST_SKIP() << "goldens not found under " << testing::goldens_dir();
  auto checkpoint = Checkpoint::open(testing::golden_checkpoint_dir(model));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().message();
  auto golden = SafetensorsFile::open(testing::golden_output_path(model, "rand"));
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  const std::string l = phase + ".layers.0.";
  if (golden->find(l + "ffn_in") == nullptr) GTEST_SKIP() << model << " has no " << l << "ffn_in";
  auto moe = MoeLayer::bind(*checkpoint, "layers.0.ffn", 0);
  ASSERT_TRUE(moe.ok()) << moe.status().message();
  std::vector<float> x = to_f32(golden->find(l + "ffn_in"));
  const int64_t dim = checkpoint->config().dim;
  for (size_t golden_values = x.size(); static_cast<int64_t>(x.size()) < repeat_to * dim;) {
    x.push_back(x[x.size() % golden_values]);
  }
  const int64_t tokens = static_cast<int64_t>(x.size()) / dim;
  auto run = [&](ThreadPool* pool) {
    std::vector<float> out(x.size());
    moe->forward(x.data(), tokens, ComputeContext::for_backend(best_backend(), pool), out.data());
    return out;
  };
  const std::vector<float> alone = run(nullptr);
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    const std::vector<float> pooled = run(&pool);
    EXPECT_EQ(std::memcmp(pooled.data(), alone.data(), alone.size() * sizeof(float)), 0)
        << model << " " << phase << ", " << threads << " threads";
  }
}

TEST(MoeGolden, PoolGivesTheBitsOfNoPool) {
  for (const char* model : {"tiny-a", "tiny-b"}) {
    for (const char* phase : {"decode", "prefill"}) check_pool_bits(model, phase);
    check_pool_bits(model, "prefill", 300);
  }
}

TEST(MoeGolden, TinyAPrefillReference) { check_moe("tiny-a", "prefill", true); }
TEST(MoeGolden, TinyADecodeReference) { check_moe("tiny-a", "decode", true); }
TEST(MoeGolden, TinyBPrefillReference) { check_moe("tiny-b", "prefill", true); }
TEST(MoeGolden, TinyBDecodeReference) { check_moe("tiny-b", "decode", true); }
TEST(MoeGolden, TinyAPrefillBest) { check_moe("tiny-a", "prefill", false); }
TEST(MoeGolden, TinyBPrefillBest) { check_moe("tiny-b", "prefill", false); }

}  // namespace
}  // namespace dsflash
