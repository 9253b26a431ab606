// AVX-512 FP8 / MXFP4 linear kernels (F/BW/VL/DQ + BF16 + VBMI + VNNI), compiled per function with target
// attributes so the rest of the binary stays x86-64-v3. The BF16 linear of this table is in linear_avx512_bf16.cpp.
//
// FP8 / FP4 (spec/MODEL.md §4.9): e4m3 and e2m1 values are exact in bf16 and their products are exact in
// fp32, so `vdpbf16ps` forms each 32-K block's partial exactly whenever the fp32 sum is exact (almost
// always; otherwise only the in-block summation order differs from the reference). The per-block scaling
// and the K-order accumulation are the reference's: y = y + (partial * sa) * sw, one block after another; where
// that is exact (act_scales_carried_exactly, nearly always) sa is folded into the bf16 activations first, so
// partial * sa comes out of vdpbf16ps itself; the multi-row path then also folds sw into its converted weights
// where that is exact (weight_scales_fold_exactly), so (partial * sa) * sw does.
//
// Weights come in either order of kernels/linear.h; tiles of 16 outputs (lane = output in the results).
// Row-major (the checkpoint's, kept for shapes the load-time copy does not take): FP8 rows == 1 and MXFP4 rows
// 1..4 run the decode paths of linear_avx512_row_major.cpp;
// - other rows >= 2 (gemm_tiles_rows): weight tiles converted once per 32-K block into an L1 scratch laid out
//   [16 k-pairs][16 outputs] bf16 dwords; per row, 16 vdpbf16ps with broadcast activation pairs leave the
//   block partials of 16 outputs in one zmm (no horizontal reduction); the scratch serves every row.
// Tile-major (the load-time copy): each 64-byte vector decodes straight into that scratch layout (FP8: 2 pairs
// with the two byte lookups and unpacks, FP4: 4 pairs with a shift and vpermw each), so there is neither a
// gather nor a reduction. Rows 1..4 (tiled_decode_rows, linear_avx512_tiled.cpp) keep the pairs in registers,
// rows 5..12 (FP8) or 5..48 (MXFP4) in several such passes; more rows go through gemm_tiles_rows. Both sum a
// block's 16 pairs in one chain in pair order, so a row's result does not depend on the rows it runs with (MXFP4
// passes of 1..4 rows take exact integer dots where they give those bits).
// On row-major weights the in-block summation order differs between the decode paths and the multi-row path
// (only where a block's fp32 sum is inexact can a row's result depend on whether it ran alone).
// The "avx512fma" table (RowsMultiply::kFp32Fma) runs the same paths with fp32 FMAs in place of vdpbf16ps where
// many rows share each decoded weight (the multi-row path; passes of 2-4 rows on tile-major weights), with the
// same bits.
// Where the CPU has AMX, MXFP4 GEMMs of kFp4AmxMinRows rows or more (tile-major) take the multi-row path with the
// rows' pass on AMX tiles (linear_amx.cpp) instead of rows_chunk, the tile unit forming only the blocks whose sums
// are exact in any order (exact_fp4_blocks), so their bits stay the chain's. The "amx" table (amx_kernels(), at the
// end) runs this file's FP8 GEMM that way for every row count, with the tile unit's in-block order.
// Compiled a second time without AVX512-BF16 (DSFLASH_AVX512_NO_BF16, linear_avx512_impl.h): the "avx512-no-bf16"
// table, the FMA paths of "avx512fma" for every row count (on tile-major weights the same bits as "avx512", since
// the FMAs take vdpbf16ps's order), the multi-row path for row-major weights, no AMX.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/thread_pool.h"
#include "kernels/linear_avx512_impl.h"
#include "kernels/linear_impl.h"
#include "kernels/linear_tables.h"
#include "kernels/peak_probe.h"

namespace DSFLASH_AVX512_NAMESPACE {

namespace {
Avx512Tables make_avx512_tables() {
  const LinearDecodeTables& t = linear_decode_tables();
  Avx512Tables a{};
  for (int c = 0; c < 128; ++c) {
    a.fp8_lo[c] = static_cast<uint8_t>(t.e4m3_bf16[c] & 0xff);
    a.fp8_hi[c] = static_cast<uint8_t>(t.e4m3_bf16[c] >> 8);
    a.fp8_words[c] = t.e4m3_bf16[c];
  }
  // Entry i: a zero or normal code with those 6 bits. Low bytes: exponent 1..7 as it is, else exponent + 8
  // (code 0 -> 64, e8 m0: low byte 0 as zero's). High bytes: code 2i, whose high byte every code of that
  // exponent shares (entries 1-3 would be subnormals: never looked up).
  for (int i = 0; i < 64; ++i) {
    a.fp8_plain_lo[i] = a.fp8_lo[(i & 0x38) != 0 ? i : i | 0x40];
    a.fp8_plain_hi[i] = a.fp8_hi[2 * i];
  }
  for (int c = 0; c < 32; ++c) a.fp4[c] = t.e2m1_bf16[c % 16];
  for (int c = 0; c < 16; ++c) {
    const uint32_t bits = static_cast<uint32_t>(t.e2m1_bf16[c]) << 16;
    std::memcpy(&a.fp4_f32[c], &bits, 4);
  }
  for (int c = 0; c < 64; ++c)
    a.fp4_biased[c] = static_cast<uint8_t>(static_cast<int>(2.0f * t.e2m1_f32[c % 16]) + kExactFp4WeightBias);
  // Y_s word 8*m + r (lane m, r = 0..7) <- output t = r % 4 of the 4 (two per source register, 16 code
  // pairs each), code pair j = 8s + 2m + r / 4.
  for (int s = 0; s < 2; ++s)
    for (int p = 0; p < 32; ++p) {
      const int m = p / 8, r = p % 8, t = r % 4, j = 8 * s + 2 * m + r / 4;
      a.fp8_gather[s][p] = static_cast<uint16_t>((t / 2) * 32 + 16 * (t % 2) + j);
    }
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 32; ++i) {
      a.interleave[h][2 * i] = static_cast<uint8_t>(32 * h + i);
      a.interleave[h][2 * i + 1] = static_cast<uint8_t>(64 + 32 * h + i);
    }
  // Y byte 16m + 4q + t <- Z byte 16t + 4m + q (Z lane t = output t's 16 packed bytes).
  for (int m = 0; m < 4; ++m)
    for (int q = 0; q < 4; ++q)
      for (int t = 0; t < 4; ++t) a.fp4_gather[16 * m + 4 * q + t] = static_cast<uint8_t>(16 * t + 4 * m + q);
  for (int q = 0; q < 4; ++q)
    for (int n = 0; n < 4; ++n)
      for (int t = 0; t < 4; ++t) a.scale_regroup[16 * q + 4 * n + t] = static_cast<uint8_t>(16 * n + 4 * q + t);
  for (int c = 0; c < 64; ++c) {
    a.fp4_lo[c] = static_cast<uint8_t>(t.e2m1_bf16[c % 16] & 0xff);
    a.fp4_hi[c] = static_cast<uint8_t>(t.e2m1_bf16[c % 16] >> 8);
  }
  return a;
}
}  // namespace

const Avx512Tables kAvx512Tables = make_avx512_tables();

