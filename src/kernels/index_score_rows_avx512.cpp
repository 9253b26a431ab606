// The exact-integer indexer dots on AVX-512 (kernels/index_score_exact.h) on the packed MXFP4 bytes of 16 keys at a
// time, same bits as the oracle. Compiled twice: as is, each quad of a block one vpdpbusd (AVX-512 VNNI: Cascade
// Lake on); and with DSFLASH_INDEX_NO_VNNI defined to 1 (index_score_rows_avx512_no_vnni.cpp) for AVX-512 F/BW alone
// (Skylake-SP), each quad one vpmaddubsw into int16 pair sums and one vpmaddwd by 1 per block, which the AVX2 kernel
// (index_score_rows_avx2.cpp) shows exact: the u8 operand is ik + 12 <= 24 and the s8 one |iq| <= 12, so an int16
// lane gathers at most 8 x 576 over a block (vpmaddubsw saturates at 2^15 - 1: never here).
// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -W(maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/index_score_exact.h"

#ifndef DSFLASH_INDEX_NO_VNNI
#define DSFLASH_INDEX_NO_VNNI 0
#endif

namespace dsflash::index_exact {
namespace {
#if DSFLASH_INDEX_NO_VNNI
#define DSFLASH_INDEX_AVX512 __attribute__((target("avx512f,avx512bw")))
#else
#define DSFLASH_INDEX_AVX512 __attribute__((target("avx512f,avx512bw,avx512vnni")))
#endif
constexpr bool kVnni = !DSFLASH_INDEX_NO_VNNI;

// 16x16 transpose of 32-bit elements: r[i] lane j -> r[j] lane i.
DSFLASH_INDEX_AVX512 inline void transpose16x16(__m512i* r) {
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
// four elements of one key per 32-bit lane) and ub [dim/32][16] scale codes; false when a valid row has a scale
// code >= kFirstNonFiniteScaleCode. dim <= 128 and a multiple of 32.
// The 16 rows' nibbles (dim/2 bytes, one zmm each) are transposed first: vector i then holds, in lane l, the 8
// nibbles of elements 8i..8i+7 of key l. Table lookups turn its low and high nibbles (even and odd elements) into
// (ik + 12) bytes; unpacking them interleaves each dword's elements back in order, two keys per 128-bit lane and
// half (lane L of the low unpack: key 4L's quads 2i, 2i+1, then key 4L+1's; the high unpack: keys 4L+2, 4L+3), and
// one two-source dword permute per quad gathers its 16 keys in lane order.
DSFLASH_INDEX_AVX512 bool pack_group(const uint8_t* const* rows, int lanes, int64_t dim, uint8_t* kq, int32_t* ub) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kTwiceE2m1Plus12)));
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const int64_t row_bytes = dim / 2;
  const __mmask64 byte_mask = row_bytes >= 64 ? ~__mmask64{0} : (__mmask64{1} << row_bytes) - 1;
  __m512i v[kIndexKeyLanes];
  for (int l = 0; l < kIndexKeyLanes; ++l) {
    v[l] = l < lanes ? _mm512_maskz_loadu_epi8(byte_mask, rows[l]) : _mm512_setzero_si512();
  }
  transpose16x16(v);
  // key k = 4L + m: m = 0, 1 from the low unpack's dwords 4L, 4L + 2; m = 2, 3 from the high unpack's (+16)
  const __m512i even_quads = _mm512_setr_epi32(0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30);
  const __m512i odd_quads = _mm512_add_epi32(even_quads, _mm512_set1_epi32(1));
  for (int64_t i = 0; i < dim / 8; ++i) {
    const __m512i even = _mm512_shuffle_epi8(table, _mm512_and_si512(v[i], nibble));
    const __m512i odd = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v[i], 4), nibble));
    const __m512i keys01 = _mm512_unpacklo_epi8(even, odd), keys23 = _mm512_unpackhi_epi8(even, odd);
    _mm512_storeu_si512(kq + (2 * i) * 64, _mm512_permutex2var_epi32(keys01, even_quads, keys23));
    _mm512_storeu_si512(kq + (2 * i + 1) * 64, _mm512_permutex2var_epi32(keys01, odd_quads, keys23));
  }
  // Scale codes: each row's dim/32 (<= 4) bytes in one 32-bit lane (missing rows: 127), then one vector per block.
  const int blocks = static_cast<int>(dim / 32);
  alignas(64) uint32_t codes[kIndexKeyLanes];
  for (int l = 0; l < kIndexKeyLanes; ++l) {
    codes[l] = 0x7f7f7f7fu;
    if (l >= lanes) continue;
    if (blocks == kMaxIndexBlocks) {  // a fixed-size copy the compiler inlines (the model's dim 128)
      std::memcpy(&codes[l], rows[l] + row_bytes, kMaxIndexBlocks);
    } else {
      std::memcpy(&codes[l], rows[l] + row_bytes, static_cast<size_t>(blocks));
    }
  }
  const __m512i words = _mm512_load_si512(codes);
  const __mmask64 block_bytes = 0x1111111111111111ull * ((1u << blocks) - 1);  // bytes < blocks of every lane
  const bool finite =
      _mm512_mask_cmpge_epu8_mask(block_bytes, words, _mm512_set1_epi8(static_cast<char>(kFirstNonFiniteScaleCode))) == 0;
  for (int b = 0; b < blocks; ++b)
    _mm512_storeu_si512(ub + b * kIndexKeyLanes, _mm512_and_si512(_mm512_srli_epi32(words, 8 * b), _mm512_set1_epi32(0xff)));
  return finite;
}

