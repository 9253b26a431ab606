// The scalar oracle of src/kernels/linear.h against a double-precision evaluation of the same block formula
// (spec/MODEL.md §4.9), exactly where fp32 is exact, and on the points that pin the official numerics.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/linear.h"
#include "kernels/linear_impl.h"
#include "kernels/linear_tables.h"
#include "test_linear_util.h"

namespace dsflash {
namespace {

using test::Exact;

TEST(LinearTables, MatchFormatsCodecsForEveryCode) {
  const LinearDecodeTables& t = linear_decode_tables();
  for (int c = 0; c < 256; ++c) {
    float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(t.e4m3_f32[c])) << c;
      EXPECT_TRUE(std::isnan(bf16_to_f32(t.e4m3_bf16[c]))) << c;
    } else {
      EXPECT_EQ(t.e4m3_f32[c], v) << c;
      EXPECT_EQ(bf16_to_f32(t.e4m3_bf16[c]), v) << "e4m3 code " << c << " is not exact in bf16";
    }
    float s = e8m0_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(s)) EXPECT_TRUE(std::isnan(t.e8m0_f32[c]));
    else EXPECT_EQ(t.e8m0_f32[c], s) << c;
  }
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(t.e2m1_f32[c], e2m1_to_f32(static_cast<uint8_t>(c))) << c;
    EXPECT_EQ(bf16_to_f32(t.e2m1_bf16[c]), e2m1_to_f32(static_cast<uint8_t>(c))) << c;
  }
}

TEST(LinearReference, Fp8MatchesDoubleWithinSummationBound) {
  std::mt19937 rng(1);
  for (auto [rows, out, in] : {std::tuple{1, 1, 32}, {3, 45, 96}, {5, 64, 256}, {2, 33, 1280}}) {
    auto x = test::random_fp8_acts(rng, rows, in);
    auto w = test::random_fp8_weight(rng, out, in);
    std::vector<float> y(static_cast<size_t>(rows * out), -1.0f);
    reference_linear_kernels().fp8_gemm(x.view(), w.view(), y.data(), nullptr);
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) {
        Exact e = test::exact_fp8(x.view(), w.view(), r, o);
        EXPECT_NEAR(y[r * out + o], e.value, test::fp32_sum_bound(in, e.abs_sum)) << r << "," << o;
      }
  }
}

TEST(LinearReference, Fp4MatchesDoubleWithinSummationBound) {
  std::mt19937 rng(2);
  for (auto [rows, out, in] : {std::tuple{1, 1, 32}, {3, 45, 96}, {4, 70, 512}}) {
    auto x = test::random_fp8_acts(rng, rows, in);
    auto w = test::random_fp4_weight(rng, out, in);
    std::vector<float> y(static_cast<size_t>(rows * out), -1.0f);
    reference_linear_kernels().fp4_gemm(x.view(), w.view(), y.data(), nullptr);
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) {
        Exact e = test::exact_fp4(x.view(), w.view(), r, o);
        EXPECT_NEAR(y[r * out + o], e.value, test::fp32_sum_bound(in, e.abs_sum)) << r << "," << o;
      }
  }
}

TEST(LinearReference, Bf16MatchesDoubleWithinSummationBound) {
  std::mt19937 rng(3);
  for (auto [rows, out, in] : {std::tuple{1, 1, 1}, {3, 45, 7}, {2, 17, 5120}}) {
    for (bool bf16_x : {true, false}) {
      auto x = test::random_floats(rng, rows * in, bf16_x);
      auto w = test::random_bf16_weight(rng, out, in);
      std::vector<float> y(static_cast<size_t>(rows * out), -1.0f);
      reference_linear_kernels().bf16_gemm(x.data(), rows, w.view(), y.data(), nullptr);
      for (int r = 0; r < rows; ++r)
        for (int o = 0; o < out; ++o) {
          Exact e = test::exact_bf16(x.data(), w.view(), r, o);
          EXPECT_NEAR(y[r * out + o], e.value, test::fp32_sum_bound(in, e.abs_sum)) << r << "," << o;
        }
    }
  }
}

