#include "kernels/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include <immintrin.h>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/bf16_lanes.h"
#include "kernels/index_score.h"
#include "kernels/linear_impl.h"
#include "kernels/reduce.h"
#include "kernels/sparse_attention_impl.h"
#include "kernels/torch_exp.h"
#include "kernels/transpose8.h"

namespace dsflash {
namespace {

using namespace sparse_attention_impl;

constexpr float kInitialMax = -1e30f;  // the reference's running max starts here, not at -inf

// The oracle's (query, head): the online softmax over the list in blocks of 64, given the head's scores
// [num_entries] (s_j = (q_h · row_j) * scale, -inf for -1 entries).
// exp evaluated as the reference's torch.exp on its [heads, block] (probabilities) and [heads] (correction,
// sink) tensors: SLEEF on whole vector chunks, std::exp on the tail of the tensor (kernels/torch_exp.h).
// P·V and the num update element by element over dim, entries in list order. The fast kernel (below) repeats
// this sequence for every (head, d).
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


// ---- The fast kernel: AVX2 (the x86-64-v3 build baseline) and the driver shared with the AVX-512 paths ----

// sleef_expf_u10 on 8 lanes with the same operations lane for lane (FMAs exactly where it calls std::fma,
// round-to-nearest-even for nearbyint, 2^q as two exact powers), so every lane is the scalar function's bits.
inline __m256 sleef_expf_u10_x8(__m256 x) {
  const __m256 q_f = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.442695040888963407359924681001892137f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i q = _mm256_cvtps_epi32(q_f);  // exact: q_f is integral (lanes out of range are replaced below)
  __m256 s = _mm256_fmadd_ps(q_f, _mm256_set1_ps(-0.693145751953125f), x);
  s = _mm256_fmadd_ps(q_f, _mm256_set1_ps(-1.428606765330187045e-06f), s);
  __m256 u = _mm256_set1_ps(0.000198527617612853646278381f);
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00139304355252534151077271f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00833336077630519866943359f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.0416664853692054748535156f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.166666671633720397949219f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.5f));
  u = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(s, s), u, s));
  // 2^(q/2) and 2^(q - q/2) built from their exponent bits: both lie in [-75, 72] for x in [-104, 100].
  const __m256i q_half = _mm256_srai_epi32(q, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q_half, bias), 23));
  const __m256 scale_b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(q, q_half), bias), 23));
  u = _mm256_mul_ps(_mm256_mul_ps(u, scale_a), scale_b);
  // The scalar function's early returns (disjoint conditions): x > 100 -> inf, x < -104 -> 0, NaN -> x.
  u = _mm256_blendv_ps(u, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, _mm256_set1_ps(100.0f), _CMP_GT_OQ));
  u = _mm256_blendv_ps(u, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-104.0f), _CMP_LT_OQ));
  return _mm256_blendv_ps(u, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// max(s[0..count)) for the block's online-softmax step, in 8 lanes. Differs from the oracle's in-order
// std::max chain only in the sign of a zero maximum (NaN scores are skipped by both), and a zero's sign never
// reaches an output: it only enters differences whose exp is then exp(±0) = 1 on both exp paths.
float block_max(const float* s, int64_t count) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + j), m);  // a NaN score keeps m
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float result = lanes[0];
  for (int l = 1; l < 8; ++l) result = std::max(result, lanes[l]);
  for (; j < count; ++j) result = std::max(result, s[j]);
  return result;
}

// out[d] = bf16(num[d] / den) for d < dim (IEEE division, then round_bf16_x8 on 8 lanes).
void divide_round(const float* num, float den, int64_t dim, float* out) {
  const __m256 divisor = _mm256_set1_ps(den);
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) _mm256_storeu_ps(out + d, round_bf16_x8(_mm256_div_ps(_mm256_loadu_ps(num + d), divisor)));
  for (; d < dim; ++d) out[d] = round_to_bf16(num[d] / den);
}

