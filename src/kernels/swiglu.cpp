#include "kernels/swiglu.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "formats/formats.h"
#include "kernels/bf16_lanes.h"

namespace dsflash {
namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// silu of every bf16 value, indexed by its 16 bits [65536] fp32; built at first use, read-only after.
const float* silu_of_bf16() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits) t[bits] = silu(bf16_to_f32(static_cast<uint16_t>(bits)));
    return t;
  }();
  return table.data();
}

}  // namespace

void swiglu_reference(const float* gate, const float* up, int64_t n, float limit, float weight, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float g = round_to_bf16(gate[i]);
    float u = round_to_bf16(up[i]);
    if (limit > 0.0f) {
      u = std::clamp(u, -limit, limit);
      g = std::min(g, limit);
    }
    out[i] = round_to_bf16(weight * (silu(g) * u));
  }
}

void swiglu_avx2(const float* gate, const float* up, int64_t n, float limit, float weight, float* out) {
  if (limit > 0.0f && round_to_bf16(limit) != limit) {
    swiglu_reference(gate, up, n, limit, weight, out);
    return;
  }
  const float* table = silu_of_bf16();
  const bool clamp = limit > 0.0f;
  const __m256 high = _mm256_set1_ps(limit), low = _mm256_set1_ps(-limit), w = _mm256_set1_ps(weight);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 g = round_bf16_x8(_mm256_loadu_ps(gate + i));
    __m256 u = round_bf16_x8(_mm256_loadu_ps(up + i));
    if (clamp) {
      // std::clamp(u, -limit, limit) and std::min(g, limit): ordered compares, so a NaN stays.
      u = _mm256_blendv_ps(u, low, _mm256_cmp_ps(u, low, _CMP_LT_OQ));
      u = _mm256_blendv_ps(u, high, _mm256_cmp_ps(high, u, _CMP_LT_OQ));
      g = _mm256_blendv_ps(g, high, _mm256_cmp_ps(high, g, _CMP_LT_OQ));
    }
    const __m256i index = _mm256_srli_epi32(_mm256_castps_si256(g), 16);  // g's bf16 bits
    const __m256 silu_g = _mm256_i32gather_ps(table, index, 4);
    _mm256_storeu_ps(out + i, round_bf16_x8(_mm256_mul_ps(w, _mm256_mul_ps(silu_g, u))));
  }
  swiglu_reference(gate + i, up + i, n - i, limit, weight, out + i);
}

}  // namespace dsflash