// Codes whose values are small dyadic numbers: every partial and the whole sum fit in 24 bits, so fp32 is
// exact in any order and the reference must equal the double result bit for bit.
TEST(LinearReference, ExactWhereFp32IsExact) {
  std::mt19937 rng(4);
  // e4m3 codes of ±{0, 0.5, 1, 1.5, 2, 3, 4} and e2m1 codes (all are of that kind).
  const uint8_t e4m3_small[] = {0x00, 0x30, 0x38, 0x3c, 0x40, 0x44, 0x48, 0x80, 0xb0, 0xb8, 0xbc, 0xc0, 0xc4, 0xc8};
  const int rows = 3, out = 40, in = 128;
  auto x = test::random_fp8_acts(rng, rows, in, 125, 129);
  auto w8 = test::random_fp8_weight(rng, out, in, 125, 129);
  auto w4 = test::random_fp4_weight(rng, out, in, 125, 129);
  for (auto& c : x.codes) c = e4m3_small[rng() % std::size(e4m3_small)];
  for (auto& c : w8.codes) c = e4m3_small[rng() % std::size(e4m3_small)];
  std::vector<float> y8(rows * out), y4(rows * out);
  reference_linear_kernels().fp8_gemm(x.view(), w8.view(), y8.data(), nullptr);
  reference_linear_kernels().fp4_gemm(x.view(), w4.view(), y4.data(), nullptr);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      EXPECT_EQ(y8[r * out + o], static_cast<float>(test::exact_fp8(x.view(), w8.view(), r, o).value));
      EXPECT_EQ(y4[r * out + o], static_cast<float>(test::exact_fp4(x.view(), w4.view(), r, o).value));
    }
  // bf16 with integer values: exact too.
  std::vector<float> xf(rows * in);
  for (auto& v : xf) v = static_cast<float>(static_cast<int>(rng() % 9) - 4);
  test::Bf16WeightData wb;
  wb.out = out;
  wb.in = in;
  for (int i = 0; i < out * in; ++i) wb.data.push_back(f32_to_bf16(static_cast<float>(static_cast<int>(rng() % 7) - 3)));
  std::vector<float> yb(rows * out);
  reference_linear_kernels().bf16_gemm(xf.data(), rows, wb.view(), yb.data(), nullptr);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o)
      EXPECT_EQ(yb[r * out + o], static_cast<float>(test::exact_bf16(xf.data(), wb.view(), r, o).value));
}

// The weight scale of FP8 rows is per 32 output rows: rows 31 and 32 of a weight must use different scales.
TEST(LinearReference, Fp8WeightScaleIsPer32x32Block) {
  test::Fp8WeightData w;
  w.out = 33;
  w.in = 64;
  w.codes.assign(33 * 64, 0x38);  // 1.0
  w.scales = {127, 128, 129, 131};  // [2, 2]: blocks (0,0)=1 (0,1)=2 (1,0)=4 (1,1)=16
  test::Fp8ActData x;
  x.rows = 1;
  x.k = 64;
  x.codes.assign(64, 0x38);
  x.scales = {127, 127};
  std::vector<float> y(33);
  reference_linear_kernels().fp8_gemm(x.view(), w.view(), y.data(), nullptr);
  EXPECT_EQ(y[0], 32.0f * 1 + 32.0f * 2);
  EXPECT_EQ(y[31], 32.0f * 1 + 32.0f * 2);
  EXPECT_EQ(y[32], 32.0f * 4 + 32.0f * 16);
}

