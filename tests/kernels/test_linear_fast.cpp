// Every linear kernel set this CPU runs (AVX-512, AVX2) against the scalar reference
// (src/kernels/linear_reference.cpp) on random shapes with ragged rows, outputs and block counts.
//
// Tolerances: the fast FP8/FP4 kernels keep the reference's block structure (one fp32 partial per 32-K
// block, (partial * sa) * sw, blocks accumulated in K order) and differ only in the order of the 32
// exact products inside a block, so they are bit-identical whenever the block sums are exact (tested
// exactly below) and otherwise within the first-order bound of reordering an fp32 sum, twice
// n * 2^-24 * Σ|terms| (once for each side's distance from the exact value). BF16 reorders the whole
// K sum (SIMD lanes), with the same bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/linear.h"
#include "kernels/linear_impl.h"
#include "test_linear_util.h"

namespace dsflash {
namespace {

using test::LinearShape;
using test::OrderedWeights;
using test::fast_kernels;
using test::in_order;

// Ragged rows 1..300, outputs off every tile size, odd block counts, and K spanning several scratch chunks.
const LinearShape kFastShapes[] = {{1, 1, 32},    {1, 7, 64},     {2, 15, 96},   {3, 16, 160},  {4, 17, 32},
                                   {5, 31, 224},  {6, 33, 1088},  {7, 45, 2112}, {8, 64, 256},  {9, 100, 96},
                                   {12, 8, 3104}, {16, 48, 1280}, {17, 33, 544}, {1, 130, 5120}, {2, 257, 64},
                                   {40, 16, 96},  {33, 5, 64},   // few outputs, many rows: split over rows
                                   // Multi-row path (rows >= 2): row tiles of 8 with every remainder, ragged output
                                   // tiles, K over several 16-block scratch chunks (544 = 17 blocks, 2080 = 65).
                                   {2, 16, 512},  {3, 129, 576},  {8, 33, 32},   {16, 300, 2080}, {31, 37, 1056},
                                   {64, 50, 544}, {64, 161, 96},  {11, 2, 608},
                                   // Decode (rows 1): MXFP4 groups of 4 blocks with 1-3 left over, scale chunks of
                                   // 32 blocks with a ragged tail (kb 3, 7, 17, 37).
                                   {1, 19, 96},   {1, 40, 224},   {1, 33, 544},  {1, 50, 1184},
                                   // Prefill past one 256-row block, with enough tiles to split over outputs.
                                   {300, 130, 64}};

TEST(LinearFast, ThisMachineHasAFastPath) {
  // Not a skip: the dispatcher must at least offer AVX2 on the x86-64-v3 baseline this project builds for.
  EXPECT_FALSE(fast_kernels().empty());
  EXPECT_STREQ(best_linear_kernels().name, linear_impl::available_kernels().front()->name);
}

TEST(LinearFast, Fp8MatchesReference) {
  ThreadPool pool(2);
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(11);
    for (const LinearShape& s : kFastShapes) {
      auto x = test::random_fp8_acts(rng, s.rows, s.in);
      auto w = test::random_fp8_weight(rng, s.out, s.in);
      std::vector<float> ref(s.rows * s.out), fast(s.rows * s.out, -7.0f), fast_mt(s.rows * s.out, -7.0f);
      reference_linear_kernels().fp8_gemm(x.view(), w.view(), ref.data(), nullptr);
      k->fp8_gemm(x.view(), w.view(), fast.data(), nullptr);
      k->fp8_gemm(x.view(), w.view(), fast_mt.data(), &pool);
      EXPECT_EQ(fast, fast_mt) << k->name << " threads change results";
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.out; ++o) {
          test::Exact e = test::exact_fp8(x.view(), w.view(), r, o);
          ASSERT_NEAR(fast[r * s.out + o], ref[r * s.out + o], 2 * test::fp32_sum_bound(s.in, e.abs_sum))
              << k->name << " rows " << s.rows << " out " << s.out << " in " << s.in << " at " << r << "," << o;
        }
    }
  }
}

TEST(LinearFast, Fp4MatchesReference) {
  ThreadPool pool(2);
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(12);
    for (const LinearShape& s : kFastShapes) {
      auto x = test::random_fp8_acts(rng, s.rows, s.in);
      auto w = test::random_fp4_weight(rng, s.out, s.in);
      std::vector<float> ref(s.rows * s.out), fast(s.rows * s.out, -7.0f), fast_mt(s.rows * s.out, -7.0f);
      reference_linear_kernels().fp4_gemm(x.view(), w.view(), ref.data(), nullptr);
      k->fp4_gemm(x.view(), w.view(), fast.data(), nullptr);
      k->fp4_gemm(x.view(), w.view(), fast_mt.data(), &pool);
      EXPECT_EQ(fast, fast_mt) << k->name << " threads change results";
      for (int r = 0; r < s.rows; ++r)
        for (int o = 0; o < s.out; ++o) {
          test::Exact e = test::exact_fp4(x.view(), w.view(), r, o);
          ASSERT_NEAR(fast[r * s.out + o], ref[r * s.out + o], 2 * test::fp32_sum_bound(s.in, e.abs_sum))
              << k->name << " rows " << s.rows << " out " << s.out << " in " << s.in << " at " << r << "," << o;
        }
    }
  }
}

TEST(LinearFast, Bf16MatchesReference) {
  ThreadPool pool(2);
  const LinearShape shapes[] = {{1, 1, 1},   {1, 5, 7},    {2, 9, 15},     {3, 4, 16},   {4, 13, 17},
                          {5, 3, 100}, {7, 33, 513}, {16, 21, 1280}, {17, 6, 33}, {1, 130, 5120},
                          {40, 300, 64},
                          // more rows than one L2 row block holds at this K (several blocks, a ragged last one)
                          {70, 9, 4100}};
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(13);
    for (const LinearShape& s : shapes)
      for (bool bf16_x : {true, false}) {
        auto x = test::random_floats(rng, s.rows * s.in, bf16_x);
        auto w = test::random_bf16_weight(rng, s.out, s.in);
        std::vector<float> ref(s.rows * s.out), fast(s.rows * s.out, -7.0f), fast_mt(s.rows * s.out, -7.0f);
        reference_linear_kernels().bf16_gemm(x.data(), s.rows, w.view(), ref.data(), nullptr);
        k->bf16_gemm(x.data(), s.rows, w.view(), fast.data(), nullptr);
        k->bf16_gemm(x.data(), s.rows, w.view(), fast_mt.data(), &pool);
        EXPECT_EQ(fast, fast_mt) << k->name << " threads change results";
        for (int r = 0; r < s.rows; ++r)
          for (int o = 0; o < s.out; ++o) {
            test::Exact e = test::exact_bf16(x.data(), w.view(), r, o);
            ASSERT_NEAR(fast[r * s.out + o], ref[r * s.out + o], 2 * test::fp32_sum_bound(s.in, e.abs_sum))
                << k->name << " rows " << s.rows << " out " << s.out << " in " << s.in << " at " << r << "," << o;
          }
      }
  }
}