// probs[j] = torch_exp_element(s[j] - next_max, index0 + j, total) for j < count (count <= 64): the indices in
// the whole vector chunks of the [heads, count] tensor through sleef_expf_u10_x8, the tensor's tail std::exp.
void block_exp(const float* s, float next_max, int64_t count, int64_t index0, int64_t total, float* probs) {
  const int64_t vector_end = std::clamp<int64_t>(total - total % kTorchVectorChunk - index0, 0, count);
  const __m256 shift = _mm256_set1_ps(next_max);
  int64_t j = 0;
  for (; j + 8 <= vector_end; j += 8) {
    _mm256_storeu_ps(probs + j, sleef_expf_u10_x8(_mm256_sub_ps(_mm256_loadu_ps(s + j), shift)));
  }
  if (j < vector_end) {  // a partial group of 8 (lanes past vector_end are computed on 0 and dropped)
    alignas(32) float x[8] = {};
    for (int64_t i = j; i < vector_end; ++i) x[i - j] = s[i] - next_max;
    _mm256_store_ps(x, sleef_expf_u10_x8(_mm256_load_ps(x)));
    for (int64_t i = j; i < vector_end; ++i) probs[i] = x[i - j];
  }
  for (j = vector_end; j < count; ++j) probs[j] = std::exp(s[j] - next_max);
}

// acc + a * b: the product rounded, then the sum (the oracle's), or one FMA where the product is exact.
template <bool kFused>
inline __m256 multiply_add(__m256 a, __m256 b, __m256 acc) {
  return kFused ? _mm256_fmadd_ps(a, b, acc) : _mm256_add_ps(acc, _mm256_mul_ps(a, b));
}

// acc[i * kScoreHeads + l] (l < 16) = Σ_d q_t[d * kScoreHeads + l] * r[i][d] in d order, mul then add (or
// FMAs: kFused): 4 rows x 16 heads in 8 ymm chains.
template <bool kFused>
void score_four_rows(const float* q_t, const float* const* r, int64_t dim, float* acc) {
  __m256 a[4][2];
  for (auto& v : a) v[0] = v[1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    const __m256 q0 = _mm256_loadu_ps(q_t + d * kScoreHeads);
    const __m256 q1 = _mm256_loadu_ps(q_t + d * kScoreHeads + 8);
    for (int i = 0; i < 4; ++i) {
      const __m256 x = _mm256_broadcast_ss(r[i] + d);
      a[i][0] = multiply_add<kFused>(q0, x, a[i][0]);
      a[i][1] = multiply_add<kFused>(q1, x, a[i][1]);
    }
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(acc + i * kScoreHeads, a[i][0]);
    _mm256_storeu_ps(acc + i * kScoreHeads + 8, a[i][1]);
  }
}

// ScoreRowsKernel for AVX2: 16 ymm cannot hold 8 rows x 32 heads, so four passes of 4 rows x 16 heads.
void score_rows_avx2(const float* q_t, const float* const* r, int64_t dim, bool fused, float (*acc)[kScoreHeads]) {
  for (int rows = 0; rows < kScoreRows; rows += 4) {
    for (int lanes = 0; lanes < kScoreHeads; lanes += kHeadLanes) {
      if (fused) score_four_rows<true>(q_t + lanes, r + rows, dim, &acc[rows][lanes]);
      else score_four_rows<false>(q_t + lanes, r + rows, dim, &acc[rows][lanes]);
    }
  }
}

// PvBlockKernel for AVX2: sub-groups of 4 heads x 16 dims (8 ymm accumulators, each row chunk loaded once
// per sub-group); the dims past the last whole 16 run pv_element.
template <bool kFused>
void pv_block_avx2_impl(const PvBlock& b, int64_t dim, float* num, int64_t num_stride) {
  for (int g0 = 0; g0 < b.lanes; g0 += 4) {
    int64_t d = 0;
    for (; d + 16 <= dim; d += 16) {
      __m256 acc[4][2];
      for (auto& v : acc) v[0] = v[1] = _mm256_setzero_ps();
      for (int j = 0; j < b.present; ++j) {
        const __m256 r0 = _mm256_loadu_ps(b.rows[j] + d);
        const __m256 r1 = _mm256_loadu_ps(b.rows[j] + d + 8);
        const float* p = b.p + j * kGroupHeads + g0;
        for (int g = 0; g < 4; ++g) {
          const __m256 pg = _mm256_broadcast_ss(p + g);
          acc[g][0] = multiply_add<kFused>(pg, r0, acc[g][0]);
          acc[g][1] = multiply_add<kFused>(pg, r1, acc[g][1]);
        }
      }
      for (int g = 0; g < 4; ++g) {
        float* n = num + (g0 + g) * num_stride + d;
        const __m256 c = _mm256_broadcast_ss(b.correction + g0 + g);
        _mm256_storeu_ps(n, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(n), c), acc[g][0]));
        _mm256_storeu_ps(n + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(n + 8), c), acc[g][1]));
      }
    }
    for (; d < dim; ++d) {
      for (int g = g0; g < g0 + 4; ++g) num[g * num_stride + d] = pv_element(b, g, d, num[g * num_stride + d]);
    }
  }
}