namespace {

// ---- Multi-row path (rows >= 2) ----
// A tile's weights (16 outputs) are converted once per 32-K block into an L1 scratch of 16 zmm, one per
// code pair j = 0..15, lane o = output o's bf16 pair (k = 2j, 2j+1) as a dword. For one row,
// dp(acc, W_j, broadcast(activation pair j)) over the 16 j leaves output o's block partial in lane o (no
// horizontal reduction), and one converted block serves every row. Activations are plain bf16 [rows, k].

constexpr int kRowTile = 8;  // rows sharing each scratch load: 8 x 2 accumulators
// From kWideRowTileMinRows rows on, 12 (24 accumulators): each converted scratch load, and in the FMA path its
// split into fp32 halves, then serves 12 rows. bench_linear --threads=1 avx512fma, medians of 5, alternated 2x:
// 256 rows wq_b 134-136 -> 140-143 GFLOP/s, wo_b 127-132 -> 137; at 16 rows 12 + 4 lost to 8 + 8 (wq_b 126-128 ->
// 119), at 64 within noise.
constexpr int kWideRowTile = 12;
constexpr int64_t kWideRowTileMinRows = 48;
constexpr int64_t kPrefillRowBlock = 256;  // rows per pass over the weights in prefill
// Folding the weight scales costs ~6 vector ops per converted scratch vector and saves one multiply per row and
// block: measured (bench_linear, tiled, 2 threads) 7% slower at 16 rows, even at 64, 1-6% faster at 256.
constexpr int64_t kFoldWeightScalesMinRows = 128;



// FP8: one block (32 codes) of 16 outputs, output i's block at base + offsets[i] -> dst[16] (see above).
// z[n] = outputs 2n, 2n+1 (16 code-pair words each). vpermt2w gathers, for 4 outputs, the 8 code pairs
// j = 8s + 2m, 8s + 2m + 1 into lane m of y[l]; the lane transpose makes c lane l = outputs 4l..4l+3, in
// the word order [4 outputs at j even][4 outputs at j odd], which vpunpck{l,h}bw in fp8_to_bf16 turns
// into W_j (outputs in lane order) and W_j+1.
DSFLASH_AVX512 inline void convert_block_fp8(const uint8_t* base, const int64_t* offsets, __m512i* dst, const Avx512Tables& at,
                                             __m512i lo0, __m512i lo1, __m512i hi0, __m512i hi1) {
  __m512i z[8];
  for (int n = 0; n < 8; ++n)
    z[n] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + offsets[2 * n]))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + offsets[2 * n + 1])), 1);
  for (int s = 0; s < 2; ++s) {
    const __m512i gather = _mm512_load_si512(at.fp8_gather[s]);
    __m512i y[4], c[4];
    for (int l = 0; l < 4; ++l) y[l] = _mm512_permutex2var_epi16(z[2 * l], gather, z[2 * l + 1]);
    transpose_lanes(y, c);
    for (int m = 0; m < 4; ++m) {
      __m512i w0, w1;
      fp8_to_bf16(c[m], lo0, lo1, hi0, hi1, &w0, &w1);
      _mm512_store_si512(dst + 2 * (4 * s + m), w0);
      _mm512_store_si512(dst + 2 * (4 * s + m) + 1, w1);
    }
  }
}

// FP4: one block (16 packed bytes) of 16 outputs -> dst[16]. z[n] lane t = output 4n+t; vpermb puts in
// lane m of y[n] the bytes j = 4m..4m+3 of those 4 outputs (byte 4q + t = output t, j = 4m + q); after the
// lane transpose q[m] lane n holds outputs 4n..4n+3. vpshufb looks up both nibbles' bf16 bytes and two
// unpack levels build the dwords, which land as W_4m+q with lane = output.
DSFLASH_AVX512 inline void convert_block_fp4(const uint8_t* base, const int64_t* offsets, __m512i* dst, __m512i gather,
                                             __m512i lut_lo, __m512i lut_hi) {
  __m512i y[4], q[4];
  for (int n = 0; n < 4; ++n) {
    auto ld = [&](int i) DSFLASH_AVX512 { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + offsets[4 * n + i])); };
    __m512i z = _mm512_castsi128_si512(ld(0));
    z = _mm512_inserti32x4(z, ld(1), 1);
    z = _mm512_inserti32x4(z, ld(2), 2);
    z = _mm512_inserti32x4(z, ld(3), 3);
    y[n] = _mm512_permutexvar_epi8(gather, z);
  }
  transpose_lanes(y, q);
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  for (int m = 0; m < 4; ++m) {
    const __m512i n0 = _mm512_and_si512(q[m], nibble);
    const __m512i n1 = _mm512_and_si512(_mm512_srli_epi16(q[m], 4), nibble);
    const __m512i l0 = _mm512_shuffle_epi8(lut_lo, n0), h0 = _mm512_shuffle_epi8(lut_hi, n0);
    const __m512i l1 = _mm512_shuffle_epi8(lut_lo, n1), h1 = _mm512_shuffle_epi8(lut_hi, n1);
    const __m512i even_lo = _mm512_unpacklo_epi8(l0, h0), even_hi = _mm512_unpackhi_epi8(l0, h0);
    const __m512i odd_lo = _mm512_unpacklo_epi8(l1, h1), odd_hi = _mm512_unpackhi_epi8(l1, h1);
    _mm512_store_si512(dst + 4 * m + 0, _mm512_unpacklo_epi16(even_lo, odd_lo));
    _mm512_store_si512(dst + 4 * m + 1, _mm512_unpackhi_epi16(even_lo, odd_lo));
    _mm512_store_si512(dst + 4 * m + 2, _mm512_unpacklo_epi16(even_hi, odd_hi));
    _mm512_store_si512(dst + 4 * m + 3, _mm512_unpackhi_epi16(even_hi, odd_hi));
  }
}

// Activation codes [rows, k] e4m3 -> bf16 bits [rows, k] in k order, rows [r0, r1). with_scales: each value times
// its block's scale, 2^(code - 127), by adding to the bf16 exponent of the nonzero finite values (exact under
// act_scales_carried_exactly).
DSFLASH_AVX512 void prepare_activation_bf16(const Fp8Activations& x, uint16_t* out, int64_t r0, int64_t r1,
                                            bool with_scales) {
  const Avx512Tables& at = avx512_tables();
#if DSFLASH_AVX512_NO_VBMI
  __m512i words_tables[4];
  for (int i = 0; i < 4; ++i) words_tables[i] = _mm512_load_si512(at.fp8_words + 32 * i);
#else
  const __m512i lo0 = _mm512_load_si512(at.fp8_lo), lo1 = _mm512_load_si512(at.fp8_lo + 64);
  const __m512i hi0 = _mm512_load_si512(at.fp8_hi), hi1 = _mm512_load_si512(at.fp8_hi + 64);
  const __m512i first = _mm512_load_si512(at.interleave[0]), second = _mm512_load_si512(at.interleave[1]);
#endif
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = x.codes + r * x.k;
    const uint8_t* scales = x.scales + r * (x.k / 32);
    uint16_t* dst = out + r * x.k;
    // One block's 32 bf16 words, scaled when asked: exponent + (scale code - 127) where the value is neither zero
    // nor NaN (e4m3 has no infinity).
    auto store_block = [&](uint16_t* to, __m512i words, int64_t block) DSFLASH_AVX512 {
      if (with_scales) {
        const __m512i magnitude = _mm512_and_si512(words, _mm512_set1_epi16(0x7fff));
        const __mmask32 scaled = _mm512_test_epi16_mask(magnitude, magnitude) &
                                 _mm512_cmpneq_epi16_mask(_mm512_and_si512(words, _mm512_set1_epi16(0x7f80)),
                                                          _mm512_set1_epi16(0x7f80));
        const int exponent_step = (static_cast<int>(scales[block]) - 127) * 128;
        words = _mm512_mask_add_epi16(words, scaled, words, _mm512_set1_epi16(static_cast<short>(exponent_step)));
      }
      _mm512_storeu_si512(to, words);
    };
#if DSFLASH_AVX512_NO_VBMI
    for (int64_t i = 0; i < x.k; i += 32) {  // k % 32 == 0: one block's 32 codes widened to words, looked up
      const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i)));
      store_block(dst + i, fp8_words_to_bf16(c, words_tables), i / 32);
    }
#else
    for (int64_t i = 0; i < x.k; i += 32) {  // k % 32 == 0; a lone last 32 codes loads half a register
      const bool full = i + 64 <= x.k;
      const __m512i c = full ? _mm512_loadu_si512(codes + i) : _mm512_maskz_loadu_epi8(0xffffffffull, codes + i);
      const __m512i lo = _mm512_permutex2var_epi8(lo0, c, lo1);
      __m512i hi = _mm512_permutex2var_epi8(hi0, c, hi1);
      hi = _mm512_ternarylogic_epi32(hi, c, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (c & 0x80)
      store_block(dst + i, _mm512_permutex2var_epi8(lo, first, hi), i / 32);
      if (!full) break;
      store_block(dst + i + 32, _mm512_permutex2var_epi8(lo, second, hi), i / 32 + 1);
      i += 32;
    }
#endif
  }
}

// Weight lines of the next chunk for a rows_chunk call to prefetch, spread over its blocks: lines[0, count),
// per_block of them before each block's rows.
struct ChunkPrefetch {
  const uint8_t* const* lines = nullptr;
  int count = 0, per_block = 0;
};

