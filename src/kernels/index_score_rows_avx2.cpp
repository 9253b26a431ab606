// The exact-integer indexer dots on AVX2 (kernels/index_score_exact.h): vpmaddubsw on the packed MXFP4 bytes of 16
// keys at a time, 8 keys per vector, same bits as the oracle. The u8 operand is ik + 12 <= 24 and the s8 one
// |iq| <= 12, so a pair sum is at most 576 (vpmaddubsw saturates at 2^15 - 1: never here) and the 8 pair sums an
// int16 lane gathers over a block of 32 at most 4608; vpmaddwd by 1 then gives each key's block sum in int32.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/index_score_exact.h"

namespace dsflash::index_exact {
namespace {

constexpr int kHalfLanes = kIndexKeyLanes / 2;  // keys per 256-bit vector

// A missing key's row: nibbles 0 (ik = 0), so its dots are 0 whatever its scale.
constexpr uint8_t kZeroRow[kMaxIndexBlocks * 16 + kMaxIndexBlocks] = {};

// 4x4 transpose of 32-bit elements within each 128-bit lane: element (lane L, j) of r[i] -> element (L, i) of r[j].
inline void transpose4x4_in_lanes(__m256i* r) {
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]);  // r0[0] r1[0] r0[1] r1[1] per lane
  const __m256i t1 = _mm256_unpackhi_epi32(r[0], r[1]);  // r0[2] r1[2] r0[3] r1[3]
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]);
  const __m256i t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  r[0] = _mm256_unpacklo_epi64(t0, t2);
  r[1] = _mm256_unpackhi_epi64(t0, t2);
  r[2] = _mm256_unpacklo_epi64(t1, t3);
  r[3] = _mm256_unpackhi_epi64(t1, t3);
}

// PackGroup. Per half (keys 8h..8h+7) and block b: the block's 16 nibble bytes of keys k and k + 4 in the two
// 128-bit lanes of one vector become (ik + 12) bytes by a table lookup; unpacking low and high nibbles gives
// elements 0-15 (quads 0-3 of the block) and 16-31 (quads 4-7) in element order. A 4x4 transpose within the lanes
// of the four vectors k = 0..3 then gives one vector per quad with keys 0-3 in the low lane and 4-7 in the high one:
// the half's 8 keys in order, no lane crossing.
bool pack_group(const uint8_t* const* rows, int lanes, int64_t dim, uint8_t* kq, int32_t* ub) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kTwiceE2m1Plus12)));
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const int blocks = static_cast<int>(dim / 32);
  const int64_t row_bytes = dim / 2;
  const uint8_t* row[kIndexKeyLanes];
  for (int l = 0; l < kIndexKeyLanes; ++l) row[l] = l < lanes ? rows[l] : kZeroRow;
  for (int half = 0; half < 2; ++half) {
    const uint8_t* const* keys = row + kHalfLanes * half;
    for (int b = 0; b < blocks; ++b) {
      __m256i low[4], high[4];
      for (int k = 0; k < 4; ++k) {
        const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keys[k] + 16 * b));
        const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keys[k + 4] + 16 * b));
        const __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(first), second, 1);
        const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, nibble));
        const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble));
        low[k] = _mm256_unpacklo_epi8(lo, hi);
        high[k] = _mm256_unpackhi_epi8(lo, hi);
      }
      transpose4x4_in_lanes(low);
      transpose4x4_in_lanes(high);
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(kq + (8 * b + i) * 64 + 32 * half), low[i]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(kq + (8 * b + 4 + i) * 64 + 32 * half), high[i]);
      }
    }
  }
  bool finite = true;
  for (int l = 0; l < kIndexKeyLanes; ++l) {
    for (int b = 0; b < blocks; ++b) {
      const int32_t code = l < lanes ? rows[l][row_bytes + b] : 127;
      finite = finite && code < kFirstNonFiniteScaleCode;
      ub[b * kIndexKeyLanes + l] = code;
    }
  }
  return finite;
}

constexpr int kHeadChunk = 16;  // heads whose block sums wait on the stack ([16][4] vectors, 2 KB)

// Block sums of heads [h0, h0 + count) of one query against the 8 keys of one half: sums [count][kBlocks] vectors
// of 8 int32, Σ_{d in b} iq_d ik_d per key. kq points at the half's first quad ([dim/4] quads, 64 bytes apart).
// A block's 8 key vectors stay in registers while every head of the chunk multiplies them: 8 broadcasts of 4 q
// bytes, 8 vpmaddubsw and their int16 sum, one vpmaddwd by 1, and the +12 taken back.
template <int kBlocks>
inline void block_sums(const uint8_t* kq, const QueryHeadInts* q, int count, __m256i* sums) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < kBlocks; ++b) {
    __m256i k[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) k[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kq + (8 * b + j) * 64));
    for (int h = 0; h < count; ++h) {
      const int8_t* iq = q[h].iq + 32 * b;
      __m256i acc = _mm256_setzero_si256();  // int16 pair sums, two per key
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        int32_t q4;
        std::memcpy(&q4, iq + 4 * j, sizeof(q4));
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(k[j], _mm256_set1_epi32(q4)));
      }
      sums[h * kBlocks + b] = _mm256_add_epi32(_mm256_madd_epi16(acc, ones), _mm256_set1_epi32(q[h].offset[b]));
    }
  }
}

