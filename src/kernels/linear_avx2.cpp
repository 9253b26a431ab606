// AVX2 + FMA + F16C linear kernels (the x86-64-v3 baseline).
//
// FP8 / FP4 (spec/MODEL.md §4.9): the block partials are scaled and accumulated in K order exactly as the
// reference: y = y + (partial * sa) * sw. Three paths compute the partials:
// - 1..kDecodeMaxRows rows, in either weight order, and on tile-major weights up to kFp8PassMaxRows /
//   kFp4PassMaxRows rows in passes of those: the decode kernels (linear_avx2_decode.cpp), each weight block converted
//   in registers as it is read.
// - more rows (gemm_tiles, here): weights widened once per chunk into lanes [block][k][48 outputs] fp32 (bytes
//   transposed, then through the fp16 converter: an e4m3 code's magnitude bits shifted into an fp16 word give the
//   value times 2^-8 exactly, subnormals included; e2m1 values are fp16 words from a 16-entry table of high bytes),
//   then each block summed down k from 0 as the reference does, every product exact. Where the scales allow
//   (scales_keep_scaled_sums_exact) the activations come times their block scales and the lanes times theirs, so
//   that a block's sum already is (partial * sa) * sw, with no multiply per block to take FMA slots. With the
//   running sums kept apart from y (gemm_tiles), bench_linear --threads=2 rows:256 (Zen 3, 3 alternations, minima
//   of 5): wo_b_fp8_tiled 166 -> 148 ms, wq_b 148 -> 136, w13_mxfp4 83 -> 80, w2 44 -> 40; wo_b on 1 thread 317-325
//   -> 295-298 with the sums apart alone, 278-296 with both.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/linear_avx2_impl.h"
#include "kernels/linear_impl.h"

namespace dsflash::linear_impl {

namespace avx2 {

namespace {

// Several rows (prefill, batched decode): weights converted once per chunk into lanes, [block][k][48 outputs] fp32,
// then for each row and block 32 FMAs down k, each a broadcast activation times one vector of 8 outputs' weights.
// The block's sum is then sequential in k from 0, the reference's own order (linear_reference.cpp), with no
// horizontal sums. 2 rows x 6 tiles give 12 independent chains and 2 broadcasts per 12 FMAs (bench_linear avx2,
// Zen 1, 2 threads, alternated 2x against 3 rows x 4 tiles: rows:256 w2_mxfp4 44.0 / 43.4 -> 49.1 / 48.7 GFLOP/s,
// wo_b_fp8 +1-3%; rows:16 within 5%; 4 blocks a chunk instead of 8 no faster); 3 rows x 4 tiles had measured
// 1.25-1.35x the GFLOP/s of summing each block over 8 lanes and reducing, and 4 rows x 2 tiles no faster than that.
// With each lane vector loaded once for both rows (lane_rows), 3 x 4 measured 3-10% faster on FP8 and 6-11% slower
// on MXFP4.
constexpr int kLaneTiles = 6;         // tiles at a time
constexpr int kLaneWidth = kLaneTiles * kTile;  // outputs per k in lanes
// 4 blocks x 32 k x 48 outputs fp32 = 24 KB of lanes, which each row pair reads whole: from L1 (32 KB); 48 KB came
// from L2, at the FMA peak 32 bytes a cycle, all of a Zen 3's L2-to-L1 rate. With the scales folded and the sums
// apart (see the top), bench_linear --threads=2 rows:256, 3 alternations, minima of 5: wo_b_fp8_tiled 148-155 ->
// 142-145 ms, w2_mxfp4 40.2-40.9 -> 38.4-38.9 against 8 blocks; 2 blocks 149-150 / 40.1-41.0. (On the Zen 1 measured
// above, before those two changes, 4 blocks had been no faster.)
constexpr int kLaneChunkBlocks = 4;
constexpr int kLaneRows = 2;          // rows at a time (the one left over runs alone)
constexpr int64_t kPrefillRowBlock = 256;  // rows per pass over the weights in prefill (run_block_gemm)

// 16 FP8 codes, k and k + 1 of 8 outputs (bytes 0-7: k, 8-15: k + 1, output order) -> values[0] (k) and values[1]
// (k + 1), 8 outputs each, as value * 2^-8; kNanCodes turns the NaN codes into fp16 NaNs.
template <bool kNanCodes>
inline void fp8_pair_values(__m128i codes, __m256 (&values)[2]) {
  const __m128i zero = _mm_setzero_si128();
  for (int h = 0; h < 2; ++h) {
    __m128i words = e4m3_fp16_words(h == 0 ? _mm_unpacklo_epi8(zero, codes) : _mm_unpackhi_epi8(zero, codes));
    if constexpr (kNanCodes) {
      const __m128i magnitude = _mm_set1_epi16(0x3F80);
      const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(words, magnitude), magnitude);
      words = _mm_or_si128(words, _mm_and_si128(nan, _mm_set1_epi16(0x7E00)));
    }
    values[h] = _mm256_cvtph_ps(words);
  }
}

// The same times `scale` (see weights_to_lanes) into lanes rows k and k + 1 (the next row is kLaneWidth floats on).
template <bool kNanCodes>
inline void fp8_pair_to_lanes(__m128i codes, __m256 scale, float* lanes) {
  __m256 values[2];
  fp8_pair_values<kNanCodes>(codes, values);
  _mm256_store_ps(lanes, _mm256_mul_ps(values[0], scale));
  _mm256_store_ps(lanes + kLaneWidth, _mm256_mul_ps(values[1], scale));
}

// 8 outputs' 32 e4m3 codes of one FP8 block in k order -> lanes [32 k][kLaneWidth] fp32, this tile's 8 columns,
// value * 2^-8 * scale. The bytes are transposed 8 x 8 first, so each k's 8 outputs convert as one vector of fp16 words
// (e4m3_fp16_words): an eighth of the data moved by transposing fp32, and no lane crossing. kNanCodes also turns
// the NaN codes (0x7f / 0xff, all 7 magnitude bits set) into fp16 NaNs.
template <bool kNanCodes>
inline void fp8_block_to_lanes(const uint8_t* const* codes, __m256 scale, float* lanes) {
  for (int q = 0; q < 4; ++q) {  // k 8q .. 8q + 7
    __m128i r[kTile];
    for (int i = 0; i < kTile; ++i) r[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes[i] + 8 * q));
    const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
    const __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
    const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);  // k 0-3 / 4-7, outputs 0-3
    const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);  // outputs 4-7
    // k pairs (2j, 2j + 1) of the 8: 8 outputs' bytes each
    const __m128i pairs[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                              _mm_unpackhi_epi32(b1, b3)};
    for (int j = 0; j < 4; ++j) fp8_pair_to_lanes<kNanCodes>(pairs[j], scale, lanes + (8 * q + 2 * j) * kLaneWidth);
  }
}

