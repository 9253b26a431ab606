// Sparse attention with sink (src/kernels/sparse_attention.h): the scalar oracle against a double-precision
// statement of the same formula, the -1 entries, the sink-only case, and the fast kernel against the oracle on
// ragged shapes (bit for bit), with and without threads.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/sparse_attention.h"
#include "kernels/sparse_attention_impl.h"
#include "kernels/torch_exp.h"

namespace dsflash {
namespace {

struct Problem {
  int heads = 0;
  int64_t dim = 0, entries = 0;
  std::vector<float> q, kv, sink;
  std::vector<const float*> rows;  // one query
};

Problem make_problem(int heads, int64_t dim, int64_t entries, double missing, uint32_t seed, float spread = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  Problem p;
  p.heads = heads;
  p.dim = dim;
  p.entries = entries;
  p.q.resize(static_cast<size_t>(heads * dim));
  for (float& v : p.q) v = round_to_bf16(normal(rng));
  p.kv.resize(static_cast<size_t>(entries * dim));
  for (float& v : p.kv) v = round_to_bf16(normal(rng));
  p.sink.resize(static_cast<size_t>(heads));
  for (float& v : p.sink) v = normal(rng);
  for (int64_t j = 0; j < entries; ++j) p.rows.push_back(unit(rng) < missing ? nullptr : &p.kv[static_cast<size_t>(j * dim)]);
  return p;
}

// One call of `k` on a batch: q [queries, heads, dim], rows [queries, entries] (nullptr = a -1 entry), sink
// [heads]. The output starts at -7, a value no kernel writes, so an element left unwritten shows.
std::vector<float> run_batch(const SparseAttentionKernels& k, const std::vector<float>& q,
                             const std::vector<const float*>& rows, const std::vector<float>& sink, int64_t queries,
                             int64_t entries, int heads, int64_t dim, float scale, ThreadPool* pool) {
  std::vector<float> out(static_cast<size_t>(queries * heads * dim), -7.0f);
  SparseAttentionArgs a;
  a.q = q.data();
  a.rows = rows.data();
  a.sink = sink.data();
  a.out = out.data();
  a.num_queries = queries;
  a.num_entries = entries;
  a.heads = heads;
  a.dim = dim;
  a.scale = scale;
  k.attend(a, pool);
  return out;
}

std::vector<float> run(const Problem& p, const SparseAttentionKernels& k, float scale, ThreadPool* pool = nullptr) {
  return run_batch(k, p.q, p.rows, p.sink, 1, p.entries, p.heads, p.dim, scale, pool);
}

// The formula in double: one global max (the online rescaling is exact in real arithmetic except for the
// bf16 rounding of probabilities, which depends on the running max; blocks of 64 reproduce it).
std::vector<double> oracle(const Problem& p, float scale) {
  std::vector<double> out(static_cast<size_t>(p.heads * p.dim), 0.0);
  for (int h = 0; h < p.heads; ++h) {
    double m = -1e30, den = 0.0;
    std::vector<double> num(static_cast<size_t>(p.dim), 0.0);
    for (int64_t b = 0; b < p.entries; b += 64) {
      const int64_t e = std::min<int64_t>(p.entries, b + 64);
      std::vector<double> s(static_cast<size_t>(e - b), -INFINITY);
      double next = m;
      for (int64_t j = b; j < e; ++j) {
        if (p.rows[static_cast<size_t>(j)] == nullptr) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < p.dim; ++d) dot += double(p.q[static_cast<size_t>(h * p.dim + d)]) * p.rows[static_cast<size_t>(j)][d];
        s[static_cast<size_t>(j - b)] = dot * scale;
        next = std::max(next, s[static_cast<size_t>(j - b)]);
      }
      const double c = std::exp(m - next);
      den *= c;
      for (double& v : num) v *= c;
      for (int64_t j = b; j < e; ++j) {
        if (p.rows[static_cast<size_t>(j)] == nullptr) continue;
        const double prob = std::exp(s[static_cast<size_t>(j - b)] - next);
        den += prob;
        const double rounded = round_to_bf16(static_cast<float>(prob));
        for (int64_t d = 0; d < p.dim; ++d) num[static_cast<size_t>(d)] += rounded * p.rows[static_cast<size_t>(j)][d];
      }
      m = next;
    }
    den += std::exp(double(p.sink[static_cast<size_t>(h)]) - m);
    for (int64_t d = 0; d < p.dim; ++d) out[static_cast<size_t>(h * p.dim + d)] = num[static_cast<size_t>(d)] / den;
  }
  return out;
}

// Within `ulps` bf16 ulps of the value's magnitude (plus a small absolute floor for values near zero).
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double ulps, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = ulps * std::ldexp(std::fabs(want[i]), -7) + 1e-6;
    if (std::fabs(got[i] - want[i]) > tol && ++bad < 5) ADD_FAILURE() << what << " [" << i << "] " << got[i] << " vs " << want[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(SparseAttention, ReferenceMatchesDoubleFormula) {
  for (int64_t entries : {1, 7, 63, 64, 65, 130, 640}) {
    const Problem p = make_problem(3, 72, entries, 0.2, static_cast<uint32_t>(entries), 0.5f);
    const float scale = 1.0f / std::sqrt(72.0f);
    const std::vector<float> got = run(p, reference_sparse_attention(), scale);
    for (float v : got) EXPECT_EQ(v, round_to_bf16(v));  // bf16 output
    expect_close(got, oracle(p, scale), 2.0, "reference");
  }
}

TEST(SparseAttention, MissingEntriesTakeNoPart) {
  // All entries missing: only the sink is left in the denominator, the output is zero.
  Problem p = make_problem(2, 32, 10, 1.0, 3);
  for (float v : run(p, reference_sparse_attention(), 0.2f)) EXPECT_EQ(v, 0.0f);
  // A single present entry, everything else missing: out = bf16(bf16(1) * v / (1 + exp(sink - s))).
  p = make_problem(2, 32, 5, 1.0, 4);
  p.rows[3] = &p.kv[3 * 32];
  const std::vector<float> got = run(p, reference_sparse_attention(), 0.2f);
  for (int h = 0; h < 2; ++h) {
    double s = 0.0;
    for (int d = 0; d < 32; ++d) s += double(p.q[static_cast<size_t>(h * 32 + d)]) * p.kv[static_cast<size_t>(3 * 32 + d)];
    s *= 0.2;
    const double den = 1.0 + std::exp(double(p.sink[static_cast<size_t>(h)]) - s);
    for (int d = 0; d < 32; ++d) {
      EXPECT_NEAR(got[static_cast<size_t>(h * 32 + d)], p.kv[static_cast<size_t>(3 * 32 + d)] / den,
                  std::fabs(p.kv[static_cast<size_t>(3 * 32 + d)]) * 0.01 + 1e-6);
    }
  }
}

TEST(SparseAttention, ProbabilitiesAreRoundedToBf16BeforePV) {
  // Two equal rows of ones with scores s and s - d: p = (1, bf16(exp(-d))); out = (1 + bf16(e^-d)) / den.
  const int64_t dim = 32;
  Problem p;
  p.heads = 1;
  p.dim = dim;
  p.entries = 2;
  p.q.assign(dim, 0.0f);
  p.q[0] = 1.0f;
  p.kv.assign(2 * dim, 1.0f);
  p.kv[dim] = 0.7f;  // second row's score is lower by 0.3
  for (int64_t d = 1; d < dim; ++d) p.kv[static_cast<size_t>(dim + d)] = 1.0f;
  p.sink = {-100.0f};
  p.rows = {&p.kv[0], &p.kv[static_cast<size_t>(dim)]};
  const std::vector<float> got = run(p, reference_sparse_attention(), 1.0f);
  const float e = std::exp(0.7f - 1.0f);
  const float num = 1.0f + round_to_bf16(e);  // channel 1: both rows hold 1
  const float den = (1.0f + e) + std::exp(-100.0f - 1.0f);
  EXPECT_EQ(got[1], round_to_bf16(num / den));
}

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++bad < 5) {
      ADD_FAILURE() << what << " [" << i << "] " << got[i] << " vs reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// The fast kernel keeps every operation of the oracle (scores vectorised across heads, P·V across dim), so
// its output is the oracle's bits: head counts below, at and past the 16-head group, ragged list lengths
// around the 64-entry blocks and the 4-row passes, dims past the 8 x 8 query transposes (44), -1 entries, with
// and without threads.
TEST(SparseAttention, BestIsBitExactWithReference) {
  ThreadPool pool(2);
  for (int heads : {1, 4, 16, 17, 40}) {
    for (int64_t dim : {32, 40, 44, 128}) {
      for (int64_t entries : {1, 3, 17, 64, 100, 257}) {
        const Problem p = make_problem(heads, dim, entries, 0.3,
                                       static_cast<uint32_t>(heads * 100000 + dim * 1000 + entries));
        const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
        const std::vector<float> ref = run(p, reference_sparse_attention(), scale);
        const std::string what = "heads " + std::to_string(heads) + " dim " + std::to_string(dim) + " entries " +
                                 std::to_string(entries);
        expect_bits_equal(run(p, best_sparse_attention(), scale), ref, "best " + what);
        expect_bits_equal(run(p, best_sparse_attention(), scale, &pool), ref, "best+pool " + what);
      }
    }
  }
  // every entry -1: the output is zero on both paths
  const Problem empty = make_problem(20, 32, 70, 1.0, 9);
  expect_bits_equal(run(empty, best_sparse_attention(), 0.2f), run(empty, reference_sparse_attention(), 0.2f), "all -1");
}

// Several queries, each with its own list (one with only -1 entries), large score spreads (the running max
// moves and the bf16 probability rounding matters); short lists (all queries in one score chunk) and long
// ones (heads x entries past the fast kernel's ~1M-float score buffer: one query per chunk).
void check_batch(int heads, int64_t dim, int64_t entries, int64_t queries) {
  ThreadPool pool(2);
  Problem p = make_problem(heads, dim, entries, 0.25, 77, 2.0f);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> q(static_cast<size_t>(queries * heads * dim));
  for (float& v : q) v = round_to_bf16(normal(rng));
  std::vector<const float*> rows;
  for (int64_t t = 0; t < queries; ++t) {
    for (int64_t j = 0; j < entries; ++j) {
      const int64_t shuffled = (j * 7 + t * 13) % entries;
      rows.push_back(t == 1 ? nullptr : p.rows[static_cast<size_t>(shuffled)]);
    }
  }
  auto attend = [&](const SparseAttentionKernels& k, ThreadPool* with) {
    return run_batch(k, q, rows, p.sink, queries, entries, heads, dim, 0.125f, with);
  };
  const std::vector<float> ref = attend(reference_sparse_attention(), nullptr);
  const std::string what = "batch of " + std::to_string(queries) + " x " + std::to_string(entries);
  expect_bits_equal(attend(best_sparse_attention(), nullptr), ref, what);
  expect_bits_equal(attend(best_sparse_attention(), &pool), ref, what + " +pool");
}

TEST(SparseAttention, BestIsBitExactWithReferenceOnBatches) {
  check_batch(20, 64, 150, 3);
  check_batch(20, 16, 30000, 3);
}

// The fast tables (AVX2, and AVX-512 where the CPU has it, with and without vdpbf16ps) against the oracle, memcmp of the outputs, on
// ragged shapes: head counts around the P·V groups of 8, the score groups of 32 and their 16-lane halves; dims with a tail past the
// vector chunks (72 = 48 + 16 + 8); lists around the 64-entry blocks, with scattered -1 entries, a whole block
// of -1 entries (640) or a last block of only -1 (65), and one query of only -1 entries; 1 and 5 queries
// (each with its own list order); no pool and pools of 1 and 3 threads. Scores spread widely with the larger
// scale (probabilities underflow through SLEEF's x < -104 branch); heads x block not a multiple of 16 puts the
// tensor's tail on std::exp.
TEST(SparseAttention, FastTablesAreBitExactOnRaggedShapes) {
  std::vector<const SparseAttentionKernels*> tables{&avx2_sparse_attention()};
  if (const SparseAttentionKernels* avx512 = avx512_sparse_attention()) tables.push_back(avx512);
  if (const SparseAttentionKernels* pairs = avx512_pairs_sparse_attention()) tables.push_back(pairs);
  ThreadPool one(1), three(3);
  for (int heads : {1, 3, 16, 17, 33, 64}) {
    for (int64_t dim : {64, 72, 512}) {
      for (int64_t entries : {1, 63, 64, 65, 640}) {
        for (int64_t queries : {1, 5}) {
          const uint32_t seed = static_cast<uint32_t>(heads * 7919 + dim * 131 + entries * 17 + queries);
          Problem p = make_problem(heads, dim, entries, 0.0, seed, 1.5f);
          std::mt19937 rng(seed);
          std::normal_distribution<float> normal(0.0f, 1.5f);
          std::uniform_real_distribution<double> unit(0.0, 1.0);
          std::vector<float> q(static_cast<size_t>(queries * heads * dim));
          for (float& v : q) v = round_to_bf16(normal(rng));
          std::vector<const float*> rows;
          for (int64_t t = 0; t < queries; ++t) {
            for (int64_t j = 0; j < entries; ++j) {
              const int64_t shuffled = (j * 11 + t * 5) % entries;
              const bool missing = unit(rng) < 0.15 || t == 3 || (entries == 640 && j >= 128 && j < 192) ||
                                   (entries == 65 && j == 64 && t % 2 == 1);
              rows.push_back(missing ? nullptr : &p.kv[static_cast<size_t>(shuffled * dim)]);
            }
          }
          const float scale = dim == 72 ? 0.5f : 1.0f / std::sqrt(static_cast<float>(dim));
          auto attend = [&](const SparseAttentionKernels& k, ThreadPool* pool) {
            return run_batch(k, q, rows, p.sink, queries, entries, heads, dim, scale, pool);
          };
          const std::vector<float> ref = attend(reference_sparse_attention(), nullptr);
          const std::string what = "heads " + std::to_string(heads) + " dim " + std::to_string(dim) + " entries " +
                                   std::to_string(entries) + " queries " + std::to_string(queries);
          for (const SparseAttentionKernels* k : tables) {
            expect_bits_equal(attend(*k, nullptr), ref, std::string(k->name) + " " + what);
            expect_bits_equal(attend(*k, &one), ref, std::string(k->name) + " pool 1 " + what);
            expect_bits_equal(attend(*k, &three), ref, std::string(k->name) + " pool 3 " + what);
          }
        }
      }
    }
  }
}

// SLEEF and std::exp disagree now and then, rarely enough to slip past random inputs, so this case is built:
// a score difference x where the two give different bf16 probabilities, on 3 heads x 6 entries (an [heads,
// block] tensor of 18: head 2's entries 4 and 5 are its std::exp tail, everything else SLEEF). Every head has
// the same query; entry 0 is a zero row scoring 0, entries 1..5 one row scoring x. The oracle's head 2 then
// differs from its heads 0 and 1 (the case is sensitive), and the fast tables must give the oracle's bits.
TEST(SparseAttention, FastTablesTakeExpPathsByTensorPosition) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-8.0f, -0.01f);
  float x = 0.0f;
  for (int tries = 0; tries < 50000000 && x == 0.0f; ++tries) {
    const float candidate = uniform(rng);
    if (round_to_bf16(sleef_expf_u10(candidate)) != round_to_bf16(std::exp(candidate))) x = candidate;
  }
  ASSERT_NE(x, 0.0f) << "no score difference found where SLEEF and std::exp round to different bf16";
  const int heads = 3;
  const int64_t dim = 16, entries = 6;
  Problem p;
  p.heads = heads;
  p.dim = dim;
  p.entries = entries;
  p.q.assign(static_cast<size_t>(heads * dim), 0.0f);
  for (int h = 0; h < heads; ++h) p.q[static_cast<size_t>(h * dim)] = -1.0f;
  p.kv.assign(static_cast<size_t>(2 * dim), 0.0f);
  p.kv[static_cast<size_t>(dim)] = 1.0f;  // score (q · row) * scale = -1 * -x = x
  p.sink.assign(heads, -1.0f);
  p.rows = {&p.kv[0]};
  for (int64_t j = 1; j < entries; ++j) p.rows.push_back(&p.kv[static_cast<size_t>(dim)]);
  const std::vector<float> ref = run(p, reference_sparse_attention(), -x);
  EXPECT_EQ(ref[0], ref[static_cast<size_t>(dim)]);           // heads 0 and 1: SLEEF only
  EXPECT_NE(ref[0], ref[static_cast<size_t>(2 * dim)]) << x;  // head 2: its tail on std::exp
  ThreadPool pool(3);
  std::vector<const SparseAttentionKernels*> tables{&avx2_sparse_attention()};
  if (const SparseAttentionKernels* avx512 = avx512_sparse_attention()) tables.push_back(avx512);
  if (const SparseAttentionKernels* pairs = avx512_pairs_sparse_attention()) tables.push_back(pairs);
  for (const SparseAttentionKernels* k : tables) {
    expect_bits_equal(run(p, *k, -x), ref, std::string(k->name) + " exp paths");
    expect_bits_equal(run(p, *k, -x, &pool), ref, std::string(k->name) + " exp paths, pool 3");
  }
}

