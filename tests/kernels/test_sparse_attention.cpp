// Sparse attention with sink (src/kernels/sparse_attention.h): the scalar oracle against a double-precision
// statement of the same formula, the -1 entries, the sink-only case, and the fast kernel against the oracle on
// ragged shapes (bit for bit), with and without threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/sparse_attention.h"
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
// around the 64-entry blocks and the 4-row passes, -1 entries, with and without threads.
TEST(SparseAttention, BestIsBitExactWithReference) {
  ThreadPool pool(2);
  for (int heads : {1, 4, 16, 17, 40}) {
    for (int64_t dim : {32, 40, 128}) {
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

// The fast tables (AVX2, and AVX-512 where the CPU has it) against the oracle, memcmp of the outputs, on
// ragged shapes: head counts around the P·V groups of 8, the score groups of 32 and their 16-lane halves; dims with a tail past the
// vector chunks (72 = 48 + 16 + 8); lists around the 64-entry blocks, with scattered -1 entries, a whole block
// of -1 entries (640) or a last block of only -1 (65), and one query of only -1 entries; 1 and 5 queries
// (each with its own list order); no pool and pools of 1 and 3 threads. Scores spread widely with the larger
// scale (probabilities underflow through SLEEF's x < -104 branch); heads x block not a multiple of 16 puts the
// tensor's tail on std::exp.
TEST(SparseAttention, FastTablesAreBitExactOnRaggedShapes) {
  std::vector<const SparseAttentionKernels*> tables{&avx2_sparse_attention()};
  if (const SparseAttentionKernels* avx512 = avx512_sparse_attention()) tables.push_back(avx512);
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
  for (const SparseAttentionKernels* k : tables) {
    expect_bits_equal(run(p, *k, -x), ref, std::string(k->name) + " exp paths");
    expect_bits_equal(run(p, *k, -x, &pool), ref, std::string(k->name) + " exp paths, pool 3");
  }
}

}  // namespace
}  // namespace dsflash