// The codes of 8 outputs of a tile-major FP8 tile (kernels/linear.h) for the 4 k of one 64-byte vector, by k: `half`
// is the vector's first byte plus 32h for outputs 8h .. 8h + 7, whose two quarters hold 4 outputs' k pairs each
// (byte 2i + k % 2 + 8 ((k % 4) / 2) for output i). A byte shuffle gathers each k's 4 codes of a quarter, and the
// interleave of the two quarters gives each k's 8 codes in output order: `first` holds k 0 (bytes 0-7) and k 1
// (8-15) of the vector, `second` k 2 and 3, as fp8_pair_to_lanes takes them.
struct Fp8KPairs {
  __m128i first, second;
};
inline Fp8KPairs fp8_tile_major_k_pairs(const uint8_t* half) {
  const __m128i by_k = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m128i low = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half)), by_k);
  const __m128i high = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half + 16)), by_k);
  return {_mm_unpacklo_epi32(low, high), _mm_unpackhi_epi32(low, high)};
}

// Outputs 8h .. 8h + 7 of a tile-major FP8 tile, one block -> lanes [32 k][kLaneWidth], this tile's 8 columns,
// value * 2^-8 * scale. `codes`: the block's first byte plus 32h.
template <bool kNanCodes>
inline void fp8_tile_major_block_to_lanes(const uint8_t* codes, __m256 scale, float* lanes) {
  for (int v = 0; v < 8; ++v) {
    const Fp8KPairs k = fp8_tile_major_k_pairs(codes + kTileMajorVectorBytes * v);
    fp8_pair_to_lanes<kNanCodes>(k.first, scale, lanes + (4 * v) * kLaneWidth);
    fp8_pair_to_lanes<kNanCodes>(k.second, scale, lanes + (4 * v + 2) * kLaneWidth);
  }
}