// RT rows x NT tiles (1 or 2, adjacent) over the chunk's nb blocks: act = row 0's bf16 at the chunk's first
// k (row stride k), sa = row 0's scales at the chunk's first block (stride kb), y = row 0 at the first
// tile's first output. Each scratch load serves RT rows and each broadcast NT tiles, which keeps the loads
// per vdpbf16ps near 1/2 (the loads, not the multiplies, would bound it otherwise). The 16 j of a block run
// in one accumulator per (row, tile) in j order, so a result does not depend on RT, NT or threads. Then
// y = y + (partial * sa) * sw per block in K order, less the scales already folded into the operands (kScales);
// y waits in an L1 buffer, so that the accumulators alone fill the registers.
// Act: uint16_t, bf16 activations multiplied by vdpbf16ps; or float, the same values as fp32, multiplied by fp32
// FMAs in vdpbf16ps's order (RowsMultiply::kFp32Fma): each pair's odd product, then its even one, added with one
// rounding each (pair_as_fp32). `prefetch`: the next chunk's weight lines to fetch meanwhile.
template <int RT, int NT, BlockScales kScales, class Act>
DSFLASH_AVX512 void rows_chunk(const TileScratch* scratch, int nb, const float (*const* sw)[kTile],
                               const Act* act, int64_t k, const uint8_t* sa, int64_t kb, float* y, int64_t out,
                               bool first, const __mmask16* masks, const ChunkPrefetch& prefetch) {
  static_assert(std::is_same_v<Act, uint16_t> || std::is_same_v<Act, float>);
  static_assert(kAvx512Bf16 || std::is_same_v<Act, float>, "vdpbf16ps in the bf16-free copy");
  const float* e8m0 = linear_decode_tables().e8m0_f32;
  // Full tiles use plain loads and stores (masked ones are slow on AMD); only a ragged last tile masks.
  alignas(64) float ybuf[RT][NT][kTile];
  for (int r = 0; r < RT; ++r)
    for (int t = 0; t < NT; ++t) {
      const float* src = y + r * out + t * kTile;
      _mm512_store_ps(ybuf[r][t], first                ? _mm512_setzero_ps()
                                  : masks[t] == 0xffff ? _mm512_loadu_ps(src)
                                                       : _mm512_maskz_loadu_ps(masks[t], src));
    }
  for (int b = 0; b < nb; ++b) {
    for (int l = b * prefetch.per_block; l < std::min(prefetch.count, (b + 1) * prefetch.per_block); ++l)
      _mm_prefetch(reinterpret_cast<const char*>(prefetch.lines[l]), _MM_HINT_T0);
    __m512 acc[RT][NT];
    for (int r = 0; r < RT; ++r)
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
    const Act* a = act + 32 * b;
    // One chain per (row, tile) whatever RT and NT: results do not depend on the split.
    for (int j = 0; j < 16; ++j) {
      if constexpr (std::is_same_v<Act, float>) {
        __m512 odd[NT], even[NT];
        for (int t = 0; t < NT; ++t) pair_as_fp32(_mm512_load_si512(scratch[t] + 16 * b + j), &odd[t], &even[t]);
        for (int r = 0; r < RT; ++r) {
          const __m512 x_odd = _mm512_set1_ps(a[r * k + 2 * j + 1]), x_even = _mm512_set1_ps(a[r * k + 2 * j]);
          for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_fmadd_ps(odd[t], x_odd, acc[r][t]);
          for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_fmadd_ps(even[t], x_even, acc[r][t]);
        }
      } else {
        __m512bh w[NT];
        for (int t = 0; t < NT; ++t) w[t] = (__m512bh)_mm512_load_si512(scratch[t] + 16 * b + j);
        for (int r = 0; r < RT; ++r) {
          const __m512bh x = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(a + r * k + 2 * j));
          for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w[t], x);
        }
      }
    }
    for (int r = 0; r < RT; ++r) {
      for (int t = 0; t < NT; ++t) {
        __m512 partial = acc[r][t];
        if constexpr (kScales == BlockScales::kActAndWeight)
          partial = _mm512_mul_ps(partial, _mm512_set1_ps(e8m0[sa[r * kb + b]]));
        // The multiply by sw shares the two pipes of vdpbf16ps (~5% of this loop when it is not folded away).
        if constexpr (kScales != BlockScales::kNone) partial = _mm512_mul_ps(partial, _mm512_load_ps(sw[t][b]));
        _mm512_store_ps(ybuf[r][t], _mm512_add_ps(_mm512_load_ps(ybuf[r][t]), partial));
      }
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int t = 0; t < NT; ++t) {
      float* dst = y + r * out + t * kTile;
      if (masks[t] == 0xffff) _mm512_storeu_ps(dst, _mm512_load_ps(ybuf[r][t]));
      else _mm512_mask_storeu_ps(dst, masks[t], _mm512_load_ps(ybuf[r][t]));
    }
}

// Weight scales of a chunk (sw [nb][16] fp32 powers of two, lane = output) that may be folded into its converted
// weights without changing a bit of y: every w * sw is then a normal bf16 (|w| in [2^-9, 448] or 0, e4m3's range
// and e2m1's), and with the activation scales' exponents in [g.act_exponent_low, g.act_exponent_high] every
// product and partial sum of a block is the one of rows_chunk's kWeight mode times sw exactly (as for
// act_scales_carried_exactly: sa * sw in [2^-108, 2^100]).
DSFLASH_AVX512 bool weight_scales_fold_exactly(const GemmArgs& g, const float (*sw)[kTile], int nb) {
  __m512i lowest = _mm512_set1_epi32(255), highest = _mm512_setzero_si512();
  for (int b = 0; b < nb; ++b) {
    const __m512i code = _mm512_srli_epi32(_mm512_castps_si512(_mm512_load_ps(sw[b])), 23);  // ue8m0 code
    lowest = _mm512_min_epi32(lowest, code);
    highest = _mm512_max_epi32(highest, code);
  }
  const int low = _mm512_reduce_min_epi32(lowest) - 127, high = _mm512_reduce_max_epi32(highest) - 127;
  return low >= -117 && high <= 119 && low + g.act_exponent_low >= -108 && high + g.act_exponent_high <= 100;
}

// Folds them (scratch lane o = output o's bf16 pair): each scale's exponent added to the nonzero finite words.
DSFLASH_AVX512 void fold_weight_scales(const float (*sw)[kTile], int nb, __m512i* scratch) {
  const __m512i magnitude_bits = _mm512_set1_epi16(0x7fff), exponent_bits = _mm512_set1_epi16(0x7f80);
  for (int b = 0; b < nb; ++b) {
    // (code - 127) << 7 in both words of each output's dword: the bf16 exponent step of its scale.
    const __m512i code = _mm512_srli_epi32(_mm512_castps_si512(_mm512_load_ps(sw[b])), 23);
    const __m512i word = _mm512_and_si512(_mm512_slli_epi32(_mm512_sub_epi32(code, _mm512_set1_epi32(127)), 7),
                                          _mm512_set1_epi32(0xffff));
    const __m512i step = _mm512_or_si512(word, _mm512_slli_epi32(word, 16));
    for (int j = 0; j < 16; ++j) {
      const __m512i w = _mm512_load_si512(scratch + 16 * b + j);
      const __mmask32 finite_nonzero = _mm512_test_epi16_mask(w, magnitude_bits) &
                                       _mm512_cmpneq_epi16_mask(_mm512_and_si512(w, exponent_bits), exponent_bits);
      _mm512_store_si512(scratch + 16 * b + j, _mm512_mask_add_epi16(w, finite_nonzero, w, step));
    }
  }
}

// Tiles per panel of gemm_tiles_rows. Where all rows' activations fit in the core's L2 with room to spare, one tile
// group: its chunks in turn, as the activations stay cached across groups anyway. Otherwise as many tile groups as
// keep the panel's outputs ([rows, panel tiles x 16] fp32) within kPanelOutputBytes, so that they and one chunk's
// activations ([rows, 256] fp32 at most 1 KB a row, kPrefillRowBlock rows) stay in L2 while the panel's chunks pass,
// and the activations come from L3 once per panel instead of once per tile group.
// With the chunk-major fp32 activations (bench_linear --threads=2, avx512fma, alternated 3x; one thread showed no
// clear change: the gain is in the two cores' shared L3 traffic): wo_b 256 rows 89.6-101 -> 80.5-86.5 ms, wq_b 2048
// rows 646-676 -> 620-649 ms; with panels from 1 MB, wq_b 256 rows (1.3 MB of activations) lost ~5%.
constexpr int64_t kCachedActivationBytes = 3 << 19, kPanelOutputBytes = 512 << 10;
int64_t chunk_panel_tiles(const GemmArgs& g, int kTiles) {
  const int64_t act_bytes = g.rows * g.in * (g.act_f32 != nullptr ? 4 : 2);
  if (act_bytes <= kCachedActivationBytes) return kTiles;
  const int64_t tiles = kPanelOutputBytes / (g.rows * kTile * static_cast<int64_t>(sizeof(float)));
  return std::max<int64_t>(kTiles, tiles / kTiles * kTiles);
}

