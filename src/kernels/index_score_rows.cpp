// Indexer scores from the stored key rows (kernels/index_score.h IndexScoreRowsArgs): the dequantising twins, and
// the exact-integer driver (kernels/index_score_exact.h) that the VNNI and AVX2 kernels run on.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <span>

#include "formats/quant.h"
#include "kernels/index_score.h"
#include "kernels/index_score_exact.h"

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

// Key rows fetched ahead of the group being scored.
constexpr int64_t kPrefetchKeys = 4 * kIndexKeyLanes;  // 1-12 groups ahead measured alike (AVX-512)

}  // namespace

namespace index_exact {

// The largest |q| / 2^e lies in [8, 16), so 2^-e scales exactly (|q| <= max and the quotient stays below 16); a
// quotient that fell into the subnormal range is no integer or gives back 0 for a nonzero q, so the three checks
// below accept exactly the exact splits.
bool split_block(const float* q, int8_t* iq, int32_t* exponent, int32_t* sum, int32_t* bound) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4];
  __m256 unordered = _mm256_setzero_ps(), largest = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(q + 8 * i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x[i], x[i], _CMP_UNORD_Q));
    largest = _mm256_max_ps(largest, _mm256_andnot_ps(sign, x[i]));
  }
  *sum = 0;
  *bound = 0;
  *exponent = 0;
  if (_mm256_movemask_ps(unordered) != 0) return false;  // NaN
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float m = _mm_cvtss_f32(m4);
  if (m == 0.0f) {
    std::memset(iq, 0, 32);
    return true;
  }
  if (!(m >= FLT_MIN && m <= FLT_MAX)) return false;
  const int e = static_cast<int>(std::bit_cast<uint32_t>(m) >> 23) - 130;  // biased exponent - 127 - 3
  if (e < -126 || e > 126) return false;
  const __m256 down = _mm256_castsi256_ps(_mm256_set1_epi32((127 - e) << 23));  // 2^-e
  const __m256 up = _mm256_castsi256_ps(_mm256_set1_epi32((127 + e) << 23));    // 2^e
  const __m256 twelve = _mm256_set1_ps(12.0f);
  __m256i ints[4];
  __m256i sums = _mm256_setzero_si256(), magnitudes = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    const __m256 v = _mm256_mul_ps(x[i], down);
    const __m256 whole = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 ok = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(whole, v, _CMP_EQ_OQ),
                                                  _mm256_cmp_ps(_mm256_andnot_ps(sign, v), twelve, _CMP_LE_OQ)),
                                    _mm256_cmp_ps(_mm256_mul_ps(v, up), x[i], _CMP_EQ_OQ));
    if (_mm256_movemask_ps(ok) != 0xff) return false;
    ints[i] = _mm256_cvtps_epi32(v);
    sums = _mm256_add_epi32(sums, ints[i]);
    magnitudes = _mm256_add_epi32(magnitudes, _mm256_abs_epi32(ints[i]));
  }
  // int32 -> int8 in element order: the two saturating packs interleave the 128-bit lanes, as dwords
  // [x0 0-3, x1 0-3, x2 0-3, x3 0-3 | x0 4-7, x1 4-7, x2 4-7, x3 4-7]; vpermd puts them back.
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(iq),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  alignas(32) int32_t lanes[2][8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), sums);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), magnitudes);
  for (int l = 0; l < 8; ++l) {
    *sum += lanes[0][l];
    *bound += lanes[1][l];
  }
  *bound *= 12;
  *exponent = e;
  return true;
}

