// The whole forward pass on the golden prompts, compared layer by layer with the recorded intermediates
// (prefill.layers.L.{attn_in, attn_out, ffn_in, ffn_out, out, pre_mix}, final_hc, final_norm): when an end-to-end
// difference appears, this says in which layer and sublayer it starts. Uses the reference kernels.
#include <gtest/gtest.h>

#include <cstdio>

#include "io/safetensors.h"
#include "model/golden_tensors.h"
#include "model/model_runner.h"

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
  note(fin, "final_norm", trace.final_norm, to_f32(golden->find("prefill.final_norm")), dim);
  std::printf("[%s %s] final_norm: %lld of %lld differ\n", model.c_str(), scenario.c_str(),
              static_cast<long long>(fin.mismatches), static_cast<long long>(fin.elements));
}

TEST(TransformerLayers, TinyARandPrefill) { compare_prefill("tiny-a", "rand"); }
TEST(TransformerLayers, TinyBRandPrefill) { compare_prefill("tiny-b", "rand"); }

}  // namespace
}  // namespace dsflash
