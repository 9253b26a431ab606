// Indexer scores from the stored key rows (kernels/index_score.h IndexScoreRowsArgs): the dequantising twins and
// the AVX-512 VNNI kernel on the packed MXFP4 bytes.
// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -W(maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <span>

#include "formats/quant.h"
#include "kernels/index_score.h"

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
alignas(16) constexpr uint8_t kTwiceE2m1Plus12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

constexpr int kMaxIndexBlocks = 4;  // blocks of 32 in a key (dim <= 128)

// One (query, head) of q as integers: q_d = iq_d * 2^exponent[b] per block b of 32.
struct QueryHeadInts {
  const int8_t* iq = nullptr;           // [dim]
  int32_t exponent[kMaxIndexBlocks] = {};
  int32_t offset[kMaxIndexBlocks] = {};  // 12 * Σ iq of the block: what the keys' +12 adds to the dot
  int32_t bound[kMaxIndexBlocks] = {};   // 12 * Σ|iq| (the partial-sum bound); 0 = the block is all zeros
  bool any_block = false;               // some block is not all zeros
  // (Σ_b bound[b]) << 11 < 2^24: with every block shift <= 11 (checked anyway) the partial sums stay below 2^24,
  // so the per-lane sum of shifted bounds need not be formed.
  bool small_total = false;
};

// One query's exponents over its heads' nonzero blocks, for the group-level check of exact_dots16: the smallest
// and largest exponent, the largest spread (max - min) within one head, and whether every head has small_total.
struct QueryExponents {
  bool any = false;  // some head has a nonzero block (else every dot is 0 and no check applies)
  int32_t min = 0, max = 0, spread = 0;
  bool small_total = true;
};

#define DSFLASH_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

// Splits a block of 32 fp32 q values into iq * 2^e with iq integers in [-12, 12] (e: the largest |q| / 2^e lies
// in [8, 16)); false when they are not e2m1 times one power of two, or when a value or 2^±e is not a normal
// float (the caller then scores the whole call on fp32 keys: same bits, slower). 2^-e scales exactly (|q| <= max
// and the quotient stays below 16); a quotient that fell into the subnormal range is no integer or gives back 0
// for a nonzero q, so the three checks below accept exactly the exact splits.
DSFLASH_VNNI bool split_block(const float* q, int8_t* iq, int32_t* exponent, int32_t* sum, int32_t* bound) {
  const __m512 x0 = _mm512_loadu_ps(q), x1 = _mm512_loadu_ps(q + 16);
  *sum = 0;
  *bound = 0;
  *exponent = 0;
  if ((_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) != 0) return false;  // NaN
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  if (m == 0.0f) {
    std::memset(iq, 0, 32);
    return true;
  }
  if (!(m >= FLT_MIN && m <= FLT_MAX)) return false;
  const int e = static_cast<int>(std::bit_cast<uint32_t>(m) >> 23) - 130;  // biased exponent - 127 - 3
  if (e < -126 || e > 126) return false;
  const __m512 down = _mm512_castsi512_ps(_mm512_set1_epi32((127 - e) << 23));  // 2^-e
  const __m512 up = _mm512_castsi512_ps(_mm512_set1_epi32((127 + e) << 23));    // 2^e
  const __m512 twelve = _mm512_set1_ps(12.0f);
  __m512i ints[2];
  const __m512 xs[2] = {x0, x1};
  for (int half = 0; half < 2; ++half) {
    const __m512 v = _mm512_mul_ps(xs[half], down);
    const __m512 whole = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 ok = _mm512_cmp_ps_mask(whole, v, _CMP_EQ_OQ) &
                         _mm512_cmp_ps_mask(_mm512_abs_ps(v), twelve, _CMP_LE_OQ) &
                         _mm512_cmp_ps_mask(_mm512_mul_ps(v, up), xs[half], _CMP_EQ_OQ);
    if (ok != 0xffff) return false;
    ints[half] = _mm512_cvtps_epi32(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(iq + 16 * half), _mm512_cvtepi32_epi8(ints[half]));
  }
  *exponent = e;
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(ints[0], ints[1]));
  *bound = 12 * _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_abs_epi32(ints[0]), _mm512_abs_epi32(ints[1])));
  return true;
}

// 16x16 transpose of 32-bit elements: r[i] lane j -> r[j] lane i.
DSFLASH_VNNI inline void transpose16x16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);      // per 128-bit lane L: r_i[4L], r_i+1[4L], r_i[4L+1], ...
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);  // r_i[4L+2], r_i+1[4L+2], r_i[4L+3], r_i+1[4L+3]
  }
  __m512i u[16];  // u[4g + c] lane L = rows 4g..4g+3 of column 4L + c
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // a 4x4 transpose of the 128-bit lanes of u[c], u[4+c], u[8+c], u[12+c]
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
  }
}