// Lane-wise minimum and maximum over the blocks (16 lanes as two halves of 8), then the reductions over the valid
// lanes: lanes past `lanes` take the neutral INT32_MAX for the minimum and 0 for the maximum and the spread (codes
// and spreads are >= 0, and lane 0 is always valid).
KeyExponents key_exponents(const int32_t* ub, int blocks, int lanes) {
  const __m256i count = _mm256_set1_epi32(lanes);
  __m256i lo[2], hi[2], valid[2];
  for (int half = 0; half < 2; ++half) {
    valid[half] = _mm256_cmpgt_epi32(count, _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                              _mm256_set1_epi32(8 * half)));
    lo[half] = hi[half] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ub + 8 * half));
    for (int b = 1; b < blocks; ++b) {
      const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ub + b * kIndexKeyLanes + 8 * half));
      lo[half] = _mm256_min_epi32(lo[half], codes);
      hi[half] = _mm256_max_epi32(hi[half], codes);
    }
  }
  const __m256i neutral_min = _mm256_set1_epi32(INT32_MAX);
  const __m256i low = _mm256_min_epi32(_mm256_blendv_epi8(neutral_min, lo[0], valid[0]),
                                       _mm256_blendv_epi8(neutral_min, lo[1], valid[1]));
  const __m256i high = _mm256_max_epi32(_mm256_and_si256(hi[0], valid[0]), _mm256_and_si256(hi[1], valid[1]));
  const __m256i spread = _mm256_max_epi32(_mm256_and_si256(_mm256_sub_epi32(hi[0], lo[0]), valid[0]),
                                          _mm256_and_si256(_mm256_sub_epi32(hi[1], lo[1]), valid[1]));
  // 8 lanes -> lane 0: the other 128-bit half, then the 64-bit and the 32-bit neighbour
  const auto fold = [](__m256i v, auto op) {
    v = op(v, _mm256_permute2x128_si256(v, v, 1));
    v = op(v, _mm256_shuffle_epi32(v, 0x4e));
    return _mm256_cvtsi256_si32(op(v, _mm256_shuffle_epi32(v, 0xb1)));
  };
  const auto min = [](__m256i x, __m256i y) { return _mm256_min_epi32(x, y); };
  const auto max = [](__m256i x, __m256i y) { return _mm256_max_epi32(x, y); };
  return KeyExponents{fold(low, min) - 128, fold(high, max) - 128, fold(spread, max)};
}

bool group_passes_all_checks(const KeyExponents& k, const QueryExponents& qx) {
  if (!qx.any) return true;  // every dot is 0
  if (!qx.small_total) return false;
  return k.spread + qx.spread <= 11 && k.min + qx.min >= -126 && k.max + qx.max <= 103;
}