// A bf16 subnormal activation is a value like any other (the reference's FMA keeps it): a path that multiplies
// bf16 pairs in hardware which flushes subnormal inputs to zero must not be taken for it.
TEST(LinearFast, Bf16KeepsSubnormalActivations) {
  const int64_t in = 96, out = 5;
  std::vector<float> x(static_cast<size_t>(in), 0.0f);
  x[37] = bf16_to_f32(0x0003);  // 3 * 2^-133, a bf16 subnormal
  std::vector<uint16_t> w(static_cast<size_t>(out * in), 0x3f80);  // 1.0
  for (int64_t o = 0; o < out; ++o) w[static_cast<size_t>(o * in + 37)] = 0x7300;  // 2^103
  const Bf16Weight view{w.data(), out, in};
  std::vector<float> ref(out), fast(out);
  reference_linear_kernels().bf16_gemm(x.data(), 1, view, ref.data(), nullptr);
  ASSERT_EQ(ref[0], 3.0f * 0x1p-30f);
  for (const LinearKernels* k : fast_kernels()) {
    k->bf16_gemm(x.data(), 1, view, fast.data(), nullptr);
    EXPECT_EQ(fast, ref) << k->name;
  }
}

// wo_a's bf16 linear from FP8 codes, every table, both byte orders, bf16 and genuine fp32 activations (the AVX-512
// table takes the latter, and bf16 subnormals, through AVX2's fp32 FMAs): within the reordering bound of the
// reference, the same bits threaded (also split by node), and on tile-major weights each row the same bits alone.
TEST(LinearFast, Fp8AsBf16MatchesTheReferenceAndRowsRunAlone) {
  const LinearShape shapes[] = {{1, 16, 32}, {1, 64, 4096}, {2, 7, 96},    {3, 48, 1056}, {4, 32, 2048},
                          {5, 33, 544}, {8, 16, 4096}, {12, 64, 1024}, {16, 48, 4096}, {33, 16, 256}};
  ThreadPool pool(2);
  ThreadPool two_nodes(3, {}, {0, 1, 1});
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(41);
    for (const LinearShape& s : shapes)
      for (const bool bf16_x : {true, false}) {
        const auto x = test::random_floats(rng, s.rows * s.in, bf16_x);
        const auto w = test::random_fp8_weight(rng, s.out, s.in);
        const auto copy = test::dequantised_bf16(w);
        std::vector<float> ref(static_cast<size_t>(s.rows * s.out));
        reference_linear_kernels().fp8_as_bf16_gemm(x.data(), s.rows, w.view(), ref.data(), nullptr);
        for (const bool tiled : {false, true}) {
          if (tiled && !tile_major_possible(s.out, s.in)) continue;
          auto bytes = w;
          if (tiled) repack_fp8_tile_major(w.codes.data(), s.out, s.in, bytes.codes.data());
          Fp8Weight view = bytes.view();
          view.tile_major = tiled;
          ASSERT_TRUE(check_fp8_as_bf16_linear(s.in, view).ok());
          const std::string where = std::string(k->name) + " rows " + std::to_string(s.rows) + " out " +
                                    std::to_string(s.out) + " in " + std::to_string(s.in) +
                                    (tiled ? " tile-major" : "") + (bf16_x ? "" : " fp32 x");
          std::vector<float> got(ref.size(), -7.0f);
          k->fp8_as_bf16_gemm(x.data(), s.rows, view, got.data(), nullptr);
          for (int r = 0; r < s.rows; ++r)
            for (int o = 0; o < s.out; ++o) {
              const size_t i = static_cast<size_t>(r * s.out + o);
              ASSERT_NEAR(got[i], ref[i], 2 * test::fp32_sum_bound(s.in, test::exact_bf16(x.data(), copy.view(), r, o).abs_sum))
                  << where << " at " << r << "," << o;
            }
          for (ThreadPool* p : {&pool, &two_nodes}) {
            std::vector<float> threaded(ref.size(), -7.0f);
            k->fp8_as_bf16_gemm(x.data(), s.rows, view, threaded.data(), p);
            ASSERT_EQ(threaded, got) << where << " threaded, nodes " << p->num_nodes();
          }
          if (!tiled) continue;
          for (int r = 0; r < s.rows; ++r) {
            std::vector<float> alone(static_cast<size_t>(s.out), -7.0f);
            k->fp8_as_bf16_gemm(x.data() + r * s.in, 1, view, alone.data(), nullptr);
            ASSERT_TRUE(std::equal(alone.begin(), alone.end(), got.begin() + r * s.out)) << where << " row " << r;
          }
        }
      }
  }
}

// The grouped form (wo_a's einsum) gives, group by group, the bits of the table's own fp8_as_bf16_gemm on that
// group's columns of x and rows of w, threaded or not, on a simulated 2-node pool too.
TEST(LinearFast, Fp8AsBf16GroupsGiveEachGroupsOwnGemm) {
  struct GroupedShape {
    int64_t rows, groups, group_out, in;
  };
  const GroupedShape shapes[] = {{1, 8, 32, 128}, {2, 3, 64, 96},   {4, 2, 32, 1056}, {5, 4, 32, 256},
                                 {16, 8, 64, 512}, {33, 2, 96, 64}, {300, 3, 32, 128}, {3, 1, 48, 64}};
  ThreadPool pool(2);
  ThreadPool two_nodes(3, {}, {0, 1, 1});
  std::vector<const LinearKernels*> tables = linear_impl::available_kernels();  // the reference last
  for (const LinearKernels* k : tables) {
    std::mt19937 rng(43);
    for (const GroupedShape& s : shapes)
      for (const bool bf16_x : {true, false}) {
        const int64_t out = s.groups * s.group_out;
        const auto x = test::random_floats(rng, s.rows * s.groups * s.in, bf16_x);  // [rows, groups * in]
        const auto w = test::random_fp8_weight(rng, out, s.in);
        for (const bool tiled : {false, true}) {
          auto bytes = w;
          if (tiled) repack_fp8_tile_major(w.codes.data(), out, s.in, bytes.codes.data());
          Fp8Weight view = bytes.view();
          view.tile_major = tiled;
          ASSERT_TRUE(check_fp8_as_bf16_grouped_linear(s.groups * s.in, s.groups, view).ok());
          const std::string where = std::string(k->name) + " rows " + std::to_string(s.rows) + " groups " +
                                    std::to_string(s.groups) + " x " + std::to_string(s.group_out) + " in " +
                                    std::to_string(s.in) + (tiled ? " tile-major" : "") + (bf16_x ? "" : " fp32 x");
          // Expected: one call per group on the group's gathered columns and its slice of w.
          std::vector<float> expected(static_cast<size_t>(s.rows * out), -7.0f);
          std::vector<float> group_x(static_cast<size_t>(s.rows * s.in));
          std::vector<float> group_y(static_cast<size_t>(s.rows * s.group_out));
          for (int64_t g = 0; g < s.groups; ++g) {
            for (int64_t r = 0; r < s.rows; ++r)
              std::copy_n(x.data() + (r * s.groups + g) * s.in, s.in, group_x.data() + r * s.in);
            const Fp8Weight group_w{view.codes + g * s.group_out * s.in,
                                    view.scales + (g * s.group_out / 32) * (s.in / 32), s.group_out, s.in, tiled};
            k->fp8_as_bf16_gemm(group_x.data(), s.rows, group_w, group_y.data(), nullptr);
            for (int64_t r = 0; r < s.rows; ++r)
              std::copy_n(group_y.data() + r * s.group_out, s.group_out,
                          expected.data() + (r * s.groups + g) * s.group_out);
          }
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool, &two_nodes}) {
            std::vector<float> got(expected.size(), -7.0f);
            fp8_as_bf16_grouped_gemm(x.data(), s.rows, s.groups, view, got.data(), *k, p);
            ASSERT_EQ(got, expected) << where << (p ? " threaded, nodes " + std::to_string(p->num_nodes()) : "");
          }
        }
      }
  }
  // Groups must be whole 32-row scale blocks, and x must hold every group's inputs.
  std::mt19937 rng(1);
  const auto w = test::random_fp8_weight(rng, 96, 64);
  EXPECT_TRUE(check_fp8_as_bf16_grouped_linear(3 * 64, 3, w.view()).ok());   // 32 outputs each
  EXPECT_FALSE(check_fp8_as_bf16_grouped_linear(2 * 64, 2, w.view()).ok());  // 48 each
  EXPECT_FALSE(check_fp8_as_bf16_grouped_linear(64, 3, w.view()).ok());      // one group's inputs
  EXPECT_FALSE(check_fp8_as_bf16_grouped_linear(0, 0, w.view()).ok());
}