// Tiles [tile_begin, tile_end) of y for all rows, kTiles at a time: per chunk of kBlocksPerChunk blocks, the
// tiles' weights are converted into the scratch (8 KB each), then every row passes over it: in rows_chunk (2
// tiles: 16 KB, in L1), or (kAmx) in amx_rows_chunk (2, or kAmxTilesPerPass from kAmxWideRows rows on: each
// activation tile load then serves that many weight tiles). A row's result does not depend on kTiles.
template <bool kFp4, bool kAmx, int kTiles = 2>
DSFLASH_AVX512 void gemm_tiles_rows(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  struct NoTiles {
    explicit NoTiles(int64_t) {}
  };
  [[maybe_unused]] const std::conditional_t<kAmx, AmxTiles, NoTiles> amx_tiles(g.rows);  // this thread's tiles
  const LinearDecodeTables& dt = linear_decode_tables();
  const Avx512Tables& at = avx512_tables();
  const __m512i lo0 = _mm512_load_si512(at.fp8_lo), lo1 = _mm512_load_si512(at.fp8_lo + 64);
  const __m512i hi0 = _mm512_load_si512(at.fp8_hi), hi1 = _mm512_load_si512(at.fp8_hi + 64);
  const __m512i fp4_gather = _mm512_load_si512(at.fp4_gather);
  const __m512i fp4_lo = _mm512_load_si512(at.fp4_lo), fp4_hi = _mm512_load_si512(at.fp4_hi);
  __m512i tiled_tables[4], plain_tables[2];
  load_tiled_tables<kFp4>(tiled_tables);
  if constexpr (!kFp4) load_plain_fp8_tables(plain_tables);
  const int64_t row_bytes = kFp4 ? g.in / 2 : g.in;
  const int64_t block_bytes = kFp4 ? 16 : 32;
  const int64_t blocks_per_line = 64 / block_bytes;
  // Weight rows of a tile (first bytes): outputs past the end repeat the last one (their lanes are not stored).
  auto tile_rows = [&](int64_t tile, const uint8_t** rows) {
    for (int i = 0; i < kTile; ++i)
      rows[i] = g.w + (tile * kTile + std::min<int64_t>(i, g.out - 1 - tile * kTile)) * row_bytes;
  };
  // Block b of an output, from its first byte.
  auto block_offset = [&](int64_t b) {
    return (b / blocks_per_line) * kGroupBytes + (b % blocks_per_line) * block_bytes;
  };

  alignas(64) float sw[kTiles][kBlocksPerChunk][kTile];
  alignas(64) TileScratch scratch[kTiles];
  // The steps (tile group, chunk) go panel by panel (panel_tiles tiles, see chunk_panel_tiles), chunk by chunk in a
  // panel, its tile groups in each chunk: the chunk's activations then serve the whole panel from L2, and the
  // panel's outputs stay there for its next chunk. A panel of one tile group is one group's chunks in turn.
  const int64_t panel_tiles = chunk_panel_tiles(g, kTiles);
  for (int64_t panel = tile_begin; panel < tile_end; panel += panel_tiles) {
    const int64_t panel_end = std::min(tile_end, panel + panel_tiles);
    // The step after (tile, b0) (tile == tile_end: none).
    auto next_step = [&](int64_t tile, int64_t b0) {
      if (tile + kTiles < panel_end) return std::pair{tile + kTiles, b0};
      if (b0 + kBlocksPerChunk < g.kb) return std::pair{panel, b0 + kBlocksPerChunk};
      return std::pair{panel_end, int64_t{0}};
    };
    for (int64_t b0 = 0; b0 < g.kb; b0 += kBlocksPerChunk)  // (one body for both loops)
    for (int64_t tile = panel; tile < panel_end; tile += kTiles) {
      const int nt = static_cast<int>(std::min<int64_t>(kTiles, panel_end - tile));
      const int64_t o0 = tile * kTile;
      const auto [next_tile, next_b0] = next_step(tile, b0);
      __mmask16 masks[kTiles];
      const uint8_t* rows[kTiles][kTile];
      int64_t rows_o[kTiles][kTile];
      for (int t = 0; t < nt; ++t) {
        const int n = static_cast<int>(std::min<int64_t>(kTile, g.out - o0 - t * kTile));
        masks[t] = static_cast<__mmask16>((1u << n) - 1);
        tile_rows(tile + t, rows[t]);
        for (int i = 0; i < kTile; ++i) rows_o[t][i] = o0 + t * kTile + std::min(i, n - 1);
      }
      if constexpr (kFp4) {
        if (b0 == 0)  // the next group's, once (its later chunks find them in cache)
          for (int t = 0; t < kTiles; ++t)
            if (tile + kTiles + t < tile_end) prefetch_fp4_scales(g, tile + kTiles + t);
      }
      const int nb = static_cast<int>(std::min<int64_t>(kBlocksPerChunk, g.kb - b0));
      for (int t = 0; t < nt; ++t) {
        if constexpr (kFp4) {
          if (g.tile_major) fp4_tiled_scales(g, tile + t, b0, b0 + nb, sw[t]);
          else if constexpr (kAvx512Vbmi) fp4_weight_scales(g, rows_o[t], b0, b0 + nb, sw[t]);
        } else {
          const int64_t scale_row = (o0 + t * kTile) / 32;
          for (int b = 0; b < nb; ++b)
            _mm512_store_ps(sw[t][b], _mm512_set1_ps(dt.e8m0_f32[g.w_scales[scale_row * g.kb + b0 + b]]));
        }
        if (g.tile_major) {
          // The chunk is nb * block bytes in a row. rows_chunk prefetches the next step's while the rows run
          // (ChunkPrefetch); AMX passes, shorter, take it here, the same tile's block for this one.
          auto chunk_start = [&](int64_t tile_index, int64_t first_block) {
            return g.w + tile_index * kTile * row_bytes + first_block * kTiledVectors<kFp4> * kTileMajorVectorBytes;
          };
          const uint8_t* src = chunk_start(tile + t, b0);
          const bool prefetch = kAmx && next_tile + t < tile_end;
          const int64_t ahead = prefetch ? chunk_start(next_tile + t, next_b0) - src : 0;
          const int next_nb = static_cast<int>(std::min<int64_t>(kBlocksPerChunk, g.kb - next_b0));
          for (int b = 0; b < nb; ++b) {
            const bool plain = !kFp4 && kAvx512Vbmi && g.plain_block(tile + t, b0 + b);
            for (int v = 0; v < kTiledVectors<kFp4>; ++v) {
              const uint8_t* vector = src + (b * kTiledVectors<kFp4> + v) * kTileMajorVectorBytes;
              if (prefetch && b < next_nb) _mm_prefetch(reinterpret_cast<const char*>(vector + ahead), _MM_HINT_T0);
              __m512i w[kTiledPairs<kFp4>];
              if (plain) tiled_plain_fp8_pairs(vector, plain_tables, w);
              else tiled_pairs<kFp4>(vector, tiled_tables, w);
              for (int p = 0; p < kTiledPairs<kFp4>; ++p)
                _mm512_store_si512(scratch[t] + 16 * b + kTiledPairs<kFp4> * v + p, w[p]);
            }
          }
          continue;
        }
        if constexpr (kAvx512Vbmi) {  // row-major weights (the VBMI-free copy hands them to the avx2 table)
          // The rows' bytes of the next step's chunk are prefetched while this one converts: 16-32 short row
          // streams defeat the hardware prefetchers.
          const uint8_t* next[kTile];
          const bool have_next = next_tile + t < tile_end;
          if (have_next) {
            tile_rows(next_tile + t, next);
            for (int i = 0; i < kTile; ++i) next[i] += block_offset(next_b0);
          }
          // Output i's block b at src + offsets[i] (one pointer to move, not 16).
          int64_t offsets[kTile];
          for (int i = 0; i < kTile; ++i) offsets[i] = rows[t][i] - rows[t][0];
          for (int b = 0; b < nb; ++b) {
            if (have_next && b % blocks_per_line == 0)
              for (int i = 0; i < kTile; ++i)
                _mm_prefetch(reinterpret_cast<const char*>(next[i] + block_offset(b)), _MM_HINT_T0);
            const uint8_t* src = rows[t][0] + block_offset(b0 + b);
            if constexpr (kFp4) convert_block_fp4(src, offsets, scratch[t] + 16 * b, fp4_gather, fp4_lo, fp4_hi);
            else convert_block_fp8(src, offsets, scratch[t] + 16 * b, at, lo0, lo1, hi0, hi1);
          }
        }
      }
      const float(*sws[kTiles])[kTile];
      for (int t = 0; t < kTiles; ++t) sws[t] = sw[t];
      const bool first = b0 == 0;
      // All tiles' weight scales folded into the scratch (decided per chunk) or none.
      bool weights_folded = g.fold_weight_scales;
      for (int t = 0; t < nt && weights_folded; ++t) weights_folded = weight_scales_fold_exactly(g, sw[t], nb);
      for (int t = 0; t < nt && weights_folded; ++t) fold_weight_scales(sw[t], nb, scratch[t]);
      const BlockScales scales = weights_folded     ? BlockScales::kNone
                                 : g.unit_act_scales ? BlockScales::kWeight
                                                     : BlockScales::kActAndWeight;
      if constexpr (kAmx) {
        amx_rows_chunk(scratch, nt, nb, sws, g.act + 32 * b0, g.in, g.act_scales + b0, g.kb, g.y + o0, g.out, g.rows,
                       first, masks, scales, g.exact_blocks != nullptr ? g.exact_blocks + b0 : nullptr);
        continue;
      }
      // Tile-major: the next step's chunk to convert, fetched while the rows run over this one, its lines spread
      // over every rows_chunk call and block. Converting from memory instead, with the prefetches in one burst,
      // stalled on the line fill buffers (16 rows: ~1/5 of the decode step in the conversion).
      constexpr int kBlockLines = kTiledVectors<kFp4> * kTileMajorVectorBytes / 64;
      const uint8_t* next_lines[kTiles * kBlocksPerChunk * kBlockLines];
      int total_lines = 0;
      if (g.tile_major) {
        const int64_t lines_per_tile = std::min<int64_t>(kBlocksPerChunk, g.kb - next_b0) * kBlockLines;
        for (int64_t t = next_tile; t < std::min(next_tile + kTiles, tile_end); ++t)
          for (int64_t l = 0; l < lines_per_tile; ++l)
            next_lines[total_lines++] = g.w + t * kTile * row_bytes + (next_b0 * kBlockLines + l) * 64;
      }
      // Row tiles: kWideRowTile rows each from kWideRowTileMinRows rows on, kRowTile otherwise, then the rest.
      const int wide_calls = g.rows >= kWideRowTileMinRows ? static_cast<int>(g.rows / kWideRowTile) : 0;
      const int64_t narrow_rows = g.rows - wide_calls * kWideRowTile;
      const int calls = static_cast<int>(wide_calls + (narrow_rows + kRowTile - 1) / kRowTile);
      int lines_done = 0, calls_started = 0;
      ChunkPrefetch prefetch;
      int64_t r = 0;
      auto run = [&]<int RT>() DSFLASH_AVX512 {
        const int end = total_lines * (calls_started + 1) / calls;  // this call's share
        prefetch.lines = next_lines + lines_done;
        prefetch.count = end - lines_done;
        prefetch.per_block = (prefetch.count + nb - 1) / nb;
        lines_done = end;
        ++calls_started;
        const uint8_t* sa = g.act_scales + r * g.kb + b0;
        float* y = g.y + r * g.out + o0;
        // act: row r at the chunk's first input, rows `stride` apart.
        auto with_act = [&]<BlockScales kScales>(const auto* act, int64_t stride) DSFLASH_AVX512 {
          if (nt == 2)
            rows_chunk<RT, 2, kScales>(scratch, nb, sws, act, stride, sa, g.kb, y, g.out, first, masks, prefetch);
          else
            rows_chunk<RT, 1, kScales>(scratch, nb, sws, act, stride, sa, g.kb, y, g.out, first, masks, prefetch);
        };
        auto call = [&]<BlockScales kScales>() DSFLASH_AVX512 {
          auto fp32_rows = [&] {  // (only where there are fp32 rows: no offset on a null pointer)
            return g.act_f32 + b0 / kBlocksPerChunk * g.act_f32_chunk_stride + r * g.act_f32_row_stride;
          };
          if constexpr (!kAvx512Bf16) with_act.template operator()<kScales>(fp32_rows(), g.act_f32_row_stride);
          else if (g.act_f32 != nullptr) with_act.template operator()<kScales>(fp32_rows(), g.act_f32_row_stride);
          else with_act.template operator()<kScales>(g.act + r * g.in + 32 * b0, g.in);
        };
        switch (scales) {
          case BlockScales::kNone: call.template operator()<BlockScales::kNone>(); break;
          case BlockScales::kWeight: call.template operator()<BlockScales::kWeight>(); break;
          case BlockScales::kActAndWeight: call.template operator()<BlockScales::kActAndWeight>(); break;
        }
      };
      for (int call = 0; call < wide_calls; ++call, r += kWideRowTile) run.template operator()<kWideRowTile>();
      for (; r + kRowTile <= g.rows; r += kRowTile) run.template operator()<kRowTile>();
      switch (g.rows - r) {
        case 7: run.template operator()<7>(); break;
        case 6: run.template operator()<6>(); break;
        case 5: run.template operator()<5>(); break;
        case 4: run.template operator()<4>(); break;
        case 3: run.template operator()<3>(); break;
        case 2: run.template operator()<2>(); break;
        case 1: run.template operator()<1>(); break;
        default: break;
      }
    }
  }
}