// kernel.py applies the scales as (partial * sa) * sw. With sa = 2^120, sw = 2^-100 and partial = 2^17
// the first product overflows to inf; partial * (sa * sw) would be finite. This pins the order.
TEST(LinearReference, ScaleOrderIsActivationScaleThenWeightScale) {
  test::Fp8ActData x;
  x.rows = 1;
  x.k = 32;
  x.codes.assign(32, 0x78);  // 256
  x.scales = {static_cast<uint8_t>(127 + 120)};
  test::Fp8WeightData w;
  w.out = 1;
  w.in = 32;
  w.codes.assign(32, 0x48);  // 4 -> partial = 32 * 1024 = 2^15
  w.scales = {static_cast<uint8_t>(127 - 100)};
  std::vector<float> y(1);
  reference_linear_kernels().fp8_gemm(x.view(), w.view(), y.data(), nullptr);
  EXPECT_TRUE(std::isinf(y[0])) << y[0];
  test::Fp4WeightData w4;
  w4.out = 1;
  w4.in = 32;
  w4.packed.assign(16, 0x66);  // 4, 4
  w4.scales = {static_cast<uint8_t>(127 - 100)};
  reference_linear_kernels().fp4_gemm(x.view(), w4.view(), y.data(), nullptr);
  EXPECT_TRUE(std::isinf(y[0])) << y[0];
}

// The FP4 low nibble is the even k: a weight with only the low nibble set reads activation k = 0, 2, ...
TEST(LinearReference, Fp4LowNibbleIsEvenK) {
  test::Fp8ActData x;
  x.rows = 1;
  x.k = 32;
  x.codes.assign(32, 0);
  for (int j = 0; j < 32; j += 2) x.codes[j] = 0x38;  // 1.0 at even k
  x.scales = {127};
  test::Fp4WeightData w;
  w.out = 2;
  w.in = 32;
  w.packed.assign(32, 0);
  for (int i = 0; i < 16; ++i) w.packed[i] = 0x02;        // row 0: low nibble 1.0
  for (int i = 16; i < 32; ++i) w.packed[i] = 0x20;       // row 1: high nibble 1.0
  w.scales = {127, 127};
  std::vector<float> y(2);
  reference_linear_kernels().fp4_gemm(x.view(), w.view(), y.data(), nullptr);
  EXPECT_EQ(y[0], 16.0f);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(LinearReference, PoolDoesNotChangeResultsAndZeroRowsWritesNothing) {
  std::mt19937 rng(5);
  auto x = test::random_fp8_acts(rng, 4, 96);
  auto w = test::random_fp8_weight(rng, 50, 96);
  std::vector<float> a(200), b(200);
  ThreadPool pool(2);
  reference_linear_kernels().fp8_gemm(x.view(), w.view(), a.data(), nullptr);
  reference_linear_kernels().fp8_gemm(x.view(), w.view(), b.data(), &pool);
  EXPECT_EQ(a, b);
  Fp8Activations none{x.codes.data(), x.scales.data(), 0, 96};
  std::vector<float> untouched(4, 7.0f);
  reference_linear_kernels().fp8_gemm(none, w.view(), untouched.data(), nullptr);
  EXPECT_EQ(untouched, std::vector<float>(4, 7.0f));
}

// wo_a's bf16 linear from its FP8 codes: the bits of the BF16 reference on convert.py's dequantised copy, from
// either byte order, with and without a pool.
TEST(LinearReference, Fp8AsBf16IsTheBf16LinearOfTheDequantisedWeight) {
  std::mt19937 rng(31);
  ThreadPool pool(2);
  for (const auto& [rows, out, in] : {std::tuple{1, 16, 32}, {3, 7, 96}, {5, 64, 1056}, {2, 48, 4096}}) {
    const auto x = test::random_floats(rng, rows * in, true);
    const auto w = test::random_fp8_weight(rng, out, in);
    const auto copy = test::dequantised_bf16(w);
    std::vector<float> want(static_cast<size_t>(rows * out)), got(want.size(), -7.0f);
    reference_linear_kernels().bf16_gemm(x.data(), rows, copy.view(), want.data(), nullptr);
    reference_linear_kernels().fp8_as_bf16_gemm(x.data(), rows, w.view(), got.data(), &pool);
    EXPECT_EQ(got, want) << rows << "x" << out << "x" << in;
    if (!tile_major_possible(out, in)) continue;
    auto tiled = w;
    repack_fp8_tile_major(w.codes.data(), out, in, tiled.codes.data());
    Fp8Weight view = tiled.view();
    view.tile_major = true;
    std::fill(got.begin(), got.end(), -7.0f);
    reference_linear_kernels().fp8_as_bf16_gemm(x.data(), rows, view, got.data(), nullptr);
    EXPECT_EQ(got, want) << rows << "x" << out << "x" << in << " tile-major";
  }
}

TEST(LinearChecks, RejectMismatchedShapes) {
  uint8_t byte = 0;
  uint16_t half = 0;
  Fp8Activations x{&byte, &byte, 1, 64};
  EXPECT_TRUE(check_fp8_linear(x, Fp8Weight{&byte, &byte, 8, 64}).ok());
  EXPECT_FALSE(check_fp8_linear(x, Fp8Weight{&byte, &byte, 8, 96}).ok());
  Fp8Activations x40{&byte, &byte, 1, 40};
  Status s = check_fp8_linear(x40, Fp8Weight{&byte, &byte, 8, 40});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s.message();
  EXPECT_TRUE(check_fp4_linear(x, Fp4Weight{&byte, &byte, 8, 64}).ok());
  EXPECT_FALSE(check_fp4_linear(x, Fp4Weight{nullptr, &byte, 8, 64}).ok());
  EXPECT_TRUE(check_bf16_linear(7, Bf16Weight{&half, 3, 7}).ok());
  EXPECT_FALSE(check_bf16_linear(8, Bf16Weight{&half, 3, 7}).ok());
  EXPECT_TRUE(check_fp8_as_bf16_linear(64, Fp8Weight{&byte, &byte, 8, 64}).ok());
  EXPECT_FALSE(check_fp8_as_bf16_linear(96, Fp8Weight{&byte, &byte, 8, 64}).ok());
  EXPECT_FALSE(check_fp8_as_bf16_linear(40, Fp8Weight{&byte, &byte, 8, 40}).ok());
  EXPECT_FALSE(check_fp8_as_bf16_linear(64, Fp8Weight{&byte, &byte, 8, 64, true}).ok());  // 8 outputs: no tiles
}

}  // namespace
}  // namespace dsflash