// 8 outputs' 16 packed bytes of one MXFP4 block (byte j: k = 2j in the low nibble, 2j + 1 in the high one) -> lanes
// [32 k][kLaneWidth] fp32, this tile's 8 columns, value * scale. The packed bytes are transposed first (8 x 16, in
// registers), so that each vector holds bytes j = 2m and 2m + 1 of the 8 outputs; the nibbles then become the fp16
// high bytes of k = 4m .. 4m + 3 through one 16-entry table, for the whole tile at once.
inline void fp4_block_to_lanes(const uint8_t* const* packed, __m128i fp16_table, __m256 scale, float* lanes) {
  const __m128i nibble = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
  __m128i r[kTile];
  for (int i = 0; i < kTile; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed[i]));
  __m128i pairs_low[4], pairs_high[4];  // outputs 2p, 2p + 1 interleaved: bytes 0-7 / 8-15
  for (int p = 0; p < 4; ++p) {
    pairs_low[p] = _mm_unpacklo_epi8(r[2 * p], r[2 * p + 1]);
    pairs_high[p] = _mm_unpackhi_epi8(r[2 * p], r[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // bytes 8h .. 8h + 7
    const __m128i* a = h == 0 ? pairs_low : pairs_high;
    const __m128i quads[4] = {_mm_unpacklo_epi16(a[0], a[1]), _mm_unpackhi_epi16(a[0], a[1]),   // outputs 0-3
                              _mm_unpacklo_epi16(a[2], a[3]), _mm_unpackhi_epi16(a[2], a[3])};  // outputs 4-7
    for (int half = 0; half < 2; ++half) {  // 4 bytes of quads[half] and quads[half + 2]
      const __m128i bytes[2] = {_mm_unpacklo_epi32(quads[half], quads[half + 2]),
                                _mm_unpackhi_epi32(quads[half], quads[half + 2])};
      for (int e = 0; e < 2; ++e) {
        const int j = 8 * h + 4 * half + 2 * e;  // bytes j, j + 1 of the 8 outputs
        const __m128i low = _mm_shuffle_epi8(fp16_table, _mm_and_si128(bytes[e], nibble));
        const __m128i high = _mm_shuffle_epi8(fp16_table, _mm_and_si128(_mm_srli_epi16(bytes[e], 4), nibble));
        const __m128i words[4] = {_mm_unpacklo_epi8(zero, low), _mm_unpacklo_epi8(zero, high),
                                  _mm_unpackhi_epi8(zero, low), _mm_unpackhi_epi8(zero, high)};
        for (int i = 0; i < 4; ++i)
          _mm256_store_ps(lanes + (2 * j + i) * kLaneWidth, _mm256_mul_ps(_mm256_cvtph_ps(words[i]), scale));
      }
    }
  }
}

// Outputs 8h .. 8h + 7 of a tile-major MXFP4 tile (kernels/linear.h), one block -> lanes [32 k][kLaneWidth] fp32,
// this tile's 8 columns, value * scale. `half`: the block's first byte plus 32h. In each 64-byte vector output i's
// 8 k sit in dword i: its low nibbles k 0 4 1 5, its high ones k 2 6 3 7 (bytes 0-3). Both nibble sets become fp16
// high bytes through one 16-entry table; then per 128-bit lane one byte shuffle gathers bytes j and j + 1 of its 4
// outputs as fp16 words (words 0-3 and 4-7), and a qword permute puts each k's 8 outputs in one half, for F16C.
inline void fp4_tile_major_block_to_lanes(const uint8_t* half, __m256i fp16_table, __m256 scale, float* lanes) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i bytes_01 = _mm256_setr_epi8(-1, 0, -1, 4, -1, 8, -1, 12, -1, 1, -1, 5, -1, 9, -1, 13,  //
                                            -1, 0, -1, 4, -1, 8, -1, 12, -1, 1, -1, 5, -1, 9, -1, 13);
  const __m256i bytes_23 = _mm256_add_epi8(bytes_01, _mm256_set1_epi16(0x0200));
  for (int v = 0; v < 4; ++v) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + v * kTileMajorVectorBytes));
    const __m256i sets[2] = {_mm256_shuffle_epi8(fp16_table, _mm256_and_si256(raw, nibble)),
                             _mm256_shuffle_epi8(fp16_table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble))};
    for (int set = 0; set < 2; ++set)
      for (int pair = 0; pair < 2; ++pair) {
        // bytes 2 pair and 2 pair + 1 of the dwords: k 8v + 2 set + pair and 4 more
        const __m256i words =
            _mm256_permute4x64_epi64(_mm256_shuffle_epi8(sets[set], pair == 0 ? bytes_01 : bytes_23), 0xD8);
        const int k = 8 * v + 2 * set + pair;
        _mm256_store_ps(lanes + k * kLaneWidth, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(words)), scale));
        _mm256_store_ps(lanes + (k + 4) * kLaneWidth,
                        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(words, 1)), scale));
      }
  }
}

