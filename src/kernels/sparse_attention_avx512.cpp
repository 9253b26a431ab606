// AVX-512 (F/VL) paths of the fast sparse-attention kernel (kernels/sparse_attention_impl.h), compiled per
// function with a target attribute so the rest of the binary stays x86-64-v3. The operations per (head, row,
// d) are the AVX2 paths' and the oracle's: mul then add in d order (scores) and list order (P·V), or one FMA
// for the two where the caller found every product exact (the same bits).
// GCC 12's _mm512_reduce_* helpers (self-initialised on purpose) trip -W(maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>

#include "kernels/sparse_attention_impl.h"

// The one target string of this file; every function that uses AVX-512 intrinsics carries it (the vdpbf16ps
// scores add BF16).
#define DSFLASH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define DSFLASH_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace dsflash::sparse_attention_impl {
namespace {

// acc + a * b: the product rounded, then the sum (the oracle's), or one FMA where the product is exact.
template <bool kFused>
DSFLASH_AVX512 inline __m512 multiply_add(__m512 a, __m512 b, __m512 acc) {
  return kFused ? _mm512_fmadd_ps(a, b, acc) : _mm512_add_ps(acc, _mm512_mul_ps(a, b));
}

// acc[i][l] = Σ_d q_t[d][l] * r[i][d]: 32 heads in two zmm x 8 rows = 16 independent add chains; each
// broadcast row element serves both halves (one broadcast per multiply ran at ~0.65 of the mul/add rate on
// Zen 5, one per two at ~0.93).
template <bool kFused>
DSFLASH_AVX512 void score_rows_impl(const float* q_t, const float* const* r, int64_t dim, float (*acc)[kScoreHeads]) {
  __m512 a[kScoreRows][2];
  for (auto& v : a) v[0] = v[1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    const __m512 q0 = _mm512_loadu_ps(q_t + d * kScoreHeads);
    const __m512 q1 = _mm512_loadu_ps(q_t + d * kScoreHeads + kHeadLanes);
#pragma GCC unroll 8
    for (int i = 0; i < kScoreRows; ++i) {
      const __m512 x = _mm512_set1_ps(r[i][d]);
      a[i][0] = multiply_add<kFused>(q0, x, a[i][0]);
      a[i][1] = multiply_add<kFused>(q1, x, a[i][1]);
    }
  }
  for (int i = 0; i < kScoreRows; ++i) {
    _mm512_storeu_ps(acc[i], a[i][0]);
    _mm512_storeu_ps(acc[i] + kHeadLanes, a[i][1]);
  }
}

DSFLASH_AVX512 void score_rows_avx512(const float* q_t, const float* const* r, int64_t dim, bool fused,
                                      float (*acc)[kScoreHeads]) {
  if (fused) score_rows_impl<true>(q_t, r, dim, acc);
  else score_rows_impl<false>(q_t, r, dim, acc);
}

// ScoreRowsPairsKernel: score_rows_impl's passes by vdpbf16ps, one per (row, pair of d) and half of 32 heads.
// Per chunk of 64 d, the 8 rows' bf16 pairs are gathered first ([8][32] dwords, high word = the even d, as in
// q_pairs) by one vpermt2w per 32 elements, then each pair broadcasts from there.
DSFLASH_AVX512_BF16 void score_rows_pairs_avx512(const uint32_t* q_pairs, const float* const* r, int64_t dim,
                                                 float (*acc)[kScoreHeads]) {
  constexpr int64_t kChunkPairs = 32;
  // Word 2p of the result <- element 2p + 1's high word (word 4p + 3 of the 32 elements' 64 words), word 2p + 1 <-
  // element 2p's (word 4p + 1).
  alignas(64) static constexpr auto kPick = [] {
    std::array<uint16_t, 32> pick{};
    for (int p = 0; p < 16; ++p) {
      pick[2 * p] = static_cast<uint16_t>(4 * p + 3);
      pick[2 * p + 1] = static_cast<uint16_t>(4 * p + 1);
    }
    return pick;
  }();
  const __m512i pick = _mm512_load_si512(kPick.data());
  __m512 a[kScoreRows][2];
  for (auto& v : a) v[0] = v[1] = _mm512_setzero_ps();
  alignas(64) uint32_t pairs[kScoreRows][kChunkPairs];
  for (int64_t d0 = 0; d0 < dim; d0 += 2 * kChunkPairs) {
    const int64_t n = std::min(kChunkPairs, (dim - d0) / 2);  // pairs of this chunk
    for (int i = 0; i < kScoreRows; ++i)
      for (int64_t p = 0; p < n; p += 16) {
        // Elements from here on; past the row's end, masked lanes load 0 (never read back). Full vectors take plain
        // loads (masked ones are slow on AMD).
        const int64_t left = dim - d0 - 2 * p;
        auto load = [&](const float* from, int64_t count) DSFLASH_AVX512_BF16 {
          if (count >= 16) return _mm512_castps_si512(_mm512_loadu_ps(from));
          return _mm512_castps_si512(
              _mm512_maskz_loadu_ps(count <= 0 ? __mmask16{0} : static_cast<__mmask16>((1u << count) - 1), from));
        };
        const float* from = r[i] + d0 + 2 * p;
        const __m512i lo = load(from, left), hi = load(from + 16, left - 16);
        _mm512_store_si512(&pairs[i][p], _mm512_permutex2var_epi16(lo, pick, hi));
      }
    const uint32_t* q = q_pairs + (d0 / 2) * kScoreHeads;
    for (int64_t p = 0; p < n; ++p) {
      const __m512bh q0 = (__m512bh)_mm512_loadu_si512(q + p * kScoreHeads);
      const __m512bh q1 = (__m512bh)_mm512_loadu_si512(q + p * kScoreHeads + kHeadLanes);
#pragma GCC unroll 8
      for (int i = 0; i < kScoreRows; ++i) {
        const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[i][p]));
        a[i][0] = _mm512_dpbf16_ps(a[i][0], q0, x);
        a[i][1] = _mm512_dpbf16_ps(a[i][1], q1, x);
      }
    }
  }
  for (int i = 0; i < kScoreRows; ++i) {
    _mm512_storeu_ps(acc[i], a[i][0]);
    _mm512_storeu_ps(acc[i] + kHeadLanes, a[i][1]);
  }
}

