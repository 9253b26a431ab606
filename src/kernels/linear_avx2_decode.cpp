// The AVX2 table's decode kernels: 1..kDecodeMaxRows activation rows (on tile-major weights more, in passes:
// kFp8PassMaxRows, kFp4PassMaxRows), each weight block converted in registers as it is read (the many-row lanes
// path is linear_avx2.cpp's gemm_tiles, which these fall back to for NaN codes).
// - Row-major weights (decode_rows_tiles): each block of 8 outputs converted and multiplied at once, in fp32 FMAs,
//   or for MXFP4 in exact integers where the activations allow (prepare_fp4_decode_rows).
// - Tile-major FP8 weights (decode_fp8_tile_major, decode_fp8_tile_major_rows): each 64-byte vector converted as it
//   is read into bf16 words of the values times 2^-120 (fp8_tile_major_bf16) against activations times 2^64, each
//   block summed down k from 0, the reference's order.
// - Tile-major MXFP4 weights (decode_fp4_tile_major): each block in exact integers where every row allows, else
//   down k from 0: the reference's bits either way.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/linear_avx2_impl.h"

namespace dsflash::linear_impl::avx2 {

// An MXFP4 block's dot product in exact integers (as the AVX-512 decode, linear_avx512_tiled.cpp): an e4m3
// activation is a = N * 2^(s-10), with sig = 8 + mantissa and e' = the exponent field for normals, sig = mantissa
// and e' = 1 for subnormals, N = sig << (e' - s) and s the smallest e' of the block's nonzero values; a weight is
// w = W / 2, W = 2 * e2m1 in [-12, 12]. A block's sum of a * w is (Σ N * W) * 2^(s-11). Where 12 Σ |N| < 2^24,
// Σ N * W and every partial sum in any order are below 2^24: exact in int32, and exact as a float, so the integer
// sum gives the bits of any fp32 order. Blocks with NaN codes or wider magnitude spans keep the fp32 path (unit 0).
// vpmaddubsw multiplies unsigned bytes (W + 12, in [0, 24]) by signed ones, so N goes in as byte pieces:
// N = 65536 * p2 + 256 * p1 + p0 with p0, p1 in [-128, 127] (p2 is small: |N| < 2^24 / 12). Per block
// kFp4PieceBlockBytes (linear_avx2_impl.h): piece p's 32 bytes at 32p, in the nibble order below.

// MXFP4 decode rows from their e4m3 codes x [rows, in] (the order: linear_avx2_impl.h's declaration).
void prepare_fp4_decode_rows(const Fp8Activations& x, bool tile_major, float* values, int8_t* pieces, float* units,
                             uint8_t* piece_counts, int32_t* offsets) {
  const LinearDecodeTables& dt = linear_decode_tables();
  // Row-major: per 128-bit lane its even bytes, then its odd ones; the qword permute (0xD8) then gives the nibble
  // order. Tile-major: k 0 4 1 5 2 6 3 7 of each 8, within the lanes.
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i by_vector = _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15,  //
                                             0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  // After two packs, dword j of a vector holds 4 bytes of source vector j % 4 (j / 4: its lane): back in order.
  const __m256i unpack_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f), low_bits = _mm256_set1_epi8(0x0f);
  const __m256i one = _mm256_set1_epi8(1), above_every_step = _mm256_set1_epi8(16);
  for (int64_t b = 0; b < x.rows * (x.k / 32); ++b) {
    const uint8_t* c = x.codes + 32 * b;
    float* v = values + 32 * b;
    alignas(32) uint8_t ordered[32];
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
    const __m256i codes = tile_major ? _mm256_shuffle_epi8(raw, by_vector)
                                     : _mm256_permute4x64_epi64(_mm256_shuffle_epi8(raw, split), 0xD8);
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

namespace {

constexpr int kChunkBlocks = 32;  // blocks whose MXFP4 weight scales decode_rows_tiles looks up at once

// 8 vectors (one per output) -> one vector whose lane i is the sum of vector i's lanes.
inline __m256 reduce_8(const __m256* v) {
  __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// How far ahead of a row the decode prefetches. The 8 row streams of a tile defeat the hardware prefetchers (as on
// AVX-512, linear_avx512_row_major.cpp). bench_linear avx2 rows:1 (Zen 1, 2 threads), alternated 2x: wq_b_fp8
// 6.2-6.3 -> 7.6 GB/s, w2_mxfp4 6.1-6.2 -> 7.0, wo_b_fp8 7.6 alike; 512, 1024 and 2048 bytes measured alike.
constexpr int64_t kDecodePrefetchBytes = 1024;

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

// The tile-major decode's conversion (kernels/linear.h): 8 outputs of a tile for the 4 k of one 64-byte vector,
// `half` being the vector's first byte plus 32h for outputs 8h .. 8h + 7. Each 128-bit lane of the half holds 4
// outputs' codes as 16-bit words, k 4v (low byte) and 4v + 1 (high byte) in words 0-3, k 4v + 2 and 4v + 3 in
// words 4-7. Each code becomes a bf16 word in place: its 7 magnitude bits at bits 10..4 are the bf16 exponent's low
// 4 bits and the top 3 mantissa bits, its sign at bit 15, so the word is the e4m3 value times 2^-120 exactly, a
// subnormal code a bf16 (and fp32) subnormal (linear_avx2_impl.h, kFp8DecodeActLog2: why the sums keep the
// reference's bits). The word unpacked above 16 zero bits is that fp32: `low` holds the low bytes' words (k 4v in
// words 0-3, 4v + 2 in 4-7), `high` the high bytes'; the lanes keep outputs 0-3 and 4-7 apart, so an in-lane unpack
// gives a k's 8 outputs in order. NaN codes (0x7f / 0xff) land on finite values: the callers deal with them. FMAs
// take subnormal operands at full speed where measured (Zen 3: 8 independent FMAs took 1.27 ns either way) and keep
// their products exact (nothing here sets MXCSR's DAZ).
struct Fp8HalfWords {
  __m256i low, high;
};
inline Fp8HalfWords fp8_tile_major_bf16(const uint8_t* half) {
  const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half));
  const __m256i sign_and_magnitude = _mm256_set1_epi16(static_cast<short>(0x87F0));
  return {_mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(words, 8), 4), sign_and_magnitude),
          _mm256_and_si256(_mm256_srai_epi16(words, 4), sign_and_magnitude)};
}
// The 8 outputs' weights of k = 4v + e (e = 0..3) times 2^-120, from fp8_tile_major_bf16's words.
inline __m256 fp8_tile_major_k(const Fp8HalfWords& words, int e) {
  const __m256i zero = _mm256_setzero_si256(), source = e % 2 == 0 ? words.low : words.high;
  return _mm256_castsi256_ps(e < 2 ? _mm256_unpacklo_epi16(zero, source) : _mm256_unpackhi_epi16(zero, source));
}