// As Bf16KeepsSubnormalActivations, for the FP8 weight's bf16 linear: 3 * 2^-133 times 1.0 * 2^100.
TEST(LinearFast, Fp8AsBf16KeepsSubnormalActivations) {
  const int64_t in = 96, out = 32;
  std::vector<float> x(static_cast<size_t>(in), 0.0f);
  x[37] = bf16_to_f32(0x0003);
  test::Fp8WeightData w;
  w.out = out;
  w.in = in;
  w.codes.assign(static_cast<size_t>(out * in), 0x38);  // 1.0
  w.scales.assign(static_cast<size_t>((out / 32) * (in / 32)), 127 + 100);
  std::vector<float> ref(out), fast(out);
  reference_linear_kernels().fp8_as_bf16_gemm(x.data(), 1, w.view(), ref.data(), nullptr);
  ASSERT_EQ(ref[0], 3.0f * 0x1p-33f);
  auto tiled = w;
  repack_fp8_tile_major(w.codes.data(), out, in, tiled.codes.data());
  Fp8Weight tiled_view = tiled.view();
  tiled_view.tile_major = true;
  for (const LinearKernels* k : fast_kernels())
    for (const Fp8Weight& view : {w.view(), tiled_view}) {
      std::fill(fast.begin(), fast.end(), -7.0f);
      k->fp8_as_bf16_gemm(x.data(), 1, view, fast.data(), nullptr);
      EXPECT_EQ(fast, ref) << k->name << (view.tile_major ? " tile-major" : "");
    }
}

// Tile-major weights (a load-time repack, kernels/linear.h), read by every table: within the reordering bound of
// the reference on the row-major bytes, bit-identical to it where block sums are exact, the same bits alone and
// threaded (also split by NUMA node), and each row's result the same bits as that row run alone (the decode paths, 1..4 rows, and the
// multi-row path sum a block in the same order).
TEST(LinearFast, TileMajorWeightsMatchTheReferenceAndRowsRunAlone) {
  // (1 to 10 tiles of 16 outputs, 4, 2 and 1 at a time on the decode paths; 5-12 rows there in passes of up to 4,
  // MXFP4 up to 48 rows; the first rows on the multi-row path: 13 for FP8, 49 for MXFP4)
  const LinearShape shapes[] = {{1, 16, 32},   {1, 48, 1280}, {2, 32, 256},   {2, 112, 256},  {3, 160, 2176},
                                {4, 16, 128},  {4, 80, 384},  {5, 48, 384},   {8, 32, 1280},  {12, 48, 384},
                                {13, 48, 384}, {16, 64, 2176}, {48, 48, 384}, {49, 48, 384}, {300, 48, 128},
                                {1, 32, 1056}};
  const uint8_t e4m3_small[] = {0x00, 0x30, 0x38, 0x3c, 0x40, 0x44, 0x48, 0x80, 0xb0, 0xb8, 0xbc, 0xc0, 0xc4, 0xc8};
  ThreadPool pool(2);
  ThreadPool two_nodes(3, {}, {0, 1, 1});  // a simulated 2-node machine: tiles split by node
  for (const LinearKernels* k : linear_impl::available_kernels()) {
    std::mt19937 rng(21);
    for (const LinearShape& s : shapes)
      for (const bool exact_sums : {false, true}) {
        auto x = test::random_fp8_acts(rng, s.rows, s.in);
        auto w8 = test::random_fp8_weight(rng, s.out, s.in);
        auto w4 = test::random_fp4_weight(rng, s.out, s.in);
        if (exact_sums) {
          for (auto& c : x.codes) c = e4m3_small[rng() % std::size(e4m3_small)];
          for (auto& c : w8.codes) c = e4m3_small[rng() % std::size(e4m3_small)];
        }
        ASSERT_TRUE(tile_major_possible(s.out, s.in));
        auto w8_tiled = w8;
        auto w4_tiled = w4;
        repack_fp8_tile_major(w8.codes.data(), s.out, s.in, w8_tiled.codes.data());
        repack_fp4_tile_major(w4.packed.data(), s.out, s.in, w4_tiled.packed.data());
        repack_fp4_scales_tile_major(w4.scales.data(), s.out, s.in, w4_tiled.scales.data());
        Fp8Weight v8 = w8_tiled.view();
        Fp4Weight v4 = w4_tiled.view();
        v8.tile_major = v4.tile_major = true;
        ASSERT_TRUE(check_fp8_linear(x.view(), v8).ok());
        ASSERT_TRUE(check_fp4_linear(x.view(), v4).ok());
        const std::string where = std::string(k->name) + " rows " + std::to_string(s.rows) + " out " +
                                  std::to_string(s.out) + " in " + std::to_string(s.in);
        std::vector<float> ref8(s.rows * s.out), ref4(s.rows * s.out);
        reference_linear_kernels().fp8_gemm(x.view(), w8.view(), ref8.data(), nullptr);
        reference_linear_kernels().fp4_gemm(x.view(), w4.view(), ref4.data(), nullptr);
        std::vector<float> got8(s.rows * s.out, -7.0f), got4(s.rows * s.out, -7.0f);
        k->fp8_gemm(x.view(), v8, got8.data(), nullptr);
        k->fp4_gemm(x.view(), v4, got4.data(), nullptr);
        if (exact_sums) {
          ASSERT_EQ(got8, ref8) << where << " fp8";
          ASSERT_EQ(got4, ref4) << where << " fp4";
        }
        for (int r = 0; r < s.rows; ++r)
          for (int o = 0; o < s.out; ++o) {
            const size_t i = static_cast<size_t>(r * s.out + o);
            ASSERT_NEAR(got8[i], ref8[i], 2 * test::fp32_sum_bound(s.in, test::exact_fp8(x.view(), w8.view(), r, o).abs_sum))
                << where << " fp8 at " << r << "," << o;
            ASSERT_NEAR(got4[i], ref4[i], 2 * test::fp32_sum_bound(s.in, test::exact_fp4(x.view(), w4.view(), r, o).abs_sum))
                << where << " fp4 at " << r << "," << o;
          }
        for (ThreadPool* p : {&pool, &two_nodes}) {
          std::vector<float> threaded(s.rows * s.out, -7.0f);
          k->fp8_gemm(x.view(), v8, threaded.data(), p);
          ASSERT_EQ(threaded, got8) << where << " fp8 threaded, nodes " << p->num_nodes();
          k->fp4_gemm(x.view(), v4, threaded.data(), p);
          ASSERT_EQ(threaded, got4) << where << " fp4 threaded, nodes " << p->num_nodes();
        }
        for (int r = 0; r < s.rows; ++r) {
          const Fp8Activations row{x.codes.data() + r * s.in, x.scales.data() + r * (s.in / 32), 1, s.in};
          std::vector<float> alone(s.out, -7.0f);
          k->fp8_gemm(row, v8, alone.data(), nullptr);
          ASSERT_TRUE(std::equal(alone.begin(), alone.end(), got8.begin() + r * s.out)) << where << " fp8 row " << r;
          k->fp4_gemm(row, v4, alone.data(), nullptr);
          ASSERT_TRUE(std::equal(alone.begin(), alone.end(), got4.begin() + r * s.out)) << where << " fp4 row " << r;
        }
      }
  }
}