// The P·V kernels' pass over dims [0, dim): chunks of 48 dims (24 accumulators: three row loads and eight p
// broadcasts per 24 multiplies), the rest in one chunk of up to 3 vectors with the last one masked:
// chunk.operator()<kVectors, kFull>(first dim, mask of the last vector).
template <class Chunk>
DSFLASH_AVX512 inline void for_each_pv_chunk(int64_t dim, const Chunk& chunk) {
  constexpr int64_t kChunk = 48;
  int64_t d = 0;
  for (; d + kChunk <= dim; d += kChunk) chunk.template operator()<3, true>(d, 0xffff);
  const int64_t rest = dim - d;
  if (rest == 0) return;
  const int64_t tail = rest % 16;
  const __mmask16 last = tail == 0 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << tail) - 1);
  if (rest > 32) chunk.template operator()<3, false>(d, last);
  else if (rest > 16) chunk.template operator()<2, false>(d, last);
  else chunk.template operator()<1, false>(d, last);
}

// The group's P·V over dims [d, d + 16 * kVectors) for all 8 heads (heads past lanes run on p = 0, c = 1):
// 8 x kVectors zmm accumulators, each row chunk loaded once for the 8 heads. `last` masks the final vector's
// dims at the end of the row (masked lanes load 0 and are not stored); kFull chunks use plain loads and stores
// (masked ones are slow on AMD).
template <int kVectors, bool kFull, bool kFused>
DSFLASH_AVX512 inline void pv_chunk(const PvBlock& b, int64_t d, __mmask16 last, float* num, int64_t num_stride) {
  auto load = [&](const float* from, int v) DSFLASH_AVX512 {
    return kFull || v + 1 < kVectors ? _mm512_loadu_ps(from + 16 * v) : _mm512_maskz_loadu_ps(last, from + 16 * v);
  };
  __m512 acc[kGroupHeads * kVectors];  // [head][vector], flat: GCC keeps a flat array of vectors in registers
#pragma GCC unroll 24
  for (int i = 0; i < kGroupHeads * kVectors; ++i) acc[i] = _mm512_setzero_ps();
  for (int j = 0; j < b.present; ++j) {
    const float* row = b.rows[j] + d;
    __m512 r[kVectors];
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) r[v] = load(row, v);
    const float* p = b.p + j * kGroupHeads;
#pragma GCC unroll 8
    for (int g = 0; g < kGroupHeads; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g]);
#pragma GCC unroll 3
      for (int v = 0; v < kVectors; ++v) acc[g * kVectors + v] = multiply_add<kFused>(pg, r[v], acc[g * kVectors + v]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < kGroupHeads; ++g) {
    const __m512 c = _mm512_set1_ps(b.correction[g]);
    float* n = num + g * num_stride + d;
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) {
      const __m512 updated = _mm512_add_ps(_mm512_mul_ps(load(n, v), c), acc[g * kVectors + v]);
      if (kFull || v + 1 < kVectors) _mm512_storeu_ps(n + 16 * v, updated);
      else _mm512_mask_storeu_ps(n + 16 * v, last, updated);
    }
  }
}