// 16 stored key rows (lanes valid, the rest read as ik = 0, scale code 127) -> kq [dim/4][16][4] bytes (ik + 12,
// four elements of one key per 32-bit lane) and ub [dim/32][16] scale codes; false when a valid row has a NaN scale
// code (255). dim <= 128 and a multiple of 32.
// Each row's nibbles (dim/2 bytes, one zmm) become (ik + 12) bytes by a table lookup; unpacking low and high
// nibbles interleaves them back in element order within each 128-bit lane (lane L = block L): `lo` holds elements
// 32L..32L+15 (quads 8L..8L+3), `hi` elements 32L+16..32L+31 (quads 8L+4..8L+7). Transposing 16 keys' vectors
// then gives one vector per quad with the 16 keys in its 32-bit lanes.
DSFLASH_VNNI bool pack_group(const uint8_t* const* rows, int lanes, int64_t dim, uint8_t* kq, int32_t* ub) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kTwiceE2m1Plus12)));
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const int64_t row_bytes = dim / 2, quads = dim / 4;
  const __mmask64 byte_mask = row_bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << row_bytes) - 1;
  for (int half = 0; half < 2; ++half) {
    __m512i v[kIndexKeyLanes];
    for (int l = 0; l < kIndexKeyLanes; ++l) {
      const __m512i bytes = l < lanes ? _mm512_maskz_loadu_epi8(byte_mask, rows[l]) : _mm512_setzero_si512();
      const __m512i low = _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, nibble));
      const __m512i high = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble));
      v[l] = half == 0 ? _mm512_unpacklo_epi8(low, high) : _mm512_unpackhi_epi8(low, high);
    }
    transpose16x16(v);
    for (int i = 0; i < kIndexKeyLanes; ++i) {
      const int64_t quad = 8 * (i / 4) + 4 * half + i % 4;
      if (quad < quads) _mm512_storeu_si512(kq + quad * 64, v[i]);
    }
  }
  // Scale codes: each row's dim/32 (<= 4) bytes in one 32-bit lane (missing rows: 127), then one vector per block.
  const int blocks = static_cast<int>(dim / 32);
  alignas(64) uint32_t codes[kIndexKeyLanes];
  for (int l = 0; l < kIndexKeyLanes; ++l) {
    codes[l] = 0x7f7f7f7fu;
    if (l < lanes) std::memcpy(&codes[l], rows[l] + row_bytes, static_cast<size_t>(blocks));
  }
  const __m512i words = _mm512_load_si512(codes);
  const __mmask64 block_bytes = 0x1111111111111111ull * ((1u << blocks) - 1);  // bytes < blocks of every lane
  const bool finite = _mm512_mask_cmpeq_epi8_mask(block_bytes, words, _mm512_set1_epi8(static_cast<char>(0xff))) == 0;
  for (int b = 0; b < blocks; ++b)
    _mm512_storeu_si512(ub + b * kIndexKeyLanes, _mm512_and_si512(_mm512_srli_epi32(words, 8 * b), _mm512_set1_epi32(0xff)));
  return finite;
}

