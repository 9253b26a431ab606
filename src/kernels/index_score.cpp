#include "kernels/index_score.h"

#include <algorithm>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

#if defined(__AVX2__)
// Four heads x 16 keys in 8 ymm accumulators; mul then add as separate instructions (no fma), so each lane
// performs exactly dot_in_order's sequence.
void dots_four_heads(const float* packed, const float* q, int64_t dim, float* dots) {
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
#endif

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

}  // namespace

void index_dots16(const float* packed, const float* q, int heads, int64_t dim, float* dots) {
  int h = 0;
#if defined(__AVX2__)
  for (; h + 4 <= heads; h += 4) dots_four_heads(packed, q + h * dim, dim, dots + h * kIndexKeyLanes);
#endif
  for (; h < heads; ++h) dots_one_head(packed, q + h * dim, dim, dots + h * kIndexKeyLanes);
}

}  // namespace dsflash