// The weights of NT tiles from output o0 (n of them real; the rest repeat the last) for blocks [b0, b1): lanes
// [b1 - b0][32][kLaneWidth] (FP8 as value * 2^-8; with g.act_times_scales each value times its scale instead),
// scales sw [b1 - b0][kLaneWidth]. Every block is read in place, in either weight order: calling the out-of-line
// gather helpers (fp8_block_codes, fp4_block_packed) for every output and block cost about a fifth of a 16-row FP8
// GEMM (bench_linear avx2 rows:16, 1 thread).
template <bool kFp4, int NT>
void weights_to_lanes(const GemmArgs& g, int64_t o0, int n, int64_t b0, int64_t b1, float* lanes, float* sw) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const int64_t row_bytes = kFp4 ? g.in / 2 : g.in;
  const __m128i fp16_table = _mm_load_si128(reinterpret_cast<const __m128i*>(fp4_byte_tables().fp16_high));
  const __m256i fp16_table_both = _mm256_broadcastsi128_si256(fp16_table);
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f);
  const __m256 one = _mm256_set1_ps(1.0f), unscale = _mm256_set1_ps(kFp4 ? 1.0f : 256.0f);
  for (int t = 0; t < NT; ++t) {
    if (!kFp4 && g.tile_major) {
      // Whole tiles of 8 (tile-major weights have a multiple of 16 outputs): half (o / 8) % 2 of a 16-output tile.
      const int64_t o = o0 + kTile * t;
      const uint8_t* tile_codes = g.w + (o - o % kTileMajorOutputs) * g.in + 32 * ((o / kTile) % 2);
      for (int64_t b = b0; b < b1; ++b) {
        const uint8_t* codes = tile_codes + b * 32 * kTileMajorOutputs;
        __m256i largest = _mm256_setzero_si256();  // the largest magnitude code, to spot NaN codes
        for (int v = 0; v < 8 && g.may_hold_nan; ++v)
          largest = _mm256_max_epu8(largest, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                                                  codes + kTileMajorVectorBytes * v)),
                                                              magnitude_bits));
        float* tile_lanes = lanes + (b - b0) * 32 * kLaneWidth + kTile * t;
        const float scale = dt.e8m0_f32[g.w_scales[(o / 32) * g.kb + b]];  // one per 32 x 32 block
        _mm256_store_ps(sw + (b - b0) * kLaneWidth + kTile * t, _mm256_set1_ps(scale));
        const __m256 lane_scale = g.act_times_scales ? _mm256_set1_ps(256.0f * scale) : one;
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(largest, magnitude_bits)) != 0)
          fp8_tile_major_block_to_lanes<true>(codes, lane_scale, tile_lanes);
        else
          fp8_tile_major_block_to_lanes<false>(codes, lane_scale, tile_lanes);
      }
      continue;
    }
    if (kFp4 && g.tile_major) {  // whole tiles of 8 again: half (o / 8) % 2 of a 16-output tile
      const int64_t o = o0 + kTile * t, h = (o / kTile) % 2;
      const uint8_t* tile_packed = g.w + (o - o % kTileMajorOutputs) * (g.in / 2) + 32 * h;
      const uint8_t* tile_scales = g.w_scales + (o - o % kTileMajorOutputs) * g.kb + kTile * h;
      for (int64_t b = b0; b < b1; ++b) {
        float* scales = sw + (b - b0) * kLaneWidth + kTile * t;
        for (int i = 0; i < kTile; ++i) scales[i] = dt.e8m0_f32[tile_scales[kTileMajorOutputs * b + i]];
        fp4_tile_major_block_to_lanes(tile_packed + b * 16 * kTileMajorOutputs, fp16_table_both,
                                      g.act_times_scales ? _mm256_load_ps(scales) : one,
                                      lanes + (b - b0) * 32 * kLaneWidth + kTile * t);
      }
      continue;
    }
    int64_t outputs[kTile];
    for (int i = 0; i < kTile; ++i) outputs[i] = o0 + std::min(kTile * t + i, n - 1);
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* bytes[kTile];           // FP8: each output's 32 codes; MXFP4: its 16 packed bytes
      float* scales = sw + (b - b0) * kLaneWidth + kTile * t;
      __m256i largest = _mm256_setzero_si256();  // FP8: the largest magnitude code, to spot NaN codes
      for (int i = 0; i < kTile; ++i) {
        const int64_t o = outputs[i];
        if constexpr (kFp4) {
          bytes[i] = g.w + o * row_bytes + 16 * b;
          scales[i] = dt.e8m0_f32[g.w_scales[o * g.kb + b]];
        } else {
          bytes[i] = g.w + o * row_bytes + 32 * b;
          const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes[i]));
          largest = _mm256_max_epu8(largest, _mm256_and_si256(codes, magnitude_bits));
          scales[i] = dt.e8m0_f32[g.w_scales[(o / 32) * g.kb + b]];
        }
      }
      float* tile_lanes = lanes + (b - b0) * 32 * kLaneWidth + kTile * t;
      const __m256 lane_scale = g.act_times_scales ? _mm256_mul_ps(_mm256_load_ps(scales), unscale) : one;
      if constexpr (kFp4) {
        fp4_block_to_lanes(bytes, fp16_table, lane_scale, tile_lanes);
      } else if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(largest, magnitude_bits)) != 0) {
        fp8_block_to_lanes<true>(bytes, lane_scale, tile_lanes);
      } else {
        fp8_block_to_lanes<false>(bytes, lane_scale, tile_lanes);
      }
    }
  }
}

