// The AVX2 table's own paths (src/kernels/linear_avx2.cpp, linear_avx2_decode.cpp) against the scalar reference,
// where their sum orders promise more than test_linear_fast.cpp's tolerances: the reference's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

#include "core/thread_pool.h"
#include "kernels/linear.h"
#include "kernels/linear_avx2_impl.h"
#include "kernels/linear_impl.h"
#include "test_linear_util.h"

namespace dsflash {
namespace {

using test::OrderedWeights;
using test::in_order;
// The pass sizes and limits of the decode kernels on tile-major weights (linear_avx2_impl.h).
using linear_impl::avx2::kFp4PassMaxRows;
using linear_impl::avx2::kFp8PassMaxRows;
using linear_impl::avx2::kFp8PassRows;

// Whether the table's FP8 and MXFP4 GEMMs give the reference's bits on x and the weights w8 / w4 (in w's order).
struct SameBits {
  bool fp8, fp4;
};
SameBits same_bits_as_reference(const LinearKernels* k, const test::Fp8ActData& x, const test::Fp8WeightData& w8,
                                const test::Fp4WeightData& w4, const OrderedWeights& w, ThreadPool* pool) {
  std::vector<float> got(static_cast<size_t>(x.rows * w8.out)), ref(got.size());
  const size_t bytes = got.size() * sizeof(float);
  k->fp8_gemm(x.view(), w.fp8(), got.data(), pool);
  reference_linear_kernels().fp8_gemm(x.view(), w8.view(), ref.data(), nullptr);
  const bool fp8 = std::memcmp(got.data(), ref.data(), bytes) == 0;
  k->fp4_gemm(x.view(), w.fp4(), got.data(), pool);
  reference_linear_kernels().fp4_gemm(x.view(), w4.view(), ref.data(), nullptr);
  return {fp8, std::memcmp(got.data(), ref.data(), bytes) == 0};
}

// The AVX2 table's many-row path sums each block down k from 0 (weights in lanes, linear_avx2.cpp), the reference's
// own order: the same bits on random codes, where the order of a block's products shows, in both weight orders. So
// do 1-4 rows on tile-major weights (the decode kernels on the load-time copy: FP8 down k, MXFP4 in exact integers or
// down k); row-major decode sums in another order.
TEST(LinearAvx2, ManyRowsGiveTheReferenceBits) {
  const LinearKernels* k = linear_impl::avx2_kernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(41);
  ThreadPool pool(2);
  for (const auto& [rows, out, in] : {std::tuple{5, 40, 544}, std::tuple{9, 17, 96}, std::tuple{16, 72, 1056},
                                      std::tuple{40, 16, 96}, std::tuple{1, 80, 1056}, std::tuple{2, 32, 544},
                                      std::tuple{3, 16, 96}, std::tuple{4, 48, 256}, std::tuple{1, 16, 1088}})
    for (const bool tiled : {false, true}) {
      if (tiled && !tile_major_possible(out, in)) continue;
      if (!tiled && rows <= 4) continue;
      const auto x = test::random_fp8_acts(rng, rows, in);
      const auto w8 = test::random_fp8_weight(rng, out, in);
      const auto w4 = test::random_fp4_weight(rng, out, in);
      const OrderedWeights w = in_order(w8, w4, tiled);
      const std::string where =
          "rows " + std::to_string(rows) + " out " + std::to_string(out) + (tiled ? " tiled" : "");
      const SameBits same = same_bits_as_reference(k, x, w8, w4, w, &pool);
      ASSERT_TRUE(same.fp8) << "fp8 " << where;
      ASSERT_TRUE(same.fp4) << "fp4 " << where;
    }
}

// The many-row path folds the scales into its operands (activations times their block scales, the weights' lanes
// times theirs) where every scale lies in [2^-50, 2^50], and keeps them apart otherwise (linear_avx2.cpp,
// scales_keep_scaled_sums_exact): the reference's bits at both ends of that range, with all e4m3 magnitudes
// (subnormal codes and 448 included), and beyond it, where folding would differ (a product times 2^-120 below
// fp32's normal range, a partial sum times 2^120 overflowing where the reference's does not, or the reverse).
TEST(LinearAvx2, FoldedScalesKeepTheReferenceBitsAtTheRangesEnds) {
  const LinearKernels* k = linear_impl::avx2_kernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(47);
  ThreadPool pool(2);
  const int64_t rows = 40, out = 48, in = 544;
  struct Scales {
    int act_lo, act_hi, w_lo, w_hi;
  };
  for (const Scales& s : {Scales{77, 77, 77, 77}, Scales{177, 177, 177, 177}, Scales{77, 177, 77, 177},
                          Scales{76, 80, 120, 125}, Scales{120, 125, 175, 178}, Scales{7, 20, 110, 120},
                          Scales{127, 127, 240, 250}, Scales{240, 250, 1, 10}})
    for (const bool tiled : {false, true}) {
      const auto x = test::random_fp8_acts(rng, rows, in, s.act_lo, s.act_hi);
      const auto w8 = test::random_fp8_weight(rng, out, in, s.w_lo, s.w_hi);
      const auto w4 = test::random_fp4_weight(rng, out, in, s.w_lo, s.w_hi);
      const OrderedWeights w = in_order(w8, w4, tiled);
      const std::string where = "act scales " + std::to_string(s.act_lo) + ".." + std::to_string(s.act_hi) +
                                ", weight scales " + std::to_string(s.w_lo) + ".." + std::to_string(s.w_hi) +
                                (tiled ? ", tiled" : "");
      const SameBits same = same_bits_as_reference(k, x, w8, w4, w, &pool);
      EXPECT_TRUE(same.fp8) << "fp8 " << where;
      EXPECT_TRUE(same.fp4) << "fp4 " << where;
    }
}

// Tile-major weights take the decode kernels for more rows than one pass holds, in passes of 4 (FP8) or 2 (MXFP4)
// rows over each pair of tiles, up to a count past which the many-row path takes them (linear_avx2_impl.h): the
// reference's bits at every count on both sides of those limits and of a pass's size, over an odd number of tiles;
// and where an FP8 code is a NaN (tile 1), NaN in its output for every row and the bits elsewhere, as the range met
// by the NaN is recomputed by the many-row path.
TEST(LinearAvx2, TileMajorPassesGiveTheReferenceBits) {
  const LinearKernels* k = linear_impl::avx2_kernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(43);
  ThreadPool pool(2);
  const int64_t out = 48, in = 544;
  for (const bool nan_code : {false, true})
    for (const int64_t rows : {kFp8PassRows + 1, kFp8PassRows + 2, kFp8PassRows + 3, kFp4PassMaxRows - 4,
                               kFp4PassMaxRows - 3, kFp4PassMaxRows, kFp4PassMaxRows + 1, kFp8PassMaxRows,
                               kFp8PassMaxRows + 1}) {
      const auto x = test::random_fp8_acts(rng, rows, in);
      auto w8 = test::random_fp8_weight(rng, out, in);
      if (nan_code) w8.codes[static_cast<size_t>(20 * in + 100)] = 0xff;  // output 20 (tile 1), k 100
      const auto w4 = test::random_fp4_weight(rng, out, in);
      const OrderedWeights w = in_order(w8, w4, true);
      std::vector<float> got(static_cast<size_t>(rows * out)), ref(got.size());
      const std::string where = "rows " + std::to_string(rows) + (nan_code ? " with a NaN code" : "");
      k->fp8_gemm(x.view(), w.fp8(), got.data(), &pool);
      reference_linear_kernels().fp8_gemm(x.view(), w8.view(), ref.data(), nullptr);
      for (int64_t i = 0; i < rows * out; ++i) {
        if (std::isnan(ref[i])) {
          ASSERT_TRUE(nan_code && i % out == 20 && std::isnan(got[i])) << "fp8 " << where << " at " << i;
        } else {
          ASSERT_EQ(std::memcmp(&got[i], &ref[i], sizeof(float)), 0)
              << "fp8 " << where << " at " << i << ": " << got[i] << " vs " << ref[i];
        }
      }
      k->fp4_gemm(x.view(), w.fp4(), got.data(), &pool);
      reference_linear_kernels().fp4_gemm(x.view(), w4.view(), ref.data(), nullptr);
      ASSERT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0) << "fp4 " << where;
    }
}

// The AVX2 MXFP4 decode (1..4 rows) multiplies a block in integers only where every row's block is exact
// (prepare_fp4_decode_rows), else in fp32 FMAs: row-major weights in their own order (in a block that could be exact
// any fp32 order is exact too, so each row gets the same bits alone as with rows whose blocks are not exact, and a
// row whose blocks all could be exact the reference's bits), tile-major ones down k (the reference's bits always).
// Blocks here are narrow (small dyadic codes: integers), wide (random codes, some spanning more than 2^11 in steps),
// or hold a NaN.
TEST(LinearAvx2, Fp4DecodeRowsRunAloneWithMixedExactBlocks) {
  const LinearKernels* k = linear_impl::avx2_kernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  const uint8_t narrow[] = {0x00, 0x30, 0x38, 0x3c, 0x40, 0x44, 0x48, 0x80, 0xb0, 0xb8, 0xbc, 0xc0, 0xc4, 0xc8};
  std::mt19937 rng(31);
  ThreadPool pool(2);
  for (const bool tiled : {false, true})
    for (const auto& [rows, out, in] : {std::tuple{4, 48, 2112}, std::tuple{3, 16, 96}, std::tuple{2, 64, 1024},
                                        std::tuple{1, 80, 544}}) {
      auto x = test::random_fp8_acts(rng, rows, in);
      auto w4 = test::random_fp4_weight(rng, out, in);
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < in / 32; ++b) {
          uint8_t* block = x.codes.data() + r * in + 32 * b;
          const bool narrow_block = r == 0 || rng() % 3 == 0;  // row 0: every block could be exact
          if (narrow_block && !(rows == 1 && b % 4 == 1))
            for (int j = 0; j < 32; ++j) block[j] = narrow[rng() % std::size(narrow)];
          if (r == rows - 1 && b == 1 && rows > 1) {  // a NaN, in the last row, among large codes that would be exact
            for (int j = 0; j < 32; ++j) block[j] = static_cast<uint8_t>(0x70 + (rng() % 15) + (rng() % 2) * 0x80);
            block[5] = 0x7f;
          }
        }
      const OrderedWeights w = in_order(test::random_fp8_weight(rng, out, in), w4, tiled);
      std::vector<float> together(static_cast<size_t>(rows * out)), ref(together.size());
      k->fp4_gemm(x.view(), w.fp4(), together.data(), &pool);
      reference_linear_kernels().fp4_gemm(x.view(), w4.view(), ref.data(), nullptr);
      for (int r = 0; r < rows; ++r) {
        const Fp8Activations one{x.codes.data() + r * in, x.scales.data() + r * (in / 32), 1, in};
        std::vector<float> alone(static_cast<size_t>(out));
        k->fp4_gemm(one, w.fp4(), alone.data(), nullptr);
        for (int o = 0; o < out; ++o) {
          const float t = together[r * out + o], want = ref[r * out + o];
          const std::string where = std::string(tiled ? "tiled " : "") + "rows " + std::to_string(rows) + " row " +
                                    std::to_string(r) + " out " + std::to_string(o);
          ASSERT_EQ(std::memcmp(&t, &alone[o], sizeof(float)), 0) << where << ": " << t << " alone " << alone[o];
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(t)) << where;
          } else if (r == 0 || tiled) {
            ASSERT_EQ(std::memcmp(&t, &want, sizeof(float)), 0) << where << ": " << t << " vs " << want;
          } else {
            const test::Exact e = test::exact_fp4(x.view(), w4.view(), r, o);
            ASSERT_NEAR(t, want, 2 * test::fp32_sum_bound(in, e.abs_sum)) << where;
          }
        }
      }
    }
}

