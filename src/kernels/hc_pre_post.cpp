// hc_pre / hc_post (kernels/hc.h) in AVX2 vectors over the dim index: both are element-wise in i with a fixed
// order over the streams j, so each lane runs the scalar kernel's exact sequence (mul then add, no FMA, the sum
// from 0.0f) and the bf16 rounding is done by integer arithmetic as formats.cpp f32_to_bf16 does. The last
// dim % 8 values go through masked loads and stores.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/bf16_lanes.h"
#include "kernels/hc.h"

namespace dsflash {
namespace {

// Lanes i < n set (n may exceed 8): the mask of _mm256_maskload_ps / _mm256_maskstore_ps.
inline __m256i first_lanes(int64_t n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))), index);
}

}  // namespace

void hc_pre_avx2(const float* streams, int64_t num_tokens, int hc, int64_t dim, const float* pre_mix, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* x = streams + t * hc * dim;  // [hc, dim]
    const float* p = pre_mix + t * hc;        // [hc]
    float* dst = out + t * dim;               // [dim]
    for (int64_t i = 0; i < dim; i += 8) {
      const __m256i mask = first_lanes(dim - i);
      __m256 acc = _mm256_setzero_ps();
      for (int j = 0; j < hc; ++j)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(p[j]), _mm256_maskload_ps(x + j * dim + i, mask)));
      _mm256_maskstore_ps(dst + i, mask, round_bf16_x8(acc));
    }
  }
}

void hc_post_avx2(const float* y, const float* residual, int64_t num_tokens, int hc, int64_t dim, const float* post,
                  const float* comb, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* yt = y + t * dim;                // [dim]
    const float* r = residual + t * hc * dim;     // [hc, dim]
    const float* c = comb + t * hc * hc;          // [hc, hc], c[j][k]: source j -> stream k
    const float* p = post + t * hc;               // [hc]
    float* dst = out + t * hc * dim;              // [hc, dim]
    for (int k = 0; k < hc; ++k) {
      const __m256 pk = _mm256_set1_ps(p[k]);
      for (int64_t i = 0; i < dim; i += 8) {
        const __m256i mask = first_lanes(dim - i);
        __m256 mixed = _mm256_setzero_ps();
        for (int j = 0; j < hc; ++j)
          mixed = _mm256_add_ps(mixed,
                                _mm256_mul_ps(_mm256_set1_ps(c[j * hc + k]), _mm256_maskload_ps(r + j * dim + i, mask)));
        const __m256 value = _mm256_add_ps(_mm256_mul_ps(pk, _mm256_maskload_ps(yt + i, mask)), mixed);
        _mm256_maskstore_ps(dst + k * dim + i, mask, round_bf16_x8(value));
      }
    }
  }
}

}  // namespace dsflash
