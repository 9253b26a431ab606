#include "kernels/index_score.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "formats/formats.h"
#include "kernels/reduce.h"

namespace dsflash {

float dot_in_order(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void pack_index_keys(const float* keys, int64_t num_keys, int64_t dim, float* packed) {
  std::fill(packed, packed + dim * kIndexKeyLanes, 0.0f);
  for (int64_t l = 0; l < num_keys; ++l) {
    const float* key = keys + l * dim;
    for (int64_t d = 0; d < dim; ++d) packed[d * kIndexKeyLanes + l] = key[d];
  }
}

namespace {

// Four heads x 16 keys in 8 ymm accumulators; mul then add as separate instructions (no fma), so each lane
// performs exactly dot_in_order's sequence.
__attribute__((target("avx2"))) void dots_four_heads(const float* packed, const float* q, int64_t dim,
                                                      float* dots) {
  __m256 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    const __m256 k0 = _mm256_loadu_ps(packed + d * kIndexKeyLanes);
    const __m256 k1 = _mm256_loadu_ps(packed + d * kIndexKeyLanes + 8);
    for (int h = 0; h < 4; ++h) {
      const __m256 qh = _mm256_broadcast_ss(q + h * dim + d);
      acc[h][0] = _mm256_add_ps(acc[h][0], _mm256_mul_ps(qh, k0));
      acc[h][1] = _mm256_add_ps(acc[h][1], _mm256_mul_ps(qh, k1));
    }
  }
  for (int h = 0; h < 4; ++h) {
    _mm256_storeu_ps(dots + h * kIndexKeyLanes, acc[h][0]);
    _mm256_storeu_ps(dots + h * kIndexKeyLanes + 8, acc[h][1]);
  }
}

// One head x 16 keys, plain lane loop (the compiler vectorises it; lanes are independent).
void dots_one_head(const float* packed, const float* qh, int64_t dim, float* dots) {
  float acc[kIndexKeyLanes] = {};
  for (int64_t d = 0; d < dim; ++d) {
    const float qd = qh[d];
    const float* k = packed + d * kIndexKeyLanes;
    for (int l = 0; l < kIndexKeyLanes; ++l) acc[l] += qd * k[l];
  }
  std::copy(acc, acc + kIndexKeyLanes, dots);
}

// bf16( Σ_h bf16( relu(bf16(dot_h)) * w_h ) ), dot_h = dot_of_head[h * stride]; per_head [heads] scratch.
float head_weighted_score(const float* dot_of_head, int64_t stride, const float* w, int heads, float* per_head) {
  for (int h = 0; h < heads; ++h) {
    const float relu = std::max(round_to_bf16(dot_of_head[h * stride]), 0.0f);
    per_head[h] = round_to_bf16(relu * w[h]);
  }
  return round_to_bf16(outer_cascade_sum(per_head, heads));
}

}  // namespace

void index_dots16(const float* packed, const float* q, int heads, int64_t dim, float* dots) {
  int h = 0;
  for (; h + 4 <= heads; h += 4) dots_four_heads(packed, q + h * dim, dim, dots + h * kIndexKeyLanes);
  for (; h < heads; ++h) dots_one_head(packed, q + h * dim, dim, dots + h * kIndexKeyLanes);
}

void index_scores_reference(const IndexScoreArgs& a) {
  Arena own;
  Arena& arena = a.scratch != nullptr ? *a.scratch : own;
  ArenaScope scope(arena);
  const std::span<float> dot = arena.take<float>(static_cast<size_t>(a.heads));       // [heads]
  const std::span<float> per_head = arena.take<float>(static_cast<size_t>(a.heads));  // [heads]
  for (int64_t t = 0; t < a.num_queries; ++t) {
    const float* qt = a.q + t * a.heads * a.dim;
    const float* wt = a.weights + t * a.heads;
    for (int64_t j = 0; j < a.num_keys; ++j) {
      const float* kj = a.keys + j * a.dim;
      for (int h = 0; h < a.heads; ++h) dot[static_cast<size_t>(h)] = dot_in_order(qt + h * a.dim, kj, a.dim);
      a.scores[t * a.score_stride + j] = head_weighted_score(dot.data(), 1, wt, a.heads, per_head.data());
    }
  }
}

void index_scores_packed16(const IndexScoreArgs& a) {
  const int64_t groups = (a.num_keys + kIndexKeyLanes - 1) / kIndexKeyLanes;
  // packed [groups][dim][16], dots of one group [heads][16]
  Arena own;
  Arena& arena = a.scratch != nullptr ? *a.scratch : own;
  ArenaScope scope(arena);
  const std::span<float> packed = arena.take<float>(static_cast<size_t>(groups * kIndexKeyLanes * a.dim));
  const std::span<float> dots = arena.take<float>(static_cast<size_t>(a.heads * kIndexKeyLanes));  // [heads][16]
  const std::span<float> per_head = arena.take<float>(static_cast<size_t>(a.heads));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t g0 = g * kIndexKeyLanes;
    pack_index_keys(a.keys + g0 * a.dim, std::min<int64_t>(kIndexKeyLanes, a.num_keys - g0), a.dim,
                    &packed[static_cast<size_t>(g0 * a.dim)]);
  }
  for (int64_t t = 0; t < a.num_queries; ++t) {
    const float* qt = a.q + t * a.heads * a.dim;
    const float* wt = a.weights + t * a.heads;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t g0 = g * kIndexKeyLanes;
      index_dots16(&packed[static_cast<size_t>(g0 * a.dim)], qt, a.heads, a.dim, dots.data());
      const int64_t lanes = std::min<int64_t>(kIndexKeyLanes, a.num_keys - g0);
      for (int64_t l = 0; l < lanes; ++l) {
        a.scores[t * a.score_stride + g0 + l] =
            head_weighted_score(&dots[static_cast<size_t>(l)], kIndexKeyLanes, wt, a.heads, per_head.data());
      }
    }
  }
}

}  // namespace dsflash
