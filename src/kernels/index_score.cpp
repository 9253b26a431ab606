#include "kernels/index_score.h"

// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -W(maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/bf16_lanes.h"
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

// outer_cascade_sum's schedule for n values (kernels/reduce.cpp): level 0 takes `step` values, then folds upwards
// until the index has a nonzero digit at that level. The vector twins below run it on 16 lanes at once.
struct CascadeSchedule {
  explicit CascadeSchedule(int64_t n) {
    int64_t ceil_log2 = 1;
    if (n > 2) {
      ceil_log2 = 0;
      for (uint64_t v = static_cast<uint64_t>(n) - 1; v != 0; v >>= 1) ++ceil_log2;
    }
    level_power = std::max<int64_t>(4, ceil_log2 / kLevels);
    step = int64_t{1} << level_power;
    mask = step - 1;
  }
  static constexpr int kLevels = 4;
  int64_t level_power, step, mask;
};

// --- AVX2 (the build baseline): 16 lanes as two ymm halves.
struct Lanes256 {
  __m256 lo, hi;
};

// bf16(relu(bf16(dot)) * w) for one head: relu as max(0, x) returns x unless 0 > x, exactly std::max(x, 0.0f)
// (-0.0 and NaN pass through).
__m256 weighted_head_256(__m256 dot, __m256 w) {
  const __m256 relu = _mm256_max_ps(_mm256_setzero_ps(), round_bf16_x8(dot));
  return round_bf16_x8(_mm256_mul_ps(relu, w));
}

Lanes256 weighted_head16_256(const float* dots, int h, float w) {
  const __m256 wv = _mm256_set1_ps(w);
  return {weighted_head_256(_mm256_loadu_ps(dots + h * kIndexKeyLanes), wv),
          weighted_head_256(_mm256_loadu_ps(dots + h * kIndexKeyLanes + 8), wv)};
}

Lanes256 add256(Lanes256 a, Lanes256 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }

// --- AVX-512 F: 16 lanes in one zmm.
// kQuietNans: NaN inputs give the quieted NaN with the low 16 bits dropped; without it the add may carry out of
// them (weigh_heads16_finite_avx512 says where that cannot happen).
template <bool kQuietNans>
__attribute__((target("avx512f"))) inline __m512 round_bf16_512(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), top);
  if constexpr (!kQuietNans) return _mm512_castsi512_ps(rounded);
  const __m512i quiet = _mm512_or_si512(_mm512_and_si512(b, top), _mm512_set1_epi32(0x00400000));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

template <bool kQuietNans>
__attribute__((target("avx512f"))) inline __m512 weighted_head16_512(const float* dots, int h, float w) {
  const __m512 dot = _mm512_loadu_ps(dots + h * kIndexKeyLanes);
  const __m512 relu = _mm512_max_ps(_mm512_setzero_ps(), round_bf16_512<kQuietNans>(dot));
  return round_bf16_512<kQuietNans>(_mm512_mul_ps(relu, _mm512_set1_ps(w)));
}

template <bool kQuietNans>
__attribute__((target("avx512f"))) void weigh_heads16_512(const float* dots, const float* w, int heads, float* out) {
  const CascadeSchedule s(heads);
  __m512 acc[CascadeSchedule::kLevels];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  int64_t i = 0;
  while (i + s.step <= heads) {
    for (int64_t j = 0; j < s.step; ++j, ++i) {
      acc[0] = _mm512_add_ps(acc[0], weighted_head16_512<kQuietNans>(dots, static_cast<int>(i), w[i]));
    }
    for (int j = 1; j < CascadeSchedule::kLevels; ++j) {
      acc[j] = _mm512_add_ps(acc[j], acc[j - 1]);
      acc[j - 1] = _mm512_setzero_ps();
      if ((i & (s.mask << (j * s.level_power))) != 0) break;
    }
  }
  for (; i < heads; ++i) {
    acc[0] = _mm512_add_ps(acc[0], weighted_head16_512<kQuietNans>(dots, static_cast<int>(i), w[i]));
  }
  for (int j = 1; j < CascadeSchedule::kLevels; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  _mm512_storeu_ps(out, round_bf16_512<kQuietNans>(acc[0]));
}

}  // namespace

void index_dots16(const float* packed, const float* q, int heads, int64_t dim, float* dots) {
  int h = 0;
  for (; h + 4 <= heads; h += 4) dots_four_heads(packed, q + h * dim, dim, dots + h * kIndexKeyLanes);
  for (; h < heads; ++h) dots_one_head(packed, q + h * dim, dim, dots + h * kIndexKeyLanes);
}

void weigh_heads16_reference(const float* dots, const float* w, int heads, float* out) {
  std::vector<float> per_head(static_cast<size_t>(heads));
  for (int l = 0; l < kIndexKeyLanes; ++l) out[l] = head_weighted_score(dots + l, kIndexKeyLanes, w, heads, per_head.data());
}

void weigh_heads16_avx2(const float* dots, const float* w, int heads, float* out) {
  const CascadeSchedule s(heads);
  Lanes256 acc[CascadeSchedule::kLevels];
  for (Lanes256& a : acc) a = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  while (i + s.step <= heads) {
    for (int64_t j = 0; j < s.step; ++j, ++i) acc[0] = add256(acc[0], weighted_head16_256(dots, static_cast<int>(i), w[i]));
    for (int j = 1; j < CascadeSchedule::kLevels; ++j) {
      acc[j] = add256(acc[j], acc[j - 1]);
      acc[j - 1] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      if ((i & (s.mask << (j * s.level_power))) != 0) break;
    }
  }
  for (; i < heads; ++i) acc[0] = add256(acc[0], weighted_head16_256(dots, static_cast<int>(i), w[i]));
  for (int j = 1; j < CascadeSchedule::kLevels; ++j) acc[0] = add256(acc[0], acc[j]);
  _mm256_storeu_ps(out, round_bf16_x8(acc[0].lo));
  _mm256_storeu_ps(out + 8, round_bf16_x8(acc[0].hi));
}

WeighHeads16Kernel weigh_heads16_avx512() {
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported ? weigh_heads16_512<true> : nullptr;
}

WeighHeads16Kernel weigh_heads16_finite_avx512() {
  return weigh_heads16_avx512() != nullptr ? weigh_heads16_512<false> : nullptr;
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
      float group_scores[kIndexKeyLanes];
      weigh_heads16_avx2(dots.data(), wt, a.heads, group_scores);
      std::copy(group_scores, group_scores + lanes, a.scores + t * a.score_stride + g0);
    }
  }
}

}  // namespace dsflash