// Kernels may fold the activation scales into the bf16 activations when that is exact (AVX-512: codes 19..227). A
// batch with one row past that range runs unfolded; every other row alone runs folded: the same bits, on the decode
// (<= 4 rows) and multi-row paths.
TEST(LinearFast, FoldedActivationScalesGiveTheUnfoldedBits) {
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(57);
    for (const int rows : {3, 12}) {
      const int64_t out = 48, in = 1280;
      auto x = test::random_fp8_acts(rng, rows, in);
      x.scales[0] = 228;  // row 0, block 0: 2^101
      auto w8 = test::random_fp8_weight(rng, out, in);
      auto w4 = test::random_fp4_weight(rng, out, in);
      for (const bool tiled : {false, true}) {
        const OrderedWeights ordered = in_order(w8, w4, tiled);
        const Fp8Weight v8 = ordered.fp8();
        const Fp4Weight v4 = ordered.fp4();
        std::vector<float> batch8(static_cast<size_t>(rows * out)), batch4(batch8.size());
        k->fp8_gemm(x.view(), v8, batch8.data(), nullptr);
        k->fp4_gemm(x.view(), v4, batch4.data(), nullptr);
        const std::string where = std::string(k->name) + " rows " + std::to_string(rows) + (tiled ? " tile-major" : "");
        // Rows 1.. batched without row 0 (in range: folded) give the unfolded batch's bits.
        const Fp8Activations rest{x.codes.data() + in, x.scales.data() + in / 32, rows - 1, in};
        std::vector<float> folded(static_cast<size_t>((rows - 1) * out));
        k->fp8_gemm(rest, v8, folded.data(), nullptr);
        ASSERT_TRUE(std::equal(folded.begin(), folded.end(), batch8.begin() + out)) << where << " fp8";
        k->fp4_gemm(rest, v4, folded.data(), nullptr);
        ASSERT_TRUE(std::equal(folded.begin(), folded.end(), batch4.begin() + out)) << where << " fp4";
        if (!tiled) continue;  // row-major decode paths sum a block in another order than the multi-row path
        const Fp8Activations row1{x.codes.data() + in, x.scales.data() + in / 32, 1, in};
        std::vector<float> alone(static_cast<size_t>(out));
        k->fp8_gemm(row1, v8, alone.data(), nullptr);
        ASSERT_TRUE(std::equal(alone.begin(), alone.end(), batch8.begin() + out)) << where << " fp8 row 1 alone";
        k->fp4_gemm(row1, v4, alone.data(), nullptr);
        ASSERT_TRUE(std::equal(alone.begin(), alone.end(), batch4.begin() + out)) << where << " fp4 row 1 alone";
      }
    }
  }
}

// The multi-row path may also fold the weight scales into its converted weights, per chunk of 8 blocks, where every
// product stays a normal fp32 (sa * sw >= 2^-108) and no sum overflows (sa * sw <= 2^100). At the edges: the
// smallest codes (2^-9 each side, so a product of 2^-18 * sa * sw) with sa * sw at 2^-108 (folds) and 2^-109 (would
// give subnormal products, which vdpbf16ps flushes: must not fold), and the largest ones at 2^100 and 2^101. Rows
// run folded (alone) and unfolded (in a batch with one row whose scale forbids folding): the same bits.
TEST(LinearFast, FoldedWeightScalesGiveTheUnfoldedBits) {
  struct Edge {
    int act_exponent, weight_exponent;  // chunk 0's weight scales; chunk 1's are one more (high) or one less (low)
    int step;
  };
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(58);
    for (const Edge edge : {Edge{-50, -58, -1}, Edge{50, 50, 1}}) {
      // 16 blocks: two chunks; 128 rows besides row 0, the fewest the multi-row path folds weight scales for.
      const int64_t rows = 129, out = 48, in = 512;
      // Every code the smallest (2^-9) or the largest (448), random signs: the edge's products and nothing else.
      const uint8_t magnitude = edge.step < 0 ? 0x01 : 0x7e;
      auto x = test::random_fp8_acts(rng, rows, in);
      for (uint8_t& c : x.codes) c = static_cast<uint8_t>(magnitude | (rng() & 0x80));
      std::fill(x.scales.begin(), x.scales.end(), static_cast<uint8_t>(127 + edge.act_exponent));
      x.scales[0] = 228;  // row 0, block 0: 2^101, no folding for a batch with it
      auto w8 = test::random_fp8_weight(rng, out, in);
      auto w4 = test::random_fp4_weight(rng, out, in);
      for (uint8_t& c : w8.codes) c = static_cast<uint8_t>(magnitude | (rng() & 0x80));
      for (int64_t b = 0; b < in / 32; ++b) {
        const auto code = static_cast<uint8_t>(127 + edge.weight_exponent + (b >= 8 ? edge.step : 0));
        for (int64_t o = 0; o < out; ++o) {
          if (o % 32 == 0) w8.scales[(o / 32) * (in / 32) + b] = code;
          w4.scales[o * (in / 32) + b] = code;
        }
      }
      for (const bool tiled : {false, true}) {
        const OrderedWeights ordered = in_order(w8, w4, tiled);
        const Fp8Weight v8 = ordered.fp8();
        const Fp4Weight v4 = ordered.fp4();
        const std::string where = std::string(k->name) + " act 2^" + std::to_string(edge.act_exponent) +
                                  (tiled ? " tile-major" : "");
        const Fp8Activations rest{x.codes.data() + in, x.scales.data() + in / 32, rows - 1, in};
        std::vector<float> batch(static_cast<size_t>(rows * out)), folded(static_cast<size_t>((rows - 1) * out));
        k->fp8_gemm(x.view(), v8, batch.data(), nullptr);
        k->fp8_gemm(rest, v8, folded.data(), nullptr);
        EXPECT_TRUE(std::equal(folded.begin(), folded.end(), batch.begin() + out)) << where << " fp8";
        k->fp4_gemm(x.view(), v4, batch.data(), nullptr);
        k->fp4_gemm(rest, v4, folded.data(), nullptr);
        EXPECT_TRUE(std::equal(folded.begin(), folded.end(), batch.begin() + out)) << where << " fp4";
      }
    }
  }
}

