// The BF16 linear against the official outputs (shared/goldens, read through DSFLASH_SHARED_DIR): the
// golden logits are the official head, used in fp32 (x.float() @ head.float().T, MANIFEST.md), applied to
// the recorded final-norm rows. The reference (sequential fused multiply-adds in K order) reproduces every
// official logit bit for bit; the SIMD sets stay within the fp32 reordering bound of test_linear_fast.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "io/safetensors.h"
#include "kernels/linear.h"
#include "test_linear_util.h"

namespace dsflash {
namespace {

namespace fs = std::filesystem;

const fs::path kGoldens = fs::path(DSFLASH_SHARED_DIR) / "goldens";

// head.weight from whichever shard holds it; the file stays open while the view is used.
struct Head {
  SafetensorsFile file;
  const TensorView* weight;
};

Result<Head> open_head(const fs::path& checkpoint) {
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    if (entry.path().extension() != ".safetensors") continue;
    Result<SafetensorsFile> f = SafetensorsFile::open(entry.path().string());
    if (!f.ok()) return f.status();
    if (f->find("head.weight")) {
      Head h{std::move(f.value()), nullptr};
      h.weight = h.file.find("head.weight");
      return h;
    }
  }
  return Status::Error(checkpoint.string() + ": no shard holds head.weight");
}

void check_head_logits(const std::string& model, const std::string& scenario) {
  const fs::path dir = kGoldens / model;
  if (!fs::exists(dir)) GTEST_FAIL() << "goldens missing: " << dir;
  Result<Head> head = open_head(dir / "checkpoint");
  ASSERT_TRUE(head.ok()) << head.status().message();
  const TensorView& w = *head->weight;
  ASSERT_EQ(w.dtype, DType::kBF16);
  const int64_t vocab = w.dim(0), dim = w.dim(1);
  Result<SafetensorsFile> out = SafetensorsFile::open((dir / "outputs" / (scenario + ".safetensors")).string());
  ASSERT_TRUE(out.ok()) << out.status().message();
  const TensorView* logits = out->find("logits");
  ASSERT_NE(logits, nullptr);
  ASSERT_EQ(logits->dim(1), vocab);
  int64_t first_row = 0;
  ThreadPool pool(2);
  int64_t identical = 0, total = 0;
  for (const char* part : {"prefill.final_norm", "decode.final_norm"}) {
    const TensorView* normed = out->find(part);
    if (!normed) continue;
    ASSERT_EQ(normed->dtype, DType::kBF16);
    ASSERT_EQ(normed->dim(1), dim);
    const int64_t rows = normed->dim(0);
    std::vector<float> x(static_cast<size_t>(rows * dim));
    for (int64_t i = 0; i < rows * dim; ++i) x[i] = bf16_to_f32(normed->as<uint16_t>()[i]);
    const Bf16Weight bw{w.as<uint16_t>(), vocab, dim};
    for (const LinearKernels* k : {&reference_linear_kernels(), &best_linear_kernels()}) {
      std::vector<float> y(static_cast<size_t>(rows * vocab));
      k->bf16_gemm(x.data(), rows, bw, y.data(), &pool);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t v = 0; v < vocab; ++v) {
          const float want = logits->as<float>()[(first_row + r) * vocab + v];
          const float got = y[r * vocab + v];
          test::Exact e = test::exact_bf16(x.data(), bw, r, v);
          ASSERT_NEAR(got, want, 2 * test::fp32_sum_bound(dim, e.abs_sum))
              << model << "/" << scenario << " " << k->name << " " << part << " row " << r << " token " << v;
          if (k == &reference_linear_kernels()) {
            identical += got == want;
            ++total;
          }
        }
    }
    first_row += rows;
  }
  ASSERT_GT(total, 0);
  // The reference's sequential fused multiply-adds are torch's order here: every logit is bit-identical.
  EXPECT_EQ(identical, total) << model << "/" << scenario << ": reference logits differing from the official ones";
}

TEST(LinearGolden, HeadLogitsTinyA) { check_head_logits("tiny-a", "rand"); }
TEST(LinearGolden, HeadLogitsTinyB) { check_head_logits("tiny-b", "rand"); }
TEST(LinearGolden, HeadLogitsTinyC) { check_head_logits("tiny-c", "rand"); }

}  // namespace
}  // namespace dsflash
