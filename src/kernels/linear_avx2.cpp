// AVX2 + FMA + F16C linear kernels (the x86-64-v3 baseline).
//
// FP8 / FP4 (spec/MODEL.md §4.9): the block partials are scaled and accumulated in K order exactly as the
// reference: y = y + (partial * sa) * sw. Three paths compute the partials:
// - 1..kDecodeMaxRows rows on row-major weights (decode_rows_tiles): each block of 8 outputs is converted in
//   registers and multiplied at once, in fp32 FMAs, or for MXFP4 in exact integers where the activations allow.
// - 1..kDecodeMaxRows rows on tile-major FP8 weights (decode_fp8_tile_major, decode_fp8_tile_major_rows): each
//   64-byte vector converted as it is read (fp8_tile_major_fp16), each block summed down k from 0.
// - more rows (gemm_tiles): weights widened once per chunk into lanes [block][k][48 outputs] fp32 (bytes
//   transposed, then through the fp16 converter: an e4m3 code's magnitude bits shifted into an fp16 word give the
//   value times 2^-8 exactly, subnormals included; e2m1 values are fp16 words from a 16-entry table of high bytes),
//   then each block summed down k from 0 as the reference does, every product exact.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/linear_impl.h"
#include "kernels/linear_tables.h"

namespace dsflash::linear_impl {

namespace {

constexpr int kTile = 8;          // outputs per tile: one ymm of fp32 results
constexpr int kChunkBlocks = 32;  // blocks whose MXFP4 weight scales decode_rows_tiles looks up at once

// Activation codes [rows, k] e4m3 -> fp32 values [rows, k] (exact), in `scratch`.
std::span<float> widen_activations(const Fp8Activations& x, ThreadScratch& scratch) {
  const LinearDecodeTables& t = linear_decode_tables();
  const std::span<float> out = scratch.take<float>(static_cast<size_t>(x.rows * x.k));
  for (int64_t i = 0; i < x.rows * x.k; ++i) out[static_cast<size_t>(i)] = t.e4m3_f32[x.codes[i]];
  return out;
}

// 8 words each holding an e4m3 code in its high byte (the codes unpacked above zero bytes) -> 8 fp16 words worth
// value * 2^-8: the arithmetic shift right by one is the sign-extended code << 7, which puts the sign in bit 15 and
// the 7 magnitude bits in the fp16 exponent/mantissa fields (bit 14 cleared by the mask), subnormals included. NaN
// codes (0x7f / 0xff) land on finite words: the callers deal with them. 128-bit forms: on a Zen 1 the 256-bit ones
// take twice the cycles per code. (In a loop of conversions and FMAs alone this costs nothing over the conversion
// and FMA, where vpmovsxbw and a left shift cost 9%; in the one-row decode the two measure alike.)
inline __m128i e4m3_fp16_words(__m128i code_high_words) {
  return _mm_and_si128(_mm_srai_epi16(code_high_words, 1), _mm_set1_epi16(static_cast<short>(0xBF80)));
}

// The MXFP4 decode's 16-entry byte tables (indexed by an e2m1 code), from LinearDecodeTables::e2m1_f32, made once:
// fp16_high: the high byte of the value's fp16 (every e2m1 value is an fp16 whose low byte is 0); w_plus_12:
// W + 12 with W = 2 * value in [-12, 12], the unsigned byte operand of vpmaddubsw.
struct Fp4ByteTables {
  alignas(16) uint8_t fp16_high[16];
  alignas(16) uint8_t w_plus_12[16];
};
const Fp4ByteTables& fp4_byte_tables() {
  static const Fp4ByteTables tables = [] {
    const LinearDecodeTables& dt = linear_decode_tables();
    Fp4ByteTables t{};
    for (int c = 0; c < 16; ++c) {
      t.fp16_high[c] = static_cast<uint8_t>(_cvtss_sh(dt.e2m1_f32[c], _MM_FROUND_TO_NEAREST_INT) >> 8);
      t.w_plus_12[c] = static_cast<uint8_t>(2.0f * dt.e2m1_f32[c] + 12.0f);
    }
    return t;
  }();
  return tables;
}

// 8 vectors (one per output) -> one vector whose lane i is the sum of vector i's lanes.
inline __m256 reduce_8(const __m256* v) {
  __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

struct GemmArgs {
  const uint8_t* w = nullptr;         // FP8 codes [out, in] or FP4 packed [out, in/2]
  const uint8_t* w_scales = nullptr;  // FP8 [ceil(out/32), kb] or FP4 [out, kb], ue8m0
  int64_t out = 0, in = 0, kb = 0, rows = 0;
  bool tile_major = false;             // weight order (kernels/linear.h)
  bool may_hold_nan = true;            // FP8: Fp8Weight::may_hold_nan
  const float* act = nullptr;          // [rows, in] fp32 values
  // One to kDecodeMaxRows rows on MXFP4 (decode_rows_tiles): the same values as integers where that is exact
  // (prepare_fp4_decode_rows): N in signed byte pieces [rows, kb, kFp4PieceBlockBytes], units [rows, kb] (0: the
  // block is not exact), piece counts [rows, kb] (2 or 3).
  const int8_t* act_pieces = nullptr;
  const float* act_units = nullptr;
  const uint8_t* act_piece_counts = nullptr;
  const int32_t* act_int_offsets = nullptr;  // [rows, kb]: 12 * Σ N of each block
  const uint8_t* act_scales = nullptr;  // [rows, kb] ue8m0
  float* y = nullptr;                  // [rows, out]
};

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
constexpr int kLaneChunkBlocks = 8;   // 8 blocks x 32 k x 48 outputs fp32 = 48 KB of lanes
constexpr int kLaneRows = 2;          // rows at a time

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

// The same into lanes rows k and k + 1 (the next row is kLaneWidth floats on).
template <bool kNanCodes>
inline void fp8_pair_to_lanes(__m128i codes, float* lanes) {
  __m256 values[2];
  fp8_pair_values<kNanCodes>(codes, values);
  _mm256_store_ps(lanes, values[0]);
  _mm256_store_ps(lanes + kLaneWidth, values[1]);
}

// 8 outputs' 32 e4m3 codes of one FP8 block in k order -> lanes [32 k][kLaneWidth] fp32, this tile's 8 columns,
// value * 2^-8. The bytes are transposed 8 x 8 first, so each k's 8 outputs convert as one vector of fp16 words
// (e4m3_fp16_words): an eighth of the data moved by transposing fp32, and no lane crossing. kNanCodes also turns
// the NaN codes (0x7f / 0xff, all 7 magnitude bits set) into fp16 NaNs.
template <bool kNanCodes>
inline void fp8_block_to_lanes(const uint8_t* const* codes, float* lanes) {
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
    for (int j = 0; j < 4; ++j) fp8_pair_to_lanes<kNanCodes>(pairs[j], lanes + (8 * q + 2 * j) * kLaneWidth);
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
// value * 2^-8. `codes`: the block's first byte plus 32h.
template <bool kNanCodes>
inline void fp8_tile_major_block_to_lanes(const uint8_t* codes, float* lanes) {
  for (int v = 0; v < 8; ++v) {
    const Fp8KPairs k = fp8_tile_major_k_pairs(codes + kTileMajorVectorBytes * v);
    fp8_pair_to_lanes<kNanCodes>(k.first, lanes + (4 * v) * kLaneWidth);
    fp8_pair_to_lanes<kNanCodes>(k.second, lanes + (4 * v + 2) * kLaneWidth);
  }
}

// The one-row decode's conversion of the same codes (decode_fp8_tile_major): the fp16 words of the 8 outputs for
// the 4 k of the vector, in `fp16` [k % 2][16]: words 0-7 k 4v + k % 2, words 8-15 k 4v + 2 + k % 2, each the 8
// outputs' values times 2^-8 (e4m3_fp16_words; NaN codes land on finite words, the caller deals with them). Each
// 16-byte quarter of the half holds 4 outputs' codes as 16-bit words, k 4v (low byte) and 4v + 1 (high byte) in its
// first 8 bytes, k 4v + 2 and 4v + 3 in its last 8; one qword permute gathers the two quarters' first halves in the
// low 128 bits and their last halves in the high ones. A word's high byte is already where e4m3_fp16_words takes
// its code (the low byte's bits fall below the fp16 mask), and a left shift by 8 puts the low byte there.
// The words go through memory on purpose: vcvtph2ps from memory is one uop on an FMA port, from a register it takes
// a shuffle-port uop too. The empty asm keeps the compiler from forwarding the stores into registers.
// bench_linear --threads=2, avx2, this Xeon, fp8_tiled rows:1, alternated 2x against fp8_tile_major_k_pairs and
// fp8_pair_values (both with the prefetch): wq_b 2.37 -> 1.73-1.78 ms, wo_b 2.12-2.14 -> 1.45-1.53. The lanes path
// keeps those: there, with its fp32 stores, this one measured 5-10% slower (rows 2, 4, 16).
inline void fp8_tile_major_fp16(const uint8_t* half, uint16_t (&fp16)[2][16]) {
  const __m256i words = _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(half)), 0xD8);
  const __m256i sign_and_magnitude = _mm256_set1_epi16(static_cast<short>(0xBF80));
  _mm256_store_si256(reinterpret_cast<__m256i*>(fp16[0]),
                     _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(words, 8), 1), sign_and_magnitude));
  _mm256_store_si256(reinterpret_cast<__m256i*>(fp16[1]),
                     _mm256_and_si256(_mm256_srai_epi16(words, 1), sign_and_magnitude));
  __asm__ volatile("" : "+m"(fp16));
}
// The values of k = 4v + e (e = 0..3) from fp8_tile_major_fp16's words.
inline __m256 fp8_tile_major_value(const uint16_t (&fp16)[2][16], int e) {
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(&fp16[e % 2][8 * (e / 2)])));
}