// How far ahead of each tile's stream the one-row tile-major decode prefetches (one line per tile and vector; past a
// tile's end it reaches into the next one). Without it the 4 streams ran at 0.5 of the read probe: bench_linear
// --threads=2, avx2, this Xeon, wo_b_fp8_tiled rows:1 2.4-2.6 ms without, 1.53 / 1.45-1.58 / 1.48 ms at 1, 2
// and 4 KB (with the conversion through memory).
constexpr int64_t kTileMajorPrefetchBytes = 2048;

// One activation row on tile-major FP8 weights (kernels/linear.h), kTiles tiles of 16 outputs from `tile`: per
// 64-byte vector (k 4v .. 4v + 3 of a tile), each half's codes become bf16 words in place (fp8_tile_major_bf16) and
// each k's 8 outputs one in-lane unpack, multiplied by a broadcast activation (g.act_decode: times 2^64), loaded once
// for every tile. The products are the reference's times 2^-56 and exact, every partial sum a normal fp32 or an exact
// subnormal (linear_avx2_impl.h), so each block summed down k from 0, the reference's own order as the many-row path
// (gemm_tiles), is the reference's sum times 2^-56: every row count gives the reference's bits. Row-major weights
// need an 8-lane reduction per output and block instead (reduce_8: about a fifth of the one-row FP8 decode on a Zen
// 1). 2-4 rows take decode_fp8_tile_major_rows: this kernel's forms for them (4, 2 and 1 tiles at a time) kept 8-16
// block sums plus a vector's weights, more than the 16 registers. Returns the largest magnitude code seen, as
// decode_rows_tiles does (0x7f: a NaN code, which converts to a finite value here).
// Per half: 3 shifts, 2 ands, 4 unpacks and 4 FMAs, where fp16 words converted by F16C from memory (vcvtph2ps from
// memory: one uop on a Xeon's FMA port) took a qword permute, the same shifts, 2 stores and 4 vcvtph2ps. On a 2-core
// Zen 3 EPYC (bench_linear, avx2, alternated against the F16C form, which ran 4 tiles at a time): wo_b_fp8_cached_tiled
// rows:1, one thread, medians of 5, 0.048 -> 0.030 ms (0.038 before widen_activations' vector form); two threads from
// memory, wq_b_fp8_tiled rows:1 2.13-3.49 -> 1.46-1.94 ms, wo_b 1.89-2.57 -> 1.27-2.27 (the VM's read rate swings).
template <int kTiles, bool kCheckNan>
uint8_t decode_fp8_tile_major(const GemmArgs& g, int64_t tile) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f);
  const __m256 unscale = _mm256_set1_ps(kFp8DecodeUnscale);
  const int64_t block_bytes = 32 * kTileMajorOutputs;
  const int64_t o0 = tile * kTileMajorOutputs;
  __m256i nan_seen = _mm256_setzero_si256();
  __m256 y[kTiles][2];  // [tile][outputs 0-7, 8-15]
  for (int u = 0; u < kTiles; ++u) y[u][0] = y[u][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < g.kb; ++b) {
    __m256 acc[kTiles][2];
    for (int u = 0; u < kTiles; ++u) acc[u][0] = acc[u][1] = _mm256_setzero_ps();
    for (int v = 0; v < 8; ++v) {
      __m256 x[4];  // a_k * 2^64, k = 4v .. 4v + 3
      for (int e = 0; e < 4; ++e) x[e] = _mm256_broadcast_ss(g.act_decode + 32 * b + 4 * v + e);
      for (int u = 0; u < kTiles; ++u) {
        const uint8_t* vector = g.w + (o0 + kTileMajorOutputs * u) * g.in + b * block_bytes + kTileMajorVectorBytes * v;
        _mm_prefetch(reinterpret_cast<const char*>(vector + kTileMajorPrefetchBytes), _MM_HINT_T0);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* half = vector + 32 * h;
          if constexpr (kCheckNan) {
            const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half));
            nan_seen = _mm256_max_epu8(nan_seen, _mm256_and_si256(codes, magnitude_bits));
          }
          const Fp8HalfWords words = fp8_tile_major_bf16(half);
          for (int e = 0; e < 4; ++e) acc[u][h] = _mm256_fmadd_ps(fp8_tile_major_k(words, e), x[e], acc[u][h]);
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

// decode_fp8_tile_major over tiles [tile_begin, tile_end) of 16 outputs, 2 at a time and then one by one: 4 sums,
// 4 broadcasts and the words fit the 16 registers, where 4 tiles' 8 sums spilled (Zen 3, wo_b_fp8_cached_tiled rows:1
// 0.048 ms with 4 tiles, 0.038 with 2). The NaN check (about a tenth of the one-row time) only where the weight may
// hold NaN codes.
uint8_t decode_fp8_tile_major_range(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  uint8_t largest = 0;
  auto run = [&]<bool kCheckNan>() {
    int64_t tile = tile_begin;
    for (; tile + 2 <= tile_end; tile += 2) largest = std::max(largest, decode_fp8_tile_major<2, kCheckNan>(g, tile));
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

// R = 2..4 activation rows on NT tile-major FP8 tiles of 16 outputs from `tile`, with decode_fp8_tile_major's
// conversion, prefetch and order: each block summed down k from 0, so every row count gives the reference's bits.
// Both halves' R block sums of the NT tiles (2 NT R, 8 at most: see decode_fp8_tile_major_rows_range), two weight
// vectors and a broadcast stay in the 16 registers; a vector's bf16 words go through memory (each k's unpack reads
// them), since holding them too spilled a sum into its chain. (It replaced the lanes path for these rows:
// bench_linear --threads=2, avx2, a Xeon, alternated 2x: wq_b_fp8_tiled rows:2 3.71-3.73 -> 2.00-2.04 ms, rows:3
// 4.23-4.36 -> 2.68-2.77, rows:4 4.41-4.60 -> 2.82-2.86; wo_b rows:4 4.24-4.81 -> 3.01-3.07. Against the F16C
// conversion on a Zen 3, wo_b_fp8_cached_tiled one thread, medians: rows:2 0.059 -> 0.044 ms, rows:3 0.082 ->
// 0.059, rows:4 0.103 -> 0.071; wq_b_fp8_tiled two threads, alternated 2x: rows:3 3.09-3.15 -> 2.45-2.52, rows:4
// 3.77-4.68 -> 3.27-3.35.)
// Returns the largest magnitude code seen where the weight may hold NaN codes, as decode_fp8_tile_major does.
template <int R, int NT>
uint8_t decode_fp8_tile_major_rows(const GemmArgs& g, int64_t tile) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m256i magnitude_bits = _mm256_set1_epi8(0x7f);
  const __m256 unscale = _mm256_set1_ps(kFp8DecodeUnscale);
  const int64_t block_bytes = 32 * kTileMajorOutputs;
  const int64_t o0 = tile * kTileMajorOutputs;
  const int64_t tile_bytes = kTileMajorOutputs * g.in;
  const uint8_t* tile_codes = g.w + o0 * g.in;
  __m256i nan_seen = _mm256_setzero_si256();
  alignas(32) float y[R][NT][2][kTile] = {};  // [row][tile][outputs 0-7, 8-15], in memory: the sums take the registers
  for (int64_t b = 0; b < g.kb; ++b) {
    __m256 acc[NT][2][R];
    for (int u = 0; u < NT; ++u)
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < R; ++r) acc[u][h][r] = _mm256_setzero_ps();
    const float* block_act[R];  // each row's block, times 2^64
    for (int r = 0; r < R; ++r) block_act[r] = g.act_decode + r * g.in + 32 * b;
    for (int v = 0; v < 8; ++v) {
      alignas(32) Fp8HalfWords words[NT][2];  // [tile][half]
      for (int u = 0; u < NT; ++u) {
        const uint8_t* vector = tile_codes + u * tile_bytes + b * block_bytes + kTileMajorVectorBytes * v;
        _mm_prefetch(reinterpret_cast<const char*>(vector + kTileMajorPrefetchBytes), _MM_HINT_T0);
        if (g.may_hold_nan)
          for (int h = 0; h < 2; ++h) {
            const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vector + 32 * h));
            nan_seen = _mm256_max_epu8(nan_seen, _mm256_and_si256(codes, magnitude_bits));
          }
        words[u][0] = fp8_tile_major_bf16(vector);
        words[u][1] = fp8_tile_major_bf16(vector + 32);
      }
      __asm__ volatile("" : "+m"(words));
      // Per k each row's broadcast serves the NT tiles' two halves as it is loaded: the 2 NT R sums, two weight
      // vectors and one broadcast take 11-15 of the 16 registers (all R broadcasts at once had spilled a sum).
      for (int e = 0; e < 4; ++e)
        for (int u = 0; u < NT; ++u) {
          const __m256 w[2] = {fp8_tile_major_k(words[u][0], e), fp8_tile_major_k(words[u][1], e)};
          for (int r = 0; r < R; ++r) {
            const __m256 x = _mm256_broadcast_ss(block_act[r] + 4 * v + e);
            for (int h = 0; h < 2; ++h) acc[u][h][r] = _mm256_fmadd_ps(w[h], x, acc[u][h][r]);
          }
        }
    }
    for (int u = 0; u < NT; ++u) {
      const __m256 w_scale = _mm256_set1_ps(dt.e8m0_f32[g.w_scales[((o0 + u * kTileMajorOutputs) / 32) * g.kb + b]]);
      for (int r = 0; r < R; ++r) {
        const __m256 sa = _mm256_set1_ps(dt.e8m0_f32[g.act_scales[r * g.kb + b]]);
        for (int h = 0; h < 2; ++h)
          _mm256_store_ps(y[r][u][h], _mm256_add_ps(_mm256_load_ps(y[r][u][h]), _mm256_mul_ps(_mm256_mul_ps(
                                                        _mm256_mul_ps(acc[u][h][r], unscale), sa), w_scale)));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NT; ++u)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(g.y + r * g.out + o0 + u * kTileMajorOutputs + kTile * h, _mm256_load_ps(y[r][u][h]));
  alignas(32) uint8_t seen[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(seen), nan_seen);
  return *std::max_element(seen, seen + 32);
}

// decode_fp8_tile_major_rows over tiles [tile_begin, tile_end): two tiles at a time for 2 rows (two streams per
// thread), one at a time for 3-4 (12 or 16 sums would not fit the registers). (bench_linear --threads=2, avx2, a
// Xeon, F16C conversion, one tile against two, alternated 2x: wo_b_fp8_tiled rows:2 2.01-2.20 -> 1.78-1.84 ms, rows:3
// 2.66-2.96 -> 2.37-2.45, wo_a rows:2 0.225-0.228 -> 0.193-0.203; with the bf16 words on a Zen 3, rows:3
// wo_b_fp8_cached_tiled one thread 0.081 ms with two tiles, 0.062 with one.)
template <int R>
uint8_t decode_fp8_tile_major_rows_range(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  constexpr int kTilesAtOnce = R < 3 ? 2 : 1;
  uint8_t largest = 0;
  int64_t tile = tile_begin;
  for (; tile + kTilesAtOnce <= tile_end; tile += kTilesAtOnce)
    largest = std::max(largest, decode_fp8_tile_major_rows<R, kTilesAtOnce>(g, tile));
  for (; tile < tile_end; ++tile) largest = std::max(largest, decode_fp8_tile_major_rows<R, 1>(g, tile));
  return largest;
}

// How far ahead of each tile's stream the tile-major MXFP4 decode prefetches (one line per tile and vector).
constexpr int64_t kFp4TileMajorPrefetchBytes = 2048;

// Σ (W + 12) * N - 12 Σ N = Σ W * N of one MXFP4 block for NT tile-major tiles of 16 outputs (kernels/linear.h) and
// R rows, in P byte pieces (prepare_fp4_decode_rows, tile-major order): sums [row][tile][outputs 0-7, 8-15], int32
// lanes by output. Per 64-byte vector (8 k of 16 outputs, output i in dword i), each 32-byte half's low nibbles hold
// k 0 4 1 5 of the vector and its high nibbles k 2 6 3 7 in every dword: one byte lookup each gives W + 12 in that
// order, and vpmaddubsw against a row's piece bytes of those k (one dword, broadcast) sums each output's pairs.
// Two vectors' words add up before one vpmaddwd adds their pairs (piece 1 times 256, piece 2 shifted by 16 after
// it): each vpmaddubsw word is at most 2 * 24 * 128 in magnitude, four of them below 2^15, no saturation. (Against
// a vpmaddwd per vector; bench_linear --threads=2, avx2, this Xeon, alternated 2x: w13_mxfp4_tiled rows:4 1.44-1.48
// -> 1.36-1.44 ms, w2 rows:4 0.93-0.95 -> 0.79-0.85, rows:1 alike.) Every sum is an integer below 2^25: exact.
template <int R, int NT, int P>
inline void exact_fp4_tile_major_sums(const GemmArgs& g, const uint8_t* w, int64_t tile_bytes, int64_t b,
                                      int64_t prefetch_bytes, __m256i w_table, __m256i (&sums)[R][NT][2]) {
  const __m256i nibble = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), times_256 = _mm256_set1_epi16(256);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) sums[r][t][0] = sums[r][t][1] = _mm256_set1_epi32(-g.act_int_offsets[r * g.kb + b]);
  auto piece = [&](int r, int p, int v, int set) {  // row r's piece p bytes of the vector's low (0) / high (1) set
    int32_t bytes;
    std::memcpy(&bytes, g.act_pieces + (r * g.kb + b) * kFp4PieceBlockBytes + 32 * p + 8 * v + 4 * set, 4);
    return _mm256_set1_epi32(bytes);
  };