void pv_block_avx2(const PvBlock& b, int64_t dim, float* num, int64_t num_stride) {
  if (b.fused) pv_block_avx2_impl<true>(b, dim, num, num_stride);
  else pv_block_avx2_impl<false>(b, dim, num, num_stride);
}

// ValueBoundsKernel on 8 lanes, the tail scalar (see bounds_from_bits).
ValueBounds bounds_avx2(const float* values, int64_t count) {
  const __m256i magnitude_bits = _mm256_set1_epi32(0x7fffffff), one = _mm256_set1_epi32(1);
  __m256i low = _mm256_set1_epi32(-1), high = _mm256_setzero_si256(), any = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + i));
    const __m256i magnitude = _mm256_and_si256(x, magnitude_bits);
    low = _mm256_min_epu32(low, _mm256_sub_epi32(magnitude, one));
    high = _mm256_max_epu32(high, magnitude);
    any = _mm256_or_si256(any, x);
  }
  alignas(32) uint32_t lows[8], highs[8], anys[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lows), low);
  _mm256_store_si256(reinterpret_cast<__m256i*>(highs), high);
  _mm256_store_si256(reinterpret_cast<__m256i*>(anys), any);
  uint32_t low_minus_one = ~0u, highest = 0, any_bits = 0;
  for (int l = 0; l < 8; ++l) {
    low_minus_one = std::min(low_minus_one, lows[l]);
    highest = std::max(highest, highs[l]);
    any_bits |= anys[l];
  }
  for (; i < count; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
    low_minus_one = std::min(low_minus_one, (bits & 0x7fffffffu) - 1u);
    highest = std::max(highest, bits & 0x7fffffffu);
    any_bits |= bits;
  }
  return bounds_from_bits(low_minus_one, highest, any_bits);
}

// Visits the items [begin, end) of a (query, group) item space, `groups` per query, one query at a time:
// fn(query, first group, end group).
template <class Fn>
void for_each_query_groups(int64_t begin, int64_t end, int64_t groups, Fn&& fn) {
  for (int64_t item = begin; item < end;) {
    const int64_t query = item / groups;
    const int64_t first = item % groups;
    const int64_t last = std::min(groups, first + (end - item));
    fn(query, first, last);
    item += last - first;
  }
}

// t [dim][32] = a group's queries q [lanes][dim] transposed (t[d * 32 + l] = q[l * dim + d]), lanes past `lanes`
// zero: 8 x 8 blocks through registers, the ragged edges element by element.
void transpose_queries(const float* q, int lanes, int64_t dim, float* t) {
  const int full_lanes = lanes / 8 * 8;
  const int64_t full_dims = dim / 8 * 8;
  for (int l0 = 0; l0 < full_lanes; l0 += 8) {
    for (int64_t d0 = 0; d0 < full_dims; d0 += 8) {
      __m256 rows[8];
      for (int r = 0; r < 8; ++r) rows[r] = _mm256_loadu_ps(q + (l0 + r) * dim + d0);
      transpose8(rows);
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(t + (d0 + c) * kScoreHeads + l0, rows[c]);
    }
  }
  for (int64_t d = 0; d < dim; ++d) {
    for (int l = d < full_dims ? full_lanes : 0; l < kScoreHeads; ++l) {
      t[d * kScoreHeads + l] = l < lanes ? q[l * dim + d] : 0.0f;
    }
  }
}