// The fast tables multiply with FMAs only where every product is exact in fp32 (sparse_attention_impl.h,
// products_exact); elsewhere they round each product first, as the oracle does. Each case below is built so
// that an FMA changes the output (checked first: the test can fail), on one head over 3 entries of 16 dims:
//  - P·V: a probability 2^-100 times a row element 1.25 * 2^-49 is a subnormal product (1.25 * 2^-149, rounded
//    alone to 2^-149) added to 2^-125 + 2^-133: rounded first it ties to even, fused it rounds up; den = 2,
//    so the output's bf16 rounding (another tie) shows the difference;
//  - scores: a row that is not bf16 (the product needs more than 24 bits), scale 2^23;
//  - scores: a product that overflows after a large negative one (rounded first: inf; fused: finite).
TEST(SparseAttention, FastTablesFuseOnlyExactProducts) {
  std::vector<const SparseAttentionKernels*> tables{&avx2_sparse_attention()};
  if (const SparseAttentionKernels* avx512 = avx512_sparse_attention()) tables.push_back(avx512);
  if (const SparseAttentionKernels* pairs = avx512_pairs_sparse_attention()) tables.push_back(pairs);
  ThreadPool three(3);
  constexpr int64_t kDim = 16;
  struct Case {
    std::string what;
    std::vector<float> q, rows;  // q [dim], rows [3][dim] (dims past those given are 0)
    float scale;
  };
  std::vector<Case> cases;
  auto row_set = [](std::vector<std::vector<float>> given) {
    std::vector<float> rows(3 * kDim, 0.0f);
    for (size_t j = 0; j < given.size(); ++j) std::copy(given[j].begin(), given[j].end(), rows.begin() + j * kDim);
    return rows;
  };
  // P·V: entries A1, A2 score 0 (m = 0), B scores -1 * (100 ln 2) (p = bf16(exp) = 2^-100); dim 1 carries the
  // values.
  const float ln2_100 = 100.0f * std::log(2.0f);
  ASSERT_EQ(round_to_bf16(std::exp(-ln2_100)), 0x1p-100f);
  cases.push_back({"P.V subnormal product", {1.0f}, row_set({{0.0f, 0x1p-125f}, {0.0f, 0x1p-133f}, {-1.0f, 0x1.4p-49f}}), ln2_100});
  {
    const float partial = 0x1p-125f + 0x1p-133f, product = 0x1p-100f * 0x1.4p-49f;  // rounded to 2^-149
    ASSERT_NE(round_to_bf16((partial + product) / 2.0f), round_to_bf16(std::fma(0x1p-100f, 0x1.4p-49f, partial) / 2.0f));
  }
  // Scores: a fp32 row element r (not bf16) with 1 + 3 * r rounded twice != fused.
  float r = 0.0f;
  for (uint32_t bits = 0x32aaaa00u; r == 0.0f && bits < 0x32aaac00u; ++bits) {  // 3r near 2^-24, half an ulp of 1
    const float candidate = std::bit_cast<float>(bits);
    if (1.0f + 3.0f * candidate != std::fma(3.0f, candidate, 1.0f)) r = candidate;
  }
  ASSERT_NE(r, 0.0f);
  cases.push_back({"score row not bf16", {1.0f, 3.0f}, row_set({{1.0f, r}, {1.0f}}), 0x1p23f});
  // Scores: -1.5 * 2^127 then 2^128 (overflows when rounded alone).
  cases.push_back({"score overflowing product", {0x1p64f, 0x1p64f}, row_set({{-0x1.8p63f, 0x1p64f}, {0.0f}}), 0x1p-127f});
  ASSERT_NE(std::isinf(-0x1.8p127f + 0x1p64f * 0x1p64f), std::isinf(std::fma(0x1p64f, 0x1p64f, -0x1.8p127f)));
  // Scores by vdpbf16ps (bf16_dot_exact) only where it keeps the bits: a partial sum 1.5 * 2^-126 - 2^-126 = 2^-127
  // (subnormal: flushed to 0 there) and a subnormal bf16 input 2^-130 of a normal product 2^-30 (read as 0
  // there); dim 2 carries a value so that the score reaches the output.
  cases.push_back({"score partial sum subnormal", {1.0f, 1.0f}, row_set({{0x1.8p-126f, -0x1p-126f, 1.0f}, {0.0f}}), 0x1p126f});
  cases.push_back({"score input subnormal", {0x1p100f}, row_set({{0x1p-130f, 0.0f, 1.0f}, {0.0f}}), 0x1p29f});
  for (Case& c : cases) {
    c.q.resize(kDim, 0.0f);
    const std::vector<const float*> rows{&c.rows[0], &c.rows[kDim], &c.rows[2 * kDim]};
    const std::vector<float> sink{-200.0f};
    auto attend = [&](const SparseAttentionKernels& k, ThreadPool* pool) {
      return run_batch(k, c.q, rows, sink, 1, 3, 1, kDim, c.scale, pool);
    };
    const std::vector<float> ref = attend(reference_sparse_attention(), nullptr);
    for (const SparseAttentionKernels* k : tables) {
      expect_bits_equal(attend(*k, nullptr), ref, std::string(k->name) + " " + c.what);
      expect_bits_equal(attend(*k, &three), ref, std::string(k->name) + " pool 3 " + c.what);
    }
  }
}

