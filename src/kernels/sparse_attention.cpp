#include "kernels/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include <immintrin.h>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/index_score.h"
#include "kernels/reduce.h"
#include "kernels/torch_exp.h"

namespace dsflash {
namespace {

constexpr float kInitialMax = -1e30f;  // the reference's running max starts here, not at -inf

constexpr int kHeadLanes = 16;  // heads per group in the fast kernel's vector lanes

// One (query, head): the online softmax over the list in blocks of 64, given the head's scores
// [num_entries] (s_j = (q_h · row_j) * scale, -inf for -1 entries).
// exp evaluated as the reference's torch.exp on its [heads, block] (probabilities) and [heads] (correction,
// sink) tensors: SLEEF on whole vector chunks, std::exp on the tail of the tensor (kernels/torch_exp.h).
// P·V and the num update run element-wise over dim in list order (vectorised across dim: no reordering).
void attend_head(const float* scores, const float* const* rows, int64_t num_entries, int64_t dim, float sink, int head,
                 int heads, float* out, float* num, float* mm, float* probs) {
  float maximum = kInitialMax;
  float denominator = 0.0f;
  std::fill(num, num + dim, 0.0f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t begin = 0; begin < num_entries; begin += kSparseAttentionBlock) {
    const int64_t count = std::min<int64_t>(kSparseAttentionBlock, num_entries - begin);
    const float* const* block = rows + begin;
    float block_max = neg_inf;
    for (int64_t j = 0; j < count; ++j) {
      probs[j] = scores[begin + j];
      block_max = std::max(block_max, probs[j]);
    }
    const float next_max = std::max(maximum, block_max);
    const float correction = torch_exp_element(maximum - next_max, head, heads);
    for (int64_t j = 0; j < count; ++j) probs[j] = torch_exp_element(probs[j] - next_max, head * count + j, heads * count);
    denominator = denominator * correction + cascade_sum(probs, count);
    // P·V with bf16-rounded probabilities into a fresh accumulator, then num = num * c + P·V.
    std::fill(mm, mm + dim, 0.0f);
    for (int64_t j = 0; j < count; ++j) {
      if (block[j] == nullptr) continue;  // p_j = 0 and the row is zero in the reference
      const float p = round_to_bf16(probs[j]);
      const float* row = block[j];
      for (int64_t d = 0; d < dim; ++d) mm[d] += p * row[d];
    }
    for (int64_t d = 0; d < dim; ++d) num[d] = num[d] * correction + mm[d];
    maximum = next_max;
  }
  denominator += torch_exp_element(sink - maximum, head, heads);
  for (int64_t d = 0; d < dim; ++d) out[d] = round_to_bf16(num[d] / denominator);
}

// The scalar oracle: each (query, head) scored with in-order dot products, one at a time.
void attend_reference(const SparseAttentionArgs& a, ThreadPool*) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> num(static_cast<size_t>(a.dim)), mm(static_cast<size_t>(a.dim)), scores(static_cast<size_t>(a.num_entries));
  float probs[kSparseAttentionBlock];
  for (int64_t query = 0; query < a.num_queries; ++query) {
    const float* const* rows = a.rows + query * a.num_entries;
    for (int head = 0; head < a.heads; ++head) {
      const float* q = a.q + (query * a.heads + head) * a.dim;
      // masked_fill(-inf) comes before the scale multiply in the reference: -inf * scale = -inf.
      for (int64_t j = 0; j < a.num_entries; ++j) {
        scores[static_cast<size_t>(j)] = rows[j] != nullptr ? dot_in_order(q, rows[j], a.dim) * a.scale : neg_inf;
      }
      attend_head(scores.data(), rows, a.num_entries, a.dim, a.sink[head], head, a.heads,
                  a.out + (query * a.heads + head) * a.dim, num.data(), mm.data(), probs);
    }
  }
}

// acc[i][l] = Σ_d q_t[d][l] * r[i][d] in d order, mul then add (no fma): 4 rows x 16 heads in 8 ymm chains.
// AVX2 (the x86-64-v3 build baseline); only the fast table runs it.
__attribute__((target("avx2"))) void score_four_rows(const float* q_t, const float* const* r, int64_t dim,
                                                      float (*acc)[kHeadLanes]) {
  __m256 a[4][2];
  for (auto& v : a) v[0] = v[1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    const __m256 q0 = _mm256_loadu_ps(q_t + d * kHeadLanes);
    const __m256 q1 = _mm256_loadu_ps(q_t + d * kHeadLanes + 8);
    for (int i = 0; i < 4; ++i) {
      const __m256 x = _mm256_broadcast_ss(r[i] + d);
      a[i][0] = _mm256_add_ps(a[i][0], _mm256_mul_ps(q0, x));
      a[i][1] = _mm256_add_ps(a[i][1], _mm256_mul_ps(q1, x));
    }
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(acc[i], a[i][0]);
    _mm256_storeu_ps(acc[i] + 8, a[i][1]);
  }
}

// Scores of up to 16 heads against the list, the heads in the vector lanes: q_t [dim][16] (the group's
// queries transposed, zero lanes past the group), scores [lanes][num_entries] (lanes <= 16 heads of the group).
// Each lane runs dot_in_order's sequence (mul, then add, in d order from 0.0f), so the scores are the oracle's
// bits.
void score_head_group(const float* q_t, int lanes, const float* const* rows, int64_t num_entries, int64_t dim,
                      float scale, float* scores) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  constexpr int kRows = 4;  // rows per pass: 4 x 16 independent accumulator chains
  int64_t present[kRows];
  for (int64_t j = 0; j < num_entries;) {
    int n = 0;
    for (; j < num_entries && n < kRows; ++j) {
      if (rows[j] == nullptr) {
        for (int l = 0; l < lanes; ++l) scores[l * num_entries + j] = neg_inf;
      } else {
        present[n++] = j;
      }
    }
    float acc[kRows][kHeadLanes] = {};
    const float* r[kRows];
    for (int i = 0; i < kRows; ++i) r[i] = i < n ? rows[present[i]] : nullptr;
    if (n == kRows) {
      score_four_rows(q_t, r, dim, acc);
    } else {
      for (int i = 0; i < n; ++i) {
        for (int64_t d = 0; d < dim; ++d) {
          const float* qd = q_t + d * kHeadLanes;
          const float x = r[i][d];
          for (int l = 0; l < kHeadLanes; ++l) acc[i][l] += qd[l] * x;
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      for (int l = 0; l < lanes; ++l) scores[l * num_entries + present[i]] = acc[i][l] * scale;
    }
  }
}

// Phase 1 items (query, group of 16 heads): the group's scores into scores [queries][heads][num_entries].
void score_groups(const SparseAttentionArgs& a, int64_t query0, float* scores, int64_t begin, int64_t end,
                  Arena& scratch) {
  const int64_t groups = (a.heads + kHeadLanes - 1) / kHeadLanes;
  const std::span<float> q_t = scratch.take<float>(static_cast<size_t>(a.dim * kHeadLanes));  // [dim][16]
  for (int64_t item = begin; item < end; ++item) {
    const int64_t query = query0 + item / groups;
    const int head0 = static_cast<int>(item % groups) * kHeadLanes;
    const int lanes = std::min(kHeadLanes, a.heads - head0);
    std::fill(q_t.begin(), q_t.end(), 0.0f);
    for (int l = 0; l < lanes; ++l) {
      const float* q = a.q + (query * a.heads + head0 + l) * a.dim;
      for (int64_t d = 0; d < a.dim; ++d) q_t[static_cast<size_t>(d * kHeadLanes + l)] = q[d];
    }
    score_head_group(q_t.data(), lanes, a.rows + query * a.num_entries, a.num_entries, a.dim, a.scale,
                     scores + ((query - query0) * a.heads + head0) * a.num_entries);
  }
}

// Phase 2 items (query, head): the online softmax and P·V as the oracle runs them.
void attend_heads(const SparseAttentionArgs& a, int64_t query0, const float* scores, int64_t begin, int64_t end,
                  Arena& scratch) {
  const std::span<float> num = scratch.take<float>(static_cast<size_t>(a.dim));  // [dim]
  const std::span<float> mm = scratch.take<float>(static_cast<size_t>(a.dim));   // [dim]
  float probs[kSparseAttentionBlock];
  for (int64_t item = begin; item < end; ++item) {
    const int64_t query = query0 + item / a.heads;
    const int head = static_cast<int>(item % a.heads);
    attend_head(scores + item * a.num_entries, a.rows + query * a.num_entries, a.num_entries, a.dim, a.sink[head],
                head, a.heads, a.out + (query * a.heads + head) * a.dim, num.data(), mm.data(), probs);
  }
}

// Two phases per chunk of queries, so that threads split (query, head) items in the softmax / P·V phase even
// for one decode query (64 heads = only 4 groups of 16 in the scoring phase). The chunk bounds the score
// buffer [chunk, heads, num_entries] to about 4 MB.
void attend_best(const SparseAttentionArgs& a, ThreadPool* pool) {
  constexpr int64_t kScoreBudget = int64_t{1} << 20;  // floats
  const int64_t groups = (a.heads + kHeadLanes - 1) / kHeadLanes;
  const int64_t per_query = a.heads * std::max<int64_t>(a.num_entries, 1);
  const int64_t chunk = std::clamp<int64_t>(kScoreBudget / per_query, 1, std::max<int64_t>(a.num_queries, 1));
  ThreadScratch caller(pool, 0);
  const std::span<float> scores = caller.take<float>(static_cast<size_t>(chunk * per_query));  // [chunk, heads, entries]
  auto run = [&](int64_t items, ThreadPool::RangeFn fn) {
    if (pool == nullptr || items < 2) {
      fn(0, items, 0);
    } else {
      pool->parallel_for(items, fn);
    }
  };
  for (int64_t query0 = 0; query0 < a.num_queries; query0 += chunk) {
    const int64_t n = std::min(chunk, a.num_queries - query0);
    run(n * groups, [&](int64_t begin, int64_t end, int thread) {
      ThreadScratch scratch(pool, thread);
      score_groups(a, query0, scores.data(), begin, end, scratch.arena());
    });
    run(n * a.heads, [&](int64_t begin, int64_t end, int thread) {
      ThreadScratch scratch(pool, thread);
      attend_heads(a, query0, scores.data(), begin, end, scratch.arena());
    });
  }
}

}  // namespace

const SparseAttentionKernels& reference_sparse_attention() {
  static const SparseAttentionKernels kernels{"reference", attend_reference};
  return kernels;
}

const SparseAttentionKernels& best_sparse_attention() {
  static const SparseAttentionKernels kernels{"heads16-threads", attend_best};
  return kernels;
}

}  // namespace dsflash