// Blocks whose integers N need a third byte piece (some |N| >= 2^15, yet 12 Σ |N| < 2^24: one large code among
// subnormal ones) sum exactly, so the AVX2 decode rows (1..4, integer pieces) give the reference's bits in both
// weight orders; so do rows of two-piece blocks in a pass with a three-piece row.
TEST(LinearAvx2, Fp4DecodeTakesThreePieceBlocksExactly) {
  const LinearKernels* k = linear_impl::avx2_kernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(41);
  ThreadPool pool(2);
  for (const bool tiled : {false, true})
    for (const int rows : {1, 2, 3, 4}) {
      const int out = 48, in = 256;
      auto x = test::random_fp8_acts(rng, rows, in);
      auto w4 = test::random_fp4_weight(rng, out, in);
      for (int r = 0; r < rows; ++r)
        for (int b = 0; b < in / 32; ++b) {
          uint8_t* block = x.codes.data() + r * in + 32 * b;
          const bool three_pieces = r % 2 == 0 || b % 3 == 0;
          for (int j = 0; j < 32; ++j) block[j] = static_cast<uint8_t>(rng() % 8 + (rng() % 2) * 0x80);  // subnormal
          // 0x70 + m: 2^7 (1 + m/8), N = (8 + m) << 13 >= 2^16 against the subnormals' unit; else N < 2^12.
          if (three_pieces) block[rng() % 32] = static_cast<uint8_t>(0x70 + rng() % 8 + (rng() % 2) * 0x80);
          else block[rng() % 32] = static_cast<uint8_t>(0x48 + rng() % 8);
        }
      const OrderedWeights w = in_order(test::random_fp8_weight(rng, out, in), w4, tiled);
      std::vector<float> got(static_cast<size_t>(rows * out)), ref(got.size());
      k->fp4_gemm(x.view(), w.fp4(), got.data(), &pool);
      reference_linear_kernels().fp4_gemm(x.view(), w4.view(), ref.data(), nullptr);
      for (int i = 0; i < rows * out; ++i)
        ASSERT_EQ(std::memcmp(&got[i], &ref[i], sizeof(float)), 0)
            << (tiled ? "tiled " : "") << "rows " << rows << " row " << i / out << " out " << i % out << ": "
            << got[i] << " vs " << ref[i];
    }
}