#pragma GCC unroll 2
  for (int v = 0; v < 4; v += 2)
#pragma GCC unroll 2
    for (int t = 0; t < NT; ++t) {
      const uint8_t* vector = w + t * tile_bytes + b * 4 * kTileMajorVectorBytes + v * kTileMajorVectorBytes;
      _mm_prefetch(reinterpret_cast<const char*>(vector + prefetch_bytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(vector + kTileMajorVectorBytes + prefetch_bytes), _MM_HINT_T0);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256i low_w[2], high_w[2];  // vectors v and v + 1
        for (int u = 0; u < 2; ++u) {
          const __m256i raw =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vector + u * kTileMajorVectorBytes + 32 * h));
          low_w[u] = _mm256_shuffle_epi8(w_table, _mm256_and_si256(raw, nibble));
          high_w[u] = _mm256_shuffle_epi8(w_table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          auto words = [&](int p) {  // both vectors' words: at most 4 * 2 * 24 * 128 in magnitude
            return _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(low_w[0], piece(r, p, v, 0)),
                                                     _mm256_maddubs_epi16(high_w[0], piece(r, p, v, 1))),
                                    _mm256_add_epi16(_mm256_maddubs_epi16(low_w[1], piece(r, p, v + 1, 0)),
                                                     _mm256_maddubs_epi16(high_w[1], piece(r, p, v + 1, 1))));
          };
          __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(words(0), ones), _mm256_madd_epi16(words(1), times_256));
          if constexpr (P == 3) sum = _mm256_add_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(words(2), ones), 16));
          sums[r][t][h] = _mm256_add_epi32(sums[r][t][h], sum);
        }
      }
    }
}

