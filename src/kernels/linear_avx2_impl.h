// Internals shared by the AVX2 table's two files (not part of the contract): linear_avx2.cpp holds the many-row
// lanes path (gemm_tiles), the entry points and the table; linear_avx2_decode.cpp the decode kernels of
// 1..kDecodeMaxRows rows (more in passes on tile-major weights). Every function here runs on the x86-64-v3 baseline
// (AVX2, FMA, F16C).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/linear.h"
#include "kernels/linear_tables.h"

namespace dsflash::linear_impl::avx2 {

constexpr int kTile = 8;           // outputs per tile: one ymm of fp32 results
constexpr int kDecodeMaxRows = 4;  // rows the decode kernels take (decode, and the few tokens of an expert)
// On tile-major weights the decode kernels also take up to kFp8PassMaxRows / kFp4PassMaxRows rows, in passes of
// kFp8PassRows / kFp4PassRows rows over each pair of tiles (the later passes read the tiles from the caches). A row's
// bits do not depend on its pass (both paths sum each block down k, the reference's order), and up to these counts
// the passes beat converting the weights into the many-row path's lanes, which too few rows share. (bench_linear
// --threads=2, avx2, a Zen 3 EPYC, 3 alternations, minima of 5, lanes -> passes: wo_b_fp8_tiled rows:12 10.0-10.3
// -> 7.9-9.0 ms, rows:16 12.3-12.6 -> 10.6-11.1, rows:24 16.9-17.1 -> 15.8-16.0, rows:32 21.4-21.7 -> 21.5-22.1;
// wq_b rows:16 11.4-12.1 -> 10.5-10.8, rows:24 16.1-16.4 -> 15.8-16.0, rows:32 20.7-21.3 -> 21.1-21.3;
// w13_mxfp4_tiled rows:12 5.0-5.5 -> 4.0-4.7, rows:16 6.3-6.5 -> 5.4-5.5, rows:24 8.8-8.9 -> 8.2-8.3, rows:32
// 11.2-11.4 -> 10.8-12.5; w2 rows:12 2.59-2.62 -> 2.26-2.29, rows:16 3.27-3.28 -> 3.06-3.84, rows:24 4.58 -> 4.49-4.54,
// rows:32 5.77-5.83 -> 6.17-7.36; wo_a_fp8_grouped_tiled (bf16 activations) rows:12 8.6-8.8 -> 6.5-6.7, rows:24
// 14.8-15.0 -> 13.1-13.7. From the caches, one thread, wo_b_fp8_cached_tiled rows:12 239-265 -> 202-204 us.)
constexpr int kFp8PassRows = 4;
constexpr int kFp8PassMaxRows = 24;
constexpr int kFp4PassRows = 2;  // the MXFP4 kernel's integer sums of more rows no longer fit in the registers
constexpr int kFp4PassMaxRows = 16;
// Bytes of one MXFP4 block's activation pieces (prepare_fp4_decode_rows): 3 pieces of 32 signed bytes.
constexpr int64_t kFp4PieceBlockBytes = 96;

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
inline const Fp4ByteTables& fp4_byte_tables() {
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

inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The tile-major FP8 decode (1..kFp8PassMaxRows rows) converts each code to its value times 2^-120 (the code's bits
// placed in a bf16 word, subnormal codes to fp32 subnormals) and multiplies activations times 2^64
// (GemmArgs::act_decode), so its products are the reference's times 2^-56. Every product and partial sum of a block
// is a multiple of 2^-9 (the smallest e4m3 step) times the smallest step of the row's activations; where that times
// 2^-56 is at least 2^-149 and nothing overflows, the scaled sums round exactly as the reference's (a power of two
// scales a normal fp32's rounding alike, and a multiple of 2^-149 below 2^-126 needs no rounding in either): e4m3
// activations always qualify, other fp32 activations where every nonzero |a| is in [2^-61, 2^64)
// (fp8_decode_activations). Scaling the block sum back by 2^56 is then exact.
constexpr int kFp8DecodeActLog2 = 64;
constexpr int kFp8DecodeSmallestActLog2 = -61;
constexpr float kFp8DecodeActScale = 0x1p64f;
constexpr float kFp8DecodeUnscale = 0x1p56f;  // 2^(120 - kFp8DecodeActLog2)

struct GemmArgs {
  const uint8_t* w = nullptr;         // FP8 codes [out, in] or FP4 packed [out, in/2]
  const uint8_t* w_scales = nullptr;  // FP8 [ceil(out/32), kb] or FP4 [out, kb], ue8m0
  int64_t out = 0, in = 0, kb = 0, rows = 0;
  bool tile_major = false;             // weight order (kernels/linear.h)
  bool may_hold_nan = true;            // FP8: Fp8Weight::may_hold_nan
  const float* act = nullptr;          // [rows, in] fp32 values
  // gemm_tiles only: act holds each value times its block's act scale, and the lanes take each weight times its
  // scale, so that every block's sum comes out as the reference's (partial * sa) * sw (exact where
  // scales_keep_scaled_sums_exact says so); false: the scales multiply each block's sum.
  bool act_times_scales = false;
  // FP8, tile-major weights, 1..kFp8PassMaxRows rows: act times kFp8DecodeActScale, where that keeps the decode's
  // bits (see above); null: those rows take gemm_tiles.
  const float* act_decode = nullptr;
  // MXFP4 rows of the decode kernels (decode_rows_tiles: up to kDecodeMaxRows, decode_fp4_tile_major: up to
  // kFp4PassMaxRows): each block's values in the order of the weights' nibbles, and the same values as integers
  // where that is exact (prepare_fp4_decode_rows): N in signed byte pieces [rows, kb, kFp4PieceBlockBytes], units
  // [rows, kb] (0: the block is not exact), piece counts [rows, kb] (2 or 3).
  const int8_t* act_pieces = nullptr;
  const float* act_units = nullptr;
  const uint8_t* act_piece_counts = nullptr;
  const int32_t* act_int_offsets = nullptr;  // [rows, kb]: 12 * Σ N of each block
  const uint8_t* act_scales = nullptr;  // [rows, kb] ue8m0
  float* y = nullptr;                  // [rows, out]
};

// Rows [r0, r1) of g: every per-row operand moved to row r0 (null ones stay null).
inline GemmArgs row_slice(const GemmArgs& g, int64_t r0, int64_t r1) {
  GemmArgs part = g;
  part.rows = r1 - r0;
  auto move = [&](auto*& p, int64_t row_elements) {
    if (p != nullptr) p += r0 * row_elements;
  };
  move(part.act, g.in);
  move(part.act_decode, g.in);
  move(part.act_pieces, g.kb * kFp4PieceBlockBytes);
  move(part.act_units, g.kb);
  move(part.act_piece_counts, g.kb);
  move(part.act_int_offsets, g.kb);
  move(part.act_scales, g.kb);
  move(part.y, g.out);
  return part;
}

// The many-row path (linear_avx2.cpp): y [rows, out] of g's rows for the 8-output tiles [tile_begin, tile_end).
template <bool kFp4>
void gemm_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end);

// The decode kernels (linear_avx2_decode.cpp).
// MXFP4 decode rows from their e4m3 codes x [rows, in]: values [rows, in] fp32 with each block in the order its
// weights' nibbles come out, and the same values as the integers N in pieces [rows, in / 32, kFp4PieceBlockBytes]
// (that order too), with units [rows, in / 32] = 2^(s-11), 0 where the block is not exact (a NaN code, or
// 12 Σ |N| >= 2^24), piece counts [rows, in / 32] (3 where some p2 is not 0, else 2) and offsets [rows, in / 32] =
// 12 * Σ N of each block (what W + 12 adds). The order: row-major weights (tile_major false): even k 0..14, even k
// 16..30, odd k 1..15, odd k 17..31 (a packed block's low nibbles, then its high ones); tile-major: k 0 4 1 5 2 6 3 7
// of each 8 (a tile-major vector's low nibbles of an output's dword, then its high ones; kernels/linear.h). The
// values come through fp16 (e4m3_fp16_words; NaN blocks from the table), and N = value * 2^(10-s): exact integers.
void prepare_fp4_decode_rows(const Fp8Activations& x, bool tile_major, float* values, int8_t* pieces, float* units,
                             uint8_t* piece_counts, int32_t* offsets);
// g.rows (1..kDecodeMaxRows) on row-major weights, one contiguous range of tiles per thread.
template <bool kFp4>
void run_decode_rows(const GemmArgs& g, ThreadPool* pool);
// g.rows (FP8 1..kFp8PassMaxRows, MXFP4 1..kFp4PassMaxRows) on tile-major weights, one contiguous range of tiles per
// thread.
template <bool kFp4>
void run_decode_tile_major(const GemmArgs& g, ThreadPool* pool);

}  // namespace dsflash::linear_impl::avx2