// (A subnormal product in the scores changes one ulp of a score near 2^-125, which the bf16 output hides for any
// scale a float can hold; products_exact and the bounds kernels are tested directly below instead.)

using sparse_attention_impl::ValueBounds;

// The bounds kernels of both paths: smallest nonzero and largest magnitude over lengths around the vector
// widths (tails), -0 and +0 as zero, subnormals, NaN / inf, and values that are not bf16 (high = NaN).
TEST(SparseAttention, ValueBoundsOfEveryPath) {
  std::vector<std::pair<const char*, sparse_attention_impl::ValueBoundsKernel>> kernels{
      {"avx2", sparse_attention_impl::avx2_paths().bounds}};
  if (sparse_attention_impl::avx512_paths(false).bounds != nullptr) {
    kernels.push_back({"avx512", sparse_attention_impl::avx512_paths(false).bounds});
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [name, bounds] : kernels) {
    SCOPED_TRACE(name);
    for (int64_t count : {0, 1, 7, 8, 9, 15, 16, 17, 33, 40}) {
      SCOPED_TRACE(count);
      std::vector<float> v(static_cast<size_t>(count), 0.0f);
      for (int64_t i = 1; i < count; i += 3) v[static_cast<size_t>(i)] = -0.0f;
      ValueBounds b = bounds(v.data(), count);
      EXPECT_EQ(b.low, inf);
      EXPECT_EQ(b.high, 0.0f);
      if (count == 0) continue;
      // Values in the last place (the tail of the vector loop) and elsewhere.
      v.back() = -0x1.8p-3f;
      v.front() = count > 1 ? 0x1.2p5f : v.front();
      b = bounds(v.data(), count);
      EXPECT_EQ(b.low, 0x1.8p-3f);
      EXPECT_EQ(b.high, count > 1 ? 0x1.2p5f : 0x1.8p-3f);
      v.back() = 0x1p-133f;  // the smallest bf16 subnormal
      EXPECT_EQ(bounds(v.data(), count).low, 0x1p-133f);
      v.back() = -inf;
      EXPECT_EQ(bounds(v.data(), count).high, inf);
      v.back() = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(bounds(v.data(), count).high));
      v.back() = 1.0f + 0x1p-20f;  // not a bf16 value
      EXPECT_TRUE(std::isnan(bounds(v.data(), count).high));
    }
  }
}