void score_rows_exact(const IndexScoreRowsArgs& a, const ExactIndexKernels& kernels) {
  const int64_t blocks = a.dim / 32;
  if (a.dim % 32 != 0 || blocks > kMaxIndexBlocks || a.num_keys <= 0 || a.num_queries <= 0) {
    scores_of_dequantised_rows<index_scores_packed16>(a);
    return;
  }
  Arena own;
  Arena& arena = a.scratch != nullptr ? *a.scratch : own;
  ArenaScope scope(arena);
  const size_t query_heads = static_cast<size_t>(a.num_queries * a.heads);
  // q as integers: iq [queries, heads, dim], the rest per (query, head) and per query.
  const std::span<int8_t> iq = arena.take<int8_t>(query_heads * static_cast<size_t>(a.dim));
  const std::span<QueryHeadInts> q_ints = arena.take<QueryHeadInts>(query_heads);
  const std::span<QueryExponents> q_exponents = arena.take<QueryExponents>(static_cast<size_t>(a.num_queries));
  for (int64_t t = 0; t < a.num_queries; ++t) {
    QueryExponents& qx = q_exponents[static_cast<size_t>(t)];
    qx = QueryExponents{};
    qx.bf16_weights = std::all_of(a.weights + t * a.heads, a.weights + (t + 1) * a.heads,
                                  [](float w) { return (std::bit_cast<uint32_t>(w) & 0xffffu) == 0; });
    for (int64_t h = 0; h < a.heads; ++h) {
      const size_t qh = static_cast<size_t>(t * a.heads + h);
      QueryHeadInts& qi = q_ints[qh];
      qi = QueryHeadInts{};
      int8_t* ints = &iq[qh * static_cast<size_t>(a.dim)];
      qi.iq = ints;
      const float* q = a.q + static_cast<int64_t>(qh) * a.dim;
      int64_t bounds = 0;
      int32_t head_min = 0, head_max = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t sum = 0;
        if (!split_block(q + b * 32, ints + b * 32, &qi.exponent[b], &sum, &qi.bound[b])) {
          scores_of_dequantised_rows<index_scores_packed16>(a);  // q is not MXFP4-shaped
          return;
        }
        qi.offset[b] = -12 * sum;
        bounds += qi.bound[b];
        if (qi.bound[b] == 0) continue;
        qi.scale_bits[b] = (qi.exponent[b] - 1) * (1 << 23);
        head_min = qi.any_block ? std::min(head_min, qi.exponent[b]) : qi.exponent[b];
        head_max = qi.any_block ? std::max(head_max, qi.exponent[b]) : qi.exponent[b];
        qi.any_block = true;
      }
      qi.small_total = (bounds << 11) < (int64_t{1} << 24);
      if (!qi.any_block) continue;
      qx.min = qx.any ? std::min(qx.min, head_min) : head_min;
      qx.max = qx.any ? std::max(qx.max, head_max) : head_max;
      qx.spread = std::max(qx.spread, head_max - head_min);
      qx.small_total = qx.small_total && qi.small_total;
      qx.any = true;
    }
  }
  const ExactDots16 exact_dots = kernels.exact_dots[blocks];
  const std::span<uint8_t> kq = arena.take<uint8_t>(static_cast<size_t>(a.dim * kIndexKeyLanes));  // [dim/4][16][4]
  const std::span<int32_t> ub = arena.take<int32_t>(static_cast<size_t>(blocks * kIndexKeyLanes));  // [blocks][16]
  const std::span<float> dots = arena.take<float>(static_cast<size_t>(a.heads * kIndexKeyLanes));    // [heads][16]
  const std::span<float> keys = arena.take<float>(static_cast<size_t>(kIndexKeyLanes * a.dim));      // fallback
  const std::span<float> packed = arena.take<float>(static_cast<size_t>(kIndexKeyLanes * a.dim));
  const int64_t row_bytes = a.dim / 2 + blocks;
  for (int64_t g0 = 0; g0 < a.num_keys; g0 += kIndexKeyLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kIndexKeyLanes, a.num_keys - g0));
    // The rows of a later group (both lines of a row that may straddle two): they lie in blocks of a few KB spread
    // over the cache pages, where the hardware prefetchers restart at every block. A row that follows the previous
    // one in memory starts on the line that one ends on, so only each row's last byte is fetched, plus the first of
    // a row that starts a run (half the prefetches: on cold rows laid out as the KV blocks store them, 4-9% less
    // time per call). j > 0: the prefetched group lies kPrefetchKeys ahead.
    const int64_t prefetch_end = std::min(a.num_keys, g0 + kPrefetchKeys + kIndexKeyLanes);
    for (int64_t j = g0 + kPrefetchKeys; j < prefetch_end; ++j) {
      const uint8_t* row = a.key_rows[j];
      if (row != a.key_rows[j - 1] + row_bytes) _mm_prefetch(reinterpret_cast<const char*>(row), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + row_bytes - 1), _MM_HINT_T0);
    }
    const bool scales_finite = kernels.pack_group(a.key_rows + g0, lanes, a.dim, kq.data(), ub.data());
    const KeyExponents group_keys = key_exponents(ub.data(), static_cast<int>(blocks), lanes);
    bool packed_ready = false;
    for (int64_t t = 0; t < a.num_queries; ++t) {
      const bool checked = !group_passes_all_checks(group_keys, q_exponents[static_cast<size_t>(t)]);
      WeighHeads16Kernel weigh = q_exponents[static_cast<size_t>(t)].bf16_weights ? kernels.weigh_finite : kernels.weigh;
      if (!scales_finite || !exact_dots(kq.data(), ub.data(), &q_ints[static_cast<size_t>(t * a.heads)], checked,
                                        a.heads, lanes, dots.data())) {
        if (!packed_ready) {
          dequantise_rows(a, g0, lanes, keys.data());
          pack_index_keys(keys.data(), lanes, a.dim, packed.data());
          packed_ready = true;
        }
        index_dots16(packed.data(), a.q + t * a.heads * a.dim, a.heads, a.dim, dots.data());
        weigh = kernels.weigh;  // fp32 dots may be inf or NaN
      }
      float* scores = a.scores + t * a.score_stride + g0;
      if (lanes == kIndexKeyLanes) {
        weigh(dots.data(), a.weights + t * a.heads, a.heads, scores);
      } else {
        float group_scores[kIndexKeyLanes];
        weigh(dots.data(), a.weights + t * a.heads, a.heads, group_scores);
        std::copy(group_scores, group_scores + lanes, scores);
      }
    }
  }
}

}  // namespace index_exact

namespace {

void index_scores_rows_vnni_entry(const IndexScoreRowsArgs& a) {
  index_exact::score_rows_exact(a, *index_exact::vnni_exact_index_kernels());
}
void index_scores_rows_avx512bw_entry(const IndexScoreRowsArgs& a) {
  index_exact::score_rows_exact(a, *index_exact::avx512bw_exact_index_kernels());
}

}  // namespace

void index_scores_rows_reference(const IndexScoreRowsArgs& a) { scores_of_dequantised_rows<index_scores_reference>(a); }
void index_scores_rows_packed16(const IndexScoreRowsArgs& a) { scores_of_dequantised_rows<index_scores_packed16>(a); }
void index_scores_rows_avx2(const IndexScoreRowsArgs& a) {
  index_exact::score_rows_exact(a, index_exact::avx2_exact_index_kernels());
}

IndexScoreRowsKernel index_scores_rows_vnni() {
  return index_exact::vnni_exact_index_kernels() != nullptr ? index_scores_rows_vnni_entry : nullptr;
}
IndexScoreRowsKernel index_scores_rows_avx512bw() {
  return index_exact::avx512bw_exact_index_kernels() != nullptr ? index_scores_rows_avx512bw_entry : nullptr;
}

}  // namespace dsflash