// A block GEMM's activations: e4m3 codes with their ue8m0 block scales (model.py's act_quant), or fp32 rows that
// hold bf16 values, whose scales are 1.0 (LinearKernels::fp8_as_bf16_gemm).
struct GemmActivations {
  const Fp8Activations* codes = nullptr;  // or
  const float* bf16_values = nullptr;     // [rows, groups * k]: the groups' inputs side by side
  const uint8_t* scales = nullptr;        // [rows, k/32] ue8m0 of the codes
  int64_t rows = 0, k = 0;
  // bf16 values only: a block-diagonal GEMM (fp8_as_bf16_grouped_gemm), group g's outputs (the weight's g-th
  // out / groups rows) from its k inputs.
  int64_t groups = 1;
};

// Activation scales a kernel may fold into the bf16 activations without changing a bit: a' = a * sa is then exact in
// bf16 (|a| in [2^-9, 448] or 0, e4m3's range), every product a' * w = (a * w) * sa with |a * w| >= 2^-18 stays a
// normal fp32 (vdpbf16ps flushes subnormal results), and so do the block's partial sums (multiples of the smallest
// product, at most 32 * 448^2 < 2^23 of them): all of it is the unscaled computation shifted by an exact power of
// two, so the partial equals the reference's partial * sa. That needs 2^-108 <= sa <= 2^100: codes 19..227.
struct ScaleCodeRange {
  uint8_t lowest = 255, highest = 0;  // ue8m0 codes; lowest > highest: no scales
};
ScaleCodeRange scale_code_range(const uint8_t* scales, int64_t n) {
  ScaleCodeRange range;  // a plain loop: the compiler vectorises it (std::minmax_element it does not)
  for (int64_t i = 0; i < n; ++i) {
    range.lowest = std::min(range.lowest, scales[i]);
    range.highest = std::max(range.highest, scales[i]);
  }
  return range;
}
bool act_scales_carried_exactly(ScaleCodeRange range) {
  return range.lowest > range.highest || (range.lowest >= 127 - 108 && range.highest <= 127 + 100);
}

// bf16 bits [n] -> the same values as fp32.
DSFLASH_AVX512 void widen_bf16(const uint16_t* bf16, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_si512(out + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                       reinterpret_cast<const __m256i*>(bf16 + i))), 16));
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(bf16[i]) << 16;
    std::memcpy(out + i, &bits, 4);
  }
}

// Rows [r0, r1) of bf16 bits [rows, in] -> the same values as fp32 in GemmArgs::act_f32's chunk-major order.
DSFLASH_AVX512 void widen_bf16_chunk_major(const uint16_t* bf16, int64_t rows, int64_t in, int64_t r0, int64_t r1,
                                           float* out) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t k0 = 0; k0 < in; k0 += kChunkInputs)
      widen_bf16(bf16 + r * in + k0, std::min(kChunkInputs, in - k0),
                 out + k0 / kChunkInputs * rows * kChunkInputs + r * kChunkInputs);
}