// RB rows from `row` by NT tiles from o0, blocks [b0, b1) of lanes: each block's (partial * sa) * sw added in K
// order to the rows' running sums `sums` [RB][kLaneWidth] fp32 (first: they start from 0). last: the sums go to
// y [rows, out] (n outputs of the tiles real) instead of back to `sums`.
template <bool kFp4, int RB, int NT, bool kScaled>
void lane_rows(const GemmArgs& g, int64_t row, int64_t o0, int n, int64_t b0, int64_t b1, const float* lanes,
               const float* sw, float* sums, bool first, bool last) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m256 unscale = _mm256_set1_ps(kFp4 ? 1.0f : 256.0f);
  __m256 y[RB][NT];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t)
      y[r][t] = first ? _mm256_setzero_ps() : _mm256_load_ps(sums + r * kLaneWidth + kTile * t);
  for (int64_t b = b0; b < b1; ++b) {
    __m256 acc[RB][NT];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
    const float* block_lanes = lanes + (b - b0) * 32 * kLaneWidth;
    const float* block_act[RB];
    for (int r = 0; r < RB; ++r) block_act[r] = g.act + (row + r) * g.in + b * 32;
#pragma GCC unroll 4
    for (int k = 0; k < 32; ++k) {
      __m256 x[RB];
      for (int r = 0; r < RB; ++r) x[r] = _mm256_broadcast_ss(block_act[r] + k);
      for (int t = 0; t < NT; ++t) {
        __m256 w = _mm256_load_ps(block_lanes + k * kLaneWidth + kTile * t);
        // One load per vector for all RB rows: left to itself the compiler folds the load into each row's FMA,
        // and a 256-bit load is two of the two load ports' slots on a Zen 1, which then bound the loop.
        __asm__("" : "+x"(w));
        for (int r = 0; r < RB; ++r) acc[r][t] = _mm256_fmadd_ps(x[r], w, acc[r][t]);
      }
    }
    for (int r = 0; r < RB; ++r) {
      if constexpr (kScaled) {  // the block's sum already is (partial * sa) * sw (GemmArgs::act_times_scales)
        for (int t = 0; t < NT; ++t) y[r][t] = _mm256_add_ps(y[r][t], acc[r][t]);
        continue;
      }
      const __m256 sa = _mm256_set1_ps(dt.e8m0_f32[g.act_scales[(row + r) * g.kb + b]]);
      for (int t = 0; t < NT; ++t)
        y[r][t] = _mm256_add_ps(y[r][t], _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(acc[r][t], unscale), sa),
                                                       _mm256_load_ps(sw + (b - b0) * kLaneWidth + kTile * t)));
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t) {
      if (!last) {
        _mm256_store_ps(sums + r * kLaneWidth + kTile * t, y[r][t]);
        continue;
      }
      float* yr = g.y + (row + r) * g.out + o0 + kTile * t;
      const int valid = std::clamp(n - kTile * t, 0, kTile);
      if (valid == kTile) _mm256_storeu_ps(yr, y[r][t]);
      else if (valid > 0) _mm256_maskstore_ps(yr, lane_mask(valid), y[r][t]);
    }
}

}  // namespace

template <bool kFp4>
void gemm_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  alignas(32) float lanes[kLaneChunkBlocks * 32 * kLaneWidth];
  alignas(32) float sw[kLaneChunkBlocks * kLaneWidth];
  // The running sums of up to kPrefillRowBlock rows of a tile group between chunks, [rows][kLaneWidth] fp32 (48 KB),
  // kept contiguous: y's rows lie out floats apart (20 KB at out = 5120), where 256 of them share a few cache sets.
  alignas(32) float sums[kPrefillRowBlock * kLaneWidth];
  auto tiles = [&]<int NT>(int64_t tile) {
    const int64_t o0 = tile * kTile;
    const int n = static_cast<int>(std::min<int64_t>(kTile * NT, g.out - o0));
    for (int64_t r0 = 0; r0 < g.rows; r0 += kPrefillRowBlock) {
      const int64_t r1 = std::min(g.rows, r0 + kPrefillRowBlock);
      for (int64_t b0 = 0; b0 < g.kb; b0 += kLaneChunkBlocks) {
        const int64_t b1 = std::min(g.kb, b0 + kLaneChunkBlocks);
        const bool first = b0 == 0, last = b1 == g.kb;
        weights_to_lanes<kFp4, NT>(g, o0, n, b0, b1, lanes, sw);
        auto rows = [&]<bool kScaled>() {
          int64_t r = r0;
          for (; r + kLaneRows <= r1; r += kLaneRows)
            lane_rows<kFp4, kLaneRows, NT, kScaled>(g, r, o0, n, b0, b1, lanes, sw, sums + (r - r0) * kLaneWidth,
                                                     first, last);
          if (r < r1)
            lane_rows<kFp4, 1, NT, kScaled>(g, r, o0, n, b0, b1, lanes, sw, sums + (r - r0) * kLaneWidth, first, last);
        };
        if (g.act_times_scales) rows.template operator()<true>();
        else rows.template operator()<false>();
      }
    }
  };
  int64_t tile = tile_begin;
  for (; tile + 6 <= tile_end; tile += 6) tiles.template operator()<6>(tile);
  for (; tile + 4 <= tile_end; tile += 4) tiles.template operator()<4>(tile);
  for (; tile + 2 <= tile_end; tile += 2) tiles.template operator()<2>(tile);
  if (tile < tile_end) tiles.template operator()<1>(tile);
}