// 8 outputs' 16 packed bytes of one MXFP4 block (byte j: k = 2j in the low nibble, 2j + 1 in the high one) -> lanes
// [32 k][kLaneWidth] fp32, this tile's 8 columns. The packed bytes are transposed first (8 x 16, in registers), so
// that each vector holds bytes j = 2m and 2m + 1 of the 8 outputs; the nibbles then become the fp16 high bytes of
// k = 4m .. 4m + 3 through one 16-entry table, for the whole tile at once.
inline void fp4_block_to_lanes(const uint8_t* const* packed, __m128i fp16_table, float* lanes) {
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
        _mm256_store_ps(lanes + (2 * j) * kLaneWidth, _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, low)));
        _mm256_store_ps(lanes + (2 * j + 1) * kLaneWidth, _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, high)));
        _mm256_store_ps(lanes + (2 * j + 2) * kLaneWidth, _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, low)));
        _mm256_store_ps(lanes + (2 * j + 3) * kLaneWidth, _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, high)));
      }
    }
  }
}

// The weights of NT tiles from output o0 (n of them real; the rest repeat the last) for blocks [b0, b1): lanes
// [b1 - b0][32][kLaneWidth] (FP8 as value * 2^-8), scales sw [b1 - b0][kLaneWidth]. Row-major and tile-major FP8
// blocks are read in place: calling the out-of-line gather helpers (fp8_block_codes, fp4_block_packed) for every
// output and block cost about a fifth of a 16-row FP8 GEMM (bench_linear avx2 rows:16, 1 thread); only tile-major
// MXFP4 blocks (which this table leaves row-major: LinearKernels::prefers_tile_major) still go through them.
template <bool kFp4, int NT>
void weights_to_lanes(const GemmArgs& g, int64_t o0, int n, int64_t b0, int64_t b1, float* lanes, float* sw) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const Fp4Weight w4{g.w, g.w_scales, g.out, g.in, g.tile_major};
  const int64_t row_bytes = kFp4 ? g.in / 2 : g.in;
  const __m128i fp16_table = _mm_load_si128(reinterpret_cast<const __m128i*>(fp4_byte_tables().fp16_high));
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f);
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
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(largest, magnitude_bits)) != 0)
          fp8_tile_major_block_to_lanes<true>(codes, tile_lanes);
        else
          fp8_tile_major_block_to_lanes<false>(codes, tile_lanes);
        const float scale = dt.e8m0_f32[g.w_scales[(o / 32) * g.kb + b]];  // one per 32 x 32 block
        _mm256_store_ps(sw + (b - b0) * kLaneWidth + kTile * t, _mm256_set1_ps(scale));
      }
      continue;
    }
    int64_t outputs[kTile];
    for (int i = 0; i < kTile; ++i) outputs[i] = o0 + std::min(kTile * t + i, n - 1);
    for (int64_t b = b0; b < b1; ++b) {
      uint8_t tile_major_packed[kTile][16];  // MXFP4 blocks of tile-major weights are gathered here
      const uint8_t* bytes[kTile];           // FP8: each output's 32 codes; MXFP4: its 16 packed bytes
      float* scales = sw + (b - b0) * kLaneWidth + kTile * t;
      __m256i largest = _mm256_setzero_si256();  // FP8: the largest magnitude code, to spot NaN codes
      for (int i = 0; i < kTile; ++i) {
        const int64_t o = outputs[i];
        if constexpr (kFp4) {
          bytes[i] = g.tile_major ? fp4_block_packed(w4, o, b, tile_major_packed[i]) : g.w + o * row_bytes + 16 * b;
          scales[i] = dt.e8m0_f32[g.w_scales[fp4_scale_index(o, b, g.kb, g.tile_major)]];
        } else {
          bytes[i] = g.w + o * row_bytes + 32 * b;
          const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes[i]));
          largest = _mm256_max_epu8(largest, _mm256_and_si256(codes, magnitude_bits));
          scales[i] = dt.e8m0_f32[g.w_scales[(o / 32) * g.kb + b]];
        }
      }
      float* tile_lanes = lanes + (b - b0) * 32 * kLaneWidth + kTile * t;
      if constexpr (kFp4) {
        fp4_block_to_lanes(bytes, fp16_table, tile_lanes);
      } else if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(largest, magnitude_bits)) != 0) {
        fp8_block_to_lanes<true>(bytes, tile_lanes);
      } else {
        fp8_block_to_lanes<false>(bytes, tile_lanes);
      }
    }
  }
}