namespace dsflash {
namespace {

// linear_fp8 / linear_fp4 = act_quant_block32 of every row, then the GEMM, for every kernel set.
TEST(LinearFused, EqualsActQuantThenGemm) {
  std::mt19937 rng(21);
  const int rows = 5, out = 37, in = 160;
  auto x = test::random_floats(rng, rows * in, true);
  auto w8 = test::random_fp8_weight(rng, out, in);
  auto w4 = test::random_fp4_weight(rng, out, in);
  std::vector<uint8_t> codes(rows * in), scales(rows * in / 32);
  for (int r = 0; r < rows; ++r) act_quant_block32(x.data() + r * in, in, codes.data() + r * in, scales.data() + r * in / 32);
  const Fp8Activations q{codes.data(), scales.data(), rows, in};
  std::vector<float> want8(rows * out), want4(rows * out);
  reference_linear_kernels().fp8_gemm(q, w8.view(), want8.data(), nullptr);
  reference_linear_kernels().fp4_gemm(q, w4.view(), want4.data(), nullptr);
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<float> got(rows * out, -1.0f);
    linear_fp8(x.data(), rows, w8.view(), got.data(), reference_linear_kernels(), p);
    EXPECT_EQ(got, want8);
    linear_fp4(x.data(), rows, w4.view(), got.data(), reference_linear_kernels(), p);
    EXPECT_EQ(got, want4);
    // The fast set on the same quantised operands stays within the reordering bound of test_linear_fast.
    linear_fp8(x.data(), rows, w8.view(), got.data(), best_linear_kernels(), p);
    for (int i = 0; i < rows * out; ++i) {
      test::Exact e = test::exact_fp8(q, w8.view(), i / out, i % out);
      EXPECT_NEAR(got[i], want8[i], 2 * test::fp32_sum_bound(in, e.abs_sum));
    }
  }
}

// The subnormal and NaN e4m3 codes are exactly those whose value is NaN or below e4m3's smallest normal (2^-6) and
// not zero; the FP8 copy marks each tile's 32-k block that holds none of them, on the pool or not.
TEST(TileMajor, Fp8PlainCodeBlocksMarkTheBlocksWithoutSubnormalOrNanCodes) {
  for (int c = 0; c < 256; ++c) {
    const float v = std::fabs(linear_decode_tables().e4m3_f32[c]);
    EXPECT_EQ(fp8_code_is_subnormal_or_nan(static_cast<uint8_t>(c)), std::isnan(v) || (v > 0 && v < 0x1p-6f)) << c;
  }
  const int64_t out = 48, in = 192, kb = in / 32;
  std::mt19937 rng(8);
  std::vector<uint8_t> codes(static_cast<size_t>(out * in));
  for (auto& c : codes) c = static_cast<uint8_t>((rng() % 0x77 + 8) | rng() % 2 * 0x80);  // zero-free, normal
  ThreadPool pool(3);
  std::vector<uint8_t> tiled(codes.size()), plain(static_cast<size_t>(fp8_plain_code_block_count(out, in)));
  std::vector<uint8_t> on_pool(plain.size());
  auto flags_of = [&](const std::vector<uint8_t>& from) {
    repack_fp8_tile_major(from.data(), out, in, tiled.data(), nullptr, plain.data());
    repack_fp8_tile_major(from.data(), out, in, tiled.data(), &pool, on_pool.data());
    EXPECT_EQ(on_pool, plain);
    return plain;
  };
  EXPECT_EQ(flags_of(codes), std::vector<uint8_t>(plain.size(), 1));
  codes[0] = 0x00;  // zeros are plain
  codes[5] = 0x80;
  EXPECT_EQ(flags_of(codes), std::vector<uint8_t>(plain.size(), 1));
  // (output, k, code): one subnormal or NaN each, in different tile blocks.
  const std::tuple<int64_t, int64_t, uint8_t> odd[] = {{0, 1, 0x01}, {17, 70, 0x87}, {31, 191, 0x7f}, {47, 96, 0xff},
                                                      {40, 33, 0x04}};
  std::vector<uint8_t> want(plain.size(), 1);
  for (const auto& [o, k, code] : odd) {
    codes[static_cast<size_t>(o * in + k)] = code;
    want[static_cast<size_t>(o / 16 * kb + k / 32)] = 0;
  }
  EXPECT_EQ(flags_of(codes), want);
}

// Every code and FP4 scale lands at its documented place (kernels/linear.h), the block accessors give back the
// row-major block, and the layout is possible only on whole tiles and blocks.
// The copies write a tile in chunks of 64 vectors (kernels/linear_dispatch.cpp): in = 192 fits one chunk, 1056 spans
// several and a partial one, for the FP8 codes (264 vectors) and the MXFP4 ones (132).
void expect_repack_puts_every_code_at_its_offset(int64_t in) {
  SCOPED_TRACE("in " + std::to_string(in));
  const int64_t out = 48;
  std::mt19937 rng(5);
  std::vector<uint8_t> codes(static_cast<size_t>(out * in)), packed(static_cast<size_t>(out * in / 2));
  for (auto& b : codes) b = static_cast<uint8_t>(rng());
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> codes_tiled(codes.size()), packed_tiled(packed.size());
  repack_fp8_tile_major(codes.data(), out, in, codes_tiled.data());
  repack_fp4_tile_major(packed.data(), out, in, packed_tiled.data());
  ThreadPool pool(3);
  std::vector<uint8_t> on_pool(codes.size());
  repack_fp8_tile_major(codes.data(), out, in, on_pool.data(), &pool);
  EXPECT_EQ(on_pool, codes_tiled);
  on_pool.assign(packed.size(), 0);
  repack_fp4_tile_major(packed.data(), out, in, on_pool.data(), &pool);
  EXPECT_EQ(on_pool, packed_tiled);
  std::vector<uint8_t> scales(static_cast<size_t>(out * in / 32)), scales_tiled(scales.size());
  for (auto& b : scales) b = static_cast<uint8_t>(rng());
  repack_fp4_scales_tile_major(scales.data(), out, in, scales_tiled.data());
  on_pool.assign(scales.size(), 0);
  repack_fp4_scales_tile_major(scales.data(), out, in, on_pool.data(), &pool);
  EXPECT_EQ(on_pool, scales_tiled);
  const Fp8Weight w8{codes_tiled.data(), scales.data(), out, in, true};
  const Fp4Weight w4{packed_tiled.data(), scales_tiled.data(), out, in, true};
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) {
      ASSERT_EQ(codes_tiled[static_cast<size_t>(fp8_tile_major_offset(o, k, in))], codes[static_cast<size_t>(o * in + k)])
          << o << "," << k;
      const NibbleOffset at = fp4_tile_major_offset(o, k, in);
      const uint8_t byte = packed[static_cast<size_t>(o * in / 2 + k / 2)];
      ASSERT_EQ((packed_tiled[static_cast<size_t>(at.byte)] >> at.shift) & 0xf, k % 2 == 0 ? byte & 0xf : byte >> 4)
          << o << "," << k;
    }
    for (int64_t b = 0; b < in / 32; ++b) {
      ASSERT_EQ(scales_tiled[static_cast<size_t>(fp4_scale_index(o, b, in / 32, true))],
                scales[static_cast<size_t>(fp4_scale_index(o, b, in / 32, false))]);
      uint8_t scratch8[32], scratch16[16];
      ASSERT_EQ(std::memcmp(fp8_block_codes(w8, o, b, scratch8), codes.data() + o * in + 32 * b, 32), 0) << o << "," << b;
      ASSERT_EQ(std::memcmp(fp4_block_packed(w4, o, b, scratch16), packed.data() + o * in / 2 + 16 * b, 16), 0)
          << o << "," << b;
    }
  }
  // The FP8 copy reports NaN codes (0x7f, 0xff) wherever they are, on the pool or not, and only those.
  std::vector<uint8_t> numbers(codes.size());
  for (auto& c : numbers) c = static_cast<uint8_t>(rng() % 0x7f) | static_cast<uint8_t>(rng() % 2 * 0x80);
  EXPECT_FALSE(repack_fp8_tile_major(numbers.data(), out, in, on_pool.data()));
  EXPECT_FALSE(repack_fp8_tile_major(numbers.data(), out, in, on_pool.data(), &pool));
  for (const size_t at : {size_t{0}, numbers.size() / 2 + 5, numbers.size() - 1})
    for (const uint8_t nan : {0x7f, 0xff}) {
      std::vector<uint8_t> one_nan = numbers;
      one_nan[at] = nan;
      EXPECT_TRUE(repack_fp8_tile_major(one_nan.data(), out, in, on_pool.data())) << at;
      EXPECT_TRUE(repack_fp8_tile_major(one_nan.data(), out, in, on_pool.data(), &pool)) << at;
    }
}

