// The AVX-512 tables' MXFP4 decode through integers (src/kernels/linear_avx512_tiled.cpp): the activations' integer
// pieces (linear_impl::prepare_exact_fp4_rows) and the results of 1..13 rows against a scalar model of the bf16
// chain those integers stand in for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/linear.h"
#include "kernels/linear_impl.h"
#include "test_linear_util.h"

namespace dsflash {
namespace {

// The AVX-512 tables (without the AVX2 one, whose MXFP4 decode sums a block in an order of its own).
std::vector<const LinearKernels*> avx512_tables() {
  std::vector<const LinearKernels*> tables;
  for (const LinearKernels* k : {linear_impl::avx512_kernels_multiplying(linear_impl::RowsMultiply::kBf16Dot),
                                 linear_impl::avx512_kernels_multiplying(linear_impl::RowsMultiply::kFp32Fma),
                                 linear_impl::amx_kernels()})
    if (k != nullptr) tables.push_back(k);
  return tables;
}

// The bits of the AVX-512 tables' bf16 chain (MODEL.md §4.9 block formula, each block's 32 products added pair by
// pair, the odd element first): one output of one row, from row-major weights.
float chain_fp4(const Fp8Activations& x, const Fp4Weight& w, int64_t r, int64_t o) {
  const int64_t kb = w.in / 32;
  float y = 0.0f;
  for (int64_t b = 0; b < kb; ++b) {
    auto product_term = [&](int64_t k, float acc) {
      const uint8_t byte = w.packed[o * (w.in / 2) + k / 2];
      return std::fma(e4m3_to_f32(x.codes[r * w.in + k]), e2m1_to_f32(k % 2 == 0 ? byte & 15 : byte >> 4), acc);
    };
    float partial = 0.0f;
    for (int64_t k = 32 * b; k < 32 * b + 32; k += 2) partial = product_term(k, product_term(k + 1, partial));
    y = y + (partial * e8m0_to_f32(x.scales[r * kb + b])) * e8m0_to_f32(w.scales[o * kb + b]);
  }
  return y;
}

// prepare_exact_fp4_rows: every code's value is N * unit * 2 with N = 65536 * p2 + 256 * p1 + p0 read from the
// pieces in their documented order, the bias is -12 * Σ N of the block, a block takes 3 pieces exactly where p2 is
// not all 0, and it keeps the chain (count 0) exactly where a NaN or 12 Σ |N| >= 2^24 forbids the integers.
TEST(LinearExactFp4, PiecesHoldTheCodesValues) {
  if (linear_impl::avx512_kernels() == nullptr) GTEST_SKIP() << "no AVX-512 on this CPU";
  struct Case {
    std::vector<uint8_t> set;  // the block's first codes, the rest 0
    int pieces;
  };
  // 448 = 14 * 2^(15-10) and 0.125 = 8 * 2^(4-10): N(448) = 14 << 11 = 28672, two pieces. Beside 0.0625 (e' 3) it is
  // 14 << 12 = 57344, beside 2^-9 (the subnormal 1 * 2^(1-10)) 14 << 14 = 229376: three pieces. Six 448s and a 2^-9
  // sum to 12 * 1376257 < 2^24 of them; seven do not.
  const std::vector<uint8_t> six(6, 0x7E), seven(7, 0x7E);
  auto with = [](std::vector<uint8_t> codes, uint8_t last) {
    codes.push_back(last);
    return codes;
  };
  const Case cases[] = {{{0x7E, 0x20}, 2},       {{0x7E, 0x18}, 3},        {{0xFE, 0xA0, 0x7E}, 2},
                        {{0x38, 0x01, 0x81}, 2}, {{0x7E, 0x01}, 3},        {{0x38, 0x7F}, 0},
                        {{0xFF}, 0},             {{0x00, 0x80}, 2},        {{}, 2},
                        {{0x77, 0x40, 0x29}, 2}, {{0x7E, 0x20, 0xA1}, 2},  {with(six, 0x01), 3},
                        {with(seven, 0x01), 0},  {with(six, 0x81), 3},     {{0xFE, 0x81}, 3}};
  std::mt19937 rng(5);
  std::vector<uint8_t> codes;
  std::vector<int> expected;
  for (const Case& c : cases) {
    std::vector<uint8_t> block(32, 0x00);
    std::copy(c.set.begin(), c.set.end(), block.begin());
    std::shuffle(block.begin(), block.end(), rng);
    codes.insert(codes.end(), block.begin(), block.end());
    expected.push_back(c.pieces);
  }
  const int64_t k = 32 * 8;  // two rows of 8 blocks, beside 2 left over: the rows' strides show
  while (codes.size() < 2 * k) {
    for (int i = 0; i < 32; ++i) {  // random codes of exponent fields 8..15: steps within 2^7, always 2 pieces
      const auto code = static_cast<uint8_t>((rng() & 0x80) | (8 + rng() % 8) << 3 | (rng() & 7));
      codes.push_back((code & 0x7F) == 0x7F ? code - 1 : code);  // not NaN
    }
    expected.push_back(2);
  }
  const size_t blocks = expected.size();
  std::vector<int8_t> pieces(blocks * linear_impl::kExactFp4PieceBlockBytes, -1);
  std::vector<int32_t> biases(blocks, -1);
  std::vector<float> units(blocks, -1.0f);
  std::vector<uint8_t> counts(blocks, 9);
  linear_impl::prepare_exact_fp4_rows(codes.data(), 2, k, pieces.data(), biases.data(), units.data(), counts.data());
  constexpr int kPosition[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // of k0 + m in the order 0 4 1 5 2 6 3 7
  for (size_t b = 0; b < blocks; ++b) {
    ASSERT_EQ(counts[b], expected[b]) << "block " << b;
    ASSERT_EQ(units[b] != 0.0f, expected[b] != 0) << "block " << b;
    if (expected[b] == 0) continue;
    int32_t sum = 0;
    bool third = false;
    for (int i = 0; i < 32; ++i) {
      const uint8_t code = codes[32 * b + i];
      const int8_t* vector = pieces.data() + linear_impl::kExactFp4PieceBlockBytes * b +
                             linear_impl::kExactFp4PieceVectorBytes * (i / 8);
      const int at = kPosition[i % 8];
      const int32_t n = 65536 * vector[16 + at] + 256 * vector[8 + at] + vector[at];
      third |= vector[16 + at] != 0;
      ASSERT_EQ(static_cast<float>(n) * units[b] * 2.0f, e4m3_to_f32(code)) << "block " << b << " code " << int{code};
      sum += n;
    }
    ASSERT_EQ(biases[b], -12 * sum) << "block " << b;
    ASSERT_EQ(third, expected[b] == 3) << "block " << b;
  }
}

// 1..13 rows on tile-major weights (passes of 1-4 rows, through integers where the pass takes them: every pass on the
// FMA table, passes of 1 and 2 rows on the vdpbf16ps one (tiled_fp4_takes_integers; 5 rows run a pass of 2 and one of 3
// rows on the chain); from 5 rows AMX tiles where the CPU has them) give the chain's bits on blocks of every kind:
// narrow (two pieces), wide (three), past the exact bound (the chain), a NaN, zeros, and random codes; rows mix them
// within a pass, so a pass's blocks take the most pieces any row needs or the chain. The weights are mostly e2m1's
// extremes (+-0.5, +-6), where sums past the bound round.
TEST(LinearExactFp4, RowsThroughIntegersGiveTheChainsBits) {
  const std::vector<const LinearKernels*> tables = avx512_tables();
  if (tables.empty()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  std::mt19937 rng(61);
  ThreadPool pool(2);
  const uint8_t extreme_codes[] = {0x1, 0x7, 0x9, 0xf};  // e2m1 0.5, 6, -0.5, -6
  int inexact_results = 0;  // outputs where rounding the blocks' exact sums would not give the chain's bits
  int kinds[4] = {};        // the blocks' piece counts (0, 2, 3) over the fixtures
  for (const auto& [out, in] : {std::pair{48, 320}, std::pair{64, 1184}, std::pair{80, 96}}) {
    test::Fp4WeightData w4 = test::random_fp4_weight(rng, out, in, 124, 130);
    for (auto& c : w4.packed)
      if (rng() % 4 != 0) c = static_cast<uint8_t>(extreme_codes[rng() % 4] | extreme_codes[rng() % 4] << 4);
    const test::OrderedWeights w = test::in_order(test::random_fp8_weight(rng, out, in), w4, true);
    const int64_t kb = in / 32;
    for (const int64_t rows : {1, 2, 3, 4, 5, 7, 8, 13}) {
      test::Fp8ActData x = test::random_fp8_acts(rng, rows, in, 118, 134);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < kb; ++b) {
          uint8_t* block = x.codes.data() + r * in + 32 * b;
          const int kind = static_cast<int>(rng() % 6);
          auto sign = [&] { return static_cast<uint8_t>(rng() & 0x80); };
          if (kind == 0)  // exponent fields 8..12: two pieces
            for (int i = 0; i < 32; ++i) block[i] = static_cast<uint8_t>((0x40 + rng() % 40) | sign());
          if (kind == 1 || kind == 2) {  // a 2^-9 beside two (wide) or eight to 31 (past the bound) 448s
            std::fill(block, block + 32, 0x00);
            const int large = kind == 1 ? 2 : 8 + static_cast<int>(rng() % 24);
            for (int i = 0; i < large; ++i) block[i] = static_cast<uint8_t>(0x7E | sign());
            block[large] = static_cast<uint8_t>(0x01 | sign());
            std::shuffle(block, block + 32, rng);
          }
          if (kind == 3) std::fill(block, block + 32, 0x00);
          // kind 4, 5: random finite codes
        }
      if (rows >= 3) x.codes[2 * in + 32 * (kb / 2) + 3] = 0x7F;  // a NaN: row 2's outputs are all NaN
      const Fp8Activations view = x.view();
      {
        std::vector<int8_t> pieces(static_cast<size_t>(rows * kb * linear_impl::kExactFp4PieceBlockBytes));
        std::vector<int32_t> biases(static_cast<size_t>(rows * kb));
        std::vector<float> units(biases.size());
        std::vector<uint8_t> counts(biases.size());
        linear_impl::prepare_exact_fp4_rows(x.codes.data(), rows, in, pieces.data(), biases.data(), units.data(),
                                            counts.data());
        for (const uint8_t c : counts) ++kinds[c];
      }
      std::vector<float> want(static_cast<size_t>(rows * out));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
          want[r * out + o] = chain_fp4(view, w4.view(), r, o);
          // The same formula with each block's sum rounded once from its exact value, as integers would give.
          float rounded = 0.0f;
          for (int64_t b = 0; b < kb; ++b) {
            double sum = 0;
            for (int64_t k = 32 * b; k < 32 * b + 32; ++k) {
              const uint8_t byte = w4.packed[o * (in / 2) + k / 2];
              sum += static_cast<double>(e4m3_to_f32(x.codes[r * in + k])) * e2m1_to_f32(k % 2 == 0 ? byte & 15 : byte >> 4);
            }
            rounded = rounded + (static_cast<float>(sum) * e8m0_to_f32(x.scales[r * kb + b])) *
                                    e8m0_to_f32(w4.scales[o * kb + b]);
          }
          const float chain = want[r * out + o];
          inexact_results += !std::isnan(chain) && std::memcmp(&chain, &rounded, sizeof(float)) != 0;
        }
      for (const LinearKernels* k : tables)
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<float> got(want.size(), -7.0f);
          k->fp4_gemm(view, w.fp4(), got.data(), p);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t o = 0; o < out; ++o) {
              const float g = got[r * out + o], c = want[r * out + o];
              ASSERT_TRUE(std::memcmp(&g, &c, sizeof(float)) == 0 || (std::isnan(g) && std::isnan(c)))
                  << k->name << " out " << out << " in " << in << " rows " << rows << " row " << r << " output " << o
                  << (p ? " pool" : "") << ": " << g << " chain " << c;
              ASSERT_EQ(std::isnan(g), r == 2) << k->name << " rows " << rows << " row " << r << " output " << o;
            }
        }
    }
  }
  // The fixture's own checks: every kind of block, and sums where integers in place of the chain would show.
  EXPECT_GT(kinds[0], 0);
  EXPECT_GT(kinds[2], 0);
  EXPECT_GT(kinds[3], 0);
  EXPECT_GT(inexact_results, 0);
}

}  // namespace
}  // namespace dsflash