// kH heads of one query against 16 keys: dots [kH][16]. key_exp [kBlocks]: the keys' scale exponents u - 128 per
// block (lanes = keys). kChecked: test every (head, valid lane) for exactness and return false (dots unspecified)
// when one fails; false when the caller has shown that none can (exact_dots16). The head and block counts are
// template parameters so the accumulators stay in registers; a block of q that is all zero (bound 0) adds exactly 0
// (iq = 0, Σ iq = 0), so only its exponent is left out of the minimum.
template <int kH, int kBlocks, bool kChecked>
DSFLASH_VNNI inline bool exact_dots_heads(const uint8_t* kq, const __m512i* key_exp, const QueryHeadInts* q,
                                          __mmask16 valid, float* dots) {
  // Per head the smallest exponent E_min over its nonzero blocks (a head without one keeps 2^30: its dots are 0).
  // A block's shift E_b - E_min is formed where it is used; for an all-zero block it may be anything (negative:
  // vpsllvd gives 0), as that block's partial is 0.
  __m512i e_min[kH];
#pragma GCC unroll 8
  for (int h = 0; h < kH; ++h) {
    const QueryHeadInts& qi = q[h];
    __m512i e[kBlocks];
    __m512i lo = _mm512_set1_epi32(1 << 30);
    for (int b = 0; b < kBlocks; ++b) {
      e[b] = _mm512_add_epi32(key_exp[b], _mm512_set1_epi32(qi.exponent[b]));
      if (qi.bound[b] != 0) lo = _mm512_min_epi32(lo, e[b]);
    }
    e_min[h] = lo;
    if constexpr (kChecked) {
      if (!qi.any_block) continue;
      // s > 11 fails the check, so the shifts used below are all <= 11 on valid lanes; lanes past the valid ones
      // may hold any shift, their results are never stored.
      __m512i shift[kBlocks];
      __mmask16 ok = valid;
      for (int b = 0; b < kBlocks; ++b) {
        shift[b] = qi.bound[b] == 0 ? _mm512_setzero_si512() : _mm512_sub_epi32(e[b], lo);
        ok &= _mm512_cmple_epi32_mask(shift[b], _mm512_set1_epi32(11));
      }
      if (!qi.small_total) {
        __m512i total = _mm512_setzero_si512();
        for (int b = 0; b < kBlocks; ++b) {
          total = _mm512_add_epi32(total, _mm512_sllv_epi32(_mm512_set1_epi32(qi.bound[b]), shift[b]));
        }
        ok &= _mm512_cmplt_epi32_mask(total, _mm512_set1_epi32(1 << 24));
      }
      ok &= _mm512_cmpge_epi32_mask(lo, _mm512_set1_epi32(-126));
      ok &= _mm512_cmple_epi32_mask(lo, _mm512_set1_epi32(103));
      if (ok != valid) return false;
    }
  }
  __m512i n[kH];
#pragma GCC unroll 8
  for (int h = 0; h < kH; ++h) n[h] = _mm512_setzero_si512();
  for (int b = 0; b < kBlocks; ++b) {
    __m512i acc[kH];
#pragma GCC unroll 8
    for (int h = 0; h < kH; ++h) acc[h] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int quad = b * 8; quad < b * 8 + 8; ++quad) {
      const __m512i k = _mm512_loadu_si512(kq + quad * 64);
#pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        int32_t q4;
        std::memcpy(&q4, q[h].iq + quad * 4, sizeof(q4));
        acc[h] = _mm512_dpbusd_epi32(acc[h], k, _mm512_set1_epi32(q4));
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < kH; ++h) {
      const __m512i p = _mm512_sub_epi32(acc[h], _mm512_set1_epi32(q[h].offset[b]));
      const __m512i shift = _mm512_sub_epi32(_mm512_add_epi32(key_exp[b], _mm512_set1_epi32(q[h].exponent[b])), e_min[h]);
      n[h] = _mm512_add_epi32(n[h], _mm512_sllv_epi32(p, shift));
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < kH; ++h) {
    float* out = dots + h * kIndexKeyLanes;
    if (!q[h].any_block) {
      _mm512_storeu_ps(out, _mm512_setzero_ps());
      continue;
    }
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e_min[h], _mm512_set1_epi32(127)), 23));
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(n[h]), scale));
  }
  return true;
}

template <int kBlocks, bool kChecked>
DSFLASH_VNNI bool exact_dots_all_heads(const uint8_t* kq, const __m512i* key_exp, const QueryHeadInts* heads_ints,
                                       int heads, __mmask16 valid, float* dots) {
  int h = 0;
  for (; h + 8 <= heads; h += 8) {
    if (!exact_dots_heads<8, kBlocks, kChecked>(kq, key_exp, heads_ints + h, valid, dots + h * kIndexKeyLanes)) return false;
  }
  if (h + 4 <= heads) {
    if (!exact_dots_heads<4, kBlocks, kChecked>(kq, key_exp, heads_ints + h, valid, dots + h * kIndexKeyLanes)) return false;
    h += 4;
  }
  for (; h < heads; ++h) {
    if (!exact_dots_heads<1, kBlocks, kChecked>(kq, key_exp, heads_ints + h, valid, dots + h * kIndexKeyLanes)) return false;
  }
  return true;
}

// dots [heads][16] of one query against 16 keys packed as (ik + 12) bytes kq [dim/4][16][4] with ue8m0 scale
// codes ub [dim/32][16] (int32); false (dots unspecified) when some valid lane's exactness check fails.
// The per-(head, lane) checks are skipped when the group passes them all at once: for a nonzero block b of head
// h, its shift (k_b + q_hb) - min over nonzero b' of (k_b' + q_hb') is at most the key's exponent spread plus the
// head's, and that minimum lies in [min k + min q, max k + max q]; with small_total no sum of shifted bounds is
// needed. So spread_k + spread_q <= 11, min k + min q >= -126 and max k + max q <= 103 (over the valid lanes and
// every head) imply every check.
template <int kBlocks>
DSFLASH_VNNI bool exact_dots16(const uint8_t* kq, const int32_t* ub, const QueryHeadInts* heads_ints,
                               const QueryExponents& qx, int heads, int lanes, float* dots) {
  const __mmask16 valid = static_cast<__mmask16>((1u << lanes) - 1u);
  __m512i key_exp[kBlocks];
  for (int b = 0; b < kBlocks; ++b) key_exp[b] = _mm512_sub_epi32(_mm512_loadu_si512(ub + b * 16), _mm512_set1_epi32(128));
  bool all_pass = !qx.any;
  if (qx.any && qx.small_total) {
    __m512i k_min = key_exp[0], k_max = key_exp[0];
    for (int b = 1; b < kBlocks; ++b) {
      k_min = _mm512_min_epi32(k_min, key_exp[b]);
      k_max = _mm512_max_epi32(k_max, key_exp[b]);
    }
    const int32_t spread = _mm512_mask_reduce_max_epi32(valid, _mm512_sub_epi32(k_max, k_min));
    all_pass = spread + qx.spread <= 11 && _mm512_mask_reduce_min_epi32(valid, k_min) + qx.min >= -126 &&
               _mm512_mask_reduce_max_epi32(valid, k_max) + qx.max <= 103;
  }
  if (all_pass) return exact_dots_all_heads<kBlocks, false>(kq, key_exp, heads_ints, heads, valid, dots);
  return exact_dots_all_heads<kBlocks, true>(kq, key_exp, heads_ints, heads, valid, dots);
}