// kH heads of one query against 16 keys: dots [kH][16]. key_bits [kBlocks]: the keys' ue8m0 codes << 23 per block
// (lanes = keys). kChecked: test every (head, valid lane) for exactness first and return false (dots unspecified)
// when one fails; false when group_passes_all_checks has shown that none can.
// Each block's integer dot P_b (|P_b| <= bound_b < 2^24) becomes fp32 exactly, and one fma adds P_b * 2^E_b (E_b in
// the normal range, so the product is exact) to the head's sum. Where the checks hold, every partial sum is an
// integer multiple of 2^E_min below 2^24 * 2^E_min, so every fma is exact and the result is N * 2^E_min, the
// reference's bits (index_score.h). A block of q that is all zero has P_b = 0 and a finite scale
// (QueryHeadInts::scale_bits), so it adds +0 whatever the key's code; a head without a nonzero block gives +0, as
// the reference's sum from 0.0f does.
template <int kH, int kBlocks, bool kChecked>
DSFLASH_INDEX_AVX512 inline bool exact_dots_heads(const uint8_t* kq, const __m512i* key_bits, const QueryHeadInts* q,
                                          __mmask16 valid, float* dots) {
  if constexpr (kChecked) {
    for (int h = 0; h < kH; ++h) {
      const QueryHeadInts& qi = q[h];
      if (!qi.any_block) continue;
      // Per lane the smallest exponent E_min over the head's nonzero blocks, and each such block's shift E_b - E_min:
      // s > 11 fails the check, so the shifted bounds summed below use shifts <= 11 on valid lanes (lanes past the
      // valid ones may hold anything, their results are never stored).
      __m512i e[kBlocks];
      __m512i lo = _mm512_set1_epi32(1 << 30);
      for (int b = 0; b < kBlocks; ++b) {
        e[b] = _mm512_add_epi32(_mm512_srli_epi32(key_bits[b], 23), _mm512_set1_epi32(qi.exponent[b] - 128));
        if (qi.bound[b] != 0) lo = _mm512_min_epi32(lo, e[b]);
      }
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
  __m512 sum[kH];
#pragma GCC unroll 8
  for (int h = 0; h < kH; ++h) sum[h] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; ++b) {
    const uint8_t* block = kq + b * 8 * 64;  // quads 8b..8b+7, 64 bytes each
    __m512i acc[kH];  // int32 block sums from the offset (VNNI), else int16 pair sums (two per key) from 0
#pragma GCC unroll 8
    for (int h = 0; h < kH; ++h) acc[h] = kVnni ? _mm512_set1_epi32(q[h].offset[b]) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int quad = 0; quad < 8; ++quad) {
      const __m512i k = _mm512_loadu_si512(block + quad * 64);
#pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        int32_t q4;
        std::memcpy(&q4, q[h].iq + (b * 8 + quad) * 4, sizeof(q4));
        if constexpr (kVnni) {
          acc[h] = _mm512_dpbusd_epi32(acc[h], k, _mm512_set1_epi32(q4));
        } else {
          acc[h] = _mm512_add_epi16(acc[h], _mm512_maddubs_epi16(k, _mm512_set1_epi32(q4)));
        }
      }
    }
    if constexpr (!kVnni) {
#pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        acc[h] = _mm512_add_epi32(_mm512_madd_epi16(acc[h], _mm512_set1_epi16(1)), _mm512_set1_epi32(q[h].offset[b]));
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < kH; ++h) {
      const __m512 scale = _mm512_castsi512_ps(_mm512_add_epi32(key_bits[b], _mm512_set1_epi32(q[h].scale_bits[b])));
      sum[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[h]), scale, sum[h]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < kH; ++h) _mm512_storeu_ps(dots + h * kIndexKeyLanes, sum[h]);
  return true;
}