TEST(TileMajor, RepackPutsEveryCodeAtItsOffset) {
  for (const int64_t in : {192, 1056}) expect_repack_puts_every_code_at_its_offset(in);
  const int64_t out = 48, in = 192;
  // Output 17, k 65: tile 1, vector 16, lane group 0, k%4 = 1 -> byte 8 * 0 + 2 * 1 + 1 of that vector.
  EXPECT_EQ(fp8_tile_major_offset(17, 65, in), 16 * in + 16 * 64 + 2 + 1);
  // Output 17, k 13: tile 1, vector 1, word 2 * 1 + 1, nibble 2 -> the high byte of that word, low nibble.
  EXPECT_EQ(fp4_tile_major_offset(17, 13, in).byte, 16 * in / 2 + 64 + 2 * 3 + 1);
  EXPECT_EQ(fp4_tile_major_offset(17, 13, in).shift, 0);
  // Output 17, block 5: tile 1, the 16 scales of block 5, lane 1.
  EXPECT_EQ(fp4_scale_index(17, 5, in / 32, true), 16 * (in / 32) + 16 * 5 + 1);
  EXPECT_TRUE(tile_major_possible(out, in));
  EXPECT_FALSE(tile_major_possible(40, in));
  EXPECT_FALSE(tile_major_possible(out, 48));
}