// dots [count][16] (this half's 8 columns) of heads [h0, h0 + count) from their block sums, each block's sum made
// fp32 and scaled by its 2^E_b, then added by fma: under the checks exact, so N * 2^E_min (the VNNI kernel's
// exact_dots_heads has the argument). key_bits [kBlocks]: the keys' ue8m0 codes << 23 per block; valid: the half's
// valid lanes as a bit mask. kChecked: test every (head, valid lane) for exactness first and return false (dots
// unspecified) when one fails; false when group_passes_all_checks has shown that none can. A block of q that is all
// zero (bound 0) has sum 0 (iq = 0, Σ iq = 0) and a finite scale (QueryHeadInts::scale_bits), so it adds +0.
template <int kBlocks, bool kChecked>
inline bool dots_of_block_sums(const __m256i* sums, const __m256i* key_bits, const QueryHeadInts* q, int count,
                               int valid, float* dots) {
  for (int h = 0; h < count; ++h) {
    const QueryHeadInts& qi = q[h];
    if constexpr (kChecked) {
      if (qi.any_block) {
        // Per lane E_min over the head's nonzero blocks and each such block's shift E_b - E_min.
        __m256i e[kBlocks];
        __m256i lo = _mm256_set1_epi32(1 << 30);
        for (int b = 0; b < kBlocks; ++b) {
          e[b] = _mm256_add_epi32(_mm256_srli_epi32(key_bits[b], 23), _mm256_set1_epi32(qi.exponent[b] - 128));
          if (qi.bound[b] != 0) lo = _mm256_min_epi32(lo, e[b]);
        }
        __m256i fail = _mm256_setzero_si256(), total = _mm256_setzero_si256();
        for (int b = 0; b < kBlocks; ++b) {
          if (qi.bound[b] == 0) continue;  // adds exactly 0, whatever its shift
          // A shift > 11 fails, so the shifts in the bound sum are all <= 11 on valid lanes.
          const __m256i shift = _mm256_sub_epi32(e[b], lo);
          fail = _mm256_or_si256(fail, _mm256_cmpgt_epi32(shift, _mm256_set1_epi32(11)));
          if (!qi.small_total) total = _mm256_add_epi32(total, _mm256_sllv_epi32(_mm256_set1_epi32(qi.bound[b]), shift));
        }
        fail = _mm256_or_si256(fail, _mm256_cmpgt_epi32(total, _mm256_set1_epi32((1 << 24) - 1)));
        fail = _mm256_or_si256(fail, _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), lo));
        fail = _mm256_or_si256(fail, _mm256_cmpgt_epi32(lo, _mm256_set1_epi32(103)));
        if ((_mm256_movemask_ps(_mm256_castsi256_ps(fail)) & valid) != 0) return false;
      }
    }
    __m256 sum = _mm256_setzero_ps();
    for (int b = 0; b < kBlocks; ++b) {
      const __m256 scale = _mm256_castsi256_ps(_mm256_add_epi32(key_bits[b], _mm256_set1_epi32(qi.scale_bits[b])));
      sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[h * kBlocks + b]), scale, sum);
    }
    _mm256_storeu_ps(dots + h * kIndexKeyLanes, sum);
  }
  return true;
}

// ExactDots16: the two halves of the group (keys 0-7, 8-15) one after the other, heads in chunks of kHeadChunk; a
// half without valid keys gets zero dots.
template <int kBlocks>
bool exact_dots16(const uint8_t* kq, const int32_t* ub, const QueryHeadInts* heads_ints, bool checked, int heads,
                  int lanes, float* dots) {
  __m256i sums[kHeadChunk * kBlocks];
  for (int half = 0; half < 2; ++half) {
    const int half_lanes = std::min(std::max(lanes - kHalfLanes * half, 0), kHalfLanes);
    float* half_dots = dots + kHalfLanes * half;
    if (half_lanes == 0) {
      for (int h = 0; h < heads; ++h) _mm256_storeu_ps(half_dots + h * kIndexKeyLanes, _mm256_setzero_ps());
      continue;
    }
    __m256i key_bits[kBlocks];
    for (int b = 0; b < kBlocks; ++b) {
      key_bits[b] = _mm256_slli_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ub + b * kIndexKeyLanes + kHalfLanes * half)), 23);
    }
    const int valid = (1 << half_lanes) - 1;
    for (int h0 = 0; h0 < heads; h0 += kHeadChunk) {
      const int count = std::min(kHeadChunk, heads - h0);
      block_sums<kBlocks>(kq + 32 * half, heads_ints + h0, count, sums);
      float* chunk_dots = half_dots + h0 * kIndexKeyLanes;
      const bool exact =
          checked ? dots_of_block_sums<kBlocks, true>(sums, key_bits, heads_ints + h0, count, valid, chunk_dots)
                  : dots_of_block_sums<kBlocks, false>(sums, key_bits, heads_ints + h0, count, valid, chunk_dots);
      if (!exact) return false;
    }
  }
  return true;
}

}  // namespace

const ExactIndexKernels& avx2_exact_index_kernels() {
  static const ExactIndexKernels kernels{
      .pack_group = pack_group,
      .exact_dots = {nullptr, exact_dots16<1>, exact_dots16<2>, exact_dots16<3>, exact_dots16<4>},
      .weigh = weigh_heads16_avx2,
      .weigh_finite = weigh_heads16_avx2,
  };
  return kernels;
}

}  // namespace dsflash::index_exact