// Small dyadic values: every block sum is exact, so any layout, scale or order slip shows as a mismatch.
TEST(LinearFast, BitIdenticalToReferenceWhereBlockSumsAreExact) {
  const uint8_t e4m3_small[] = {0x00, 0x30, 0x38, 0x3c, 0x40, 0x44, 0x48, 0x80, 0xb0, 0xb8, 0xbc, 0xc0, 0xc4, 0xc8};
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(14);
    for (const LinearShape& s : kFastShapes) {
      auto x = test::random_fp8_acts(rng, s.rows, s.in, 100, 140);
      auto w8 = test::random_fp8_weight(rng, s.out, s.in, 100, 140);
      auto w4 = test::random_fp4_weight(rng, s.out, s.in, 100, 140);
      for (auto& c : x.codes) c = e4m3_small[rng() % std::size(e4m3_small)];
      for (auto& c : w8.codes) c = e4m3_small[rng() % std::size(e4m3_small)];
      std::vector<float> ref(s.rows * s.out), fast(s.rows * s.out);
      reference_linear_kernels().fp8_gemm(x.view(), w8.view(), ref.data(), nullptr);
      k->fp8_gemm(x.view(), w8.view(), fast.data(), nullptr);
      ASSERT_EQ(fast, ref) << k->name << " fp8 rows " << s.rows << " out " << s.out << " in " << s.in;
      reference_linear_kernels().fp4_gemm(x.view(), w4.view(), ref.data(), nullptr);
      k->fp4_gemm(x.view(), w4.view(), fast.data(), nullptr);
      ASSERT_EQ(fast, ref) << k->name << " fp4 rows " << s.rows << " out " << s.out << " in " << s.in;
    }
  }
}

// The AVX-512 table's two ways to multiply many rows (linear_impl::RowsMultiply) give the same bits: random codes
// (inexact block sums, where the order of the products shows), activation scales inside and outside the range
// that is folded, both weight orders, and bf16 activations down to 2^-120 (products that vdpbf16ps would flush).
// So does the bf16-free table (FMAs throughout) wherever "avx512" runs the same path: every row count on tile-major
// weights, and the multi-row path on row-major ones (FP8 from 2 rows, MXFP4 from 5), for e4m3 activations and
// bf16 ones whose products stay normal; and the VBMI-free and VNNI-free tables on tile-major weights (their
// row-major ones are the avx2 table's).
TEST(LinearFast, Avx512MultipliesGiveTheSameBits) {
  const LinearKernels* dot = linear_impl::avx512_kernels_multiplying(linear_impl::RowsMultiply::kBf16Dot);
  const LinearKernels* fma = linear_impl::avx512_kernels_multiplying(linear_impl::RowsMultiply::kFp32Fma);
  const LinearKernels* no_bf16 = linear_impl::avx512_no_bf16::kernels();
  if (dot == nullptr) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  ASSERT_NE(no_bf16, nullptr);
  // Tables that take tile-major weights only (their row-major ones are the avx2 table's).
  const LinearKernels* tile_major_only[] = {linear_impl::avx512_no_vbmi::kernels(),
                                            linear_impl::avx512_no_vnni::kernels()};
  for (const LinearKernels* k : tile_major_only) ASSERT_NE(k, nullptr);
  // Rows 1..4 on tile-major weights take the decode paths (with FMAs from 2 rows on).
  const LinearShape shapes[] = {{1, 48, 2176},  {4, 32, 1056},  {5, 48, 384},
                                {9, 33, 1056},  {16, 64, 2176}, {300, 48, 128}};
  ThreadPool pool(2);
  std::mt19937 rng(77);
  // Results where the order of a block's products matters (the test's own check), by format.
  int differing_orders_fp8 = 0, differing_orders_fp4 = 0;
  auto same_bits = [](const std::vector<float>& u, const std::vector<float>& v) {  // NaN included
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
  };
  for (const LinearShape& s : shapes)
    for (const auto& [scale_lo, scale_hi] : {std::pair{110, 135}, std::pair{5, 250}})
      for (const bool tiled : {false, true}) {
        if (tiled && !tile_major_possible(s.out, s.in)) continue;
        const auto x = test::random_fp8_acts(rng, s.rows, s.in, scale_lo, scale_hi);
        const OrderedWeights w =
            in_order(test::random_fp8_weight(rng, s.out, s.in), test::random_fp4_weight(rng, s.out, s.in), tiled);
        const std::string where = "rows " + std::to_string(s.rows) + " in " + std::to_string(s.in) +
                                  (tiled ? " tile-major" : "") + " scales " + std::to_string(scale_lo);
        std::vector<float> a(static_cast<size_t>(s.rows * s.out)), b(a.size()), ref(a.size());
        dot->fp8_gemm(x.view(), w.fp8(), a.data(), &pool);
        fma->fp8_gemm(x.view(), w.fp8(), b.data(), nullptr);
        ASSERT_TRUE(same_bits(a, b)) << "fp8 " << where;
        if (tiled || s.rows >= 2) {
          no_bf16->fp8_gemm(x.view(), w.fp8(), b.data(), &pool);
          ASSERT_TRUE(same_bits(a, b)) << "fp8 avx512-no-bf16 " << where;
        }
        if (tiled)
          for (const LinearKernels* k : tile_major_only) {
            k->fp8_gemm(x.view(), w.fp8(), b.data(), &pool);
            ASSERT_TRUE(same_bits(a, b)) << "fp8 " << k->name << " " << where;
          }
        reference_linear_kernels().fp8_gemm(x.view(), w.w8.view(), ref.data(), nullptr);
        differing_orders_fp8 += static_cast<int>(!same_bits(a, ref));
        dot->fp4_gemm(x.view(), w.fp4(), a.data(), nullptr);
        fma->fp4_gemm(x.view(), w.fp4(), b.data(), &pool);
        ASSERT_TRUE(same_bits(a, b)) << "fp4 " << where;
        if (tiled || s.rows >= 5) {
          no_bf16->fp4_gemm(x.view(), w.fp4(), b.data(), nullptr);
          ASSERT_TRUE(same_bits(a, b)) << "fp4 avx512-no-bf16 " << where;
        }
        if (tiled)
          for (const LinearKernels* k : tile_major_only) {
            k->fp4_gemm(x.view(), w.fp4(), b.data(), &pool);
            ASSERT_TRUE(same_bits(a, b)) << "fp4 " << k->name << " " << where;
          }
        reference_linear_kernels().fp4_gemm(x.view(), w.w4.view(), ref.data(), nullptr);
        differing_orders_fp4 += static_cast<int>(!same_bits(a, ref));
        for (const float tiny : {0x1p-90f, 0x1p-120f}) {
          auto values = test::random_floats(rng, s.rows * s.in, true);
          for (int64_t i = 0; i < s.in; ++i)  // row 0, all of it, none bf16-subnormal (those take the AVX2 table)
            values[i] = round_to_bf16(std::copysign(std::max(std::fabs(values[i]), 0x1p-4f), values[i]) * tiny);
          dot->fp8_as_bf16_gemm(values.data(), s.rows, w.fp8(), a.data(), nullptr);
          fma->fp8_as_bf16_gemm(values.data(), s.rows, w.fp8(), b.data(), nullptr);
          ASSERT_TRUE(same_bits(a, b)) << "fp8 as bf16 " << where << " tiny " << tiny;
          if (tiny == 0x1p-90f && (tiled || s.rows >= 2)) {  // products >= 2^-103: none that vdpbf16ps flushes
            no_bf16->fp8_as_bf16_gemm(values.data(), s.rows, w.fp8(), b.data(), &pool);
            ASSERT_TRUE(same_bits(a, b)) << "fp8 as bf16 avx512-no-bf16 " << where << " tiny " << tiny;
            if (tiled)
              for (const LinearKernels* k : tile_major_only) {
                k->fp8_as_bf16_gemm(values.data(), s.rows, w.fp8(), b.data(), &pool);
                ASSERT_TRUE(same_bits(a, b)) << "fp8 as bf16 " << k->name << " " << where << " tiny " << tiny;
              }
          }
        }
      }
  EXPECT_GT(differing_orders_fp8, 0) << "no inexact FP8 block sum: the test cannot tell the orders apart";
  EXPECT_GT(differing_orders_fp4, 0) << "no inexact MXFP4 block sum: the test cannot tell the orders apart";
}