// Phase 1 items (query, group of 32 heads) into scores [queries][heads][num_entries] (query relative to
// query0). Per query, each pass of 8 present rows serves all the item range's groups (rows [8][dim] stay in
// L1 while the groups' transposed queries q_t [groups][dim][32] stream from L2). Each score lane runs
// dot_in_order's sequence (mul, then add, in d order from 0.0f; one FMA where the group's queries and the pass's
// rows (row_bounds [queries][num_entries]) multiply exactly), so the scores are the oracle's bits. The last
// pass repeats a row to fill its 8 (results dropped).
void score_groups(const FastPaths& paths, const SparseAttentionArgs& a, int64_t query0, const ValueBounds* row_bounds,
                  float* scores, int64_t begin, int64_t end, Arena& scratch) {
  const int64_t groups = (a.heads + kScoreHeads - 1) / kScoreHeads;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::span<float> q_t = scratch.take<float>(static_cast<size_t>(groups * a.dim * kScoreHeads));
  const std::span<ValueBounds> q_bounds = scratch.take<ValueBounds>(static_cast<size_t>(groups));
  // The queries as bf16 pairs [groups][dim / 2][32] for the vdpbf16ps passes, where the CPU has them.
  const bool pairs = paths.score_rows_pairs != nullptr && a.dim % 2 == 0;
  const int64_t pairs_per_group = a.dim / 2 * kScoreHeads;
  const std::span<uint32_t> q_pairs = scratch.take<uint32_t>(pairs ? static_cast<size_t>(groups * pairs_per_group) : 0);
  for_each_query_groups(begin, end, groups, [&](int64_t item_query, int64_t first, int64_t last) {
    const int64_t query = query0 + item_query;
    const float* const* rows = a.rows + query * a.num_entries;
    const ValueBounds* bounds = row_bounds + item_query * a.num_entries;
    float* query_scores = scores + item_query * a.heads * a.num_entries;  // [heads][entries]
    const int head_end = std::min<int>(a.heads, static_cast<int>(last) * kScoreHeads);
    for (int64_t group = first; group < last; ++group) {  // the group's queries transposed, their bounds
      const int lanes = std::min<int>(kScoreHeads, a.heads - static_cast<int>(group) * kScoreHeads);
      const float* group_q = a.q + (query * a.heads + group * kScoreHeads) * a.dim;
      q_bounds[static_cast<size_t>(group)] = paths.bounds(group_q, lanes * a.dim);
      transpose_queries(group_q, lanes, a.dim, q_t.data() + group * a.dim * kScoreHeads);
      if (pairs) make_query_pairs(q_t.data() + group * a.dim * kScoreHeads, a.dim, q_pairs.data() + group * pairs_per_group);
    }
    int64_t present[kScoreRows];
    for (int64_t j = 0; j < a.num_entries;) {
      int n = 0;
      for (; j < a.num_entries && n < kScoreRows; ++j) {
        if (rows[j] == nullptr) {
          for (int h = static_cast<int>(first) * kScoreHeads; h < head_end; ++h) query_scores[h * a.num_entries + j] = neg_inf;
        } else {
          present[n++] = j;
        }
      }
      if (n == 0) break;
      const float* r[kScoreRows];
      for (int i = 0; i < kScoreRows; ++i) r[i] = rows[present[std::min(i, n - 1)]];
      ValueBounds pass_bounds = bounds[present[0]];
      for (int i = 1; i < n; ++i) pass_bounds = merge_bounds(pass_bounds, bounds[present[i]]);
      for (int64_t group = first; group < last; ++group) {
        float acc[kScoreRows][kScoreHeads];
        const ValueBounds group_bounds = q_bounds[static_cast<size_t>(group)];
        if (pairs && bf16_dot_exact(group_bounds, pass_bounds))
          paths.score_rows_pairs(q_pairs.data() + group * pairs_per_group, r, a.dim, acc);
        else
          paths.score_rows(q_t.data() + group * a.dim * kScoreHeads, r, a.dim, products_exact(group_bounds, pass_bounds), acc);
        const int head0 = static_cast<int>(group) * kScoreHeads;
        const int lanes = std::min(kScoreHeads, a.heads - head0);
        float* head_scores = query_scores + head0 * a.num_entries;  // [lanes][entries]
        if (n == kScoreRows && present[kScoreRows - 1] - present[0] == kScoreRows - 1) {
          // 8 adjacent entries: per 8 heads, the [8 rows][8 heads] block transposed in registers and stored as
          // 8 consecutive scores of each head.
          const __m256 scale = _mm256_set1_ps(a.scale);
          for (int l0 = 0; l0 < lanes; l0 += 8) {
            __m256 block[8];
            for (int i = 0; i < kScoreRows; ++i) block[i] = _mm256_loadu_ps(&acc[i][l0]);
            transpose8(block);
            for (int c = 0; c < std::min(8, lanes - l0); ++c) {
              _mm256_storeu_ps(head_scores + (l0 + c) * a.num_entries + present[0], _mm256_mul_ps(block[c], scale));
            }
          }
        } else {
          for (int i = 0; i < n; ++i) {
            for (int l = 0; l < lanes; ++l) head_scores[l * a.num_entries + present[i]] = acc[i][l] * a.scale;
          }
        }
      }
    }
  });
}

