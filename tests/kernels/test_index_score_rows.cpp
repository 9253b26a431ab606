// Indexer scores from stored MXFP4 key rows (kernels/index_score.h IndexScoreRowsArgs): every table's
// index_scores_rows equals the oracle (rows dequantised + in-order fp32 dots) bit for bit on random shapes, ragged
// key tails and query counts; also where the exact-integer path must fall back: scales far apart within a row
// (partial sums past 2^24 ulps: random, flat q at the largest magnitude, and a built sum whose fp32 rounding shows
// in the bf16 score), tiny scales (below the normal range), NaN scales, and q that is not MXFP4-shaped; and q blocks
// that are all zero against the extreme key scales (2^-127, and from 2^126 on, where key values overflow).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/backend.h"
#include "kernels/index_score.h"
#include "test_backend_util.h"

namespace dsflash {
namespace {

struct Case {
  std::vector<float> q, w;
  std::vector<std::vector<uint8_t>> rows;
  int64_t queries = 0, keys = 0;
  int heads = 0;
  int64_t dim = 0;
};

// q: normal values through the MXFP4 fake quantiser (what the indexer feeds); keys: random nibbles and ue8m0
// scale codes in [scale_lo, scale_hi]; weights bf16 values.
Case make_case(uint32_t seed, int64_t queries, int64_t keys, int heads, int64_t dim, int scale_lo, int scale_hi,
               float q_sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), scale(scale_lo, scale_hi);
  Case c;
  c.queries = queries;
  c.keys = keys;
  c.heads = heads;
  c.dim = dim;
  c.q.resize(static_cast<size_t>(queries * heads * dim));
  for (float& v : c.q) v = normal(rng) * q_sigma;
  fake_quant_fp4_ue8m0_block32(c.q.data(), static_cast<int64_t>(c.q.size()));
  c.w.resize(static_cast<size_t>(queries * heads));
  for (float& v : c.w) v = std::ldexp(std::round(normal(rng) * 64.0f), -8);
  c.rows.resize(static_cast<size_t>(keys));
  for (auto& row : c.rows) {
    row.resize(static_cast<size_t>(dim / 2 + dim / 32));
    for (int64_t i = 0; i < dim / 2; ++i) row[static_cast<size_t>(i)] = static_cast<uint8_t>(byte(rng));
    for (int64_t b = 0; b < dim / 32; ++b) row[static_cast<size_t>(dim / 2 + b)] = static_cast<uint8_t>(scale(rng));
  }
  return c;
}

std::vector<float> run(const Case& c, void (*kernel)(const IndexScoreRowsArgs&)) {
  std::vector<const uint8_t*> rows;
  for (const auto& row : c.rows) rows.push_back(row.data());
  const int64_t stride = c.keys + 3;
  std::vector<float> scores(static_cast<size_t>(c.queries * stride), 12345.0f);
  IndexScoreRowsArgs a;
  a.q = c.q.data();
  a.weights = c.w.data();
  a.key_rows = rows.data();
  a.scores = scores.data();
  a.num_queries = c.queries;
  a.num_keys = c.keys;
  a.score_stride = stride;
  a.heads = c.heads;
  a.dim = c.dim;
  kernel(a);
  return scores;
}

// A NaN score's sign and payload are unspecified (no table keeps them).
void expect_same_scores(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  test::expect_same_bits(got, want, what, test::NanBits::kAnyNan);
}

std::vector<std::pair<std::string, void (*)(const IndexScoreRowsArgs&)>> kernels() {
  std::vector<std::pair<std::string, void (*)(const IndexScoreRowsArgs&)>> all;
  for (const Backend* b : available_backends()) all.emplace_back(b->name, b->index_scores_rows);
  all.emplace_back("packed16", index_scores_rows_packed16);
  if (IndexScoreRowsKernel vnni = index_scores_rows_vnni()) all.emplace_back("vnni", vnni);
  if (IndexScoreRowsKernel bw = index_scores_rows_avx512bw()) all.emplace_back("avx512bw", bw);
  return all;
}

TEST(IndexScoreRows, EveryTableIsTheOracleOnRandomShapes) {
  uint32_t seed = 1;
  for (int heads : {1, 5, 8, 32}) {
    for (int64_t dim : {32, 64, 128}) {
      for (int64_t keys : {1, 15, 16, 17, 100, 256}) {
        for (int64_t queries : {1, 3}) {
          const Case c = make_case(seed++, queries, keys, heads, dim, 122, 128);
          const std::vector<float> want = run(c, index_scores_rows_reference);
          for (const auto& [name, kernel] : kernels()) {
            expect_same_scores(run(c, kernel), want,
                               name + " heads " + std::to_string(heads) + " dim " + std::to_string(dim) + " keys " +
                                   std::to_string(keys) + " queries " + std::to_string(queries));
          }
        }
      }
    }
  }
}

TEST(IndexScoreRows, FallbacksKeepTheOracleBits) {
  struct Extreme {
    const char* what;
    int scale_lo, scale_hi;
    float q_sigma;
  };
  // far-apart block scales (shift > 11 or partial sums past 2^24), sub-normal products, NaN scale codes, huge q
  const Extreme extremes[] = {{"spread", 100, 140, 1.0f},
                              {"tiny", 0, 4, 1e-30f},
                              {"nan scale", 250, 255, 1.0f},
                              {"large", 200, 230, 1e20f}};
  uint32_t seed = 100;
  for (const Extreme& e : extremes) {
    for (int64_t keys : {7, 33}) {
      const Case c = make_case(seed++, 2, keys, 8, 128, e.scale_lo, e.scale_hi, e.q_sigma);
      const std::vector<float> want = run(c, index_scores_rows_reference);
      for (const auto& [name, kernel] : kernels()) expect_same_scores(run(c, kernel), want, name + " " + e.what);
    }
  }
  // q that is not e2m1 times a power of two (a value between codes): the whole call falls back.
  Case c = make_case(seed++, 2, 20, 4, 64, 124, 127);
  c.q[5] = 0.7f;
  const std::vector<float> want = run(c, index_scores_rows_reference);
  for (const auto& [name, kernel] : kernels()) expect_same_scores(run(c, kernel), want, name + " not MXFP4");
}

TEST(IndexScoreRows, FlatQueriesCheckTheShiftedBoundSum) {
  // Every q element at the largest e2m1 magnitude (|iq| = 12): the bound sum of a head (12 * 12 * 128 = 18432) is
  // too large to skip the per-lane sum of shifted bounds, which then decides between the exact path (close key
  // scales) and the fallback (scales far apart, shifted sums past 2^24).
  uint32_t seed = 300;
  for (const auto& [lo, hi] : {std::pair{124, 127}, std::pair{118, 128}, std::pair{100, 140}}) {
    for (int64_t keys : {16, 37}) {
      Case c = make_case(seed++, 2, keys, 8, 128, lo, hi);
      std::mt19937 rng(seed);
      for (float& v : c.q) v = (rng() & 1 ? 6.0f : -6.0f) * std::ldexp(1.0f, static_cast<int>(rng() % 3) - 1);
      // one power of two per block of 32, as MXFP4 stores them
      for (size_t b = 0; b < c.q.size(); b += 32) {
        const float scale = std::fabs(c.q[b]) / 6.0f;
        for (size_t i = b; i < b + 32; ++i) c.q[i] = std::copysign(6.0f * scale, c.q[i]);
      }
      const std::vector<float> want = run(c, index_scores_rows_reference);
      for (const auto& [name, kernel] : kernels()) {
        expect_same_scores(run(c, kernel), want,
                           name + " flat q, scales " + std::to_string(lo) + ".." + std::to_string(hi));
      }
    }
  }
}

// One head, one key, dim 128, built so that the reference's in-order fp32 sum loses units the exact integer sum
// keeps. Elements 0 and 96 add q·k = 1 unit each (iq 1 against ik 1, beside iq 12 against ik 0, so that their
// blocks' exponent is that of q = 6.0); elements [32, big_end) are q = 6.0 (iq 12) against ik values that sum to
// ik_sum (*ik_left: what no ik could take, 0 when reached). Key scale codes `scales`; the head weight is 1.
Case units_around_a_large_sum(int64_t big_end, int64_t ik_sum, const std::array<uint8_t, 4>& scales,
                              int64_t* ik_left) {
  constexpr int64_t kDim = 128;
  constexpr int kIkCode[13] = {0, 1, 2, 3, 4, -1, 5, -1, 6, -1, -1, -1, 7};  // e2m1 code of the value ik / 2
  Case c;
  c.queries = 1;
  c.keys = 1;
  c.heads = 1;
  c.dim = kDim;
  c.q.assign(static_cast<size_t>(kDim), 0.0f);
  c.w = {1.0f};
  for (int64_t d : {0, 96}) {
    c.q[static_cast<size_t>(d)] = 0.5f;      // iq 1 against ik 1
    c.q[static_cast<size_t>(d + 1)] = 6.0f;  // iq 12 against ik 0
  }
  for (int64_t d = 32; d < big_end; ++d) c.q[static_cast<size_t>(d)] = 6.0f;
  std::vector<uint8_t> row(static_cast<size_t>(kDim / 2 + kDim / 32), 0);
  row[0] = 0x01;   // element 0: ik 1, element 1: ik 0
  row[48] = 0x01;  // element 96: ik 1, element 97: ik 0
  int64_t left = ik_sum;
  for (int64_t d = 32; d < big_end && left > 0; ++d) {
    int ik = 12;
    while (ik > left || kIkCode[ik] < 0) --ik;
    left -= ik;
    row[static_cast<size_t>(d / 2)] |= static_cast<uint8_t>(kIkCode[ik] << (d % 2 == 0 ? 0 : 4));
  }
  *ik_left = left;
  std::copy(scales.begin(), scales.end(), row.begin() + kDim / 2);
  c.rows = {row};
  return c;
}

// Whether the reference's score of c differs from the bf16 of `exact` (the exact dot); if so, every kernel must
// give the reference's bits.
bool reference_rounding_shows(const Case& c, float exact, const std::string& what) {
  const std::vector<float> want = run(c, index_scores_rows_reference);
  if (round_to_bf16(exact) == want[0]) return false;
  for (const auto& [name, kernel] : kernels()) expect_same_scores(run(c, kernel), want, name + " " + what);
  return true;
}

TEST(IndexScoreRows, PartialSumsPastTwoTo24TakeTheFallback) {
  // Block 0 adds q·k = 1 unit (the smallest exponent), blocks 1-2 (key scales 2^11 larger) add S * 2^11 units, block
  // 3 adds 1 unit again. S * 2^11 is an odd multiple of 2^16 in [2^24, 2^25), a bf16 tie, so the exact dot (the tie
  // + 2) rounds up to bf16. The reference's in-order fp32 sum drops the first unit once past 2^24 (a tie at ulp 2, to
  // even) and the second one too, ends on the tie itself and rounds it to the even bf16 neighbour: below for half
  // the S. The block shifts pass their check (11), so only the sum of shifted bounds (12 * (13 + 768 + 13) << 11 >
  // 2^24, too large to skip) sends the key to the fallback that keeps the reference's bits.
  int found = 0;
  for (int64_t odd = 257; odd < 289; odd += 2) {
    const int64_t target = odd * 32;  // S, so that S * 2^11 = odd * 2^16
    if (target % 12 != 0) continue;   // S is a sum of products 12 * ik
    int64_t left = 0;
    const Case c = units_around_a_large_sum(96, target / 12, {120, 131, 131, 120}, &left);
    ASSERT_EQ(left, 0);
    const float exact = std::ldexp(static_cast<float>(target * 2048 + 2), -9);  // 2^(-1 + 120 - 128) per unit
    found += reference_rounding_shows(c, exact, "S " + std::to_string(target));
  }
  EXPECT_GT(found, 0) << "no sum whose fp32 rounding shows in the bf16 score";
}

TEST(IndexScoreRows, KeyScaleSpreadPastElevenTakesTheFallback) {
  // q's blocks 0, 1 and 3 share one exponent (q spread 0), the key's block 1 scale is 2^12 above blocks 0 and 3.
  // Blocks 0 and 3 add q·k = 1 unit each, block 1 adds S * 2^12 units with S = 48 m (m odd) in [2^12, 2^12 * 9/8):
  // an odd multiple of 2^16 in [2^24, 2^25), a bf16 tie. The reference's in-order sum drops both units (each a tie
  // at ulp 2, to even) and rounds the tie to even, below the exact sum's bf16 for half the m. The head's bound total
  // is small (12 * (13 + 384 + 13) << 11 < 2^24), so only the spread rule (key spread + q spread <= 11, at group and
  // lane level) stands between this key and a wrong exact-integer score.
  int found = 0;
  for (int64_t m = 87; m <= 95; m += 2) {
    const int64_t s = 48 * m;
    int64_t left = 0;
    const Case c = units_around_a_large_sum(64, s / 12, {120, 132, 120, 120}, &left);
    ASSERT_EQ(left, 0);
    const float exact = std::ldexp(static_cast<float>(s * 4096 + 2), -9);  // 2^(-1 + 120 - 128) per unit
    found += reference_rounding_shows(c, exact, "m " + std::to_string(m));
  }
  EXPECT_GT(found, 0) << "no sum whose fp32 rounding shows in the bf16 score";
}

TEST(IndexScoreRows, AllZeroBlocksOfQAndExtremeKeyScales) {
  // Block 0 of every head of query 0 is all zero, and so is all of head 1 of query 1, while the keys' block-0 scale
  // codes are extreme, one code per group of 16 keys: 0 (2^-127), 253 (2^126: the reference's key values of 4 or more
  // overflow to inf, so its dots are inf or NaN, 0 * inf included), 252 (2^125, still finite) and 254 on the ragged
  // tail. A zero block must add +0 whatever the key's scale; a code that can overflow must reach the fallback.
  constexpr uint8_t kCodes[] = {0, 253, 252, 254};
  for (int64_t dim : {64, 128}) {
    Case c = make_case(400 + static_cast<uint32_t>(dim), 2, 53, 8, dim, 122, 128);
    for (int h = 0; h < c.heads; ++h) std::fill_n(c.q.begin() + h * dim, 32, 0.0f);
    std::fill_n(c.q.begin() + (c.heads + 1) * dim, dim, 0.0f);
    for (size_t j = 0; j < c.rows.size(); ++j) c.rows[j][static_cast<size_t>(dim / 2)] = kCodes[j / 16];
    const std::vector<float> want = run(c, index_scores_rows_reference);
    for (const auto& [name, kernel] : kernels()) {
      expect_same_scores(run(c, kernel), want, name + " zero q blocks, dim " + std::to_string(dim));
    }
  }
}

TEST(IndexScoreRows, RowsMatchTheFp32KeyEntry) {
  // index_scores_rows of the stored rows == index_scores of the dequantised keys, same table.
  const Case c = make_case(7, 2, 40, 32, 128, 123, 127);
  std::vector<float> keys(static_cast<size_t>(c.keys * c.dim));
  for (int64_t j = 0; j < c.keys; ++j) {
    const uint8_t* row = c.rows[static_cast<size_t>(j)].data();
    dequant_e2m1_ue8m0(row, row + c.dim / 2, c.dim, 32, &keys[static_cast<size_t>(j * c.dim)]);
  }
  for (const Backend* b : available_backends()) {
    std::vector<float> scores(static_cast<size_t>(c.queries * c.keys));
    IndexScoreArgs a;
    a.q = c.q.data();
    a.weights = c.w.data();
    a.keys = keys.data();
    a.scores = scores.data();
    a.num_queries = c.queries;
    a.num_keys = c.keys;
    a.score_stride = c.keys;
    a.heads = c.heads;
    a.dim = c.dim;
    b->index_scores(a);
    const std::vector<float> rows = run(c, b->index_scores_rows);
    for (int64_t t = 0; t < c.queries; ++t) {
      for (int64_t j = 0; j < c.keys; ++j) {
        const float x = scores[static_cast<size_t>(t * c.keys + j)], y = rows[static_cast<size_t>(t * (c.keys + 3) + j)];
        ASSERT_EQ(std::memcmp(&x, &y, sizeof(float)), 0) << b->name << " " << t << " " << j;
      }
    }
  }
}

}  // namespace
}  // namespace dsflash
