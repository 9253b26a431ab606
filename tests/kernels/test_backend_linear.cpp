// The linear and activation-quantisation entries of every Backend this CPU runs against the reference table:
// the GEMMs within the reordering bound of tests/kernels/test_linear_fast.cpp (twice n * 2^-24 * Σ|terms|),
// act_quant bit for bit, the fused linears equal to act_quant + the table's own GEMM bit for bit.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/quant.h"
#include "kernels/backend.h"
#include "kernels/linear_impl.h"
#include "test_backend_util.h"
#include "test_linear_util.h"

namespace dsflash {
namespace {

using test::LinearShape;

// Ragged rows, outputs off every tile size, odd block counts.
const LinearShape kBackendShapes[] = {{1, 1, 32},  {1, 7, 64},   {2, 15, 96},  {3, 17, 160}, {5, 31, 224},
                                      {8, 33, 544}, {17, 45, 96}, {40, 16, 64}, {1, 130, 1088}, {64, 50, 544}};

TEST(Backend, TablesAreCompleteAndOrdered) {
  const std::vector<const Backend*> all = available_backends();
  ASSERT_GE(all.size(), 2u) << "the x86-64-v3 baseline offers at least AVX2 besides the reference";
  EXPECT_EQ(all.back(), &reference_backend());
  EXPECT_EQ(all.front(), &best_backend());
  EXPECT_STREQ(reference_backend().name, "reference");
  for (const Backend* b : all) {
    // Every entry set (a table is a plain struct of pointers: check each by name).
    EXPECT_TRUE(b->name && b->fp8_gemm && b->fp4_gemm && b->bf16_gemm && b->act_quant && b->linear_fp8 &&
                b->linear_fp4 && b->rmsnorm_bf16 && b->hc_mixes && b->hc_pre && b->hc_post && b->rope_rotate &&
                b->index_scores && b->index_scores_rows && b->topk_select && b->sparse_attention)
        << b->name;
    EXPECT_EQ(find_backend(b->name), b) << b->name;
  }
  EXPECT_EQ(find_backend("no-such-table"), nullptr);
  // "amx" only by name, never the default; its GEMM limit is the tile unit's.
  if (const Backend* amx = find_backend("amx")) {
    EXPECT_NE(amx, &best_backend());
    EXPECT_EQ(amx->gemm_peak, PeakOps::kAmxBf16);
  }
  // "avx512" multiplies many rows the faster way on this CPU, and its speed figures use that instruction's peak.
  if (const Backend* avx512 = find_backend("avx512")) {
    const bool fma = linear_impl::fastest_rows_multiply() == linear_impl::RowsMultiply::kFp32Fma;
    EXPECT_EQ(avx512->gemm_peak, fma ? PeakOps::kFp32Fma : PeakOps::kBf16Dot);
    EXPECT_EQ(avx512->fp4_gemm, linear_impl::avx512_kernels()->fp4_gemm);
  }
}

TEST(Backend, GemmsWithinTheReorderingBound) {
  ThreadPool pool(2);
  const Backend& ref = reference_backend();
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(21);
    for (const LinearShape& s : kBackendShapes) {
      const std::string what = std::string(b->name) + " rows " + std::to_string(s.rows) + " out " +
                               std::to_string(s.out) + " in " + std::to_string(s.in);
      auto x = test::random_fp8_acts(rng, s.rows, s.in);
      auto w8 = test::random_fp8_weight(rng, s.out, s.in);
      auto w4 = test::random_fp4_weight(rng, s.out, s.in);
      auto xf = test::random_floats(rng, int64_t{s.rows} * s.in, true);
      auto wb = test::random_bf16_weight(rng, s.out, s.in);
      const size_t n = static_cast<size_t>(s.rows * s.out);
      std::vector<float> want(n), got(n, -7.0f);
      ref.fp8_gemm(x.view(), w8.view(), want.data(), nullptr);
      b->fp8_gemm(x.view(), w8.view(), got.data(), &pool);
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.out; ++o)
          ASSERT_NEAR(got[r * s.out + o], want[r * s.out + o],
                      2 * test::fp32_sum_bound(s.in, test::exact_fp8(x.view(), w8.view(), r, o).abs_sum))
              << "fp8 " << what;
      ref.fp4_gemm(x.view(), w4.view(), want.data(), nullptr);
      b->fp4_gemm(x.view(), w4.view(), got.data(), &pool);
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.out; ++o)
          ASSERT_NEAR(got[r * s.out + o], want[r * s.out + o],
                      2 * test::fp32_sum_bound(s.in, test::exact_fp4(x.view(), w4.view(), r, o).abs_sum))
              << "fp4 " << what;
      ref.bf16_gemm(xf.data(), s.rows, wb.view(), want.data(), nullptr);
      b->bf16_gemm(xf.data(), s.rows, wb.view(), got.data(), &pool);
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.out; ++o)
          ASSERT_NEAR(got[r * s.out + o], want[r * s.out + o],
                      2 * test::fp32_sum_bound(s.in, test::exact_bf16(xf.data(), wb.view(), r, o).abs_sum))
              << "bf16 " << what;
    }
  }
}

