// Top-k with the reference's tie rule (src/kernels/topk.h): k largest, ties at the k-th value to the lowest
// index, +0.0 above -0.0, -inf lowest; the fast selection against the sorted oracle, single-threaded and split over
// pools of 1-4 threads (same indices in the same order), on rows long enough to be chunked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "core/workspace.h"
#include "kernels/topk.h"

namespace dsflash {
namespace {

std::vector<int32_t> select(const TopkKernels& k, const std::vector<float>& x, int64_t count,
                            ThreadPool* pool = nullptr, Arena* scratch = nullptr) {
  std::vector<int32_t> out(static_cast<size_t>(std::min<int64_t>(count, static_cast<int64_t>(x.size()))));
  k.select(x.data(), static_cast<int64_t>(x.size()), count, out.data(), pool, scratch);
  return out;
}

TEST(Topk, TiesGoToTheLowestIndex) {
  const std::vector<float> x{1.0f, 3.0f, 2.0f, 3.0f, 2.0f, 2.0f};
  EXPECT_EQ(select(reference_topk(), x, 3), (std::vector<int32_t>{1, 3, 2}));
  EXPECT_EQ(select(reference_topk(), x, 4), (std::vector<int32_t>{1, 3, 2, 4}));
  EXPECT_EQ(select(best_topk(), x, 4), (std::vector<int32_t>{1, 3, 2, 4}));
}

TEST(Topk, PositiveZeroAboveNegativeZeroAndInfinitiesOrdered) {
  const float inf = INFINITY;
  const std::vector<float> x{-0.0f, -inf, 0.0f, -1.0f, inf, -inf};
  EXPECT_EQ(select(reference_topk(), x, 6), (std::vector<int32_t>{4, 2, 0, 3, 1, 5}));
  EXPECT_EQ(select(best_topk(), x, 2), (std::vector<int32_t>{4, 2}));
  // -inf ties: the lowest indices are taken first (a Reindex layer's out-of-pool positions before invisible ones).
  EXPECT_EQ(select(reference_topk(), std::vector<float>{-inf, 5.0f, -inf, -inf}, 3), (std::vector<int32_t>{1, 0, 2}));
}

TEST(Topk, OrderKeyIsMonotonic) {
  const std::vector<float> ascending{-INFINITY, -3.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f, INFINITY};
  for (size_t i = 1; i < ascending.size(); ++i) EXPECT_LT(topk_order_key(ascending[i - 1]), topk_order_key(ascending[i]));
}

TEST(Topk, KLargerThanN) {
  EXPECT_EQ(select(reference_topk(), {2.0f, 1.0f}, 5), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(select(best_topk(), {2.0f, 1.0f}, 5), (std::vector<int32_t>{0, 1}));
}

TEST(Topk, BestMatchesReferenceWithManyTies) {
  std::mt19937 rng(7);
  const std::vector<float> palette{-INFINITY, -1.0f, -0.0f, 0.0f, 0.5f, 0.5f, 1.0f, 2.0f};
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 300);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = palette[rng() % palette.size()];
    const int64_t k = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(n + 3));
    EXPECT_EQ(select(best_topk(), x, k), select(reference_topk(), x, k)) << "n " << n << " k " << k;
  }
}

// Rows of the indexer's lengths (split into one chunk per thread, 131072 values at least each): every pool size gives
// the oracle's result.
// Values from a small palette (ties everywhere, so the lowest-index rule decides most picks), and rows whose best
// values sit in one chunk, at chunk edges or are all -inf but a few (a Reindex row).
TEST(Topk, ChunkedOverPoolsMatchesReference) {
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int threads : {1, 2, 3, 4}) pools.push_back(std::make_unique<ThreadPool>(threads));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const std::vector<float> palette{-INFINITY, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 2.0f, INFINITY};
  struct Row {
    const char* what;
    int64_t n;
  };
  for (const Row& row : {Row{"palette", 300007}, Row{"bf16 normals", 524309}, Row{"ascending", 393216},
                         Row{"sparse", 270000}, Row{"palette short", 40000}}) {
    const std::string what = row.what;
    std::vector<float> x(static_cast<size_t>(row.n));
    for (int64_t i = 0; i < row.n; ++i) {
      float& v = x[static_cast<size_t>(i)];
      if (what == "bf16 normals") {
        v = std::ldexp(std::round(normal(rng) * 8.0f), -3);
      } else if (what == "ascending") {
        v = static_cast<float>(i / 7);  // the best at the row's end, in the last chunk
      } else if (what == "sparse") {
        v = rng() % 97 == 0 ? static_cast<float>(rng() % 5) : -INFINITY;
      } else {
        v = palette[rng() % palette.size()];
      }
    }
    for (int64_t k : {1, 7, 512, 2048, 9000}) {
      const std::vector<int32_t> want = select(reference_topk(), x, k);
      EXPECT_EQ(select(best_topk(), x, k), want) << what << " k " << k << " single";
      for (const auto& pool : pools) {
        Arena scratch;
        EXPECT_EQ(select(best_topk(), x, k, pool.get(), &scratch), want)
            << what << " k " << k << " threads " << pool->num_threads();
        EXPECT_EQ(select(best_topk(), x, k, pool.get(), nullptr), want)
            << what << " k " << k << " threads " << pool->num_threads() << " own arena";
      }
    }
  }
}

}  // namespace
}  // namespace dsflash