// One MXFP4 block of a tile-major tile's 8 outputs (`half`: the block's first byte plus 32h, outputs 8h .. 8h + 7)
// for one row, in fp32 down k from 0: the reference's own order and bits. values: the row's block in the
// tile-major piece order (k 0 4 1 5 2 6 3 7 of each 8). Each product W * a is exact, and so twice the reference's;
// halving the sum is exact too. For the blocks the integers cannot take (a NaN code, or 12 Σ |N| >= 2^24): rare.
inline __m256 fp4_tile_major_block_fp32(const uint8_t* half, const float* values, __m256i w_table) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  __m256 sum = _mm256_setzero_ps();
  for (int v = 0; v < 4; ++v) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + v * kTileMajorVectorBytes));
    const __m256i sets[2] = {_mm256_shuffle_epi8(w_table, _mm256_and_si256(raw, nibble)),
                             _mm256_shuffle_epi8(w_table, _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble))};
    for (int j = 0; j < 8; ++j) {
      // k 8v + j: set (j / 2) % 2, byte 2 (j % 2) + j / 4 of the dword; position 2 (j % 4) + j / 4 in values.
      const int byte = 2 * (j % 2) + j / 4;
      const __m256i w_plus_12 = _mm256_srli_epi32(_mm256_slli_epi32(sets[(j / 2) % 2], 24 - 8 * byte), 24);
      const __m256 weight = _mm256_sub_ps(_mm256_cvtepi32_ps(w_plus_12), _mm256_set1_ps(12.0f));
      sum = _mm256_fmadd_ps(weight, _mm256_set1_ps(values[8 * v + 2 * (j % 4) + j / 4]), sum);
    }
  }
  return _mm256_mul_ps(sum, _mm256_set1_ps(0.5f));
}