// pv_chunk by vdpbf16ps (PvBlockPairsKernel): per pair of present rows, each vector of 16 dims interleaved by one
// vpermt2w (dword = the first row's bf16 in the high word, the second's in the low word) and multiplied by the
// broadcast probability pairs of the 8 heads.
template <int kVectors, bool kFull>
DSFLASH_AVX512_BF16 inline void pv_chunk_pairs(const PvBlock& b, int64_t d, __mmask16 last, __m512i pick, float* num,
                                               int64_t num_stride) {
  auto load = [&](const float* from, int v) DSFLASH_AVX512_BF16 {
    return _mm512_castps_si512(kFull || v + 1 < kVectors ? _mm512_loadu_ps(from + 16 * v)
                                                         : _mm512_maskz_loadu_ps(last, from + 16 * v));
  };
  __m512 acc[kGroupHeads * kVectors];  // [head][vector], flat
#pragma GCC unroll 24
  for (int i = 0; i < kGroupHeads * kVectors; ++i) acc[i] = _mm512_setzero_ps();
  for (int j = 0; j < b.present; j += 2) {
    const float* first = b.rows[j] + d;
    const float* second = j + 1 < b.present ? b.rows[j + 1] + d : nullptr;
    __m512bh r[kVectors];
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v)
      r[v] = (__m512bh)_mm512_permutex2var_epi16(load(first, v), pick,
                                                 second != nullptr ? load(second, v) : _mm512_setzero_si512());
    const uint32_t* p = b.p_pairs + (j / 2) * kGroupHeads;
#pragma GCC unroll 8
    for (int g = 0; g < kGroupHeads; ++g) {
      const __m512bh pg = (__m512bh)_mm512_set1_epi32(static_cast<int>(p[g]));
#pragma GCC unroll 3
      for (int v = 0; v < kVectors; ++v) acc[g * kVectors + v] = _mm512_dpbf16_ps(acc[g * kVectors + v], r[v], pg);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < kGroupHeads; ++g) {
    const __m512 c = _mm512_set1_ps(b.correction[g]);
    float* n = num + g * num_stride + d;
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) {
      const __m512 updated = _mm512_add_ps(_mm512_mul_ps(_mm512_castsi512_ps(load(n, v)), c), acc[g * kVectors + v]);
      if (kFull || v + 1 < kVectors) _mm512_storeu_ps(n + 16 * v, updated);
      else _mm512_mask_storeu_ps(n + 16 * v, last, updated);
    }
  }
}

DSFLASH_AVX512_BF16 void pv_block_pairs_avx512(const PvBlock& b, int64_t dim, float* num, int64_t num_stride) {
  // Word 2k of a result <- the second row's element k (its high word: word 2k + 1 of the second source), word
  // 2k + 1 <- the first row's.
  alignas(64) static constexpr auto kPick = [] {
    std::array<uint16_t, 32> pick{};
    for (int k = 0; k < 16; ++k) {
      pick[2 * k] = static_cast<uint16_t>(32 + 2 * k + 1);
      pick[2 * k + 1] = static_cast<uint16_t>(2 * k + 1);
    }
    return pick;
  }();
  const __m512i pick = _mm512_load_si512(kPick.data());
  for_each_pv_chunk(dim, [&]<int kVectors, bool kFull>(int64_t d, __mmask16 last) DSFLASH_AVX512_BF16 {
    pv_chunk_pairs<kVectors, kFull>(b, d, last, pick, num, num_stride);
  });
}

template <bool kFused>
DSFLASH_AVX512 void pv_block_impl(const PvBlock& b, int64_t dim, float* num, int64_t num_stride) {
  for_each_pv_chunk(dim, [&]<int kVectors, bool kFull>(int64_t d, __mmask16 last) DSFLASH_AVX512 {
    pv_chunk<kVectors, kFull, kFused>(b, d, last, num, num_stride);
  });
}

DSFLASH_AVX512 void pv_block_avx512(const PvBlock& b, int64_t dim, float* num, int64_t num_stride) {
  if (b.fused) pv_block_impl<true>(b, dim, num, num_stride);
  else pv_block_impl<false>(b, dim, num, num_stride);
}

// ValueBoundsKernel on 16 lanes (the tail masked: its zeros count as nothing). Magnitudes compare as unsigned
// integers; the smallest nonzero one is 1 + min(|x| - 1), where a zero wraps to the largest.
DSFLASH_AVX512 ValueBounds bounds_avx512(const float* values, int64_t count) {
  const __m512i magnitude_bits = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  __m512i low = _mm512_set1_epi32(-1), high = _mm512_setzero_si512(), any = _mm512_setzero_si512();
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = count - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m512i x = _mm512_maskz_loadu_epi32(lanes, values + i);
    const __m512i magnitude = _mm512_and_si512(x, magnitude_bits);
    low = _mm512_min_epu32(low, _mm512_sub_epi32(magnitude, one));
    high = _mm512_max_epu32(high, magnitude);
    any = _mm512_or_si512(any, x);
  }
  return bounds_from_bits(_mm512_reduce_min_epu32(low), _mm512_reduce_max_epu32(high),
                          static_cast<uint32_t>(_mm512_reduce_or_epi32(any)));
}

}  // namespace

FastPaths avx512_paths(bool bf16_pairs) {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!supported) return {nullptr, nullptr, nullptr};
  static const bool bf16 = __builtin_cpu_supports("avx512bf16");
  const bool pairs = bf16 && bf16_pairs;
  return {score_rows_avx512, pv_block_avx512, bounds_avx512, pairs ? score_rows_pairs_avx512 : nullptr,
          pairs ? pv_block_pairs_avx512 : nullptr};
}

}  // namespace dsflash::sparse_attention_impl
