#include "kernels/index_score.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "formats/formats.h"
#include "formats/quant.h"
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

// --- stored key rows ----------------------------------------------------------------------------------------
namespace dsflash {
namespace {

// Rows [num_keys] -> fp32 keys [num_keys, dim] (exact).
void dequantise_rows(const IndexScoreRowsArgs& a, int64_t first, int64_t count, float* keys) {
  for (int64_t j = 0; j < count; ++j) {
    const uint8_t* row = a.key_rows[first + j];
    dequant_e2m1_ue8m0(row, row + a.dim / 2, a.dim, 32, keys + j * a.dim);
  }
}

template <void (*kScores)(const IndexScoreArgs&)>
void scores_of_dequantised_rows(const IndexScoreRowsArgs& a) {
  Arena own;
  Arena& arena = a.scratch != nullptr ? *a.scratch : own;
  ArenaScope scope(arena);
  const std::span<float> keys = arena.take<float>(static_cast<size_t>(std::max<int64_t>(1, a.num_keys * a.dim)));
  dequantise_rows(a, 0, a.num_keys, keys.data());
  IndexScoreArgs args;
  args.q = a.q;
  args.weights = a.weights;
  args.keys = keys.data();
  args.scores = a.scores;
  args.num_queries = a.num_queries;
  args.num_keys = a.num_keys;
  args.score_stride = a.score_stride;
  args.heads = a.heads;
  args.dim = a.dim;
  args.scratch = &arena;
  kScores(args);
}

// Twice the e2m1 value of a nibble (magnitude codes 0-7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign), plus 12:
// the unsigned operand of vpdpbusd, in [0, 24].
constexpr uint8_t kTwiceE2m1Plus12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

// One (query, head) of q as integers: q_d = iq_d * 2^exponent[b] per block b of 32.
struct QueryHeadInts {
  int8_t* iq;          // [dim]
  int32_t* exponent;   // [dim/32]
  int32_t* sum;        // [dim/32] Σ iq (for the +12 offset of the keys)
  int32_t* bound;      // [dim/32] 12 * Σ|iq| (the partial-sum bound); 0 = the block is all zeros
};

// Splits a block of 32 fp32 q values into iq * 2^e; false when they are not e2m1 times one power of two.
bool split_block(const float* q, int8_t* iq, int32_t* exponent, int32_t* sum, int32_t* bound) {
  float m = 0.0f;
  for (int d = 0; d < 32; ++d) m = std::max(m, std::fabs(q[d]));
  *sum = 0;
  *bound = 0;
  *exponent = 0;
  if (m == 0.0f) {
    std::fill(iq, iq + 32, int8_t{0});
    return true;
  }
  if (!std::isfinite(m)) return false;
  const int e = std::ilogb(m) - 3;  // the largest |q| / 2^e in [8, 16)
  int32_t abs_sum = 0;
  for (int d = 0; d < 32; ++d) {
    const float v = std::ldexp(q[d], -e);
    if (!(std::fabs(v) <= 12.0f) || v != std::nearbyint(v) || std::ldexp(v, e) != q[d]) return false;
    iq[d] = static_cast<int8_t>(v);
    *sum += iq[d];
    abs_sum += std::abs(static_cast<int32_t>(iq[d]));
  }
  *exponent = e;
  *bound = 12 * abs_sum;
  return true;
}

// dots [heads][16] of one query against 16 keys packed as (ik + 12) bytes kq [dim/4][16][4] with ue8m0 scale
// codes ub [dim/32][16] (int32); false (dots unspecified) when some valid lane's exactness check fails.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) bool exact_dots16(const uint8_t* kq, const int32_t* ub,
                                                                           const QueryHeadInts* heads_ints, int heads,
                                                                           int64_t dim, int lanes, float* dots) {
  const int blocks = static_cast<int>(dim / 32);
  const __mmask16 valid = static_cast<__mmask16>((1u << lanes) - 1u);
  constexpr int kHeadsAtOnce = 8;
  for (int h0 = 0; h0 < heads; h0 += kHeadsAtOnce) {
    const int hn = std::min(kHeadsAtOnce, heads - h0);
    __m512i shift[kHeadsAtOnce][4];  // blocks <= 4 (dim 128); larger dims take the loop below per block
    __m512i e_min[kHeadsAtOnce];
    bool any_block[kHeadsAtOnce];
    for (int h = 0; h < hn; ++h) {
      const QueryHeadInts& qi = heads_ints[h0 + h];
      __m512i lo = _mm512_set1_epi32(1 << 30);
      any_block[h] = false;
      for (int b = 0; b < blocks; ++b) {
        if (qi.bound[b] == 0) continue;
        any_block[h] = true;
        const __m512i e = _mm512_add_epi32(_mm512_loadu_si512(ub + b * 16), _mm512_set1_epi32(qi.exponent[b] - 128));
        lo = _mm512_min_epi32(lo, e);
      }
      e_min[h] = lo;
      if (!any_block[h]) continue;
      __m512i total = _mm512_setzero_si512();
      __mmask16 ok = valid;
      for (int b = 0; b < blocks; ++b) {
        if (qi.bound[b] == 0) {
          shift[h][b] = _mm512_setzero_si512();
          continue;
        }
        const __m512i e = _mm512_add_epi32(_mm512_loadu_si512(ub + b * 16), _mm512_set1_epi32(qi.exponent[b] - 128));
        const __m512i s = _mm512_sub_epi32(e, lo);
        ok &= _mm512_cmple_epi32_mask(s, _mm512_set1_epi32(11));
        shift[h][b] = _mm512_min_epi32(s, _mm512_set1_epi32(11));
        total = _mm512_add_epi32(total, _mm512_sllv_epi32(_mm512_set1_epi32(qi.bound[b]), shift[h][b]));
      }
      ok &= _mm512_cmplt_epi32_mask(total, _mm512_set1_epi32(1 << 24));
      ok &= _mm512_cmpge_epi32_mask(lo, _mm512_set1_epi32(-126));
      ok &= _mm512_cmple_epi32_mask(lo, _mm512_set1_epi32(103));
      if (ok != valid) return false;
    }
    __m512i n[kHeadsAtOnce];
    for (int h = 0; h < hn; ++h) n[h] = _mm512_setzero_si512();
    for (int b = 0; b < blocks; ++b) {
      __m512i acc[kHeadsAtOnce];
      for (int h = 0; h < hn; ++h) acc[h] = _mm512_setzero_si512();
      for (int quad = b * 8; quad < b * 8 + 8; ++quad) {
        const __m512i k = _mm512_loadu_si512(kq + quad * 64);
        for (int h = 0; h < hn; ++h) {
          int32_t q4;
          std::memcpy(&q4, heads_ints[h0 + h].iq + quad * 4, sizeof(q4));
          acc[h] = _mm512_dpbusd_epi32(acc[h], k, _mm512_set1_epi32(q4));
        }
      }
      for (int h = 0; h < hn; ++h) {
        const QueryHeadInts& qi = heads_ints[h0 + h];
        if (qi.bound[b] == 0) continue;
        const __m512i p = _mm512_sub_epi32(acc[h], _mm512_set1_epi32(12 * qi.sum[b]));
        n[h] = _mm512_add_epi32(n[h], _mm512_sllv_epi32(p, shift[h][b]));
      }
    }
    for (int h = 0; h < hn; ++h) {
      float* out = dots + (h0 + h) * kIndexKeyLanes;
      if (!any_block[h]) {
        _mm512_storeu_ps(out, _mm512_setzero_ps());
        continue;
      }
      const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e_min[h], _mm512_set1_epi32(127)), 23));
      _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(n[h]), scale));
    }
  }
  return true;
}

