// The whole forward pass on the golden prompts, compared layer by layer with the recorded intermediates
// (prefill.layers.L.{attn_in, attn_out, ffn_in, ffn_out, out}, final_hc, final_norm; decode.layers.L.out): when an
// end-to-end difference appears, this says in which layer and sublayer it starts. Uses the reference kernels,
// which reproduce all of them bit for bit.
#include <gtest/gtest.h>

#include <cstdio>

#include "io/safetensors.h"
#include "model/golden_tensors.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"

namespace dsflash {
namespace {

using testing::to_f32;
using testing::to_i64;

// First row (of `row_elems` values) where a and b differ, or -1.
int64_t first_bad_row(const std::vector<float>& a, const std::vector<float>& b, int64_t row_elems) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i) / row_elems;
  }
  return a.size() == b.size() ? -1 : 0;
}

struct LayerReport {
  int64_t first_row = -1;  // earliest row where any recorded tensor of the model differs
  std::string where;
  int64_t mismatches = 0;
  int64_t elements = 0;
};

void note(LayerReport& report, const std::string& name, const std::vector<float>& mine, const std::vector<float>& golden,
          int64_t row_elems) {
  if (golden.empty()) return;
  const int64_t row = first_bad_row(mine, golden, row_elems);
  report.mismatches += testing::count_mismatches(mine, golden);
  report.elements += static_cast<int64_t>(golden.size());
  if (row >= 0 && (report.first_row < 0 || row < report.first_row)) {
    report.first_row = row;
    report.where = name;
  }
}

void compare_prefill(const std::string& model, const std::string& scenario) {
  if (!testing::goldens_present()) GTEST_SKIP() << "goldens not found under " << testing::goldens_dir();
  auto golden = SafetensorsFile::open(testing::golden_output_path(model, scenario));
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  RunnerOptions options;
  options.reference = true;
  auto runner = ModelRunner::open(testing::golden_checkpoint_dir(model), options);
  ASSERT_TRUE(runner.ok()) << runner.status().message();
  const auto prompt64 = to_i64(golden->find("prompt_ids"));
  std::vector<int32_t> prompt(prompt64.begin(), prompt64.end());
  auto seq = (*runner)->new_sequence();
  ASSERT_TRUE(seq.ok()) << seq.status().message();
  ForwardTrace trace;
  std::vector<float> logits;
  ASSERT_TRUE((*runner)->forward(prompt, *seq, LogitsRows::kAll, &logits, &trace).ok());
  const int64_t dim = (*runner)->config().dim;
  const int hc = (*runner)->config().hc_mult;
  LayerReport report;
  for (size_t layer = 0; layer < trace.layers.size(); ++layer) {
    const auto& t = trace.layers[layer];
    const std::string l = "prefill.layers." + std::to_string(layer) + ".";
    LayerReport one;
    note(one, l + "attn_in", t.attn_in, to_f32(golden->find(l + "attn_in")), dim);
    note(one, l + "attn_out", t.attn_out, to_f32(golden->find(l + "attn_out")), dim);
    note(one, l + "ffn_in", t.ffn_in, to_f32(golden->find(l + "ffn_in")), dim);
    note(one, l + "ffn_out", t.ffn_out, to_f32(golden->find(l + "ffn_out")), dim);
    note(one, l + "out", t.out, to_f32(golden->find(l + "out")), hc * dim);
    std::printf("[%s %s] layer %zu: %lld of %lld elements differ, first row %lld (%s)\n", model.c_str(),
                scenario.c_str(), layer, static_cast<long long>(one.mismatches), static_cast<long long>(one.elements),
                static_cast<long long>(one.first_row), one.where.c_str());
    if (one.first_row >= 0 && (report.first_row < 0 || one.first_row < report.first_row)) report = one;
  }
  LayerReport fin;
  note(fin, "final_hc", trace.final_hc, to_f32(golden->find("prefill.final_hc")), dim);
  note(fin, "final_norm", trace.final_norm, to_f32(golden->find("prefill.final_norm")), dim);
  std::printf("[%s %s] final_hc/final_norm: %lld of %lld differ\n", model.c_str(), scenario.c_str(),
              static_cast<long long>(fin.mismatches), static_cast<long long>(fin.elements));
  // The reference kernels reproduce every recorded intermediate bit for bit.
  EXPECT_EQ(report.first_row, -1) << "first difference in " << report.where << " row " << report.first_row;
  EXPECT_EQ(fin.mismatches, 0);
}

// Decode steps (index_k_fix variant: each KV source's own indexer keys): every block's output streams of every
// step, teacher forced with the golden ids.
void compare_decode(const std::string& model) {
  if (!testing::goldens_present()) GTEST_SKIP() << "goldens not found under " << testing::goldens_dir();
  auto golden = SafetensorsFile::open(testing::golden_output_path(model, "rand.index_k_fix"));
  ASSERT_TRUE(golden.ok()) << golden.status().message();
  RunnerOptions options;
  options.reference = true;
  auto runner = ModelRunner::open(testing::golden_checkpoint_dir(model), options);
  ASSERT_TRUE(runner.ok()) << runner.status().message();
  const auto prompt64 = to_i64(golden->find("prompt_ids"));
  const auto generated = to_i64(golden->find("generated_ids"));
  std::vector<int32_t> prompt(prompt64.begin(), prompt64.end());
  auto seq = (*runner)->new_sequence();
  ASSERT_TRUE(seq.ok());
  std::vector<float> logits;
  ASSERT_TRUE((*runner)->forward(prompt, *seq, LogitsRows::kLast, &logits).ok());
  const int n_layers = (*runner)->config().n_layers;
  const int64_t row = (*runner)->config().hc_mult * (*runner)->config().dim;
  std::vector<std::vector<float>> golden_out(static_cast<size_t>(n_layers));
  for (int l = 0; l < n_layers; ++l) golden_out[static_cast<size_t>(l)] = to_f32(golden->find("decode.layers." + std::to_string(l) + ".out"));
  int64_t bad = 0, compared = 0;
  for (size_t t = 0; t + 1 < generated.size(); ++t) {
    ForwardTrace trace;
    ASSERT_TRUE((*runner)->forward({static_cast<int32_t>(generated[t])}, *seq, LogitsRows::kLast, &logits, &trace).ok());
    for (int l = 0; l < n_layers; ++l) {
      const auto& g = golden_out[static_cast<size_t>(l)];
      if (g.empty()) continue;
      std::vector<float> expect(g.begin() + static_cast<long>(t) * row, g.begin() + static_cast<long>(t + 1) * row);
      bad += testing::count_mismatches(trace.layers[static_cast<size_t>(l)].out, expect);
      compared += row;
    }
  }
  std::printf("[%s rand.index_k_fix decode] block outputs: %lld of %lld elements differ\n", model.c_str(),
              static_cast<long long>(bad), static_cast<long long>(compared));
  EXPECT_GT(compared, 0);
  EXPECT_EQ(bad, 0);
}

TEST(TransformerLayers, TinyARandPrefill) { compare_prefill("tiny-a", "rand"); }
TEST(TransformerLayers, TinyBRandPrefill) { compare_prefill("tiny-b", "rand"); }
TEST(TransformerLayers, TinyCRandPrefill) { compare_prefill("tiny-c", "rand"); }
TEST(TransformerLayers, TinyADecode) { compare_decode("tiny-a"); }
TEST(TransformerLayers, TinyBDecode) { compare_decode("tiny-b"); }

}  // namespace
}  // namespace dsflash