// An expert's w1 and w3 as one weight (repack_fp4_pair_tile_major): its tiles alternate between the two weights'
// own tile-major tiles, on the pool or not, and every table's GEMM on it gives each weight's own bits at
// fp4_pair_column (w1) and 16 columns further (w3).
TEST(TileMajor, PairAlternatesTheTwoWeightsTiles) {
  const int64_t out = 48, in = 192, tile_bytes = 16 * in / 2, tile_scales = 16 * in / 32;
  std::mt19937 rng(8);
  const test::Fp4WeightData a = test::random_fp4_weight(rng, out, in), b = test::random_fp4_weight(rng, out, in);
  std::vector<uint8_t> packed(static_cast<size_t>(2 * out * in / 2)), scales(static_cast<size_t>(2 * out * in / 32));
  repack_fp4_pair_tile_major(a.view(), b.view(), packed.data(), scales.data());
  ThreadPool pool(3);
  std::vector<uint8_t> packed_on_pool(packed.size()), scales_on_pool(scales.size());
  repack_fp4_pair_tile_major(a.view(), b.view(), packed_on_pool.data(), scales_on_pool.data(), &pool);
  EXPECT_EQ(packed_on_pool, packed);
  EXPECT_EQ(scales_on_pool, scales);
  test::Fp4WeightData a_tiled = a, b_tiled = b;
  for (test::Fp4WeightData* w : {&a_tiled, &b_tiled}) {
    const test::Fp4WeightData& from = w == &a_tiled ? a : b;
    repack_fp4_tile_major(from.packed.data(), out, in, w->packed.data());
    repack_fp4_scales_tile_major(from.scales.data(), out, in, w->scales.data());
  }
  for (int64_t t = 0; t < 2 * out / 16; ++t) {
    const test::Fp4WeightData& from = t % 2 == 0 ? a_tiled : b_tiled;
    ASSERT_EQ(std::memcmp(packed.data() + t * tile_bytes, from.packed.data() + t / 2 * tile_bytes, tile_bytes), 0) << t;
    ASSERT_EQ(std::memcmp(scales.data() + t * tile_scales, from.scales.data() + t / 2 * tile_scales, tile_scales), 0)
        << t;
  }
  EXPECT_EQ(fp4_pair_column(0), 0);
  EXPECT_EQ(fp4_pair_column(17), 33);
  const Fp4Weight pair{packed.data(), scales.data(), 2 * out, in, true};
  Fp4Weight a_view = a_tiled.view(), b_view = b_tiled.view();
  a_view.tile_major = b_view.tile_major = true;
  for (const LinearKernels* k : linear_impl::available_kernels())
    for (const int64_t rows : {1, 3, 12}) {
      const test::Fp8ActData x = test::random_fp8_acts(rng, rows, in);
      std::vector<float> both(static_cast<size_t>(rows * 2 * out)), ya(static_cast<size_t>(rows * out)), yb(ya.size());
      k->fp4_gemm(x.view(), pair, both.data(), &pool);
      k->fp4_gemm(x.view(), a_view, ya.data(), &pool);
      k->fp4_gemm(x.view(), b_view, yb.data(), &pool);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
          const int64_t at = r * 2 * out + fp4_pair_column(o);
          ASSERT_EQ(std::bit_cast<uint32_t>(both[at]), std::bit_cast<uint32_t>(ya[r * out + o]))
              << k->name << " w1 " << o;
          ASSERT_EQ(std::bit_cast<uint32_t>(both[at + 16]), std::bit_cast<uint32_t>(yb[r * out + o]))
              << k->name << " w3 " << o;
        }
    }
}

}  // namespace
}  // namespace dsflash