template void gemm_tiles<false>(const GemmArgs&, int64_t, int64_t);
template void gemm_tiles<true>(const GemmArgs&, int64_t, int64_t);

}  // namespace avx2

namespace {

using namespace avx2;

// Activation codes [rows, k] e4m3 -> fp32 values [rows, k] times `scale` (a power of two up to 2^64: exact), with
// times_block_scales also times each block's ue8m0 scale (exact where scales_keep_scaled_sums_exact), in `scratch`:
// 16 codes at a time through fp8_pair_values (x.k is a multiple of 32), any 16 with a NaN code from the table. (The
// table lookup per code had taken a fifth of a one-row FP8 GEMM of 64 x 8192 from the caches.)
std::span<float> widen_activations(const Fp8Activations& x, ThreadScratch& scratch, float scale = 1.0f,
                                   bool times_block_scales = false) {
  const LinearDecodeTables& t = linear_decode_tables();
  const int64_t n = x.rows * x.k;
  float* out = scratch.take<float>(static_cast<size_t>(n)).data();
  const __m128i magnitude_bits = _mm_set1_epi8(0x7f);
  for (int64_t i = 0; i < n; i += 16) {
    const float s = times_block_scales ? scale * t.e8m0_f32[x.scales[i / 32]] : scale;
    const __m256 unscale = _mm256_set1_ps(256.0f * s);
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.codes + i));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_and_si128(codes, magnitude_bits), magnitude_bits)) != 0) {
      for (int64_t j = i; j < i + 16; ++j) out[j] = t.e4m3_f32[x.codes[j]] * s;
      continue;
    }
    __m256 values[2];
    fp8_pair_values<false>(codes, values);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(values[0], unscale));
    _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(values[1], unscale));
  }
  return {out, static_cast<size_t>(n)};
}

// Whether the n ue8m0 scales all lie in [2^-50, 2^50] (bytes 77 .. 177), where gemm_tiles may fold them into its
// operands (GemmArgs::act_times_scales) and keep the reference's bits. With e4m3 activations x and FP8 or MXFP4
// weights w, every nonzero |x w| lies in [2^-18, 2^18), so every partial sum of a block is a multiple of 2^-18 (fp32
// rounds such sums to multiples of 2^-18 again) of magnitude 0 or in [2^-18, 2^23]. Times sa sw in [2^-100, 2^100]
// (or times sa alone, the reference's intermediate) no product or sum leaves fp32's normal range, where scaling by a
// power of two commutes with rounding: the sum of the scaled operands is the reference's (partial * sa) * sw bit for
// bit. Real scales lie near 2^-20 .. 2^0; any other (0xff, NaN, included) keeps the scales apart.
bool scales_keep_scaled_sums_exact(const uint8_t* scales, int64_t n) {
  uint8_t lowest = 0xff, highest = 0;
  for (int64_t i = 0; i < n; ++i) {  // (vectorised by the compiler: byte min / max)
    lowest = std::min(lowest, scales[i]);
    highest = std::max(highest, scales[i]);
  }
  return lowest >= 127 - 50 && highest <= 127 + 50;
}

// fp32 activations x [n] (n a multiple of 8) -> out [n] = x times kFp8DecodeActScale, where every nonzero |x| lies
// in [2^kFp8DecodeSmallestActLog2, 2^kFp8DecodeActLog2) (there the FP8 decode gives the reference's bits:
// linear_avx2_impl.h); false otherwise (an fp32 subnormal, inf or NaN included), out then unspecified.
bool fp8_decode_activations(const float* x, int64_t n, float* out) {
  const __m256i exponent_field = _mm256_set1_epi32(0x7f800000), magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i smallest = _mm256_set1_epi32((127 + kFp8DecodeSmallestActLog2) << 23);
  const __m256i largest = _mm256_set1_epi32((127 + kFp8DecodeActLog2 - 1) << 23);
  const __m256 scale = _mm256_set1_ps(kFp8DecodeActScale);
  __m256i outside = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256i bits = _mm256_castps_si256(v), e = _mm256_and_si256(bits, exponent_field);
    // Zero's exponent field is 0, below the smallest, but zero has no step of its own.
    const __m256i nonzero = _mm256_cmpgt_epi32(_mm256_and_si256(bits, magnitude), _mm256_setzero_si256());
    outside = _mm256_or_si256(outside, _mm256_and_si256(nonzero, _mm256_cmpgt_epi32(smallest, e)));
    outside = _mm256_or_si256(outside, _mm256_cmpgt_epi32(e, largest));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(v, scale));
  }
  return _mm256_testz_si256(outside, outside);
}