// The AVX-512 tables' in-block order, pinned by a block where it shows: 14 large products make A = 14 * 2688 (MXFP4:
// 448 * 6) or 14 * 448^2 (FP8), then the last pair adds u/2 (even element) and 3u/4 (odd), u = ulp(A). Odd first
// (vdpbf16ps, and the FMA twin): A + 3u/4 -> A + u, + u/2 -> A + 2u (the tie to even). Even first (the
// reference's k order): A + u/2 -> A (tie), + 3u/4 -> A + u. Tile-major weights at rows 1, 4 (decode paths), 8
// (FP8: the multi-row path; MXFP4: two decode passes) and 49 (the multi-row path), row-major ones at rows 8 and 49
// (the row-major decode paths sum a block in an order of their own).
TEST(LinearFast, Avx512AddsEachPairOddThenEven) {
  const int out = 32, in = 32;
  test::Fp8ActData x;
  x.k = in;
  test::Fp8WeightData w8;
  w8.out = out;
  w8.in = in;
  w8.codes.assign(out * in, 0x00);
  w8.scales.assign(1, 127);
  test::Fp4WeightData w4;
  w4.out = out;
  w4.in = in;
  w4.packed.assign(out * in / 2, 0x00);
  w4.scales.assign(out, 127);
  std::vector<uint8_t> act_row(in, 0x00);
  for (int k = 0; k < 14; ++k) act_row[k] = 0x7E;  // 448
  for (int o = 0; o < out; ++o) {
    for (int k = 0; k < 14; ++k) w8.codes[o * in + k] = 0x7E;
    w8.codes[o * in + 14] = 0x38;  // 1.0
    w8.codes[o * in + 15] = 0x3C;  // 1.5
    for (int k = 0; k < 14; k += 2) w4.packed[o * in / 2 + k / 2] = 0x77;  // 6.0, 6.0 (low nibble: even k)
    w4.packed[o * in / 2 + 7] = 0x32;  // k 14: 1.0, k 15: 1.5
  }
  const float a4 = 14.0f * 2688.0f, u4 = 0x1p-8f, a8 = 14.0f * 448.0f * 448.0f, u8 = 0x1p-2f;
  for (const LinearKernels* k : {linear_impl::avx512_kernels_multiplying(linear_impl::RowsMultiply::kBf16Dot),
                                 linear_impl::avx512_kernels_multiplying(linear_impl::RowsMultiply::kFp32Fma),
                                 linear_impl::avx512_no_bf16::kernels(), linear_impl::avx512_no_vbmi::kernels(),
                                 linear_impl::avx512_no_vnni::kernels()}) {
    if (k == nullptr) continue;  // the CPU lacks its features
    const bool row_major_is_avx2 = k == linear_impl::avx512_no_vbmi::kernels() ||
                                   k == linear_impl::avx512_no_vnni::kernels();
    for (const int rows : {1, 4, 8, 49})
      for (const bool tiled : {false, true}) {
        if (!tiled && (rows < 8 || row_major_is_avx2)) continue;
        x.rows = rows;
        x.scales.assign(rows, 127);
        x.codes.clear();
        for (int r = 0; r < rows; ++r) x.codes.insert(x.codes.end(), act_row.begin(), act_row.end());
        const std::string where = std::string(k->name) + " rows " + std::to_string(rows) + (tiled ? " tile-major" : "");
        const OrderedWeights w = in_order(w8, w4, tiled);
        std::vector<float> y(static_cast<size_t>(rows * out));
        for (const uint8_t small : {uint8_t{0x01}, uint8_t{0x20}}) {  // 2^-9 (MXFP4's u/2), 2^-3 (FP8's)
          x.codes[14] = x.codes[15] = small;
          for (int r = 1; r < rows; ++r) std::copy_n(x.codes.begin(), in, x.codes.begin() + r * in);
          if (small == 0x01) {
            k->fp4_gemm(x.view(), w.fp4(), y.data(), nullptr);
            for (const float v : y) ASSERT_EQ(v, a4 + 2 * u4) << "fp4 " << where;
            reference_linear_kernels().fp4_gemm(x.view(), w4.view(), y.data(), nullptr);
            ASSERT_EQ(y[0], a4 + u4);
          } else {
            k->fp8_gemm(x.view(), w.fp8(), y.data(), nullptr);
            for (const float v : y) ASSERT_EQ(v, a8 + 2 * u8) << "fp8 " << where;
            reference_linear_kernels().fp8_gemm(x.view(), w8.view(), y.data(), nullptr);
            ASSERT_EQ(y[0], a8 + u8);
          }
        }
      }
  }
}

// Realistic operands (activations from act_quant of normal values, weights quantised per block): the
// block sums are almost always exact, so the fast kernels should agree bit for bit nearly everywhere.
TEST(LinearFast, RealisticOperandsAgreeBitForBitAlmostEverywhere) {
  for (const LinearKernels* k : fast_kernels()) {
    std::mt19937 rng(15);
    const int rows = 4, out = 96, in = 1280;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    test::Fp8ActData x;
    x.rows = rows;
    x.k = in;
    x.codes.resize(rows * in);
    x.scales.resize(rows * in / 32);
    std::vector<float> xv(in);
    for (int r = 0; r < rows; ++r) {
      for (auto& v : xv) v = round_to_bf16(normal(rng));
      std::vector<float> scaled(xv);
      // act_quant_block32 (src/formats/quant.h) is the formats teammate's; emulate its per-block scale
      // choice here only to get realistic codes (the kernels do not depend on how codes were made).
      for (int b = 0; b < in / 32; ++b) {
        float amax = 1e-4f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xv[b * 32 + j]));
        int e = static_cast<int>(std::ceil(std::log2(amax / 448.0f)));
        x.scales[r * (in / 32) + b] = e8m0_from_exponent(e);
        for (int j = 0; j < 32; ++j) x.codes[r * in + b * 32 + j] = f32_to_e4m3(xv[b * 32 + j] / std::ldexp(1.0f, e));
      }
    }
    auto w = test::random_fp8_weight(rng, out, in, 115, 122);
    for (auto& c : w.codes) c = f32_to_e4m3(normal(rng) * 64.0f);
    std::vector<float> ref(rows * out), fast(rows * out);
    reference_linear_kernels().fp8_gemm(x.view(), w.view(), ref.data(), nullptr);
    k->fp8_gemm(x.view(), w.view(), fast.data(), nullptr);
    int same = 0;
    for (int i = 0; i < rows * out; ++i) same += fast[i] == ref[i];
    EXPECT_GE(same, rows * out * 9 / 10) << k->name;
  }
}

