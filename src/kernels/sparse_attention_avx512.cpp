// AVX-512 (F/VL) paths of the fast sparse-attention kernel (kernels/sparse_attention_impl.h), compiled per
// function with a target attribute so the rest of the binary stays x86-64-v3. The operations per (head, row,
// d) are the AVX2 paths' and the oracle's: mul then add, never fused, in d order (scores) and list order (P·V).
#include <immintrin.h>

#include "kernels/sparse_attention_impl.h"

// The one target string of this file; every function that uses AVX-512 intrinsics carries it.
#define DSFLASH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace dsflash::sparse_attention_impl {
namespace {

// acc[i][l] = Σ_d q_t[d][l] * r[i][d]: 16 heads in one zmm, 8 rows = 8 independent add chains.
DSFLASH_AVX512 void score_rows_avx512(const float* q_t, const float* const* r, int64_t dim, float (*acc)[kHeadLanes]) {
  __m512 a[kScoreRows];
  for (__m512& v : a) v = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    const __m512 q = _mm512_loadu_ps(q_t + d * kHeadLanes);
    for (int i = 0; i < kScoreRows; ++i) a[i] = _mm512_add_ps(a[i], _mm512_mul_ps(q, _mm512_set1_ps(r[i][d])));
  }
  for (int i = 0; i < kScoreRows; ++i) _mm512_storeu_ps(acc[i], a[i]);
}

// The group's P·V over dims [d, d + 16 * kVectors) (kVectors 1 or 2) for all 8 heads (heads past lanes run on
// p = 0, c = 1): 8 x kVectors zmm accumulators, each row chunk loaded once for the 8 heads. `last` masks the
// final vector's dims (the end of the row: masked lanes load 0 and are not stored).
template <int kVectors>
DSFLASH_AVX512 inline void pv_chunk(const PvBlock& b, int64_t d, __mmask16 last, float* num, int64_t num_stride) {
  __m512 acc[kGroupHeads * kVectors];  // [head][vector], flat: GCC keeps a flat array of vectors in registers
#pragma GCC unroll 16
  for (int i = 0; i < kGroupHeads * kVectors; ++i) acc[i] = _mm512_setzero_ps();
  for (int j = 0; j < b.present; ++j) {
    const float* row = b.rows[j] + d;
    const __m512 r0 = kVectors == 1 ? _mm512_maskz_loadu_ps(last, row) : _mm512_loadu_ps(row);
    const __m512 r1 = kVectors == 1 ? r0 : _mm512_maskz_loadu_ps(last, row + 16);
    const float* p = b.p + j * kGroupHeads;
#pragma GCC unroll 8
    for (int g = 0; g < kGroupHeads; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g]);
      acc[g * kVectors] = _mm512_add_ps(acc[g * kVectors], _mm512_mul_ps(pg, r0));
      if constexpr (kVectors == 2) acc[g * 2 + 1] = _mm512_add_ps(acc[g * 2 + 1], _mm512_mul_ps(pg, r1));
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < kGroupHeads; ++g) {
    const __m512 c = _mm512_set1_ps(b.correction[g]);
    float* n = num + g * num_stride + d;
    if constexpr (kVectors == 1) {
      _mm512_mask_storeu_ps(n, last, _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(last, n), c), acc[g]));
    } else {
      _mm512_storeu_ps(n, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(n), c), acc[g * 2]));
      _mm512_mask_storeu_ps(n + 16, last,
                            _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(last, n + 16), c), acc[g * 2 + 1]));
    }
  }
}

// PvBlockKernel: chunks of 32 dims (16 accumulators), the rest in one masked chunk of up to 32.
DSFLASH_AVX512 void pv_block_avx512(const PvBlock& b, int64_t dim, float* num, int64_t num_stride) {
  int64_t d = 0;
  for (; d + 32 <= dim; d += 32) pv_chunk<2>(b, d, 0xffff, num, num_stride);
  const int64_t rest = dim - d;
  if (rest > 16) {
    pv_chunk<2>(b, d, static_cast<__mmask16>((1u << (rest - 16)) - 1), num, num_stride);
  } else if (rest > 0) {
    pv_chunk<1>(b, d, static_cast<__mmask16>((1u << rest) - 1), num, num_stride);
  }
}

}  // namespace

FastPaths avx512_paths() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!supported) return {nullptr, nullptr};
  return {score_rows_avx512, pv_block_avx512};
}

}  // namespace dsflash::sparse_attention_impl