// products_exact: every product of the two sets normal (>= 2^-126) and below 2^127, at both edges; a set with
// no nonzero value ({inf, 0}) multiplies exactly with anything finite; NaN bounds never.
TEST(SparseAttention, Bf16DotExactAtItsEdges) {
  using sparse_attention_impl::bf16_dot_exact;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(bf16_dot_exact({1.0f, 1.0f}, {0x1p-100f, 1.0f}));
  EXPECT_FALSE(bf16_dot_exact({1.0f, 1.0f}, {0x1.fep-101f, 1.0f}));     // a product below 2^-100
  EXPECT_FALSE(bf16_dot_exact({0x1p-127f, 1.0f}, {0x1p100f, 0x1p100f}));  // a subnormal input, products normal
  EXPECT_TRUE(bf16_dot_exact({0x1p-126f, 1.0f}, {0x1p26f, 0x1p26f}));
  EXPECT_FALSE(bf16_dot_exact({1.0f, 0x1p64f}, {1.0f, 0x1p63f}));       // an overflowing product
  EXPECT_TRUE(bf16_dot_exact({inf, 0.0f}, {0x1p-120f, 0x1p100f}));      // all zero on one side
  EXPECT_FALSE(bf16_dot_exact({1.0f, nan}, {1.0f, 1.0f}));
}