// Every x[i] is 0 or of magnitude >= 2^-100 (NaN and infinity count as large).
DSFLASH_AVX512 bool bf16_products_stay_normal(const float* x, int64_t n) {
  const __m512i magnitude_bits = _mm512_set1_epi32(0x7fffffff), smallest = _mm512_set1_epi32(27 << 23);  // 2^-100
  __mmask16 tiny = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = i + 16 <= n ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + i), magnitude_bits);
    tiny |= _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(v, v), v, smallest);
  }
  return tiny == 0;
}

// How run_block_gemm prepares activations in k order: scales folded in (then act_scales are all 1.0) or kept apart.
struct NaturalActivations {
  const GemmActivations* x;
  bool with_scales;
  // Rows [r0, r1) as bf16 bits in k order, out [rows, k]; grouped bf16 values group by group, out
  // [groups, rows, k].
  void prepare(uint16_t* out, int64_t r0, int64_t r1) const {
    if (x->codes != nullptr) {
      prepare_activation_bf16(*x->codes, out, r0, r1, with_scales);
      return;
    }
    for (int64_t group = 0; group < x->groups; ++group)
      narrow_bf16_rows_avx512(x->bf16_values + group * x->k, x->groups * x->k, x->k, x->k,
                              out + group * x->rows * x->k, r0, r1);
  }
};