// R activation rows (1..kFp4PassRows) on NT tile-major MXFP4 tiles of 16 outputs from `tile`, all of K. A block
// every row can take in integers takes exact_fp4_tile_major_sums (NT x R x 2 int32 sums in registers); any other
// takes fp4_tile_major_block_fp32: the reference's bits either way, so every row count gives the same. The block
// sums are scaled and added in K order as the reference does: y = y + (partial * sa) * sw.
template <int R, int NT>
void decode_fp4_tile_major(const GemmArgs& g, int64_t tile) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m256i w_table =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(fp4_byte_tables().w_plus_12)));
  const int64_t tile_bytes = kTileMajorOutputs * g.in / 2;
  const int64_t block_bytes = 4 * kTileMajorVectorBytes;
  const uint8_t* w = g.w + tile * tile_bytes;
  alignas(32) float y[R][NT][2][kTile] = {};  // in memory: the registers hold the integer sums
  for (int64_t b = 0; b < g.kb; ++b) {
    // In a tile's last bytes each stream prefetches the start of the tile it reads next (NT tiles on).
    const bool near_end = b * block_bytes + kFp4TileMajorPrefetchBytes >= tile_bytes;
    const int64_t prefetch_bytes = kFp4TileMajorPrefetchBytes + (near_end ? (NT - 1) * tile_bytes : 0);
    int pieces = 2;  // the most any row's block needs; 0: some row's block is not exact
    for (int r = 0; r < R && pieces != 0; ++r)
      pieces = g.act_units[r * g.kb + b] == 0.0f ? 0 : std::max<int>(pieces, g.act_piece_counts[r * g.kb + b]);
    __m256 partial[R][NT][2];
    if (pieces != 0) {
      __m256i sums[R][NT][2];
      if (pieces == 2) exact_fp4_tile_major_sums<R, NT, 2>(g, w, tile_bytes, b, prefetch_bytes, w_table, sums);
      else exact_fp4_tile_major_sums<R, NT, 3>(g, w, tile_bytes, b, prefetch_bytes, w_table, sums);
      for (int r = 0; r < R; ++r) {
        const __m256 unit = _mm256_set1_ps(g.act_units[r * g.kb + b]);
        for (int t = 0; t < NT; ++t)
          for (int h = 0; h < 2; ++h) partial[r][t][h] = _mm256_mul_ps(_mm256_cvtepi32_ps(sums[r][t][h]), unit);
      }
    } else {
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t)
          for (int h = 0; h < 2; ++h)
            partial[r][t][h] = fp4_tile_major_block_fp32(w + t * tile_bytes + b * block_bytes + 32 * h,
                                                         g.act + r * g.in + 32 * b, w_table);
    }
    for (int t = 0; t < NT; ++t) {
      // The tile's 16 scales of the block (16 consecutive bytes): a ue8m0 e is the fp32 whose exponent field is e,
      // except 0 (2^-127, subnormal in fp32) and 255 (NaN), which take the table.
      const uint8_t* scales = g.w_scales + (tile + t) * kTileMajorOutputs * g.kb + kTileMajorOutputs * b;
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
      const __m128i special = _mm_or_si128(_mm_cmpeq_epi8(bytes, _mm_setzero_si128()),
                                           _mm_cmpeq_epi8(bytes, _mm_set1_epi8(-1)));
      __m256 w_scale[2];
      if (_mm_movemask_epi8(special) == 0) {
        w_scale[0] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(bytes), 23));
        w_scale[1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), 23));
      } else {
        alignas(32) float table[kTileMajorOutputs];
        for (int i = 0; i < kTileMajorOutputs; ++i) table[i] = dt.e8m0_f32[scales[i]];
        w_scale[0] = _mm256_load_ps(table);
        w_scale[1] = _mm256_load_ps(table + kTile);
      }
      for (int r = 0; r < R; ++r) {
        const __m256 sa = _mm256_set1_ps(dt.e8m0_f32[g.act_scales[r * g.kb + b]]);
        for (int h = 0; h < 2; ++h)
          _mm256_store_ps(y[r][t][h], _mm256_add_ps(_mm256_load_ps(y[r][t][h]),
                                                    _mm256_mul_ps(_mm256_mul_ps(partial[r][t][h], sa), w_scale[h])));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(g.y + r * g.out + (tile + t) * kTileMajorOutputs + kTile * h, _mm256_load_ps(y[r][t][h]));
}