// RB rows from `row` by NT tiles from o0, blocks [b0, b1) of lanes: y [rows, out] += each block's
// (partial * sa) * sw, in K order. first: y starts from 0 (the first chunk).
template <bool kFp4, int RB, int NT>
void lane_rows(const GemmArgs& g, int64_t row, int64_t o0, int n, int64_t b0, int64_t b1, const float* lanes,
               const float* sw, bool first) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m256 unscale = _mm256_set1_ps(kFp4 ? 1.0f : 256.0f);
  __m256 y[RB][NT];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t) {
      const float* yr = g.y + (row + r) * g.out + o0 + kTile * t;
      const int valid = std::clamp(n - kTile * t, 0, kTile);
      y[r][t] = first ? _mm256_setzero_ps()
                      : valid == kTile ? _mm256_loadu_ps(yr) : _mm256_maskload_ps(yr, lane_mask(valid));
    }
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
      const __m256 sa = _mm256_set1_ps(dt.e8m0_f32[g.act_scales[(row + r) * g.kb + b]]);
      for (int t = 0; t < NT; ++t)
        y[r][t] = _mm256_add_ps(y[r][t], _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(acc[r][t], unscale), sa),
                                                       _mm256_load_ps(sw + (b - b0) * kLaneWidth + kTile * t)));
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t) {
      float* yr = g.y + (row + r) * g.out + o0 + kTile * t;
      const int valid = std::clamp(n - kTile * t, 0, kTile);
      if (valid == kTile) _mm256_storeu_ps(yr, y[r][t]);
      else if (valid > 0) _mm256_maskstore_ps(yr, lane_mask(valid), y[r][t]);
    }
}

template <bool kFp4>
void gemm_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  alignas(32) float lanes[kLaneChunkBlocks * 32 * kLaneWidth];
  alignas(32) float sw[kLaneChunkBlocks * kLaneWidth];
  auto tiles = [&]<int NT>(int64_t tile) {
    const int64_t o0 = tile * kTile;
    const int n = static_cast<int>(std::min<int64_t>(kTile * NT, g.out - o0));
    for (int64_t b0 = 0; b0 < g.kb; b0 += kLaneChunkBlocks) {
      const int64_t b1 = std::min(g.kb, b0 + kLaneChunkBlocks);
      weights_to_lanes<kFp4, NT>(g, o0, n, b0, b1, lanes, sw);
      int64_t r = 0;
      for (; r + kLaneRows <= g.rows; r += kLaneRows)
        lane_rows<kFp4, kLaneRows, NT>(g, r, o0, n, b0, b1, lanes, sw, b0 == 0);
      switch (g.rows - r) {
        case 1: lane_rows<kFp4, 1, NT>(g, r, o0, n, b0, b1, lanes, sw, b0 == 0); break;
        case 2: lane_rows<kFp4, 2, NT>(g, r, o0, n, b0, b1, lanes, sw, b0 == 0); break;
        default: break;
      }
    }
  };
  int64_t tile = tile_begin;
  for (; tile + 6 <= tile_end; tile += 6) tiles.template operator()<6>(tile);
  for (; tile + 4 <= tile_end; tile += 4) tiles.template operator()<4>(tile);
  for (; tile + 2 <= tile_end; tile += 2) tiles.template operator()<2>(tile);
  if (tile < tile_end) tiles.template operator()<1>(tile);
}

// How far ahead of a row the decode prefetches. The 8 row streams of a tile defeat the hardware prefetchers (as on
// AVX-512, linear_avx512_row_major.cpp). bench_linear avx2 rows:1 (Zen 1, 2 threads), alternated 2x: wq_b_fp8
// 6.2-6.3 -> 7.6 GB/s, w2_mxfp4 6.1-6.2 -> 7.0, wo_b_fp8 7.6 alike; 512, 1024 and 2048 bytes measured alike.
constexpr int64_t kDecodePrefetchBytes = 1024;
constexpr int kDecodeMaxRows = 4;  // rows that decode_rows_tiles takes (decode, and the few tokens of an expert)

// An MXFP4 block's dot product in exact integers (as the AVX-512 decode, linear_avx512_tiled.cpp): an e4m3
// activation is a = N * 2^(s-10), with sig = 8 + mantissa and e' = the exponent field for normals, sig = mantissa
// and e' = 1 for subnormals, N = sig << (e' - s) and s the smallest e' of the block's nonzero values; a weight is
// w = W / 2, W = 2 * e2m1 in [-12, 12]. A block's sum of a * w is (Σ N * W) * 2^(s-11). Where 12 Σ |N| < 2^24,
// Σ N * W and every partial sum in any order are below 2^24: exact in int32, and exact as a float, so the integer
// sum gives the bits of any fp32 order. Blocks with NaN codes or wider magnitude spans keep the fp32 path (unit 0).
// vpmaddubsw multiplies unsigned bytes (W + 12, in [0, 24]) by signed ones, so N goes in as byte pieces:
// N = 65536 * p2 + 256 * p1 + p0 with p0, p1 in [-128, 127] (p2 is small: |N| < 2^24 / 12). Per block
// kFp4PieceBlockBytes: piece p's 32 bytes at 32p, in the nibble order below.
constexpr int64_t kFp4PieceBlockBytes = 96;