// act [rows, in] fp32 values with ue8m0 block scales act_scales [rows, in/32].
GemmArgs block_gemm_args(const float* act, const uint8_t* act_scales, int64_t rows, const uint8_t* w,
                         const uint8_t* w_scales, int64_t out, int64_t in, bool tile_major, float* y) {
  GemmArgs g;
  g.w = w;
  g.w_scales = w_scales;
  g.out = out;
  g.in = in;
  g.kb = in / 32;
  g.tile_major = tile_major;
  g.rows = rows;
  g.act = act;
  g.act_scales = act_scales;
  g.y = y;
  return g;
}

// Whether run_block_gemm takes `rows` FP8 rows through gemm_tiles (given act_decode where it takes it). (MXFP4 rows
// past the decode limits of fp4_gemm_avx2 always do.)
bool fp8_rows_take_lanes(int64_t rows, bool tile_major) {
  return tile_major ? rows > kFp8PassMaxRows : rows > kDecodeMaxRows;
}

// act_decode: FP8 on tile-major weights, 1..kFp8PassMaxRows rows, act times kFp8DecodeActScale for the decode
// kernels (GemmArgs::act_decode); null there: gemm_tiles. act_times_scales: GemmArgs::act_times_scales (rows that
// take gemm_tiles only).
template <bool kFp4>
void run_block_gemm(const float* act, const uint8_t* act_scales, int64_t rows, const uint8_t* w,
                    const uint8_t* w_scales, int64_t out, int64_t in, bool tile_major, float* y, ThreadPool* pool,
                    bool may_hold_nan = true, const float* act_decode = nullptr, bool act_times_scales = false) {
  if (rows <= 0 || out <= 0) return;
  GemmArgs g = block_gemm_args(act, act_scales, rows, w, w_scales, out, in, tile_major, y);
  g.may_hold_nan = may_hold_nan;
  g.act_times_scales = act_times_scales;
  const int64_t tiles = (out + kTile - 1) / kTile;
  if (!kFp4 && tile_major && rows <= kFp8PassMaxRows && act_decode != nullptr) {
    g.act_decode = act_decode;
    return run_decode_tile_major<false>(g, pool);
  }
  if (!kFp4 && !tile_major && rows <= kDecodeMaxRows) return run_decode_rows<kFp4>(g, pool);  // (MXFP4: fp4_gemm_avx2)
  if (pool && rows > 1 && tiles < 4 * pool->num_threads()) {
    // Few outputs, several rows: split the rows instead (every row range runs all tiles).
    pool->parallel_for(rows, [&](int64_t r0, int64_t r1, int) { gemm_tiles<kFp4>(row_slice(g, r0, r1), 0, tiles); });
    return;
  }
  // Prefill: row blocks of kPrefillRowBlock, so that each tile group re-reads one block's activations ([256, k]
  // fp32, 2-4 MB at the real shapes) from the caches instead of all rows' from memory, at the price of converting
  // the weights once per block.
  for (int64_t r0 = 0; r0 < rows; r0 += kPrefillRowBlock) {
    const GemmArgs part = row_slice(g, r0, std::min(rows, r0 + kPrefillRowBlock));
    auto body = [&](int64_t begin, int64_t end, int) { gemm_tiles<kFp4>(part, begin, end); };
    if (pool) pool->parallel_for_nodes(tiles, body, kLaneTiles);
    else body(0, tiles, 0);
  }
}

void fp8_gemm_avx2(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* pool) {
  ThreadScratch scratch(pool);
  const bool decode = w.tile_major && x.rows <= kFp8PassMaxRows;
  const float* act_decode = decode ? widen_activations(x, scratch, kFp8DecodeActScale).data() : nullptr;
  // The many-row path folds the scales into its operands where that keeps the bits (scales_keep_scaled_sums_exact).
  const bool scaled = fp8_rows_take_lanes(x.rows, w.tile_major) &&
                      scales_keep_scaled_sums_exact(x.scales, x.rows * (x.k / 32)) &&
                      scales_keep_scaled_sums_exact(w.scales, (w.out + 31) / 32 * (w.in / 32));
  // The values themselves: the many-row path, and the decode's recomputation of a range that met a NaN code.
  const float* act = !decode || w.may_hold_nan ? widen_activations(x, scratch, 1.0f, scaled).data() : nullptr;
  run_block_gemm<false>(act, x.scales, x.rows, w.codes, w.scales, w.out, w.in, w.tile_major, y, pool,
                        w.may_hold_nan, act_decode, scaled);
}