// Phase 2 items (query, group of 8 heads). Per query, block by block (the block's rows, 64 x dim floats, stay
// in L2 for all the item range's groups): each head's online-softmax step as attend_head runs it (same exp
// calls and indices, same denominator cascade), then the group's P·V in one pass over the block's rows
// (paths.pv_block, fused where the group's probabilities and the block's rows multiply exactly); at the end
// out = bf16(num / den) per head.
void attend_groups(const FastPaths& paths, const SparseAttentionArgs& a, int64_t query0, const ValueBounds* row_bounds,
                   const float* scores, int64_t begin, int64_t end, Arena& scratch) {
  const int64_t groups = (a.heads + kGroupHeads - 1) / kGroupHeads;
  const size_t slots = static_cast<size_t>(groups * kGroupHeads);
  const std::span<float> num = scratch.take<float>(slots * static_cast<size_t>(a.dim));  // [groups][8][dim]
  const std::span<float> maximum = scratch.take<float>(slots);                            // [groups][8]
  const std::span<float> denominator = scratch.take<float>(slots);                        // [groups][8]
  PvBlock block;
  int present_index[kSparseAttentionBlock];             // list position in the block of each present row
  alignas(32) float probs[kSparseAttentionBlock] = {};  // one head's exp(s_j - m') for the block
  alignas(32) float rounded[kSparseAttentionBlock];     // bf16(probs)
  for_each_query_groups(begin, end, groups, [&](int64_t item_query, int64_t first, int64_t last) {
    const int64_t query = query0 + item_query;
    const float* const* rows = a.rows + query * a.num_entries;
    const ValueBounds* bounds = row_bounds + item_query * a.num_entries;
    const float* query_scores = scores + item_query * a.heads * a.num_entries;  // [heads][entries]
    std::fill(num.begin() + first * kGroupHeads * a.dim, num.begin() + last * kGroupHeads * a.dim, 0.0f);
    std::fill(maximum.begin() + first * kGroupHeads, maximum.begin() + last * kGroupHeads, kInitialMax);
    std::fill(denominator.begin() + first * kGroupHeads, denominator.begin() + last * kGroupHeads, 0.0f);
    for (int64_t start = 0; start < a.num_entries; start += kSparseAttentionBlock) {
      const int64_t count = std::min<int64_t>(kSparseAttentionBlock, a.num_entries - start);
      block.present = 0;
      ValueBounds block_bounds{std::numeric_limits<float>::infinity(), 0.0f};
      for (int64_t j = 0; j < count; ++j) {
        if (rows[start + j] == nullptr) continue;
        present_index[block.present] = static_cast<int>(j);
        block.rows[block.present++] = rows[start + j];
        block_bounds = merge_bounds(block_bounds, bounds[start + j]);
      }
      for (int64_t group = first; group < last; ++group) {
        const int head0 = static_cast<int>(group) * kGroupHeads;
        block.lanes = std::min(kGroupHeads, a.heads - head0);
        for (int g = 0; g < kGroupHeads; ++g) {
          const int head = head0 + g;
          const size_t slot = static_cast<size_t>(head);
          if (g >= block.lanes) {  // past the last head: p = 0, c = 1 (results dropped)
            for (int i = 0; i < block.present; ++i) block.p[i * kGroupHeads + g] = 0.0f;
            block.correction[g] = 1.0f;
            continue;
          }
          const float* s = query_scores + head * a.num_entries + start;
          const float next_max = std::max(maximum[slot], block_max(s, count));
          const float correction = torch_exp_element(maximum[slot] - next_max, head, a.heads);
          block_exp(s, next_max, count, head * count, a.heads * count, probs);
          denominator[slot] = denominator[slot] * correction + cascade_sum_avx2(probs, count);
          for (int64_t j = 0; j < count; j += 8) {
            _mm256_store_ps(rounded + j, round_bf16_x8(_mm256_load_ps(probs + j)));  // lanes past count unused
          }
          for (int i = 0; i < block.present; ++i) block.p[i * kGroupHeads + g] = rounded[present_index[i]];
          block.correction[g] = correction;
          maximum[slot] = next_max;
        }
        const ValueBounds p_bounds = paths.bounds(block.p, block.present * kGroupHeads);
        float* group_num = num.data() + group * kGroupHeads * a.dim;
        if (paths.pv_block_pairs != nullptr && bf16_dot_exact(p_bounds, block_bounds)) {
          make_p_pairs(block);
          paths.pv_block_pairs(block, a.dim, group_num, a.dim);
        } else {
          block.fused = products_exact(p_bounds, block_bounds);
          paths.pv_block(block, a.dim, group_num, a.dim);
        }
      }
    }
    for (int head = static_cast<int>(first) * kGroupHeads; head < std::min<int>(a.heads, static_cast<int>(last) * kGroupHeads); ++head) {
      const size_t slot = static_cast<size_t>(head);
      const float den = denominator[slot] + torch_exp_element(a.sink[head] - maximum[slot], head, a.heads);
      divide_round(num.data() + head * a.dim, den, a.dim, a.out + (query * a.heads + head) * a.dim);
    }
  });
}