// MXFP4 decode rows from their e4m3 codes x [rows, in]: values [rows, in] fp32 with each block in the order the
// nibbles come out of a packed block (even k 0..14, even k 16..30, odd k 1..15, odd k 17..31), and the same values
// as the integers N in pieces [rows, in / 32, kFp4PieceBlockBytes] (that order too), with units [rows, in / 32] =
// 2^(s-11), 0 where the block is not exact (a NaN code, or 12 Σ |N| >= 2^24), piece counts [rows, in / 32] (3 where
// some p2 is not 0, else 2) and offsets [rows, in / 32] = 12 * Σ N of each block (what W + 12 adds). The values come
// through fp16 (e4m3_fp16_words; NaN blocks from the table), and N = value * 2^(10-s): exact integers.
void prepare_fp4_decode_rows(const Fp8Activations& x, float* values, int8_t* pieces, float* units,
                             uint8_t* piece_counts, int32_t* offsets) {
  const LinearDecodeTables& dt = linear_decode_tables();
  // Per 128-bit lane its even bytes, then its odd ones; the qword permute (0xD8) then gives the nibble order.
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  // After two packs, dword j of a vector holds 4 bytes of source vector j % 4 (j / 4: its lane): back in order.
  const __m256i unpack_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f), low_bits = _mm256_set1_epi8(0x0f);
  const __m256i one = _mm256_set1_epi8(1), above_every_step = _mm256_set1_epi8(16);
  for (int64_t b = 0; b < x.rows * (x.k / 32); ++b) {
    const uint8_t* c = x.codes + 32 * b;
    float* v = values + 32 * b;
    alignas(32) uint8_t ordered[32];
    const __m256i codes = _mm256_permute4x64_epi64(
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)), split), 0xD8);
    _mm256_store_si256(reinterpret_cast<__m256i*>(ordered), codes);
    const __m256i magnitude = _mm256_and_si256(codes, magnitude_bits);
    units[b] = 0.0f;
    piece_counts[b] = 0;
    offsets[b] = 0;
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(magnitude, magnitude_bits)) != 0) {  // a NaN code
      for (int j = 0; j < 32; ++j) v[j] = dt.e4m3_f32[ordered[j]];
      continue;
    }
    // s: the smallest e' (exponent field, at least 1) of the nonzero codes.
    const __m256i exponent = _mm256_and_si256(_mm256_srli_epi16(magnitude, 3), low_bits);
    const __m256i step = _mm256_or_si256(_mm256_max_epu8(exponent, one),
                                         _mm256_and_si256(_mm256_cmpeq_epi8(magnitude, _mm256_setzero_si256()),
                                                          above_every_step));
    __m128i m = _mm_min_epu8(_mm256_castsi256_si128(step), _mm256_extracti128_si256(step, 1));
    m = _mm_min_epu8(m, _mm_srli_si128(m, 8));
    m = _mm_min_epu8(m, _mm_srli_si128(m, 4));
    m = _mm_min_epu8(m, _mm_srli_si128(m, 2));
    m = _mm_min_epu8(m, _mm_srli_si128(m, 1));
    int smallest = _mm_cvtsi128_si32(m) & 0xff;
    if (smallest == 16) smallest = 1;  // all zero: any unit
    const __m256 to_n = _mm256_set1_ps(std::ldexp(1.0f, 10 - smallest));
    __m256i integers[4], sum = _mm256_setzero_si256(), abs_sum = _mm256_setzero_si256();
    const __m128i zero = _mm_setzero_si128(), low = _mm256_castsi256_si128(codes);
    const __m128i high = _mm256_extracti128_si256(codes, 1);
    const __m128i words[4] = {_mm_unpacklo_epi8(zero, low), _mm_unpackhi_epi8(zero, low),
                              _mm_unpacklo_epi8(zero, high), _mm_unpackhi_epi8(zero, high)};
    for (int q = 0; q < 4; ++q) {
      const __m256 value = _mm256_mul_ps(_mm256_cvtph_ps(e4m3_fp16_words(words[q])), _mm256_set1_ps(256.0f));
      _mm256_storeu_ps(v + 8 * q, value);
      integers[q] = _mm256_cvttps_epi32(_mm256_mul_ps(value, to_n));  // |N| <= 15 << 15: exact
      sum = _mm256_add_epi32(sum, integers[q]);
      abs_sum = _mm256_add_epi32(abs_sum, _mm256_abs_epi32(integers[q]));
    }
    auto total = [](__m256i lanes) {
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
      return _mm_cvtsi128_si32(t);
    };
    if (12 * int64_t{total(abs_sum)} >= (int64_t{1} << 24)) continue;
    // Pieces: p0 the sign-extended low byte, p1 the next of (N - p0) >> 8, p2 what is left.
    __m256i piece[3][4];
    __m256i high_piece = _mm256_setzero_si256();
    for (int q = 0; q < 4; ++q) {
      const __m256i n = integers[q];
      piece[0][q] = _mm256_srai_epi32(_mm256_slli_epi32(n, 24), 24);
      const __m256i rest = _mm256_srai_epi32(_mm256_sub_epi32(n, piece[0][q]), 8);
      piece[1][q] = _mm256_srai_epi32(_mm256_slli_epi32(rest, 24), 24);
      piece[2][q] = _mm256_srai_epi32(_mm256_sub_epi32(rest, piece[1][q]), 8);
      high_piece = _mm256_or_si256(high_piece, piece[2][q]);
    }
    const int count = _mm256_testz_si256(high_piece, high_piece) ? 2 : 3;
    int8_t* out = pieces + kFp4PieceBlockBytes * b;
    for (int p = 0; p < 3; ++p) {  // piece 2 (zero where count is 2) too: a pass of rows takes their largest count
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(piece[p][0], piece[p][1]),
                                               _mm256_packs_epi32(piece[p][2], piece[p][3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * p), _mm256_permutevar8x32_epi32(bytes, unpack_order));
    }
    offsets[b] = 12 * total(sum);
    units[b] = std::ldexp(1.0f, smallest - 11);
    piece_counts[b] = static_cast<uint8_t>(count);
  }
}

// The 8 outputs' Σ (W + 12) * N of one MXFP4 block (row-major weights: rows[i] = output i's packed bytes) for each of
// R rows, in kPieces byte pieces (prepare_fp4_decode_rows): int32 lanes [output 0..7]. Outputs i and i + 4 share a
// vector (the low / high 128 bits), so the nibbles of both become W + 12 through one in-lane byte lookup and every
// vpmaddubsw serves two outputs against a piece's 16 bytes broadcast to both lanes; three in-lane horizontal adds
// then leave output i in lane i. Each vpmaddubsw word is at most 2 * 24 * 128 and a word of the even and odd sums
// twice that: no saturation.
// w_table: Fp4ByteTables::w_plus_12 in both lanes.
template <int R, int kPieces>
inline void exact_fp4_block_sums(const GemmArgs& g, const uint8_t* const* rows, int64_t b, __m256i w_table,
                                 __m256i (&sums)[R]) {
  const __m256i nibble = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  // The sums of outputs (0, 4) / (2, 6) until those of (1, 5) / (3, 7) join them (hadd); halves: the first hadd.
  __m256i previous[R] = {}, halves[R] = {};
#pragma GCC unroll 4  // (a loop: w13_mxfp4 rows:4 1.95-2.02 -> 1.69-1.74 ms unrolled, bench_linear avx2)
  for (int p = 0; p < 4; ++p) {
    const __m256i raw = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[p] + 16 * b))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[p + 4] + 16 * b)), 1);
    const __m256i even_w = _mm256_shuffle_epi8(w_table, _mm256_and_si256(raw, nibble));
    const __m256i odd_w = _mm256_shuffle_epi8(w_table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble));
    for (int r = 0; r < R; ++r) {
      const int8_t* block = g.act_pieces + (r * g.kb + b) * kFp4PieceBlockBytes;
      __m256i pair_sums = _mm256_setzero_si256();
      for (int q = 0; q < kPieces; ++q) {
        const __m128i* piece = reinterpret_cast<const __m128i*>(block + 32 * q);
        const __m256i words =
            _mm256_add_epi16(_mm256_maddubs_epi16(even_w, _mm256_broadcastsi128_si256(_mm_loadu_si128(piece))),
                             _mm256_maddubs_epi16(odd_w, _mm256_broadcastsi128_si256(_mm_loadu_si128(piece + 1))));
        pair_sums = _mm256_add_epi32(pair_sums, _mm256_slli_epi32(_mm256_madd_epi16(words, ones), 8 * q));
      }
      if (p % 2 == 0) {
        previous[r] = pair_sums;
      } else {
        const __m256i folded = _mm256_hadd_epi32(previous[r], pair_sums);
        if (p == 1) halves[r] = folded;
        else sums[r] = _mm256_hadd_epi32(halves[r], folded);
      }
    }
  }
}