template <int kBlocks, bool kChecked>
DSFLASH_INDEX_AVX512 bool exact_dots_all_heads(const uint8_t* kq, const __m512i* key_bits, const QueryHeadInts* heads_ints,
                                       int heads, __mmask16 valid, float* dots) {
  int h = 0;
  for (; h + 8 <= heads; h += 8) {
    if (!exact_dots_heads<8, kBlocks, kChecked>(kq, key_bits, heads_ints + h, valid, dots + h * kIndexKeyLanes)) return false;
  }
  if (h + 4 <= heads) {
    if (!exact_dots_heads<4, kBlocks, kChecked>(kq, key_bits, heads_ints + h, valid, dots + h * kIndexKeyLanes)) return false;
    h += 4;
  }
  for (; h < heads; ++h) {
    if (!exact_dots_heads<1, kBlocks, kChecked>(kq, key_bits, heads_ints + h, valid, dots + h * kIndexKeyLanes)) return false;
  }
  return true;
}

// ExactDots16: dots [heads][16] of one query against 16 keys packed as (ik + 12) bytes kq [dim/4][16][4] with ue8m0
// scale codes ub [dim/32][16].
template <int kBlocks>
DSFLASH_INDEX_AVX512 bool exact_dots16(const uint8_t* kq, const int32_t* ub, const QueryHeadInts* heads_ints, bool checked,
                               int heads, int lanes, float* dots) {
  const __mmask16 valid = static_cast<__mmask16>((1u << lanes) - 1u);
  __m512i key_bits[kBlocks];
  for (int b = 0; b < kBlocks; ++b) key_bits[b] = _mm512_slli_epi32(_mm512_loadu_si512(ub + b * 16), 23);
  if (checked) return exact_dots_all_heads<kBlocks, true>(kq, key_bits, heads_ints, heads, valid, dots);
  return exact_dots_all_heads<kBlocks, false>(kq, key_bits, heads_ints, heads, valid, dots);
}

}  // namespace

#if DSFLASH_INDEX_NO_VNNI
const ExactIndexKernels* avx512bw_exact_index_kernels() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
const ExactIndexKernels* vnni_exact_index_kernels() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni");
#endif
  static const ExactIndexKernels kernels{
      .pack_group = pack_group,
      .exact_dots = {nullptr, exact_dots16<1>, exact_dots16<2>, exact_dots16<3>, exact_dots16<4>},
      .weigh = weigh_heads16_avx512(),
      .weigh_finite = weigh_heads16_finite_avx512(),
  };
  return supported ? &kernels : nullptr;
}

}  // namespace dsflash::index_exact