void fp4_gemm_avx2(const Fp8Activations& x, const Fp4Weight& w, float* y, ThreadPool* pool) {
  ThreadScratch scratch(pool);
  if (x.rows > 0 && x.rows <= (w.tile_major ? kFp4PassMaxRows : kDecodeMaxRows) && w.out > 0) {
    // Decode: the rows as the decode kernels take them, as values and as exact integers, in the weights' order.
    const std::span<float> values = scratch.take<float>(static_cast<size_t>(x.rows * x.k));
    const int64_t blocks = x.rows * (x.k / 32);
    const std::span<int8_t> pieces = scratch.take<int8_t>(static_cast<size_t>(blocks * kFp4PieceBlockBytes));
    const std::span<float> units = scratch.take<float>(static_cast<size_t>(blocks));
    const std::span<uint8_t> piece_counts = scratch.take<uint8_t>(static_cast<size_t>(blocks));
    const std::span<int32_t> offsets = scratch.take<int32_t>(static_cast<size_t>(blocks));
    prepare_fp4_decode_rows(x, w.tile_major, values.data(), pieces.data(), units.data(), piece_counts.data(),
                            offsets.data());
    GemmArgs g = block_gemm_args(values.data(), x.scales, x.rows, w.packed, w.scales, w.out, w.in, w.tile_major, y);
    g.act_pieces = pieces.data();
    g.act_units = units.data();
    g.act_piece_counts = piece_counts.data();
    g.act_int_offsets = offsets.data();
    if (w.tile_major) return run_decode_tile_major<true>(g, pool);
    return run_decode_rows<true>(g, pool);
  }
  const bool scaled = scales_keep_scaled_sums_exact(x.scales, x.rows * (x.k / 32)) &&
                      scales_keep_scaled_sums_exact(w.scales, w.out * (w.in / 32));
  const std::span<float> act = widen_activations(x, scratch, 1.0f, scaled);
  run_block_gemm<true>(act.data(), x.scales, x.rows, w.packed, w.scales, w.out, w.in, w.tile_major, y, pool, true,
                       nullptr, scaled);
}

// The FP8 block GEMM on the fp32 activations themselves with unit activation scales: per block
// (partial · 1) · sw, where partial sums exact products when x holds bf16 values.
void fp8_as_bf16_gemm_avx2(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* pool) {
  ThreadScratch scratch(pool);
  const std::span<uint8_t> unit_scales = scratch.take<uint8_t>(static_cast<size_t>(rows * (w.in / 32)));
  std::fill(unit_scales.begin(), unit_scales.end(), kE8m0One);
  const float* act_decode = nullptr;
  if (w.tile_major && rows <= kFp8PassMaxRows) {
    const std::span<float> scaled = scratch.take<float>(static_cast<size_t>(rows * w.in));
    if (fp8_decode_activations(x, rows * w.in, scaled.data())) act_decode = scaled.data();
  }
  run_block_gemm<false>(x, unit_scales.data(), rows, w.codes, w.scales, w.out, w.in, w.tile_major, y, pool,
                        w.may_hold_nan, act_decode);
}

// BF16: 4 outputs x RT rows of 8-lane fp32 FMA accumulators; the K tail (< 8) is added in scalar FMAs.
template <int RT>
void bf16_tile(const float* x, int64_t k, const uint16_t* w, const int64_t* o, int n_out, int64_t out, float* y) {
  __m256 acc[RT][4];
  for (int r = 0; r < RT; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 wv[4];
    for (int j = 0; j < 4; ++j)
      wv[j] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + o[j] * k + kk))), 16));
    for (int r = 0; r < RT; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * k + kk);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int j = 0; j < n_out; ++j) {
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r][j]), _mm256_extractf128_ps(acc[r][j], 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_movehdup_ps(s));
      float total = _mm_cvtss_f32(s);
      for (int64_t t = kk; t < k; ++t) {
        uint32_t bits = static_cast<uint32_t>(w[o[j] * k + t]) << 16;
        float wf;
        __builtin_memcpy(&wf, &bits, 4);
        total = __builtin_fmaf(x[r * k + t], wf, total);
      }
      y[r * out + o[j]] = total;
    }
}

void bf16_groups(const float* x, int64_t rows, const Bf16Weight& w, float* y, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    int64_t o[4];
    const int n_out = static_cast<int>(std::min<int64_t>(4, w.out - 4 * g));
    for (int j = 0; j < 4; ++j) o[j] = 4 * g + std::min(j, n_out - 1);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) bf16_tile<2>(x + r * w.in, w.in, w.data, o, n_out, w.out, y + r * w.out);
    if (r < rows) bf16_tile<1>(x + r * w.in, w.in, w.data, o, n_out, w.out, y + r * w.out);
  }
}

void bf16_gemm_avx2(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool) {
  run_bf16_gemm(x, rows, w, y, pool, [](const float* xs, int64_t n, const Bf16Weight& wt, float* ys, int64_t g0,
                                        int64_t g1) { bf16_groups(xs, n, wt, ys, g0, g1); });
}

}  // namespace

const LinearKernels* avx2_kernels() {
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  static const LinearKernels kernels{"avx2", {.fp8 = true, .fp4 = true}, fp8_gemm_avx2, fp4_gemm_avx2, bf16_gemm_avx2,
                                     fp8_as_bf16_gemm_avx2, PeakOps::kFp32Fma256};
  return supported ? &kernels : nullptr;
}

}  // namespace dsflash::linear_impl