// The MXFP4 weight scales of 8 outputs from o0 (n of them real; the rest repeat the last), blocks [b0, b1) of
// row-major scales: sw [block - b0][output] fp32. A ue8m0 e is 2^(e - 127), the fp32 whose exponent field is e, so
// 8 blocks of the 8 outputs become e << 23 at once after an 8 x 8 byte transpose; e = 0 (2^-127, subnormal in fp32)
// and e = 255 (NaN), and the blocks past the last 8, take the table. (It replaced a table lookup per scale:
// bench_linear --threads=2, avx2, this Xeon, alternated 2x: w13_mxfp4 rows:1 0.70-0.73 -> 0.67 ms.)
void fp4_tile_scales(const GemmArgs& g, const LinearDecodeTables& dt, int64_t o0, int n, int64_t b0, int64_t b1,
                     float (*sw)[kTile]) {
  const uint8_t* rows[kTile];
  for (int i = 0; i < kTile; ++i) rows[i] = g.w_scales + (o0 + std::min(i, n - 1)) * g.kb;
  int64_t b = b0;
  for (; b + 8 <= b1; b += 8) {
    __m128i r[kTile];
    for (int i = 0; i < kTile; ++i) r[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[i] + b));
    const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
    const __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
    // c: blocks 0-3 / 4-7 of outputs 0-3 (c0, c1) and 4-7 (c2, c3), 4 bytes (outputs) per block.
    const __m128i c0 = _mm_unpacklo_epi16(a0, a1), c1 = _mm_unpackhi_epi16(a0, a1);
    const __m128i c2 = _mm_unpacklo_epi16(a2, a3), c3 = _mm_unpackhi_epi16(a2, a3);
    // d[j]: blocks 2j and 2j + 1, 8 bytes (outputs 0-7) each.
    const __m128i d[4] = {_mm_unpacklo_epi32(c0, c2), _mm_unpackhi_epi32(c0, c2), _mm_unpacklo_epi32(c1, c3),
                          _mm_unpackhi_epi32(c1, c3)};
    const __m128i zero = _mm_setzero_si128(), all_ones = _mm_set1_epi8(-1);
    __m128i special = zero;
    for (const __m128i& v : d)
      special = _mm_or_si128(special, _mm_or_si128(_mm_cmpeq_epi8(v, zero), _mm_cmpeq_epi8(v, all_ones)));
    if (_mm_movemask_epi8(special) != 0) break;  // the table for the rest
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        const __m128i bytes = h == 0 ? d[j] : _mm_srli_si128(d[j], 8);
        const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu8_epi32(bytes), 23);
        _mm256_store_ps(sw[b + 2 * j + h - b0], _mm256_castsi256_ps(bits));
      }
  }
  for (; b < b1; ++b)
    for (int i = 0; i < kTile; ++i) sw[b - b0][i] = dt.e8m0_f32[rows[i][b]];
}