// wo_a's bf16 linear on tile-major FP8 weights: 1-4 rows (and a few more, in passes of 4) take the decode kernels on
// activations times 2^64 where every nonzero |a| is in [2^-61, 2^64), else the many-row path. Both sum each block down
// k from 0, so 1-4 and 6 rows give the bits they get in a batch past kFp8PassMaxRows (the many-row path). Rows of
// genuine fp32 values (24-bit significands, so sums round) at each edge of that range and past it, over small weights
// (subnormal codes and 2^-5 (1 + m/8)), so that below the range the decode's scaled sums would be subnormal throughout:
// with the range taken down to 2^-75 the test fails at 2^-70 (tried, with batches of 6).
TEST(LinearAvx2, Fp8AsBf16DecodeKeepsTheBatchBitsAtTheActivationRangesEdges) {
  const LinearKernels* k = linear_impl::avx2_kernels();
  if (k == nullptr) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(61);
  const int64_t out = 32, in = 256;
  auto w = test::random_fp8_weight(rng, out, in);
  for (uint8_t& c : w.codes) c = static_cast<uint8_t>(rng() & 0x97);  // exponent field 0 or 2
  auto tiled = w;
  ASSERT_FALSE(repack_fp8_tile_major(w.codes.data(), out, in, tiled.codes.data()));
  Fp8Weight view = tiled.view();
  view.tile_major = true;
  std::uniform_real_distribution<float> significand(1.0f, 2.0f);
  // Each row's magnitudes: 2^e times [1, 2), random signs, some zeros; e from the edges of the range and past them.
  constexpr int64_t batch = kFp8PassMaxRows + 16;  // past the rows the decode passes take: the many-row path
  for (const int e : {-61, -62, -70, 63, 64, -130, 0}) {
    std::vector<float> x(static_cast<size_t>(batch * in));
    for (float& v : x)
      v = rng() % 7 == 0 ? 0.0f : std::ldexp(significand(rng), e) * (rng() % 2 == 0 ? 1.0f : -1.0f);
    std::vector<float> together(static_cast<size_t>(batch * out));
    k->fp8_as_bf16_gemm(x.data(), batch, view, together.data(), nullptr);
    for (const int64_t rows : {1, 2, 3, 4, 6}) {
      std::vector<float> alone(static_cast<size_t>(rows * out));
      k->fp8_as_bf16_gemm(x.data(), rows, view, alone.data(), nullptr);
      for (int64_t i = 0; i < rows * out; ++i)
        ASSERT_EQ(std::memcmp(&alone[i], &together[i], sizeof(float)), 0)
            << "2^" << e << " rows " << rows << " at " << i << ": " << alone[i] << " vs " << together[i];
    }
  }
}

}  // namespace
}  // namespace dsflash