// kAmx (FP8 in the "amx" table): every row count takes the multi-row path on AMX tiles (a row's result must not
// depend on the rows it runs with, and TDPBF16PS sums a block in an order of its own, so no row may take the
// vdpbf16ps paths instead). MXFP4 needs no such table: its rows take the tiles only where every order gives the
// same bits (fp4_on_tiles below).
// multiply: how the multi-row path and the tile-major decode of 2-4 rows multiply (not kAmx; the other decode
// paths use vdpbf16ps). The bf16-free copy (!kAvx512Bf16) multiplies with FMAs everywhere.
template <bool kFp4, bool kAmx = false>
void run_block_gemm(const GemmActivations& x, const uint8_t* w, const uint8_t* w_scales, int64_t out, int64_t in,
                    bool tile_major, float* y, ThreadPool* pool, RowsMultiply multiply = RowsMultiply::kBf16Dot,
                    const uint8_t* plain_code_blocks = nullptr) {
  static_assert(!(kFp4 && kAmx));
  static_assert(kAvx512Bf16 || !kAmx);
  if (x.rows <= 0 || out <= 0) return;
  GemmArgs g;
  g.tile_major = tile_major;
  g.w = w;
  g.w_scales = w_scales;
  g.plain_code_blocks = tile_major ? plain_code_blocks : nullptr;
  g.out = out;
  g.in = in;
  g.kb = in / 32;
  g.npairs = (g.kb + 1) / 2;
  g.rows = x.rows;
  g.act_scales = x.scales;
  g.act_f32_row_stride = in;  // row-major unless the multi-row path lays it out chunk-major
  g.act_f32_chunk_stride = kChunkInputs;
  ThreadScratch scratch(pool);
  // Groups (x.groups > 1): each group a GEMM of its own on its rows of the weight (out / groups outputs), its
  // activations (group-major [groups, rows, in] once prepared) and its outputs, group-major [groups, rows, out_g]
  // (y itself for one row, else a buffer scattered into y at the end). The tiles of all groups are split over the
  // pool as one range, as the load-time copy split the whole weight's tiles.
  const int64_t groups = x.groups, group_out = out / groups;
  const int64_t group_tiles = (group_out + kTile - 1) / kTile, tiles = groups * group_tiles;
  const bool scatter_groups = groups > 1 && x.rows > 1;
  g.out = group_out;
  g.y = scatter_groups ? scratch.take<float>(static_cast<size_t>(x.rows * out)).data() : y;
  auto in_group = [&](GemmArgs a, int64_t group) {
    a.w += group * group_out * (kFp4 ? in / 2 : in);
    a.w_scales += kFp4 ? group * group_out * g.kb : group * group_out / 32 * g.kb;  // FP8: whole 32-row blocks
    if (a.plain_code_blocks != nullptr) a.plain_code_blocks += group * group_out / kTile * g.kb;
    if (a.act != nullptr) a.act += group * x.rows * in;
    if (a.act_f32 != nullptr) a.act_f32 += group * x.rows * in;
    a.y += group * x.rows * group_out;
    return a;
  };
  // fn(args, local_begin, local_end) for the part of tiles [begin, end) in each group.
  auto for_groups = [&](const GemmArgs& a, int64_t begin, int64_t end, auto fn) {
    for (int64_t group = begin / group_tiles; group < groups && group * group_tiles < end; ++group)
      fn(in_group(a, group), std::max<int64_t>(begin - group * group_tiles, 0),
         std::min(end - group * group_tiles, group_tiles));
  };
  // The decode paths (few rows, bound by the weight read): one contiguous range per thread, whose tile streams never
  // restart at a chunk boundary. bench_linear rows:1 vs_read, alternated 4x: w1 0.92 -> 0.95, w2 0.94 -> 0.96 against
  // four chunks per thread; FP8 the same.
  auto run_tiles = [&](auto tiles_fn) {
    auto body = [&](int64_t begin, int64_t end, int) { for_groups(g, begin, end, tiles_fn); };
    if (pool) pool->parallel_for_nodes(tiles, body, 1, 1);  // as the load-time copy split them: node-local reads
    else body(0, tiles, 0);
  };
  // The group-major outputs into y [rows, groups * out_g].
  auto scatter = [&] {
    if (!scatter_groups) return;
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t group = 0; group < groups; ++group)
        std::memcpy(y + (r * groups + group) * group_out, g.y + (group * x.rows + r) * group_out,
                    static_cast<size_t>(group_out) * sizeof(float));
  };
  // The paths on k-order activations. multi_row: the activation scales folded into them where that is exact
  // (bf16 values have none), leaving act_scales of 1.0 (unit_act_scales) and one multiply fewer per block and row
  // in rows_chunk; the decode paths (few rows, bound by the weight read) keep them apart and skip the check.
  auto natural_activations = [&](bool multi_row) {
    const ScaleCodeRange act_range =
        multi_row && x.codes != nullptr ? scale_code_range(x.scales, x.rows * g.kb) : ScaleCodeRange{};
    const bool fold = x.codes == nullptr || (multi_row && act_scales_carried_exactly(act_range));
    if (fold && x.codes != nullptr && act_range.lowest <= act_range.highest && x.rows >= kFoldWeightScalesMinRows) {
      // e4m3 activations of known scales: the multi-row path may fold the weight scales too.
      g.fold_weight_scales = true;
      g.act_exponent_low = act_range.lowest - 127;
      g.act_exponent_high = act_range.highest - 127;
    }
    if (fold) {
      const std::span<uint8_t> unit = scratch.take<uint8_t>(static_cast<size_t>(x.rows * g.kb));
      std::fill(unit.begin(), unit.end(), kE8m0One);
      g.act_scales = unit.data();
      g.unit_act_scales = true;
    }
    return NaturalActivations{&x, fold && x.codes != nullptr};
  };
  // fp32 FMAs (multiply) give vdpbf16ps's bits when no product or partial sum is subnormal (vdpbf16ps flushes
  // them): always for e4m3 activations (see act_scales_carried_exactly and weight_scales_fold_exactly), and for bf16
  // ones of magnitude 0 or >= 2^-100 (every product a multiple of 2^-116: the smallest e4m3 step 2^-9 times a's
  // 2^-107). Asked only where FMAs would run (the check reads every activation).
  // The bf16-free copy has no vdpbf16ps to match: its FMAs keep subnormal products (the reference's K-order FMAs
  // do too).
  auto fma_keeps_bits = [&] {
    if constexpr (!kAvx512Bf16) return true;
    return !kAmx && multiply == RowsMultiply::kFp32Fma &&
           (x.codes != nullptr || bf16_products_stay_normal(x.bf16_values, x.rows * groups * in));
  };
  // MXFP4 rows on AMX tiles in the AVX-512 table: the tile unit forms the blocks whose sums are exact in any order,
  // the bf16 chain the others (GemmArgs::exact_blocks), so every bit is this table's and a row's result still does
  // not depend on the rows it runs with.
  bool fp4_on_tiles = false;
  if constexpr (kAvx512Bf16)
    fp4_on_tiles = kFp4 && tile_major && x.codes != nullptr && groups == 1 && x.rows >= kFp4AmxMinRows && amx_usable();
  if (!kAmx && !fp4_on_tiles && tile_major && x.rows <= tiled_passes_max_rows(kFp4)) {
    // Decode and small batches on tile-major weights: pairs decoded in registers, once for every row of a pass
    // (up to kTiledDecodeMaxRows rows; more rows take several passes over each group of tiles, which beats
    // converting the weight into the multi-row path's scratch up to tiled_passes_max_rows).
    // One row stays on vdpbf16ps where there is one: measured (bench_linear, w1 / w2 tiled, 2 threads) the MXFP4
    // FMA recipe was 5-10% slower there and ~1.3x faster at 4 rows (MXFP4 blocks now mostly take the integers; FP8
    // with FMAs is as fast as the chain at one row, see tiled_decode).
    const bool fma = (x.rows >= 2 || !kAvx512Bf16) && fma_keeps_bits();
    const NaturalActivations natural = natural_activations(false);  // (sets the activation scales too)
    if (kFp4 && kAvx512Vnni && x.codes != nullptr) {
      // MXFP4: through integers wherever that is exact (prepare_exact_fp4_rows), the bf16 chain elsewhere.
      const size_t row_blocks = static_cast<size_t>(x.rows * g.kb);
      const std::span<int8_t> pieces = scratch.take<int8_t>(row_blocks * kExactFp4PieceBlockBytes);
      const std::span<int32_t> biases = scratch.take<int32_t>(row_blocks);
      const std::span<float> units = scratch.take<float>(row_blocks);
      const std::span<uint8_t> counts = scratch.take<uint8_t>(row_blocks);
      auto prepare = [&](int64_t r0, int64_t r1, int) {
        const int64_t first = r0 * g.kb;
        prepare_exact_fp4_rows(x.codes->codes + r0 * in, r1 - r0, in, pieces.data() + first * kExactFp4PieceBlockBytes,
                               biases.data() + first, units.data() + first, counts.data() + first);
      };
      if (pool && x.rows > 1) pool->parallel_for(x.rows, prepare);
      else prepare(0, x.rows, 0);
      g.exact_pieces = pieces.data();
      g.exact_biases = biases.data();
      g.exact_units = units.data();
      g.exact_piece_counts = counts.data();
    }
    if (fma && x.codes == nullptr && groups == 1) {
      g.act_f32 = x.bf16_values;  // fp32 rows holding bf16 values: the FMAs' operands as they are
    } else {
      // [groups, rows, in] bf16
      const std::span<uint16_t> act = scratch.take<uint16_t>(static_cast<size_t>(x.rows * groups * in));
      natural.prepare(act.data(), 0, x.rows);
      g.act = act.data();
      if (fma) {
        const std::span<float> act_f32 = scratch.take<float>(static_cast<size_t>(x.rows * groups * in));
        widen_bf16(act.data(), x.rows * groups * in, act_f32.data());
        g.act_f32 = act_f32.data();
      }
    }
    run_tiles([fma](const GemmArgs& a, int64_t begin, int64_t end) { tiled_decode_rows<kFp4>(a, fma, begin, end); });
    scatter();
    return;
  }
  // The decode paths on row-major weights (linear_avx512_row_major.cpp; vdpbf16ps: not in the bf16-free copy,
  // whose rows take the multi-row path).
  if constexpr (kAvx512Bf16 && !kAmx) {
    if (kFp4 && x.rows <= kFp4DecodeMaxRows) {
      // MXFP4 with few rows (decode, or the few tokens an expert gets in batched decode): one conversion
      // in registers serves every row.
      const int64_t groups = (in + 127) / 128;
      const std::span<uint16_t> natural = scratch.take<uint16_t>(static_cast<size_t>(x.rows * in));  // [rows, in]
      const std::span<uint16_t> act = scratch.take<uint16_t>(static_cast<size_t>(x.rows * groups * 128));
      natural_activations(false).prepare(natural.data(), 0, x.rows);
      for (int64_t r = 0; r < x.rows; ++r)
        fp4_decode_activation_order(natural.data() + r * in, in, act.data() + r * groups * 128);
      g.act = act.data();
      switch (x.rows) {
        case 1: run_tiles(fp4_decode_tiles<1>); break;
        case 2: run_tiles(fp4_decode_tiles<2>); break;
        case 3: run_tiles(fp4_decode_tiles<3>); break;
        default: run_tiles(fp4_decode_tiles<4>); break;
      }
      return;
    }
    if (!kFp4 && x.rows == 1 && x.codes != nullptr) {
      // FP8 decode: block-pair lane order, converted and multiplied in registers.
      const std::span<uint16_t> act = scratch.take<uint16_t>(static_cast<size_t>(g.npairs * 64));  // block-pair order
      prepare_activation_pairs(*x.codes, g.npairs, act.data());
      g.act = act.data();
      run_tiles(fp8_decode_tiles);
      return;
    }
  }
  // Several rows: plain bf16 activations [rows, in], converted weight tiles shared by all rows; for AMX, zero rows
  // past the end that its 16-row tile loads may read. Multiplied by fp32 FMAs, the rows are fp32 (the bf16 ones
  // widened; fp32 activations holding bf16 values serve as they are).
  const NaturalActivations natural = natural_activations(true);
  const bool amx_rows = kAmx || fp4_on_tiles;
  const bool fma = !fp4_on_tiles && fma_keeps_bits();
  const bool bf16_rows = !fma || x.codes != nullptr || groups > 1;
  const int64_t padding_rows = amx_rows ? kAmxPaddingRows : 0;
  std::span<uint16_t> act;
  std::span<float> act_f32;
  if (bf16_rows) {  // [groups, rows, in] and the padding rows past the last group (AMX)
    act = scratch.take<uint16_t>(static_cast<size_t>((x.rows * groups + padding_rows) * in));
    std::fill(act.begin() + x.rows * groups * in, act.end(), uint16_t{0});
  }
  // One group's fp32 rows chunk-major (GemmArgs::act_f32): a row tile's inputs of one chunk are then contiguous,
  // 1 KB a row, not rows `in` apart. Groups keep [groups, rows, in].
  const bool chunk_major = groups == 1;
  const int64_t chunks = (in + kChunkInputs - 1) / kChunkInputs;
  const int64_t act_f32_floats = chunk_major ? chunks * x.rows * kChunkInputs : x.rows * groups * in;
  if (fma && bf16_rows) act_f32 = scratch.take<float>(static_cast<size_t>(act_f32_floats));
  std::span<uint8_t> exact_blocks;
  if (fp4_on_tiles) exact_blocks = scratch.take<uint8_t>(static_cast<size_t>(x.rows * g.kb));
  auto prepare = [&](int64_t r0, int64_t r1) {
    if (!bf16_rows) return;
    natural.prepare(act.data(), r0, r1);
    if (fp4_on_tiles)
      for (int64_t r = r0; r < r1; ++r) exact_fp4_blocks(x.codes->codes + r * in, in, exact_blocks.data() + r * g.kb);
    if (fma && chunk_major)
      widen_bf16_chunk_major(act.data(), x.rows, in, r0, r1, act_f32.data());
    else if (fma)
      for (int64_t group = 0; group < groups; ++group) {
        const int64_t first = (group * x.rows + r0) * in;
        widen_bf16(act.data() + first, (r1 - r0) * in, act_f32.data() + first);
      }
  };
  if (pool)
    pool->parallel_for(x.rows, [&](int64_t r0, int64_t r1, int) { prepare(r0, r1); });
  else
    prepare(0, x.rows);
  g.act = act.data();
  if (fma) g.act_f32 = bf16_rows ? act_f32.data() : x.bf16_values;
  if (fma && bf16_rows && chunk_major) {
    g.act_f32_row_stride = kChunkInputs;
    g.act_f32_chunk_stride = x.rows * kChunkInputs;
  }
  if (fp4_on_tiles) g.exact_blocks = exact_blocks.data();
  // The tiles per pass: on AMX, 8 once the tile loads of the activations outweigh the scratch's cache misses.
  auto rows_pass = [&](const GemmArgs& part, int64_t tile_begin, int64_t tile_end) {
    for_groups(part, tile_begin, tile_end, [amx_rows](const GemmArgs& a, int64_t begin, int64_t end) {
      if constexpr (!kAvx512Bf16) gemm_tiles_rows<kFp4, false>(a, begin, end);
      else if (!amx_rows) gemm_tiles_rows<kFp4, false>(a, begin, end);
      else if (a.rows >= kAmxWideRows) gemm_tiles_rows<kFp4, true, kAmxTilesPerPass>(a, begin, end);
      else gemm_tiles_rows<kFp4, true>(a, begin, end);
    });
  };
  if (pool && tiles < 4 * pool->num_threads()) {
    // Few outputs, several rows: split the rows instead (every row range runs all tiles).
    pool->parallel_for(x.rows, [&](int64_t r0, int64_t r1, int) {
      GemmArgs part = g;
      part.rows = r1 - r0;
      part.advance_rows(r0);
      rows_pass(part, 0, tiles);
    });
    scatter();
    return;
  }
  // Prefill: row blocks of kPrefillRowBlock, so that one block's activations ([256, k] bf16, 2.5-4 MB at
  // the real shapes) stay in cache across the tiles, at the price of reading the weights once per block.
  for (int64_t r0 = 0; r0 < x.rows; r0 += kPrefillRowBlock) {
    GemmArgs part = g;
    part.rows = std::min(kPrefillRowBlock, x.rows - r0);
    part.advance_rows(r0);
    auto body = [&](int64_t begin, int64_t end, int) { rows_pass(part, begin, end); };
    if (pool) pool->parallel_for_nodes(tiles, body);
    else body(0, tiles, 0);
  }
  scatter();
}