// R activation rows (1..kDecodeMaxRows) on row-major weights: each block of 8 outputs is converted in registers
// once and multiplied with every row, so nothing is staged in memory. Per 32-K block of an output: FP8 codes
// become fp16 words (the sign-extended code << 7, bit 14 cleared: value * 2^-8 exactly, subnormals included) and
// fp32 through F16C; MXFP4 nibbles become fp16 words through a 16-entry byte table (every e2m1 value is an fp16
// whose low byte is 0: the table holds the high bytes) and fp32 the same way. 4 FMAs per row, output and block,
// the 8 outputs' block sums reduced together (reduce_8), then scaled and added in K order as gemm_tiles does. The
// in-block order differs from gemm_tiles' (the reference allows any; spec note in linear_reference.cpp). MXFP4
// blocks that every row can take in integers (g.act_units) skip the conversion: 2 vpmaddubsw per row and output
// per byte piece of N (exact_fp4_block_sums). Against the int16 vpmaddwd recipe before it (W + 12 widened to words
// by four byte unpacks per output, every |N| < 2^15; bench_linear --threads=2, avx2, this Xeon, alternated 2x):
// w13_mxfp4 rows:1 0.91 -> 0.75 ms, rows:4 2.41-2.46 -> 1.89-2.01; w2_mxfp4 rows:1 0.47 -> 0.39-0.43.
// g.act [R, in]: FP8, the rows' values in k order; MXFP4, each block's values as its nibbles come out: even k
// 0..14, even k 16..30, odd k 1..15, odd k 17..31 (prepare_fp4_decode_rows). FP8 NaN codes (0x7f / 0xff) would
// convert to finite values here: the largest masked code seen is returned, and a range that saw 0x7f is
// recomputed by gemm_tiles.
template <bool kFp4, int R>
uint8_t decode_rows_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const int64_t row_bytes = kFp4 ? g.in / 2 : g.in;
  const int64_t block_bytes = kFp4 ? 16 : 32;
  const int64_t prefetch_blocks = kDecodePrefetchBytes / block_bytes;
  const __m256 unscale = _mm256_set1_ps(kFp4 ? 1.0f : 256.0f);
  const __m128i magnitude_bits = _mm_set1_epi8(0x7f);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const Fp4ByteTables& byte_tables = fp4_byte_tables();
  const __m128i fp16_table = _mm_load_si128(reinterpret_cast<const __m128i*>(byte_tables.fp16_high));
  const __m256i w_table =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(byte_tables.w_plus_12)));
  __m128i nan_seen = _mm_setzero_si128();
  alignas(32) float sw[kChunkBlocks][kTile];  // MXFP4: the tile's weight scales of a chunk, [block][output]
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t o0 = tile * kTile;
    const int n = static_cast<int>(std::min<int64_t>(kTile, g.out - o0));
    const uint8_t* rows[kTile];
    for (int i = 0; i < kTile; ++i) rows[i] = g.w + (o0 + std::min(i, n - 1)) * row_bytes;
    __m256 y[R];
    for (int r = 0; r < R; ++r) y[r] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < g.kb; b0 += kChunkBlocks) {
      const int64_t b1 = std::min(g.kb, b0 + kChunkBlocks);
      if constexpr (kFp4) fp4_tile_scales(g, dt, o0, n, b0, b1, sw);
      for (int64_t b = b0; b < b1; ++b) {
        // Software prefetch, kDecodePrefetchBytes ahead in this range's walk order (into the next tile near a row's
        // end), one cache line per row every 64 bytes of it.
        if ((b * block_bytes) % 64 == 0) {
          const int64_t ahead_b = b + prefetch_blocks;
          const int64_t ahead_tile = tile + ahead_b / g.kb;
          if (ahead_tile < tile_end) {
            const uint8_t* ahead = g.w + ahead_tile * kTile * row_bytes + (ahead_b % g.kb) * block_bytes;
            const int rows_ahead = static_cast<int>(std::min<int64_t>(kTile, g.out - ahead_tile * kTile));
            for (int i = 0; i < rows_ahead; ++i) {
              _mm_prefetch(reinterpret_cast<const char*>(ahead + i * row_bytes), _MM_HINT_T0);
            }
          }
        }
        __m256 partial[R];  // the 8 outputs' block sums
        bool exact = kFp4 && g.act_units != nullptr;
        for (int r = 0; r < R && exact; ++r) exact = g.act_units[r * g.kb + b] != 0.0f;
        if (exact) {
          // Every row's block in integers (exact_fp4_block_sums): no conversion to fp32, which costs more than the
          // multiplies; the rows' 12 * Σ N (g.act_int_offsets) is taken back from the 8 outputs' sums at once.
          uint8_t pieces = 2;
          for (int r = 0; r < R; ++r) pieces = std::max(pieces, g.act_piece_counts[r * g.kb + b]);
          __m256i sums[R] = {};
          if (pieces == 2) exact_fp4_block_sums<R, 2>(g, rows, b, w_table, sums);
          else exact_fp4_block_sums<R, 3>(g, rows, b, w_table, sums);
          for (int r = 0; r < R; ++r) {
            const __m256i exact_sums = _mm256_sub_epi32(sums[r], _mm256_set1_epi32(g.act_int_offsets[r * g.kb + b]));
            partial[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(exact_sums), _mm256_set1_ps(g.act_units[r * g.kb + b]));
          }
        } else {
          __m256 v[R][kTile];
          for (int i = 0; i < kTile; ++i) {
            __m256 w[4];  // the output's 32 weights (times 2^-8 for FP8), in g.act's order
            if constexpr (kFp4) {
              const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + 16 * b));
              const __m128i even = _mm_shuffle_epi8(fp16_table, _mm_and_si128(raw, nibble));
              const __m128i odd = _mm_shuffle_epi8(fp16_table, _mm_and_si128(_mm_srli_epi16(raw, 4), nibble));
              const __m128i zero = _mm_setzero_si128();
              w[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, even));
              w[1] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, even));
              w[2] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, odd));
              w[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, odd));
            } else {
              const __m128i* src = reinterpret_cast<const __m128i*>(rows[i] + 32 * b);
              const __m128i low = _mm_loadu_si128(src), high = _mm_loadu_si128(src + 1), zero = _mm_setzero_si128();
              nan_seen = _mm_max_epu8(nan_seen, _mm_max_epu8(_mm_and_si128(low, magnitude_bits),
                                                             _mm_and_si128(high, magnitude_bits)));
              w[0] = _mm256_cvtph_ps(e4m3_fp16_words(_mm_unpacklo_epi8(zero, low)));
              w[1] = _mm256_cvtph_ps(e4m3_fp16_words(_mm_unpackhi_epi8(zero, low)));
              w[2] = _mm256_cvtph_ps(e4m3_fp16_words(_mm_unpacklo_epi8(zero, high)));
              w[3] = _mm256_cvtph_ps(e4m3_fp16_words(_mm_unpackhi_epi8(zero, high)));
            }
            for (int r = 0; r < R; ++r) {
              const float* ab = g.act + r * g.in + b * 32;
              __m256 sum = _mm256_mul_ps(w[0], _mm256_loadu_ps(ab));
              for (int q = 1; q < 4; ++q) sum = _mm256_fmadd_ps(w[q], _mm256_loadu_ps(ab + 8 * q), sum);
              v[r][i] = sum;
            }
          }
          for (int r = 0; r < R; ++r) partial[r] = _mm256_mul_ps(reduce_8(v[r]), unscale);
        }
        const __m256 w_scale =
            kFp4 ? _mm256_load_ps(sw[b - b0]) : _mm256_set1_ps(dt.e8m0_f32[g.w_scales[(o0 / 32) * g.kb + b]]);
        for (int r = 0; r < R; ++r) {
          const __m256 sa = _mm256_set1_ps(dt.e8m0_f32[g.act_scales[r * g.kb + b]]);
          y[r] = _mm256_add_ps(y[r], _mm256_mul_ps(_mm256_mul_ps(partial[r], sa), w_scale));
        }
      }
    }
    for (int r = 0; r < R; ++r) _mm256_maskstore_ps(g.y + r * g.out + o0, lane_mask(n), y[r]);
  }
  alignas(16) uint8_t seen[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(seen), nan_seen);
  return *std::max_element(seen, seen + 16);
}

// How far ahead of each tile's stream the one-row tile-major decode prefetches (one line per tile and vector; past a
// tile's end it reaches into the next one). Without it the 4 streams ran at 0.5 of the read probe: bench_linear
// --threads=2, avx2, this Xeon, wo_b_fp8_tiled rows:1 2.4-2.6 ms without, 1.53 / 1.45-1.58 / 1.48 ms at 1, 2
// and 4 KB (with the conversion through memory).
constexpr int64_t kTileMajorPrefetchBytes = 2048;