TEST(SparseAttention, ProductsExactAtItsEdges) {
  using sparse_attention_impl::products_exact;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(products_exact({0x1p-63f, 1.0f}, {0x1p-63f, 1.0f}));
  EXPECT_FALSE(products_exact({0x1p-64f, 1.0f}, {0x1p-63f, 1.0f}));
  EXPECT_TRUE(products_exact({1.0f, 0x1.fep62f}, {1.0f, 0x1.fep63f}));
  EXPECT_FALSE(products_exact({1.0f, 0x1p64f}, {1.0f, 0x1p63f}));
  EXPECT_TRUE(products_exact({inf, 0.0f}, {0x1p-120f, 0x1p100f}));
  EXPECT_FALSE(products_exact({1.0f, nan}, {1.0f, 1.0f}));
  EXPECT_FALSE(products_exact({1.0f, inf}, {1.0f, 1.0f}));
  const ValueBounds merged = sparse_attention_impl::merge_bounds({0x1p-3f, 2.0f}, {0x1p-5f, 1.0f});
  EXPECT_EQ(merged.low, 0x1p-5f);
  EXPECT_EQ(merged.high, 2.0f);
  EXPECT_TRUE(std::isnan(sparse_attention_impl::merge_bounds({1.0f, nan}, {1.0f, 4.0f}).high));
  EXPECT_TRUE(std::isnan(sparse_attention_impl::merge_bounds({1.0f, 4.0f}, {1.0f, nan}).high));
}

}  // namespace
}  // namespace dsflash