// The VBMI-free copy converts tile-major weights only (its byte lookups are vpermt2w / vpshufb on the tile-major
// vectors); row-major ones, left for shapes the load-time copy does not take, go to the avx2 table.
template <RowsMultiply kMultiply>
void fp8_gemm_avx512(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* pool) {
  if (!kAvx512Vbmi && !w.tile_major) return avx2_kernels()->fp8_gemm(x, w, y, pool);
  run_block_gemm<false>(GemmActivations{&x, nullptr, x.scales, x.rows, x.k}, w.codes, w.scales, w.out, w.in,
                        w.tile_major, y, pool, kMultiply, w.plain_code_blocks);
}

template <RowsMultiply kMultiply>
void fp4_gemm_avx512(const Fp8Activations& x, const Fp4Weight& w, float* y, ThreadPool* pool) {
  if (!kAvx512Vbmi && !w.tile_major) return avx2_kernels()->fp4_gemm(x, w, y, pool);
  run_block_gemm<true>(GemmActivations{&x, nullptr, x.scales, x.rows, x.k}, w.packed, w.scales, w.out, w.in,
                       w.tile_major, y, pool, kMultiply);
}

// bf16 activations (per block (partial · 1) · sw: the products are exact, as in fp8_gemm); activations that
// vdpbf16ps cannot take as they are (not bf16, or subnormal) go through the AVX2 table's fp32 FMAs instead.
template <RowsMultiply kMultiply>
void fp8_as_bf16_gemm_avx512(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* pool) {
  if (rows <= 0) return;
  if (!bf16_exact_avx512(x, rows * w.in) || (!kAvx512Vbmi && !w.tile_major)) {
    avx2_kernels()->fp8_as_bf16_gemm(x, rows, w, y, pool);  // every AVX-512 CPU has AVX2, FMA and F16C
    return;
  }
  run_block_gemm<false>(GemmActivations{nullptr, x, nullptr, rows, w.in}, w.codes, w.scales, w.out, w.in,
                        w.tile_major, y, pool, kMultiply, w.plain_code_blocks);
}

// All groups in one pass over the pool (run_block_gemm's groups), with fp8_as_bf16_gemm_avx512's bits per group.
template <RowsMultiply kMultiply>
void fp8_as_bf16_grouped_gemm_avx512(const float* x, int64_t rows, int64_t groups, const Fp8Weight& w, float* y,
                                     ThreadPool* pool) {
  if (rows <= 0) return;
  if (!bf16_exact_avx512(x, rows * groups * w.in) || (!kAvx512Vbmi && !w.tile_major)) {
    fp8_as_bf16_grouped_gemm(x, rows, groups, w, y, *avx2_kernels(), pool);
    return;
  }
  GemmActivations activations{nullptr, x, nullptr, rows, w.in};
  activations.groups = groups;
  run_block_gemm<false>(activations, w.codes, w.scales, w.out, w.in, w.tile_major, y, pool, kMultiply,
                        w.plain_code_blocks);
}

#if !DSFLASH_AVX512_NO_BF16
void fp8_gemm_amx(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* pool) {
  run_block_gemm<false, true>(GemmActivations{&x, nullptr, x.scales, x.rows, x.k}, w.codes, w.scales, w.out, w.in,
                              w.tile_major, y, pool, RowsMultiply::kBf16Dot, w.plain_code_blocks);
}
#endif

// The AVX-512 table multiplying many rows with kMultiply, its GEMMs' limit `peak`.
template <RowsMultiply kMultiply>
LinearKernels avx512_table(const char* name, PeakOps peak) {
  return {name,
          {.fp8 = true, .fp4 = true},
          fp8_gemm_avx512<kMultiply>,
          fp4_gemm_avx512<kMultiply>,
          bf16_gemm_avx512,
          fp8_as_bf16_gemm_avx512<kMultiply>,
          peak,
          fp8_as_bf16_grouped_gemm_avx512<kMultiply>,
          kAvx512Bf16 && amx_usable() ? kFp4AmxMinRows : 0};
}

}  // namespace

#if DSFLASH_AVX512_NO_BF16
const LinearKernels* kernels() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                                (!kAvx512Vbmi || __builtin_cpu_supports("avx512vbmi")) &&
                                (!kAvx512Vnni || __builtin_cpu_supports("avx512vnni"));
  static const LinearKernels table = avx512_table<RowsMultiply::kFp32Fma>(
      kAvx512Vbmi ? "avx512-no-bf16" : kAvx512Vnni ? "avx512-no-vbmi" : "avx512-no-vnni", PeakOps::kFp32Fma);
  return supported ? &table : nullptr;
}
#else
const LinearKernels* avx512_kernels_multiplying(RowsMultiply multiply) {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                                __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi") &&
                                __builtin_cpu_supports("avx512vnni");
  static const LinearKernels dot = avx512_table<RowsMultiply::kBf16Dot>("avx512", PeakOps::kBf16Dot);
  static const LinearKernels fma = avx512_table<RowsMultiply::kFp32Fma>("avx512fma", PeakOps::kFp32Fma);
  if (!supported) return nullptr;
  return multiply == RowsMultiply::kFp32Fma ? &fma : &dot;
}

RowsMultiply fastest_rows_multiply() {
  // ~2 ms per timing on the calling thread, registers only; FLOPs count products and sums alike for both. Three
  // alternated timings each, the best of each counting (other load on the machine only ever slows a timing). FMAs
  // must win clearly: a close call is not worth the fp32 copy of the activations.
  static const RowsMultiply fastest = [] {
    double dot = 0.0, fma = 0.0;
    for (int i = 0; i < 3; ++i) {
      dot = std::max(dot, measure_dot_peak(nullptr, 0.002, PeakOps::kBf16Dot).gflops);
      fma = std::max(fma, measure_dot_peak(nullptr, 0.002, PeakOps::kFp32Fma).gflops);
    }
    return fma > 1.25 * dot ? RowsMultiply::kFp32Fma : RowsMultiply::kBf16Dot;
  }();
  return fastest;
}

const LinearKernels* avx512_kernels() {
  if (avx512_kernels_multiplying(RowsMultiply::kBf16Dot) == nullptr) return nullptr;
  return avx512_kernels_multiplying(fastest_rows_multiply());
}

// The AVX-512 table with the FP8 block GEMMs on AMX tiles, every row count (see run_block_gemm); its MXFP4 GEMM
// is the AVX-512 table's (on the tiles from kFp4AmxMinRows rows, with that table's bits), and so are the bf16 ones.
const LinearKernels* amx_kernels() {
  if (avx512_kernels() == nullptr || !amx_usable()) return nullptr;
  static const LinearKernels kernels = [] {
    LinearKernels k = *avx512_kernels();  // with the multiply it chose
    k.name = "amx";
    k.fp8_gemm = fp8_gemm_amx;
    k.gemm_peak = PeakOps::kAmxBf16;
    k.fp4_amx_min_rows = 0;  // its GEMM peak is the tile unit's already
    return k;
  }();
  return &kernels;
}
#endif

}  // namespace DSFLASH_AVX512_NAMESPACE