// One activation row on tile-major FP8 weights (kernels/linear.h), kTiles tiles of 16 outputs from `tile`: per
// 64-byte vector (k 4v .. 4v + 3 of a tile), a qword permute of each half gives each k's codes of 8 outputs
// (fp8_tile_major_fp16), which widen (e4m3_fp16_words, F16C) and multiply a broadcast activation, loaded once for
// every tile. Each block is summed down k from 0, the reference's own order, as the many-row path (gemm_tiles)
// does, so every row count gives the reference's bits; row-major weights need an 8-lane reduction per output and
// block instead (reduce_8: about a fifth of the one-row FP8 decode on a Zen 1). 2-4 rows take
// decode_fp8_tile_major_rows: this kernel's forms for them (4, 2 and 1 tiles at a time) kept 8-16 block sums plus a
// vector's weights, more than the 16 registers, and the sums' chains went through the stack. Returns the largest
// magnitude code seen, as decode_rows_tiles does (0x7f: a NaN code, which converts to a finite value here).
template <int kTiles, bool kCheckNan>
uint8_t decode_fp8_tile_major(const GemmArgs& g, int64_t tile) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f);
  const __m256 unscale = _mm256_set1_ps(256.0f);
  const int64_t block_bytes = 32 * kTileMajorOutputs;
  const int64_t o0 = tile * kTileMajorOutputs;
  __m256i nan_seen = _mm256_setzero_si256();
  __m256 y[kTiles][2];  // [tile][outputs 0-7, 8-15]
  for (int u = 0; u < kTiles; ++u) y[u][0] = y[u][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < g.kb; ++b) {
    __m256 acc[kTiles][2];
    for (int u = 0; u < kTiles; ++u) acc[u][0] = acc[u][1] = _mm256_setzero_ps();
    for (int v = 0; v < 8; ++v) {
      __m256 x[4];  // a_k, k = 4v .. 4v + 3
      for (int e = 0; e < 4; ++e) x[e] = _mm256_broadcast_ss(g.act + 32 * b + 4 * v + e);
      for (int u = 0; u < kTiles; ++u) {
        const uint8_t* vector = g.w + (o0 + kTileMajorOutputs * u) * g.in + b * block_bytes + kTileMajorVectorBytes * v;
        _mm_prefetch(reinterpret_cast<const char*>(vector + kTileMajorPrefetchBytes), _MM_HINT_T0);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* half = vector + 32 * h;
          if constexpr (kCheckNan) {
            const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half));
            nan_seen = _mm256_max_epu8(nan_seen, _mm256_and_si256(codes, magnitude_bits));
          }
          alignas(32) uint16_t fp16[2][16];
          fp8_tile_major_fp16(half, fp16);
          for (int e = 0; e < 4; ++e) acc[u][h] = _mm256_fmadd_ps(fp8_tile_major_value(fp16, e), x[e], acc[u][h]);
        }
      }
    }
    const __m256 sa = _mm256_set1_ps(dt.e8m0_f32[g.act_scales[b]]);
    for (int u = 0; u < kTiles; ++u) {
      const __m256 w_scale = _mm256_set1_ps(dt.e8m0_f32[g.w_scales[((o0 + kTileMajorOutputs * u) / 32) * g.kb + b]]);
      for (int h = 0; h < 2; ++h)
        y[u][h] = _mm256_add_ps(y[u][h], _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(acc[u][h], unscale), sa), w_scale));
    }
  }
  for (int u = 0; u < kTiles; ++u)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(g.y + o0 + kTileMajorOutputs * u + kTile * h, y[u][h]);
  alignas(32) uint8_t seen[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(seen), nan_seen);
  return *std::max_element(seen, seen + 32);
}

// decode_fp8_tile_major over tiles [tile_begin, tile_end) of 16 outputs, 4 at a time and then one by one. The NaN
// check (about a tenth of the one-row time) only where the weight may hold NaN codes.
uint8_t decode_fp8_tile_major_range(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  uint8_t largest = 0;
  auto run = [&]<bool kCheckNan>() {
    int64_t tile = tile_begin;
    for (; tile + 4 <= tile_end; tile += 4) largest = std::max(largest, decode_fp8_tile_major<4, kCheckNan>(g, tile));
    for (; tile < tile_end; ++tile) largest = std::max(largest, decode_fp8_tile_major<1, kCheckNan>(g, tile));
  };
  if (g.may_hold_nan) run.template operator()<true>();
  else run.template operator()<false>();
  return largest;
}

template <bool kFp4>
uint8_t decode_rows_tiles_dispatch(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  switch (g.rows) {
    case 1: return decode_rows_tiles<kFp4, 1>(g, tile_begin, tile_end);
    case 2: return decode_rows_tiles<kFp4, 2>(g, tile_begin, tile_end);
    case 3: return decode_rows_tiles<kFp4, 3>(g, tile_begin, tile_end);
    default: return decode_rows_tiles<kFp4, 4>(g, tile_begin, tile_end);
  }
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

// decode_rows_tiles over every tile of g (1..kDecodeMaxRows rows, row-major weights), one contiguous range per
// thread: its 8 row streams never restart at a chunk boundary. FP8: a range that met a NaN code is recomputed by
// gemm_tiles (g.act in k order serves both).
template <bool kFp4>
void run_decode_rows(const GemmArgs& g, ThreadPool* pool) {
  const int64_t tiles = (g.out + kTile - 1) / kTile;
  auto body = [&](int64_t begin, int64_t end, int) {
    if (decode_rows_tiles_dispatch<kFp4>(g, begin, end) == 0x7f) gemm_tiles<kFp4>(g, begin, end);
  };
  if (pool) pool->parallel_for_nodes(tiles, body, 1, 1);
  else body(0, tiles, 0);
}

// R = 2..4 activation rows on one tile-major FP8 tile of 16 outputs, with decode_fp8_tile_major's conversion,
// prefetch and order: each block summed down k from 0, so every row count gives the reference's bits.
// One tile at a time keeps both halves' R block sums (8 at most), a weight vector and the R broadcasts in the 16
// registers; the 2R chains cover the FMA latency. (It replaced the lanes path for these rows: bench_linear
// --threads=2, avx2, this Xeon, alternated 2x: wq_b_fp8_tiled rows:2 3.71-3.73 -> 2.00-2.04 ms, rows:3 4.23-4.36 ->
// 2.68-2.77, rows:4 4.41-4.60 -> 2.82-2.86; wo_b rows:4 4.24-4.81 -> 3.01-3.07.) Returns the largest magnitude code
// seen where the weight may hold NaN codes, as decode_fp8_tile_major does.
template <int R>
uint8_t decode_fp8_tile_major_rows(const GemmArgs& g, int64_t tile) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f);
  const __m256 unscale = _mm256_set1_ps(256.0f);
  const int64_t block_bytes = 32 * kTileMajorOutputs;
  const int64_t o0 = tile * kTileMajorOutputs;
  const uint8_t* tile_codes = g.w + o0 * g.in;
  __m256i nan_seen = _mm256_setzero_si256();
  alignas(32) float y[R][2][kTile] = {};  // [row][outputs 0-7, 8-15], in memory: the registers hold the sums
  for (int64_t b = 0; b < g.kb; ++b) {
    __m256 acc[2][R];
    for (int h = 0; h < 2; ++h)
      for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps();
    for (int v = 0; v < 8; ++v) {
      const uint8_t* vector = tile_codes + b * block_bytes + kTileMajorVectorBytes * v;
      _mm_prefetch(reinterpret_cast<const char*>(vector + kTileMajorPrefetchBytes), _MM_HINT_T0);
      if (g.may_hold_nan)
        for (int h = 0; h < 2; ++h) {
          const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vector + 32 * h));
          nan_seen = _mm256_max_epu8(nan_seen, _mm256_and_si256(codes, magnitude_bits));
        }
      alignas(32) uint16_t fp16[2][2][16];  // [half][k % 2][16]
      fp8_tile_major_fp16(vector, fp16[0]);
      fp8_tile_major_fp16(vector + 32, fp16[1]);
      for (int e = 0; e < 4; ++e) {
        __m256 x[R];
        for (int r = 0; r < R; ++r) x[r] = _mm256_broadcast_ss(g.act + r * g.in + 32 * b + 4 * v + e);
        for (int h = 0; h < 2; ++h) {
          const __m256 w = fp8_tile_major_value(fp16[h], e);
          for (int r = 0; r < R; ++r) acc[h][r] = _mm256_fmadd_ps(w, x[r], acc[h][r]);
        }
      }
    }
    const __m256 w_scale = _mm256_set1_ps(dt.e8m0_f32[g.w_scales[(o0 / 32) * g.kb + b]]);
    for (int r = 0; r < R; ++r) {
      const __m256 sa = _mm256_set1_ps(dt.e8m0_f32[g.act_scales[r * g.kb + b]]);
      for (int h = 0; h < 2; ++h)
        _mm256_store_ps(y[r][h], _mm256_add_ps(_mm256_load_ps(y[r][h]), _mm256_mul_ps(_mm256_mul_ps(
                                                   _mm256_mul_ps(acc[h][r], unscale), sa), w_scale)));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(g.y + r * g.out + o0 + kTile * h, _mm256_load_ps(y[r][h]));
  alignas(32) uint8_t seen[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(seen), nan_seen);
  return *std::max_element(seen, seen + 32);
}