// Per chunk of queries, first the bounds of every listed row (products_exact: where the phases may fuse), in a
// parallel pass over the rows. Then, where the (query, group of 32 heads) items keep every thread busy: one
// parallel pass over them; query by query, a range of items scores its heads, then runs their softmax and P·V
// (groups of 8 heads) on the scores it just wrote, so no barrier separates the phases and the scores stay in the
// cache of the thread that made them (one decode query on 2 threads: ~13% faster than two passes). With more
// threads than those items (one decode query on a big machine), two passes: scores over the items, then softmax
// and P·V over (query, group of 8 heads), 4x the items. The chunk bounds the score buffer [chunk, heads,
// num_entries] to about 4 MB.
void attend_fast(const FastPaths& paths, const SparseAttentionArgs& a, ThreadPool* pool) {
  constexpr int64_t kScoreBudget = int64_t{1} << 20;  // floats
  const int64_t score_groups_per_query = (a.heads + kScoreHeads - 1) / kScoreHeads;
  const int64_t pv_groups_per_query = (a.heads + kGroupHeads - 1) / kGroupHeads;
  const int64_t per_query = a.heads * std::max<int64_t>(a.num_entries, 1);
  const int64_t chunk = std::clamp<int64_t>(kScoreBudget / per_query, 1, std::max<int64_t>(a.num_queries, 1));
  // The P·V items of the heads of score items [0, item): a score group's heads are whole P·V groups.
  static_assert(kScoreHeads % kGroupHeads == 0);
  auto pv_item = [&](int64_t item) {
    return item / score_groups_per_query * pv_groups_per_query +
           std::min(item % score_groups_per_query * (kScoreHeads / kGroupHeads), pv_groups_per_query);
  };
  ThreadScratch caller(pool);
  const std::span<float> scores = caller.take<float>(static_cast<size_t>(chunk * per_query));  // [chunk, heads, entries]
  const std::span<ValueBounds> row_bounds = caller.take<ValueBounds>(static_cast<size_t>(chunk * a.num_entries));
  auto run = [&](int64_t items, ThreadPool::RangeFn fn) {
    if (pool == nullptr) {
      fn(0, items, 0);
    } else {
      pool->parallel_for(items, fn);  // one item, or nested in a body: inline, as this thread
    }
  };
  for (int64_t query0 = 0; query0 < a.num_queries; query0 += chunk) {
    const int64_t n = std::min(chunk, a.num_queries - query0);
    const float* const* chunk_rows = a.rows + query0 * a.num_entries;
    run(n * a.num_entries, [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) {
        if (chunk_rows[i] != nullptr) row_bounds[static_cast<size_t>(i)] = paths.bounds(chunk_rows[i], a.dim);
      }
    });
    const int64_t score_items = n * score_groups_per_query;
    if (pool == nullptr || pool->num_threads() <= score_items) {
      run(score_items, [&](int64_t begin, int64_t end, int thread) {
        ThreadScratch scratch(pool, thread);
        for_each_query_groups(begin, end, score_groups_per_query, [&](int64_t query, int64_t first, int64_t last) {
          ArenaScope scope(scratch.arena());
          const int64_t item_begin = query * score_groups_per_query + first;
          const int64_t item_end = query * score_groups_per_query + last;
          score_groups(paths, a, query0, row_bounds.data(), scores.data(), item_begin, item_end, scratch.arena());
          attend_groups(paths, a, query0, row_bounds.data(), scores.data(), pv_item(item_begin), pv_item(item_end),
                        scratch.arena());
        });
      });
      continue;
    }
    run(score_items, [&](int64_t begin, int64_t end, int thread) {
      ThreadScratch scratch(pool, thread);
      score_groups(paths, a, query0, row_bounds.data(), scores.data(), begin, end, scratch.arena());
    });
    run(n * pv_groups_per_query, [&](int64_t begin, int64_t end, int thread) {
      ThreadScratch scratch(pool, thread);
      attend_groups(paths, a, query0, row_bounds.data(), scores.data(), begin, end, scratch.arena());
    });
  }
}