// Tile-major FP8 weights: a NaN code gives NaN on the decode and multi-row paths, as the reference; a weight known to
// hold none (Fp8Weight::may_hold_nan false, as the load-time copy finds out) gives the same bits as one that might.
TEST(LinearFast, TileMajorNanCodesMatchReference) {
  const int64_t out = 48, in = 128;
  for (const LinearKernels* k : fast_kernels())
    for (int rows : {1, 2, 3, 4, 7}) {
      std::mt19937 rng(rows);
      auto x = test::random_fp8_acts(rng, rows, in);
      auto w = test::random_fp8_weight(rng, out, in);
      for (auto& c : w.codes)
        if ((c & 0x7f) == 0x7f) c = 0x7e;
      test::Fp8WeightData tiled = w;
      EXPECT_FALSE(repack_fp8_tile_major(w.codes.data(), out, in, tiled.codes.data()));
      Fp8Weight view = tiled.view();
      view.tile_major = true;
      std::vector<float> checked(static_cast<size_t>(rows * out)), unchecked(checked.size());
      k->fp8_gemm(x.view(), view, checked.data(), nullptr);
      view.may_hold_nan = false;
      k->fp8_gemm(x.view(), view, unchecked.data(), nullptr);
      const std::string where = std::string(k->name) + " rows " + std::to_string(rows);
      EXPECT_EQ(std::memcmp(checked.data(), unchecked.data(), checked.size() * sizeof(float)), 0) << where;
      w.codes[37 * in + 70] = 0xff;  // output 37 (tile 2), block 2
      EXPECT_TRUE(repack_fp8_tile_major(w.codes.data(), out, in, tiled.codes.data()));
      view.may_hold_nan = true;
      std::vector<float> got(checked.size()), ref(checked.size());
      k->fp8_gemm(x.view(), view, got.data(), nullptr);
      reference_linear_kernels().fp8_gemm(x.view(), w.view(), ref.data(), nullptr);
      for (int r = 0; r < rows; ++r)
        for (int o = 0; o < out; ++o) {
          const size_t i = static_cast<size_t>(r * out + o);
          EXPECT_EQ(std::isnan(got[i]), std::isnan(ref[i])) << where << " at " << r << "," << o;
          if (o == 37) {
            EXPECT_TRUE(std::isnan(got[i])) << where << " row " << r;
          }
        }
    }
}

// Blocks known to hold only zero and normal codes (Fp8Weight::plain_code_blocks, as the load-time copy marks them)
// decode from the 64-entry tables: the bits of the 128-entry ones, on every path (decode passes of 1-4 rows, the
// multi-row path, the AMX table, the bf16 linear of FP8 codes), with every code value in the plain blocks and
// subnormal or NaN codes in others. Flags wrongly set on blocks with such codes fail it.
TEST(LinearFast, PlainCodeBlocksGiveTheBitsOfTheFullTables) {
  const int64_t out = 64, in = 1024;  // 4 tiles x 32 blocks: 65536 codes
  ThreadPool pool(2);
  for (const LinearKernels* k : fast_kernels())
    for (int rows : {1, 2, 3, 4, 5, 8, 13, 16, 49}) {
      std::mt19937 rng(rows);
      auto x = test::random_fp8_acts(rng, rows, in);
      test::Fp8WeightData w = test::random_fp8_weight(rng, out, in);
      for (size_t i = 0; i < w.codes.size(); ++i) w.codes[i] = static_cast<uint8_t>(i * 37);  // every code, in turn
      // Every 7th tile block keeps its subnormal codes, the others take normal codes in their place; no NaN codes
      // but one in each output of tile 3's block 5 (tile block 101, one of the 7th).
      auto tile_block = [&](size_t i) {
        const int64_t at = static_cast<int64_t>(i);
        return at / in / 16 * (in / 32) + at % in / 32;
      };
      for (size_t i = 0; i < w.codes.size(); ++i) {
        uint8_t& c = w.codes[i];
        if ((c & 0x7f) == 0x7f) c = static_cast<uint8_t>(c - 1);
        if (tile_block(i) % 7 != 3 && fp8_code_is_subnormal_or_nan(c)) c = static_cast<uint8_t>(c | 0x08);
      }
      for (int64_t o = 48; o < 64; ++o) w.codes[static_cast<size_t>(o * in + 5 * 32 + o % 32)] = o % 2 ? 0xff : 0x7f;
      test::Fp8WeightData tiled = w;
      std::vector<uint8_t> plain(static_cast<size_t>(fp8_plain_code_block_count(out, in)), 9);
      ASSERT_TRUE(repack_fp8_tile_major(w.codes.data(), out, in, tiled.codes.data(), nullptr, plain.data()));
      for (size_t b = 0; b < plain.size(); ++b) ASSERT_EQ(plain[b], b % 7 != 3 ? 1 : 0) << b;
      Fp8Weight full = tiled.view();
      full.tile_major = true;
      Fp8Weight fast = full;
      fast.plain_code_blocks = plain.data();
      const std::string where = std::string(k->name) + " rows " + std::to_string(rows);
      auto same_bits = [&](const std::vector<float>& a, const std::vector<float>& b) {
        return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      std::vector<float> want(static_cast<size_t>(rows * out)), got(want.size(), -7.0f);
      k->fp8_gemm(x.view(), full, want.data(), &pool);
      ASSERT_EQ(std::count_if(want.begin(), want.end(), [](float v) { return std::isnan(v); }), rows * 16) << where;
      k->fp8_gemm(x.view(), fast, got.data(), &pool);
      EXPECT_TRUE(same_bits(got, want)) << where << " fp8";
      // A flag set on a block that holds a subnormal or a NaN code changes the results.
      std::vector<uint8_t> wrong = plain;
      std::fill(wrong.begin(), wrong.end(), 1);
      Fp8Weight misflagged = full;
      misflagged.plain_code_blocks = wrong.data();
      k->fp8_gemm(x.view(), misflagged, got.data(), &pool);
      const std::string name = k->name;
      // (The tables with VBMI read the flags.)
      if (name != "avx2" && name != "avx512-no-vbmi" && name != "avx512-no-vnni") {
        EXPECT_FALSE(same_bits(got, want)) << where << " misflagged";
      }
      // The bf16 linear of the codes (wo_a), bf16 activations.
      std::vector<float> act(static_cast<size_t>(rows * in));
      for (float& a : act) a = round_to_bf16(std::ldexp(static_cast<float>(static_cast<int>(rng() % 255) - 127), -6));
      k->fp8_as_bf16_gemm(act.data(), rows, full, want.data(), &pool);
      k->fp8_as_bf16_gemm(act.data(), rows, fast, got.data(), &pool);
      EXPECT_TRUE(same_bits(got, want)) << where << " fp8 as bf16";
    }
}

// MXFP4 GEMMs of many rows may run on AMX tiles (the AVX-512 table, where the CPU has them), whose in-block sum order
// is the tile unit's; blocks whose sums may be inexact then take the bf16 chain, so every row gives the bits it
// gives alone (on the decode paths). The activation blocks here are built to round differently in different orders:
// 16 of e4m3's largest magnitude and 16 of its smallest, in either order or interleaved, against weights of +-0.5
// and +-6, beside random and narrow blocks.
TEST(LinearFast, Fp4RowsGiveTheirAloneBitsWhereBlockSumsRound) {
  constexpr int64_t kOut = 48, kIn = 320;
  std::mt19937 rng(57);
  test::Fp4WeightData w4 = test::random_fp4_weight(rng, kOut, kIn, 127, 127);
  const uint8_t extreme_codes[] = {0x1, 0x7, 0x9, 0xf};  // e2m1 0.5, 6, -0.5, -6
  for (auto& c : w4.packed)
    c = static_cast<uint8_t>(extreme_codes[rng() % 4] | extreme_codes[rng() % 4] << 4);
  const OrderedWeights w = in_order(test::random_fp8_weight(rng, kOut, kIn), w4, true);
  for (const int64_t rows : {int64_t{5}, int64_t{16}, int64_t{37}}) {
    test::Fp8ActData x;
    x.rows = rows;
    x.k = kIn;
    x.codes.resize(static_cast<size_t>(rows * kIn));
    x.scales.resize(static_cast<size_t>(rows * (kIn / 32)));
    for (auto& c : x.scales) c = static_cast<uint8_t>(120 + rng() % 15);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < kIn / 32; ++b) {
        uint8_t* block = x.codes.data() + r * kIn + 32 * b;
        const int kind = static_cast<int>((r + b) % 5);
        for (int i = 0; i < 32; ++i) {
          const uint8_t sign = (rng() & 1) ? 0x80 : 0x00;
          const bool large = kind == 0 ? i < 16 : kind == 1 ? i >= 16 : i % 2 == 1;
          if (kind <= 2) block[i] = static_cast<uint8_t>((large ? 0x7e : 0x01) | (kind == 2 ? sign : 0));
          if (kind == 3) block[i] = static_cast<uint8_t>(rng() % 0x7f) | sign;            // any finite magnitude
          if (kind == 4) block[i] = static_cast<uint8_t>(0x40 + rng() % 24) | sign;      // exponents 8..10
        }
      }
    x.codes[3 * kIn + 32 * 4 + 5] = 0x7f;  // a NaN code: row 3's outputs are all NaN, alone and batched
    for (const LinearKernels* k : fast_kernels()) {
      const std::string where = std::string(k->name) + " rows " + std::to_string(rows);
      std::vector<float> batch(static_cast<size_t>(rows * kOut), -7.0f), alone(static_cast<size_t>(kOut));
      k->fp4_gemm(x.view(), w.fp4(), batch.data(), nullptr);
      for (int64_t r = 0; r < rows; ++r) {
        const Fp8Activations row{x.codes.data() + r * kIn, x.scales.data() + r * (kIn / 32), 1, kIn};
        k->fp4_gemm(row, w.fp4(), alone.data(), nullptr);
        for (int64_t o = 0; o < kOut; ++o) {
          const float got = batch[static_cast<size_t>(r * kOut + o)], want = alone[static_cast<size_t>(o)];
          ASSERT_TRUE(std::memcmp(&got, &want, sizeof(float)) == 0 || (std::isnan(got) && std::isnan(want)))
              << where << " row " << r << " output " << o;
          ASSERT_EQ(std::isnan(got), r == 3) << where << " row " << r << " output " << o;
        }
      }
    }
  }
}