TEST(Backend, ActQuantIsActQuantBlock32PerRow) {
  ThreadPool pool(3);
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(22);
    for (int64_t rows : {1, 2, 7, 33}) {
      for (int64_t k : {32, 96, 544}) {
        std::vector<float> x = test::random_floats(rng, rows * k, true);
        x[0] = 0.0f;  // an all-but-zero block edge
        std::vector<uint8_t> want_codes(static_cast<size_t>(rows * k)), want_scales(static_cast<size_t>(rows * k / 32));
        for (int64_t r = 0; r < rows; ++r)
          act_quant_block32(x.data() + r * k, k, want_codes.data() + r * k, want_scales.data() + r * k / 32);
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<uint8_t> codes(want_codes.size(), 0xaa), scales(want_scales.size(), 0xaa);
          b->act_quant(x.data(), rows, k, codes.data(), scales.data(), p);
          EXPECT_EQ(codes, want_codes) << b->name << " rows " << rows << " k " << k;
          EXPECT_EQ(scales, want_scales) << b->name << " rows " << rows << " k " << k;
        }
      }
    }
  }
}

// linear_fp8 / linear_fp4 = the table's act_quant, then the table's GEMM (bit for bit); and within the GEMM bound
// of the reference's fused linear.
TEST(Backend, FusedLinearsAreActQuantThenTheTablesGemm) {
  ThreadPool pool(2);
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(23);
    for (const LinearShape& s : kBackendShapes) {
      const std::string what = std::string(b->name) + " rows " + std::to_string(s.rows) + " out " +
                               std::to_string(s.out) + " in " + std::to_string(s.in);
      std::vector<float> x = test::random_floats(rng, int64_t{s.rows} * s.in, true);
      auto w8 = test::random_fp8_weight(rng, s.out, s.in);
      auto w4 = test::random_fp4_weight(rng, s.out, s.in);
      test::Fp8ActData q;
      q.rows = s.rows;
      q.k = s.in;
      q.codes.resize(static_cast<size_t>(s.rows * s.in));
      q.scales.resize(static_cast<size_t>(s.rows * s.in / 32));
      b->act_quant(x.data(), s.rows, s.in, q.codes.data(), q.scales.data(), nullptr);
      const size_t n = static_cast<size_t>(s.rows * s.out);
      std::vector<float> want(n), got(n, -7.0f), ref(n);
      b->fp8_gemm(q.view(), w8.view(), want.data(), nullptr);
      b->linear_fp8(x.data(), s.rows, w8.view(), got.data(), &pool);
      test::expect_same_bits(got, want, "linear_fp8 " + what);
      reference_backend().linear_fp8(x.data(), s.rows, w8.view(), ref.data(), nullptr);
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.out; ++o)
          ASSERT_NEAR(got[r * s.out + o], ref[r * s.out + o],
                      2 * test::fp32_sum_bound(s.in, test::exact_fp8(q.view(), w8.view(), r, o).abs_sum))
              << "linear_fp8 vs reference " << what;
      b->fp4_gemm(q.view(), w4.view(), want.data(), nullptr);
      b->linear_fp4(x.data(), s.rows, w4.view(), got.data(), &pool);
      test::expect_same_bits(got, want, "linear_fp4 " + what);
      reference_backend().linear_fp4(x.data(), s.rows, w4.view(), ref.data(), nullptr);
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.out; ++o)
          ASSERT_NEAR(got[r * s.out + o], ref[r * s.out + o],
                      2 * test::fp32_sum_bound(s.in, test::exact_fp4(q.view(), w4.view(), r, o).abs_sum))
              << "linear_fp4 vs reference " << what;
    }
  }
}

}  // namespace
}  // namespace dsflash