void attend_avx2(const SparseAttentionArgs& a, ThreadPool* pool) { attend_fast(avx2_paths(), a, pool); }

// vdpbf16ps only where it runs faster than fp32 FMAs (the linear kernels' timing): the fused FMA paths give the
// same bits wherever the pairs may run.
void attend_avx512(const SparseAttentionArgs& a, ThreadPool* pool) {
  static const bool pairs = avx512_paths(true).score_rows_pairs != nullptr &&
                            linear_impl::fastest_rows_multiply() == linear_impl::RowsMultiply::kBf16Dot;
  attend_fast(avx512_paths(pairs), a, pool);
}

void attend_avx512_pairs(const SparseAttentionArgs& a, ThreadPool* pool) { attend_fast(avx512_paths(true), a, pool); }

}  // namespace

FastPaths sparse_attention_impl::avx2_paths() { return {score_rows_avx2, pv_block_avx2, bounds_avx2}; }

const SparseAttentionKernels& reference_sparse_attention() {
  static const SparseAttentionKernels kernels{"reference", attend_reference};
  return kernels;
}

const SparseAttentionKernels& avx2_sparse_attention() {
  static const SparseAttentionKernels kernels{"heads16x8-avx2", attend_avx2};
  return kernels;
}

const SparseAttentionKernels* avx512_sparse_attention() {
  static const SparseAttentionKernels kernels{"heads16x8-avx512", attend_avx512};
  return avx512_paths(false).pv_block != nullptr ? &kernels : nullptr;
}

const SparseAttentionKernels* avx512_pairs_sparse_attention() {
  static const SparseAttentionKernels kernels{"heads16x8-avx512-bf16", attend_avx512_pairs};
  return avx512_paths(true).pv_block_pairs != nullptr ? &kernels : nullptr;
}

const SparseAttentionKernels& best_sparse_attention() {
  const SparseAttentionKernels* avx512 = avx512_sparse_attention();
  return avx512 != nullptr ? *avx512 : avx2_sparse_attention();
}

}  // namespace dsflash