// MXFP4 weight scales of every value, 0 (2^-127) and 255 (NaN) included, in groups of 8 blocks and in a tail, in
// both weight orders (the AVX2 decode builds 8 blocks' or a tile's 16 scales at once as fp32 bits and takes the
// table for 0, 255 and the row-major tail).
TEST(LinearFast, Fp4WeightScalesOfEveryValueMatchReference) {
  std::mt19937 rng(43);
  for (const LinearKernels* k : fast_kernels())
    for (const bool tiled : {false, true})
      for (const int rows : {1, 4, 7}) {
        const int out = tiled ? 32 : 24, in = 32 * 19;  // 19 blocks: two groups of 8 and a tail of 3
        auto x = test::random_fp8_acts(rng, rows, in);
        auto w = test::random_fp4_weight(rng, out, in);
        for (size_t i = 0; i < w.scales.size(); ++i) w.scales[i] = static_cast<uint8_t>(i * 7 % 256);
        for (int o = 0; o < 8; ++o) w.scales[o * (in / 32) + 9] = static_cast<uint8_t>(o % 2 == 0 ? 0 : 255);
        const OrderedWeights ordered = in_order(test::random_fp8_weight(rng, out, in), w, tiled);
        std::vector<float> got(static_cast<size_t>(rows * out)), ref(got.size());
        k->fp4_gemm(x.view(), ordered.fp4(), got.data(), nullptr);
        reference_linear_kernels().fp4_gemm(x.view(), w.view(), ref.data(), nullptr);
        const std::string where = std::string(k->name) + (tiled ? " tiled" : "") + " rows " + std::to_string(rows);
        for (int i = 0; i < rows * out; ++i) {
          if (std::isnan(ref[i])) {
            ASSERT_TRUE(std::isnan(got[i])) << where << " at " << i;
          } else {
            ASSERT_EQ(std::memcmp(&got[i], &ref[i], sizeof(float)), 0)
                << where << " at " << i << ": " << got[i] << " vs " << ref[i];
          }
        }
      }
}

TEST(LinearFast, NanCodesAndScaleOrderEdgeCasesMatchReference) {
  for (const LinearKernels* k : fast_kernels())
    for (int rows : {1, 3, 7}) {  // the decode paths (AVX2: up to 4 rows) and the multi-row path
      test::Fp8ActData x;
      x.rows = rows;
      x.k = 64;
      x.codes.assign(rows * 64, 0x78);  // 256
      for (int r = 0; r < rows; ++r) x.scales.insert(x.scales.end(), {static_cast<uint8_t>(127 + 120), 127});
      test::Fp8WeightData w;
      w.out = 3;
      w.in = 64;
      w.codes.assign(3 * 64, 0x48);  // 4: block 0 partial = 2^15, x 2^120 overflows before x 2^-100
      w.codes[2 * 64 + 40] = 0x7f;   // NaN code in output 2, block 1
      w.scales = {static_cast<uint8_t>(127 - 100), 127};
      std::vector<float> y(rows * 3);
      k->fp8_gemm(x.view(), w.view(), y.data(), nullptr);
      for (int r = 0; r < rows; ++r) {
        EXPECT_TRUE(std::isinf(y[r * 3 + 0])) << k->name << " rows " << rows << " " << y[r * 3 + 0];
        EXPECT_TRUE(std::isnan(y[r * 3 + 2])) << k->name << " rows " << rows << " " << y[r * 3 + 2];
      }
    }
}

}  // namespace
}  // namespace dsflash