// decode_fp4_tile_major over tiles [tile_begin, tile_end) of 16 outputs, two at a time, 1..kFp4PassRows rows.
// (bench_linear --threads=2, avx2, this Xeon, w13_mxfp4_tiled, alternated 2x: rows:1 0.47-0.50 ms two at a time, 0.52
// one, 0.55-0.57 four; rows:4, when one pass took four rows, 1.48-1.49, 1.69-1.70 and 1.45-1.52.)
template <int R>
void decode_fp4_tile_major_range(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  int64_t tile = tile_begin;
  for (; tile + 2 <= tile_end; tile += 2) decode_fp4_tile_major<R, 2>(g, tile);
  if (tile < tile_end) decode_fp4_tile_major<R, 1>(g, tile);
}

}  // namespace

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

template void run_decode_rows<false>(const GemmArgs&, ThreadPool*);
template void run_decode_rows<true>(const GemmArgs&, ThreadPool*);

// The tile-major decode (FP8: decode_fp8_tile_major, decode_fp8_tile_major_rows; MXFP4: decode_fp4_tile_major)
// over every 16-output tile of g, one contiguous range per thread (as run_decode_rows), in passes of kFp8PassRows /
// kFp4PassRows rows over each pair of tiles; an FP8 range that met a NaN code is recomputed by gemm_tiles. The MXFP4
// kernel of R rows holds R x 2 tiles x 2 integer sums: four rows' 16 (all the registers) had spilled into their
// chains. (bench_linear, avx2, a Zen 3 EPYC, 3 alternations, minima of 5: w2_mxfp4_cached_tiled one thread rows:4 in
// one pass 97-101 us, in two 77-80; rows:3 62-64 -> 58-60; --threads=2 from memory, w2_mxfp4_tiled rows:4 1.00-1.26
// -> 0.77-0.78 ms, rows:3 0.66-0.68 -> 0.58-0.64, w13_mxfp4_tiled rows:4 1.42-1.49 -> 1.31-1.37, rows:3 1.06-1.13
// alike.)
template <bool kFp4>
void run_decode_tile_major(const GemmArgs& g, ThreadPool* pool) {
  // One pass of part's rows over tiles [begin, end); FP8: the largest magnitude code seen.
  auto pass = [](const GemmArgs& part, int64_t begin, int64_t end) -> uint8_t {
    if constexpr (kFp4) {
      if (part.rows == 1) decode_fp4_tile_major_range<1>(part, begin, end);
      else decode_fp4_tile_major_range<2>(part, begin, end);
      return 0;
    } else {
      switch (part.rows) {
        case 1: return decode_fp8_tile_major_range(part, begin, end);
        case 2: return decode_fp8_tile_major_rows_range<2>(part, begin, end);
        case 3: return decode_fp8_tile_major_rows_range<3>(part, begin, end);
        default: return decode_fp8_tile_major_rows_range<4>(part, begin, end);
      }
    }
  };
  constexpr int kPassRows = kFp4 ? kFp4PassRows : kFp8PassRows;
  auto body = [&](int64_t begin, int64_t end, int) {
    // One pass takes the whole range; several alternate over each pair of tiles.
    const int64_t group = g.rows <= kPassRows ? std::max<int64_t>(1, end - begin) : 2;
    uint8_t largest = 0;
    for (int64_t tile = begin; tile < end; tile += group)
      for (int64_t r0 = 0; r0 < g.rows; r0 += kPassRows)
        largest = std::max(largest, pass(row_slice(g, r0, std::min<int64_t>(g.rows, r0 + kPassRows)), tile,
                                         std::min(end, tile + group)));
    const int64_t tiles_per_tile = kTileMajorOutputs / kTile;
    if (!kFp4 && largest == 0x7f) gemm_tiles<false>(g, begin * tiles_per_tile, end * tiles_per_tile);
  };
  const int64_t tiles = g.out / kTileMajorOutputs;
  if (pool) pool->parallel_for_nodes(tiles, body, 1, 1);
  else body(0, tiles, 0);
}

template void run_decode_tile_major<false>(const GemmArgs&, ThreadPool*);
template void run_decode_tile_major<true>(const GemmArgs&, ThreadPool*);

}  // namespace dsflash::linear_impl::avx2