// exact_dots16 for each key block count (dim / 32 = 1..4), so the block loops unroll.
using ExactDots16 = bool (*)(const uint8_t*, const int32_t*, const QueryHeadInts*, const QueryExponents&, int, int,
                             float*);
constexpr ExactDots16 kExactDots16[kMaxIndexBlocks + 1] = {nullptr, exact_dots16<1>, exact_dots16<2>, exact_dots16<3>,
                                                           exact_dots16<4>};

// Key rows fetched ahead of the group being scored.
constexpr int64_t kPrefetchKeys = 4 * kIndexKeyLanes;  // 1-12 groups ahead measured alike

// The VNNI table entry (IndexScoreRowsKernel).
void index_scores_rows_exact(const IndexScoreRowsArgs& a) {
  const int64_t blocks = a.dim / 32;
  if (a.dim % 32 != 0 || blocks > kMaxIndexBlocks || a.num_keys <= 0 || a.num_queries <= 0) {
    scores_of_dequantised_rows<index_scores_packed16>(a);
    return;
  }
  const WeighHeads16Kernel weigh = weigh_heads16_avx512();  // present wherever this kernel is
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
        qi.offset[b] = 12 * sum;
        bounds += qi.bound[b];
        if (qi.bound[b] == 0) continue;
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
  const ExactDots16 exact_dots = kExactDots16[blocks];
  const std::span<uint8_t> kq = arena.take<uint8_t>(static_cast<size_t>(a.dim * kIndexKeyLanes));  // [dim/4][16][4]
  const std::span<int32_t> ub = arena.take<int32_t>(static_cast<size_t>(blocks * kIndexKeyLanes));  // [blocks][16]
  const std::span<float> dots = arena.take<float>(static_cast<size_t>(a.heads * kIndexKeyLanes));    // [heads][16]
  const std::span<float> keys = arena.take<float>(static_cast<size_t>(kIndexKeyLanes * a.dim));      // fallback
  const std::span<float> packed = arena.take<float>(static_cast<size_t>(kIndexKeyLanes * a.dim));
  const int64_t row_bytes = a.dim / 2 + blocks;
  for (int64_t g0 = 0; g0 < a.num_keys; g0 += kIndexKeyLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kIndexKeyLanes, a.num_keys - g0));
    // The rows of a later group (both lines of a row that may straddle two): they lie in blocks of a few KB spread
    // over the cache pages, where the hardware prefetchers restart at every block.
    for (int64_t j = g0 + kPrefetchKeys; j < std::min(a.num_keys, g0 + kPrefetchKeys + kIndexKeyLanes); ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(a.key_rows[j]), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a.key_rows[j] + row_bytes - 1), _MM_HINT_T0);
    }
    const bool scales_finite = pack_group(a.key_rows + g0, lanes, a.dim, kq.data(), ub.data());
    bool packed_ready = false;
    for (int64_t t = 0; t < a.num_queries; ++t) {
      if (!scales_finite || !exact_dots(kq.data(), ub.data(), &q_ints[static_cast<size_t>(t * a.heads)],
                                        q_exponents[static_cast<size_t>(t)], a.heads, lanes, dots.data())) {
        if (!packed_ready) {
          dequantise_rows(a, g0, lanes, keys.data());
          pack_index_keys(keys.data(), lanes, a.dim, packed.data());
          packed_ready = true;
        }
        index_dots16(packed.data(), a.q + t * a.heads * a.dim, a.heads, a.dim, dots.data());
      }
      float group_scores[kIndexKeyLanes];
      weigh(dots.data(), a.weights + t * a.heads, a.heads, group_scores);
      std::copy(group_scores, group_scores + lanes, a.scores + t * a.score_stride + g0);
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