// The VNNI table entry (IndexScoreRowsKernel).
void index_scores_rows_exact(const IndexScoreRowsArgs& a) {
  const int64_t blocks = a.dim / 32;
  if (a.dim % 32 != 0 || blocks > 4 || a.num_keys <= 0 || a.num_queries <= 0) {
    scores_of_dequantised_rows<index_scores_packed16>(a);
    return;
  }
  Arena own;
  Arena& arena = a.scratch != nullptr ? *a.scratch : own;
  ArenaScope scope(arena);
  const size_t query_heads = static_cast<size_t>(a.num_queries * a.heads);
  // q as integers: iq [queries, heads, dim], exponent / sum / bound [queries, heads, blocks].
  const std::span<int8_t> iq = arena.take<int8_t>(query_heads * static_cast<size_t>(a.dim));
  const std::span<int32_t> q_meta = arena.take<int32_t>(query_heads * static_cast<size_t>(3 * blocks));
  const std::span<QueryHeadInts> q_ints = arena.take<QueryHeadInts>(query_heads);
  for (size_t qh = 0; qh < query_heads; ++qh) {
    QueryHeadInts& qi = q_ints[qh];
    qi.iq = &iq[qh * static_cast<size_t>(a.dim)];
    qi.exponent = &q_meta[qh * static_cast<size_t>(3 * blocks)];
    qi.sum = qi.exponent + blocks;
    qi.bound = qi.sum + blocks;
    const float* q = a.q + static_cast<int64_t>(qh) * a.dim;
    for (int64_t b = 0; b < blocks; ++b) {
      if (!split_block(q + b * 32, qi.iq + b * 32, qi.exponent + b, qi.sum + b, qi.bound + b)) {
        scores_of_dequantised_rows<index_scores_packed16>(a);  // q is not MXFP4-shaped
        return;
      }
    }
  }
  const std::span<uint8_t> kq = arena.take<uint8_t>(static_cast<size_t>(a.dim * kIndexKeyLanes));  // [dim/4][16][4]
  const std::span<int32_t> ub = arena.take<int32_t>(static_cast<size_t>(blocks * kIndexKeyLanes));  // [blocks][16]
  const std::span<float> dots = arena.take<float>(static_cast<size_t>(a.heads * kIndexKeyLanes));    // [heads][16]
  const std::span<float> per_head = arena.take<float>(static_cast<size_t>(a.heads));
  const std::span<float> keys = arena.take<float>(static_cast<size_t>(kIndexKeyLanes * a.dim));      // fallback
  const std::span<float> packed = arena.take<float>(static_cast<size_t>(kIndexKeyLanes * a.dim));
  for (int64_t g0 = 0; g0 < a.num_keys; g0 += kIndexKeyLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kIndexKeyLanes, a.num_keys - g0));
    bool scales_finite = true;
    for (int l = 0; l < kIndexKeyLanes; ++l) {
      const uint8_t* row = l < lanes ? a.key_rows[g0 + l] : nullptr;
      for (int64_t quad = 0; quad < a.dim / 4; ++quad) {
        uint8_t* out = &kq[static_cast<size_t>((quad * kIndexKeyLanes + l) * 4)];
        if (row == nullptr) {
          std::fill(out, out + 4, uint8_t{12});  // ik = 0
          continue;
        }
        const uint8_t b0 = row[quad * 2], b1 = row[quad * 2 + 1];
        out[0] = kTwiceE2m1Plus12[b0 & 15];
        out[1] = kTwiceE2m1Plus12[b0 >> 4];
        out[2] = kTwiceE2m1Plus12[b1 & 15];
        out[3] = kTwiceE2m1Plus12[b1 >> 4];
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const int32_t u = row != nullptr ? row[a.dim / 2 + b] : 127;
        scales_finite &= u != 255;
        ub[static_cast<size_t>(b * kIndexKeyLanes + l)] = u;
      }
    }
    bool packed_ready = false;
    for (int64_t t = 0; t < a.num_queries; ++t) {
      const float* wt = a.weights + t * a.heads;
      if (!scales_finite || !exact_dots16(kq.data(), ub.data(), &q_ints[static_cast<size_t>(t * a.heads)], a.heads,
                                          a.dim, lanes, dots.data())) {
        if (!packed_ready) {
          dequantise_rows(a, g0, lanes, keys.data());
          pack_index_keys(keys.data(), lanes, a.dim, packed.data());
          packed_ready = true;
        }
        index_dots16(packed.data(), a.q + t * a.heads * a.dim, a.heads, a.dim, dots.data());
      }
      for (int l = 0; l < lanes; ++l) {
        a.scores[t * a.score_stride + g0 + l] =
            head_weighted_score(&dots[static_cast<size_t>(l)], kIndexKeyLanes, wt, a.heads, per_head.data());
      }
    }
  }
}

}  // namespace

void index_scores_rows_reference(const IndexScoreRowsArgs& a) { scores_of_dequantised_rows<index_scores_reference>(a); }
void index_scores_rows_packed16(const IndexScoreRowsArgs& a) { scores_of_dequantised_rows<index_scores_packed16>(a); }

IndexScoreRowsKernel index_scores_rows_vnni() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni");
  return supported ? index_scores_rows_exact : nullptr;
}

}  // namespace dsflash