// The tile-major FP8 decode (1..kDecodeMaxRows rows: decode_fp8_tile_major, decode_fp8_tile_major_rows) over every
// 16-output tile of g, one contiguous range per thread (as run_decode_rows); a range that met a NaN code is
// recomputed by gemm_tiles.
void run_decode_fp8_tile_major(const GemmArgs& g, ThreadPool* pool) {
  auto body = [&](int64_t begin, int64_t end, int) {
    uint8_t largest = 0;
    if (g.rows == 1) {
      largest = decode_fp8_tile_major_range(g, begin, end);
    } else {
      for (int64_t tile = begin; tile < end; ++tile) {
        switch (g.rows) {
          case 2: largest = std::max(largest, decode_fp8_tile_major_rows<2>(g, tile)); break;
          case 3: largest = std::max(largest, decode_fp8_tile_major_rows<3>(g, tile)); break;
          default: largest = std::max(largest, decode_fp8_tile_major_rows<4>(g, tile)); break;
        }
      }
    }
    const int64_t tiles_per_tile = kTileMajorOutputs / kTile;
    if (largest == 0x7f) gemm_tiles<false>(g, begin * tiles_per_tile, end * tiles_per_tile);
  };
  const int64_t tiles = g.out / kTileMajorOutputs;
  if (pool) pool->parallel_for_nodes(tiles, body, 1, 1);
  else body(0, tiles, 0);
}

template <bool kFp4>
void run_block_gemm(const float* act, const uint8_t* act_scales, int64_t rows, const uint8_t* w,
                    const uint8_t* w_scales, int64_t out, int64_t in, bool tile_major, float* y, ThreadPool* pool,
                    bool may_hold_nan = true) {
  if (rows <= 0 || out <= 0) return;
  GemmArgs g = block_gemm_args(act, act_scales, rows, w, w_scales, out, in, tile_major, y);
  g.may_hold_nan = may_hold_nan;
  const int64_t tiles = (out + kTile - 1) / kTile;
  if (!kFp4 && tile_major && rows <= kDecodeMaxRows) return run_decode_fp8_tile_major(g, pool);
  if (!kFp4 && !tile_major && rows <= kDecodeMaxRows) return run_decode_rows<kFp4>(g, pool);  // (MXFP4: fp4_gemm_avx2)
  if (pool && rows > 1 && tiles < 4 * pool->num_threads()) {
    // Few outputs, several rows: split the rows instead (every row range runs all tiles).
    pool->parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      GemmArgs part = g;
      part.rows = r1 - r0;
      part.act += r0 * g.in;
      part.act_scales += r0 * g.kb;
      part.y += r0 * g.out;
      gemm_tiles<kFp4>(part, 0, tiles);
    });
    return;
  }
  auto body = [&](int64_t begin, int64_t end, int) { gemm_tiles<kFp4>(g, begin, end); };
  if (pool) pool->parallel_for_nodes(tiles, body, kLaneTiles);
  else body(0, tiles, 0);
}

void fp8_gemm_avx2(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* pool) {
  ThreadScratch scratch(pool);
  const std::span<float> act = widen_activations(x, scratch);
  run_block_gemm<false>(act.data(), x.scales, x.rows, w.codes, w.scales, w.out, w.in, w.tile_major, y, pool,
                        w.may_hold_nan);
}

void fp4_gemm_avx2(const Fp8Activations& x, const Fp4Weight& w, float* y, ThreadPool* pool) {
  ThreadScratch scratch(pool);
  if (x.rows > 0 && x.rows <= kDecodeMaxRows && w.out > 0 && !w.tile_major) {
    // Decode: the rows as decode_rows_tiles takes them, as values and as exact integers.
    const std::span<float> values = scratch.take<float>(static_cast<size_t>(x.rows * x.k));
    const int64_t blocks = x.rows * (x.k / 32);
    const std::span<int8_t> pieces = scratch.take<int8_t>(static_cast<size_t>(blocks * kFp4PieceBlockBytes));
    const std::span<float> units = scratch.take<float>(static_cast<size_t>(blocks));
    const std::span<uint8_t> piece_counts = scratch.take<uint8_t>(static_cast<size_t>(blocks));
    const std::span<int32_t> offsets = scratch.take<int32_t>(static_cast<size_t>(blocks));
    prepare_fp4_decode_rows(x, values.data(), pieces.data(), units.data(), piece_counts.data(), offsets.data());
    GemmArgs g = block_gemm_args(values.data(), x.scales, x.rows, w.packed, w.scales, w.out, w.in, false, y);
    g.act_pieces = pieces.data();
    g.act_units = units.data();
    g.act_piece_counts = piece_counts.data();
    g.act_int_offsets = offsets.data();
    return run_decode_rows<true>(g, pool);
  }
  const std::span<float> act = widen_activations(x, scratch);
  run_block_gemm<true>(act.data(), x.scales, x.rows, w.packed, w.scales, w.out, w.in, w.tile_major, y, pool);
}

// The FP8 block GEMM on the fp32 activations themselves with unit activation scales: per block
// (partial · 1) · sw, where partial sums exact products when x holds bf16 values.
void fp8_as_bf16_gemm_avx2(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* pool) {
  ThreadScratch scratch(pool);
  const std::span<uint8_t> unit_scales = scratch.take<uint8_t>(static_cast<size_t>(rows * (w.in / 32)));
  std::fill(unit_scales.begin(), unit_scales.end(), kE8m0One);
  run_block_gemm<false>(x, unit_scales.data(), rows, w.codes, w.scales, w.out, w.in, w.tile_major, y, pool,
                        w.may_hold_nan);
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
  static const LinearKernels kernels{"avx2", {.fp8 = true, .fp4 = false}, fp8_gemm_avx2, fp4_gemm_avx2, bf16_gemm_avx2,
                                     fp8_as_bf16_gemm_avx2, true};
  return supported ? &kernels : nullptr;
}

}  // namespace dsflash::linear_impl
