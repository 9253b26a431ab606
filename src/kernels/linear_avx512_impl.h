// Internals shared by the AVX-512 FP8 / MXFP4 linear kernels: linear_avx512.cpp (the dispatch),
// linear_avx512_rows.cpp (the multi-row path), linear_avx512_tiled.cpp (decode and small batches on tile-major
// weights), linear_avx512_row_major.cpp (the decode paths on the checkpoint's row-major order) and linear_amx.cpp.
// Not part of the kernel contract (kernels/linear.h).
// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -W(maybe-)uninitialized (the latter at
// the sanitizer build's -O1).
#pragma once
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/linear.h"
#include "kernels/linear_impl.h"

// The one target string of the AVX-512 linear files; every function that uses AVX-512 intrinsics carries it.
// These files are compiled four times. Once as they are: the "avx512" tables (and "amx"), in dsflash::linear_impl.
// Once with DSFLASH_AVX512_NO_BF16 defined to 1 (linear_avx512_no_bf16.cpp): the table for AVX-512 CPUs without
// AVX512-BF16 (Ice Lake-SP, Ice Lake / Tiger Lake / Rocket Lake clients), in linear_impl::avx512_no_bf16, under a
// target string without avx512bf16. There the compiler itself refuses any bf16 instruction (an intrinsic of a target
// the function lacks does not compile), so a path that needs one must stay uninstantiated (kAvx512Bf16 below) or
// the build fails: that copy provably runs on those CPUs. Every multiply there is an fp32 FMA in vdpbf16ps's order,
// and there are no AMX tiles.
// A third compile defines DSFLASH_AVX512_NO_VBMI too (linear_avx512_no_vbmi.cpp): the table for AVX-512 CPUs with
// VNNI but without VBMI (Cascade Lake), in linear_impl::avx512_no_vbmi, under a target string without avx512vbmi
// either: its byte lookups take vpermt2w / vpshufb (kAvx512Vbmi below), and its row-major weights the avx2 table.
// A fourth defines DSFLASH_AVX512_NO_VNNI too (linear_avx512_no_vnni.cpp): F/BW/VL/DQ only (Skylake-SP), in
// linear_impl::avx512_no_vnni: MXFP4 blocks take the FMA chain instead of the exact integer dots (kAvx512Vnni).
#ifndef DSFLASH_AVX512_NO_BF16
#define DSFLASH_AVX512_NO_BF16 0
#endif
#ifndef DSFLASH_AVX512_NO_VBMI
#define DSFLASH_AVX512_NO_VBMI 0
#endif
#ifndef DSFLASH_AVX512_NO_VNNI
#define DSFLASH_AVX512_NO_VNNI 0
#endif
#if DSFLASH_AVX512_NO_VNNI
#define DSFLASH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define DSFLASH_AVX512_NAMESPACE dsflash::linear_impl::avx512_no_vnni
#elif DSFLASH_AVX512_NO_VBMI
#define DSFLASH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define DSFLASH_AVX512_NAMESPACE dsflash::linear_impl::avx512_no_vbmi
#elif DSFLASH_AVX512_NO_BF16
#define DSFLASH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vnni")))
#define DSFLASH_AVX512_NAMESPACE dsflash::linear_impl::avx512_no_bf16
#else
#define DSFLASH_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,avx512vnni")))
#define DSFLASH_AVX512_NAMESPACE dsflash::linear_impl
#endif

namespace DSFLASH_AVX512_NAMESPACE {

// What this copy may use: vdpbf16ps and AMX tiles (else only fp32 FMAs), VBMI's byte permutes, VNNI's vpdpbusd.
// Each compile drops the ones before it too.
constexpr bool kAvx512Bf16 = !DSFLASH_AVX512_NO_BF16;
constexpr bool kAvx512Vbmi = !DSFLASH_AVX512_NO_VBMI;
constexpr bool kAvx512Vnni = !DSFLASH_AVX512_NO_VNNI;
static_assert((kAvx512Bf16 <= kAvx512Vbmi) && (kAvx512Vbmi <= kAvx512Vnni), "each copy drops the features before it");

// Declared in linear_impl.h and defined by these files: declared again in this namespace, so that each further
// copy calls its own copies (in the first compile these are the same declarations).
void prepare_exact_fp4_rows(const uint8_t* codes, int64_t rows, int64_t k, int8_t* pieces, int32_t* biases,
                            float* units, uint8_t* piece_counts);
void exact_fp4_blocks(const uint8_t* codes, int64_t k, uint8_t* exact);
void bf16_gemm_avx512(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool);
bool bf16_exact_avx512(const float* x, int64_t n);
void narrow_bf16_rows_avx512(const float* x, int64_t x_stride, int64_t k, int64_t k_pad, uint16_t* out, int64_t r0,
                             int64_t r1);

constexpr int kTile = 16;         // outputs per tile: one zmm of fp32 results
static_assert(kTile == kTileMajorOutputs);
constexpr int64_t kGroupBytes = 64;  // row-major paths: one zmm of an output's bytes

// The MXFP4 integer decode's weights W = 2 * e2m1 in [-12, 12] enter vpdpbusd as unsigned W + 12
// (prepare_exact_fp4_rows).
constexpr int kExactFp4WeightBias = 12;

// bf16 bits of the e4m3 magnitudes 0..127 split into low and high bytes (vpermt2b looks up 128 entries);
// the sign bit is ORed into the high byte. bf16 bits of the 16 e2m1 codes for vpermw.
struct Avx512Tables {
  alignas(64) uint8_t fp8_lo[128];
  alignas(64) uint8_t fp8_hi[128];
  // The same bytes for codes that are zero or normal, from 6 bits each (fp8_plain_to_bf16): the low byte from
  // magnitude bits 0-5 (mantissa and the exponent's low 3 bits; exponents e and e + 8 share it), the high byte
  // from bits 1-6 (exponent and the mantissa's high 2 bits).
  alignas(64) uint8_t fp8_plain_lo[64];
  alignas(64) uint8_t fp8_plain_hi[64];
  alignas(64) uint16_t fp8_words[128];  // the same bf16 words, for vpermt2w (no VBMI)
  alignas(64) uint16_t fp4[32];
  alignas(64) float fp4_f32[16];  // the e2m1 values as fp32, for vpermps
  alignas(64) uint8_t fp4_biased[64];  // 2 * e2m1 + kExactFp4WeightBias of code c % 16, for vpermb (one-row decode)
  // Multi-row transposition (see convert_block_fp8 / convert_block_fp4).
  alignas(64) uint16_t fp8_gather[2][32];  // vpermt2w: 4 outputs x 8 code pairs per 128-bit lane
  alignas(64) uint8_t interleave[2][64];   // vpermt2b: (lo, hi) bytes of codes 0-31 / 32-63 -> bf16 words
  alignas(64) uint8_t fp4_gather[64];      // vpermb: 4 outputs x 4 packed bytes per 128-bit lane
  alignas(64) uint8_t scale_regroup[64];   // vpermb: byte 16q + 4n + t <- 16n + 4q + t
  alignas(64) uint8_t fp4_lo[64];          // vpshufb: e2m1 code -> low / high byte of its bf16 (x4 lanes)
  alignas(64) uint8_t fp4_hi[64];
};
// Built once before main (a function-local static would put its guard's check and a call in every decode kernel
// call, thousands per step).
extern const Avx512Tables kAvx512Tables;
inline const Avx512Tables& avx512_tables() { return kAvx512Tables; }

struct GemmArgs {
  const uint8_t* w = nullptr;         // FP8 codes [out, in] or FP4 packed [out, in/2]
  const uint8_t* w_scales = nullptr;  // FP8 [ceil(out/32), kb] or FP4 [out, kb] (tile-major: [out/16, kb, 16]), ue8m0
  int64_t out = 0, in = 0, kb = 0, npairs = 0, rows = 0;
  bool tile_major = false;  // weight order (kernels/linear.h)
  const uint16_t* act = nullptr;      // prepared [rows, npairs, 64] bf16
  // The activations as fp32 (the values of act) where the multi-row path or the decode passes multiply with fp32
  // FMAs (RowsMultiply::kFp32Fma); nullptr: vdpbf16ps on act. Row r's k at act_f32[(k / kChunkInputs) *
  // act_f32_chunk_stride + r * act_f32_row_stride + k % kChunkInputs]: row-major [rows, in] (row stride in, chunk
  // stride kChunkInputs), or in the multi-row path chunk-major [in / kChunkInputs rounded up, rows, kChunkInputs]
  // (row stride kChunkInputs, chunk stride rows * kChunkInputs), so that the rows' inputs of one scratch chunk
  // are contiguous.
  const float* act_f32 = nullptr;
  int64_t act_f32_row_stride = 0, act_f32_chunk_stride = 0;
  const uint8_t* act_scales = nullptr;  // [rows, kb] ue8m0
  // MXFP4 rows of the tile-major decode as integers where that is exact (prepare_exact_fp4_rows, kernels/linear_impl.h):
  // exact_pieces [rows, kb, kExactFp4PieceBlockBytes] the activations' integer bytes, exact_biases [rows, kb] int32,
  // exact_units [rows, kb] the value of one integer product unit, exact_piece_counts [rows, kb] the byte pieces a
  // block takes (2 or 3; 0 where it keeps the bf16 chain).
  const int8_t* exact_pieces = nullptr;
  const int32_t* exact_biases = nullptr;
  const float* exact_units = nullptr;
  const uint8_t* exact_piece_counts = nullptr;
  // MXFP4 rows on AMX tiles: [rows, kb], 1 where a block's products sum exactly in any order (exact_fp4_blocks),
  // so the tile unit's sum is the bf16 chain's; the other blocks take the chain. nullptr (FP8 in the "amx" table):
  // every block as the tile unit sums it.
  const uint8_t* exact_blocks = nullptr;
  // Every act_scales code is 127 (1.0): the activations carry their scales (prepare_activation_bf16) or have none.
  // rows_chunk then skips the exact multiply by 1.0 (an optimisation only; the bits are the same).
  bool unit_act_scales = false;
  // With unit_act_scales from e4m3 codes: the multi-row path may also fold each chunk's weight scales into its
  // converted weights where that is exact, given the exponents (code - 127) of the activation scales folded.
  bool fold_weight_scales = false;
  int act_exponent_low = 0, act_exponent_high = 0;
  float* y = nullptr;                 // [rows, out]
  // FP8 tile-major: [out/16, kb], Fp8Weight::plain_code_blocks (nullptr: none known).
  const uint8_t* plain_code_blocks = nullptr;
  // Whether tile t's block b is known to hold only zero or normal codes.
  bool plain_block(int64_t tile, int64_t b) const {
    return plain_code_blocks != nullptr && plain_code_blocks[tile * kb + b] != 0;
  }
  // The arguments from row r0 on (every per-row array is row-major).
  void advance_rows(int64_t r0) {
    if (act != nullptr) act += r0 * in;  // either may be absent (null)
    if (act_f32 != nullptr) act_f32 += r0 * act_f32_row_stride;
    act_scales += r0 * kb;
    if (exact_blocks != nullptr) exact_blocks += r0 * kb;
    if (exact_pieces != nullptr) {
      exact_pieces += r0 * kb * kExactFp4PieceBlockBytes;
      exact_biases += r0 * kb;
      exact_units += r0 * kb;
      exact_piece_counts += r0 * kb;
    }
    y += r0 * out;
  }
};

// 64 e4m3 codes (two blocks of one output) -> W0, W1 bf16 in the FP8 lane order.
DSFLASH_AVX512 inline void fp8_to_bf16(__m512i codes, __m512i lo0, __m512i lo1, __m512i hi0, __m512i hi1,
                                       __m512i* w0, __m512i* w1) {
  __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);
  __m512i hi = _mm512_permutex2var_epi8(hi0, codes, hi1);
  hi = _mm512_ternarylogic_epi32(hi, codes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (c & 0x80)
  *w0 = _mm512_unpacklo_epi8(lo, hi);
  *w1 = _mm512_unpackhi_epi8(lo, hi);
}

// fp8_to_bf16 for codes that are all zero or normal (no subnormal, no NaN: fp8_code_is_subnormal_or_nan), from the
// 64-entry tables: one vpermb each instead of a vpermt2b each (a register-only loop on this project's Xeon: 8
// vpermt2b take ~15 cycles, 8 vpermb ~7.5, and beside FMAs a vpermt2b delays them ~1.5 cycles, a vpermb ~0.4).
DSFLASH_AVX512 inline void fp8_plain_to_bf16(__m512i codes, __m512i plain_lo, __m512i plain_hi, __m512i* w0,
                                             __m512i* w1) {
  const __m512i lo = _mm512_permutexvar_epi8(codes, plain_lo);  // vpermb reads bits 0-5 of each index byte
  __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(codes, 1), plain_hi);  // bits 1-6 (bit 7: the next byte's)
  hi = _mm512_ternarylogic_epi32(hi, codes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (c & 0x80)
  *w0 = _mm512_unpacklo_epi8(lo, hi);
  *w1 = _mm512_unpackhi_epi8(lo, hi);
}

// Without VBMI: 32 e4m3 codes, one in the low byte of each word (high byte zero), -> their bf16 words, from the
// magnitudes' words (tables: fp8_words in 4 vectors of 32) by two vpermt2w (64 entries each), the sign ORed in.
DSFLASH_AVX512 inline __m512i fp8_words_to_bf16(__m512i codes, const __m512i* tables) {
  const __m512i magnitude = _mm512_and_si512(codes, _mm512_set1_epi16(0x7f));
  const __m512i low = _mm512_permutex2var_epi16(tables[0], magnitude, tables[1]);
  const __m512i high = _mm512_permutex2var_epi16(tables[2], magnitude, tables[3]);
  const __m512i words = _mm512_mask_mov_epi16(low, _mm512_test_epi16_mask(magnitude, _mm512_set1_epi16(0x40)), high);
  return _mm512_ternarylogic_epi32(words, _mm512_slli_epi16(codes, 8), _mm512_set1_epi16(static_cast<short>(0x8000)),
                                   0xF8);  // words | (codes << 8 & 0x8000)
}

// ue8m0 codes (in the low byte of each dword) -> 2^(code-127) as fp32; code 0 is the subnormal 2^-127 and
// 0xff is NaN, as in linear_decode_tables().
DSFLASH_AVX512 inline __m512 e8m0_to_f32_x16(__m512i codes) {
  __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(codes, 23));
  v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(codes, _mm512_setzero_si512()),
                         _mm512_castsi512_ps(_mm512_set1_epi32(0x00400000)));
  return _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(codes, _mm512_set1_epi32(0xff)),
                            _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

// c[m] lane l = y[l] lane m (4x4 transpose of 128-bit lanes).
DSFLASH_AVX512 inline void transpose_lanes(const __m512i* y, __m512i* c) {
  const __m512i t0 = _mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i t1 = _mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i t2 = _mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i t3 = _mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(3, 2, 3, 2));
  c[0] = _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
  c[1] = _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
  c[2] = _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
  c[3] = _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
}

// FP4 weight scales of the tile's 16 outputs for blocks [b_begin, b_end): sw[b - b_begin][i].
// Each output has its own scale row [kb]: 16 blocks of the 16 rows are loaded as 16 x 16 bytes and
// transposed like the multi-row weights (vpermb + lane transpose + vpermb), then widened per block.
// (A dword gather per 4 blocks, the obvious alternative, stalls on AMD: 16 lines per instruction.)
DSFLASH_AVX512 inline void fp4_weight_scales(const GemmArgs& g, const int64_t* rows_o, int64_t b_begin,
                                             int64_t b_end, float (*sw)[kTile]) {
  const Avx512Tables& at = avx512_tables();
  const __m512i gather = _mm512_load_si512(at.fp4_gather), regroup = _mm512_load_si512(at.scale_regroup);
  for (int64_t b = b_begin; b < b_end; b += 16) {
    const int nb = static_cast<int>(std::min<int64_t>(16, b_end - b));
    const __mmask16 m = static_cast<__mmask16>((1u << nb) - 1);
    __m512i y[4], q[4];
    for (int n = 0; n < 4; ++n) {
      auto ld = [&](int t) DSFLASH_AVX512 {
        const uint8_t* src = g.w_scales + rows_o[4 * n + t] * g.kb + b;
        return b + 16 <= g.kb ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)) : _mm_maskz_loadu_epi8(m, src);
      };
      __m512i z = _mm512_castsi128_si512(ld(0));
      z = _mm512_inserti32x4(z, ld(1), 1);
      z = _mm512_inserti32x4(z, ld(2), 2);
      z = _mm512_inserti32x4(z, ld(3), 3);
      y[n] = _mm512_permutexvar_epi8(gather, z);  // lane j/4: byte 4 (j%4) + t = output 4n+t, block j
    }
    transpose_lanes(y, q);  // q[j/4] byte 16n + 4 (j%4) + t = output 4n+t, block j
    float(*dst)[kTile] = sw + (b - b_begin);
    for (int j4 = 0; j4 < 4 && 4 * j4 < nb; ++j4) {
      const __m512i r = _mm512_permutexvar_epi8(regroup, q[j4]);  // lane j%4 = block j, byte = output
      _mm512_store_ps(dst[4 * j4], e8m0_to_f32_x16(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(r))));
      if (4 * j4 + 1 < nb) _mm512_store_ps(dst[4 * j4 + 1], e8m0_to_f32_x16(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(r, 1))));
      if (4 * j4 + 2 < nb) _mm512_store_ps(dst[4 * j4 + 2], e8m0_to_f32_x16(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(r, 2))));
      if (4 * j4 + 3 < nb) _mm512_store_ps(dst[4 * j4 + 3], e8m0_to_f32_x16(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(r, 3))));
    }
  }
}

// FP4 weight scales of tile `tile` ([16 outputs, kb] ue8m0 in either order, contiguous) into the cache. The
// transposing loads of fp4_weight_scales touch 16 lines at once and would otherwise wait for memory.
DSFLASH_AVX512 inline void prefetch_fp4_scales(const GemmArgs& g, int64_t tile) {
  const int64_t o0 = tile * kTile;
  if (o0 >= g.out) return;
  const uint8_t* base = g.w_scales + o0 * g.kb;
  const int64_t bytes = std::min<int64_t>(kTile, g.out - o0) * g.kb;
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(base + off), _MM_HINT_T0);
}
// The 16 FP4 tile-major scales (kernels/linear.h) of tile `tile`, block b (16 consecutive bytes), as fp32.
DSFLASH_AVX512 inline __m512 fp4_tiled_block_scales(const GemmArgs& g, int64_t tile, int64_t b) {
  return e8m0_to_f32_x16(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.w_scales + (tile * g.kb + b) * kTile))));
}
// Those of blocks [b_begin, b_end).
DSFLASH_AVX512 inline void fp4_tiled_scales(const GemmArgs& g, int64_t tile, int64_t b_begin, int64_t b_end,
                                            float (*sw)[kTile]) {
  for (int64_t b = b_begin; b < b_end; ++b) _mm512_store_ps(sw[b - b_begin], fp4_tiled_block_scales(g, tile, b));
}

// ---- Tile-major vectors ----
// A 32-K block of a tile-major tile is kTiledVectors<kFp4> vectors of 64 bytes; vector v decodes to the pairs
// j = kTiledPairs * v + p (p < kTiledPairs) as zmm W_j, dword lane i = output i's bf16 (k = 2j, 2j+1) of the block.
template <bool kFp4>
constexpr int kTiledVectors = kFp4 ? 4 : 8;
template <bool kFp4>
constexpr int kTiledPairs = kFp4 ? 4 : 2;

// The lookup tables of tiled_pairs, loaded once per call of a kernel (FP8: the four halves of the byte tables;
// FP4: the e2m1 word table in the first).
template <bool kFp4>
DSFLASH_AVX512 inline void load_tiled_tables(__m512i* tables) {
  const Avx512Tables& at = avx512_tables();
  if constexpr (kFp4) {
    tables[0] = _mm512_load_si512(at.fp4);
  } else if constexpr (!kAvx512Vbmi) {
    for (int i = 0; i < 4; ++i) tables[i] = _mm512_load_si512(at.fp8_words + 32 * i);
  } else {
    tables[0] = _mm512_load_si512(at.fp8_lo);
    tables[1] = _mm512_load_si512(at.fp8_lo + 64);
    tables[2] = _mm512_load_si512(at.fp8_hi);
    tables[3] = _mm512_load_si512(at.fp8_hi + 64);
  }
}

template <bool kFp4>
DSFLASH_AVX512 inline void tiled_pairs(const uint8_t* vector, const __m512i* tables, __m512i* w) {
  const __m512i raw = _mm512_loadu_si512(vector);
  if constexpr (kFp4) {
    // vpermw reads the low 5 bits of a word: nibble q and the next one's low bit (the table repeats).
    w[0] = _mm512_permutexvar_epi16(raw, tables[0]);
    w[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 4), tables[0]);
    w[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 8), tables[0]);
    w[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 12), tables[0]);
  } else if constexpr (!kAvx512Vbmi) {  // the words of fp8_to_bf16's order: unpack with zero, then look up
    w[0] = fp8_words_to_bf16(_mm512_unpacklo_epi8(raw, _mm512_setzero_si512()), tables);
    w[1] = fp8_words_to_bf16(_mm512_unpackhi_epi8(raw, _mm512_setzero_si512()), tables);
  } else {
    fp8_to_bf16(raw, tables[0], tables[1], tables[2], tables[3], &w[0], &w[1]);
  }
}

// tiled_pairs of FP8 codes known to be all zero or normal (Fp8Weight::plain_code_blocks), from the 64-entry tables
// (VBMI; plain_tables: fp8_plain_lo, fp8_plain_hi).
DSFLASH_AVX512 inline void tiled_plain_fp8_pairs(const uint8_t* vector, const __m512i* plain_tables, __m512i* w) {
  fp8_plain_to_bf16(_mm512_loadu_si512(vector), plain_tables[0], plain_tables[1], &w[0], &w[1]);
}
DSFLASH_AVX512 inline void load_plain_fp8_tables(__m512i* plain_tables) {
  plain_tables[0] = _mm512_load_si512(avx512_tables().fp8_plain_lo);
  plain_tables[1] = _mm512_load_si512(avx512_tables().fp8_plain_hi);
}

// Broadcast activation pair j of a block (bf16 [32] at `block`) to every lane.
DSFLASH_AVX512 inline __m512bh activation_pair(const uint16_t* block, int j) {
  uint32_t pair;
  std::memcpy(&pair, block + 2 * j, 4);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
}

// A bf16 pair vector (dword lane = one output's pair) as fp32: the odd elements (the high halves) and the even ones
// (the low halves shifted up), for the FMA twin of vdpbf16ps (RowsMultiply::kFp32Fma).
DSFLASH_AVX512 inline void pair_as_fp32(__m512i pairs, __m512* odd, __m512* even) {
  *odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}

// ---- Multi-row path (linear_avx512_rows.cpp) ----
constexpr int kBlocksPerChunk = 8;  // 2 tiles x 8 blocks x 1 KB = 16 KB of scratch, in L1 while rows pass
constexpr int64_t kChunkInputs = 32 * kBlocksPerChunk;
// Scratch of one tile for one chunk: [block][pair j] zmm, lane = output o's bf16 pair (k = 2j, 2j+1) as a dword.
// One block of it is also an AMX B tile: 16 rows (j) of 64 bytes in the VNNI pair layout TDPBF16PS reads.
using TileScratch = __m512i[kBlocksPerChunk * 16];
// Which scales a block's partial still needs: y = y + (partial * sa) * sw, less those folded into the operands.
enum class BlockScales {
  kActAndWeight,  // y += (partial * sa) * sw
  kWeight,        // sa folded into the activations: y += partial * sw
  kNone,          // sw folded into the scratch weights too (fold_weight_scales): y += partial
};

// ---- AMX (linear_amx.cpp) ----
constexpr int64_t kAmxPaddingRows = 15;
// Weight tiles per activation tile load from kAmxWideRows rows on (scratch 8 x 8 KB, in L2); 2 below. Measured
// (bench_linear, 1 thread, rows 2048): 2 tiles per pass kept the tile unit at ~0.07 of its peak (the activations
// re-read from L3), 4 at ~0.09, 8 at ~0.11-0.12; for one row, 8 took 2.2x the time of 2. In one process, calls
// alternating the two (2 threads, medians of 100-200 calls each; MXFP4 4608 x 2 x 5120, FP8 8192 x 5120 on "amx"),
// 2 against 8 tiles: MXFP4 5 rows 1741 / 2830 us, 12 rows 3080 / 3584, 16 rows 3820-3882 / 4281-4390, 24 rows
// 5478-5613 / 6052-6265, 32 rows 6824-7180 / 6725-7037, 48 rows 10252 / 9472, 64 rows 14073 / 12454; FP8 16 rows
// 3558 / 4289, 24 rows 5265 / 5936, 32 rows 6190 / 6511, 48 rows 9554 / 8991, 64 rows 12371 / 11418.
constexpr int kAmxTilesPerPass = 8;
constexpr int64_t kAmxWideRows = 32;
// From here on the AVX-512 tables run MXFP4 GEMMs on tile-major weights on AMX tiles where the CPU has them
// (run_block_gemm, GemmArgs::exact_blocks). On a 2-core Xeon (bench_linear --threads=2, avx512fma rows; act_quant'ed
// hidden states for w13 4608 x 2 x 5120, SwiGLU outputs for w2 5120 x 2304), against the passes of the decode path:
// 5 rows w13 1.76-1.97 -> 1.18-1.20 ms, w2 0.77-0.80 -> 0.59-0.65; 8 rows 2.15-2.29 -> 1.41-1.48, 1.01-1.12 ->
// 0.77-0.78. At 4 rows the decode path ties or wins (w13 1.01 ms both, w2 0.50 against 0.54 on tiles).
constexpr int64_t kFp4AmxMinRows = 5;
// The multi-row path's chunk step on AMX tiles, for all `rows` rows, in groups of 16 (act must have
// kAmxPaddingRows readable rows past `rows`; their results are dropped): per block, TDPBF16PS forms the 16 x 16
// block partials of 16 rows and one weight tile from a fresh zero tile, then y = y + (partial * sa) * sw as
// rows_chunk does. Same arguments as rows_chunk, plus `nt` adjacent weight tiles (1..kAmxTilesPerPass) and
// exact_blocks (GemmArgs::exact_blocks of row 0 at the chunk's first block, stride kb; or nullptr), where a block
// that is not exact takes rows_chunk's vdpbf16ps chain on the same scratch instead. The calling thread configures
// its tiles first (AmxTiles).
void amx_rows_chunk(const TileScratch* scratch, int nt, int nb, const float (*const* sw)[kTile], const uint16_t* act,
                    int64_t k, const uint8_t* sa, int64_t kb, float* y, int64_t out, int64_t rows, bool first,
                    const __mmask16* masks, BlockScales scales, const uint8_t* exact_blocks);
// The tile configuration amx_rows_chunk expects for `rows` rows, held by the calling thread for the object's
// lifetime.
class AmxTiles {
 public:
  explicit AmxTiles(int64_t rows);
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};

// Tiles [tile_begin, tile_end) of y for all g.rows rows on the multi-row path (linear_avx512_rows.cpp): the weights
// converted chunk by chunk into TileScratch, every row passing over each chunk by vdpbf16ps (g.act) or fp32 FMAs
// (g.act_f32); with `amx` (MXFP4 GEMMs on AMX tiles, or the "amx" table's FP8) by amx_rows_chunk instead.
template <bool kFp4>
void multi_row_tiles(const GemmArgs& g, bool amx, int64_t tile_begin, int64_t tile_end);

// ---- Decode on tile-major weights (linear_avx512_tiled.cpp) ----
constexpr int64_t kTiledDecodeMaxRows = 4;
// The passes a GEMM of `rows` rows runs (tiled_decode_passes balances them: the smallest has rows / passes rows).
constexpr int64_t tiled_decode_pass_count(int64_t rows) {
  return (rows + kTiledDecodeMaxRows - 1) / kTiledDecodeMaxRows;
}
// Whether a tiled pass of `rows` rows sums an MXFP4 block whose rows need `pieces` (2 or 3) byte pieces in integers
// (exact_fp4_blocks) rather than by the vdpbf16ps chain, whose bits they give. Per 64-byte vector the integers take 2 x
// pieces vpdpbusd per row, the chain 4 vdpbf16ps per row after a conversion the rows share; on the Zen 5 VM both issue
// two per cycle, on the same two pipes as vpermb / vpermw and vmulps (a scratch asm loop of 12 independent vpdpbusd per
// iteration: 4 vpermb, vpermw or vmulps beside them add 2 cycles, 4 vpaddd, shifts, vcvtdq2ps or broadcasts none). One
// row keeps the integers (its chains alone wait on vdpbf16ps's latency: 6.2 us on the L2-resident w2 shape below, 11 us
// on the VNNI-free table's chain), two rows where two pieces do; from three rows the chain wins, and a pass that takes
// no integers skips prepare_exact_fp4_rows too. bench_linear, w2_mxfp4_cached_tiled (256 x 2304, one thread, min of 12
// calls, variants alternated): 2 rows 11.4 us (integers, three pieces where a row needs them) / 10.3 (the chain for
// three-piece blocks) / 10.6 (the chain throughout); 3 rows 18.0 / 14.1 / 13.3, 4 rows 25.4 / 19.2 / 17.5; with the
// preparation skipped too, against the old kernel in another alternation, 3 rows 19.2 -> 11.1 and 4 rows 30.5 -> 14.2.
// Cold copies, two threads (w13_mxfp4_tiled 4608 x 5120 and w2_mxfp4_tiled 5120 x 2304, min of 12): 3 rows 0.408 ->
// 0.289 and 0.204 -> 0.154 ms, 4 rows 0.541 -> 0.353 and 0.334 -> 0.187. With kFma the alternative is 8 FMAs per row:
// the integers throughout.
constexpr bool tiled_fp4_takes_integers(int64_t rows, int pieces, bool fma) {
  return fma || rows == 1 || (rows == 2 && pieces == 2);
}
// Up to here the tile-major path runs several passes of at most kTiledDecodeMaxRows rows rather than the multi-row
// path, whose weight conversion into the scratch costs more than re-reading the tiles from cache per pass until
// many rows share it. Medians of calls on cold copies, 2 threads, the multi-row path against the passes alternated
// call by call: MXFP4 4608 x 5120 722 -> 498 us (5 rows), 860 -> 694 (8), 1353 -> 1066 (12), 2931 -> 2668 (28),
// 3297 -> 3088 (40), 4819 -> 4570 (48), 6066 vs 6026 (64) and 8526 -> 8747 (96); FP8 5120 x 8192 1580 -> 1370
// (5), 1618 -> 1423 (8), 2356 -> 1942 (10), 2683 -> 2476 (12), 2883 -> 2946 (14), 3199 -> 3317 (16).
// Those were measured on a 2-core Zen 5 VM before the MXFP4 passes took integer dots. Passes of three and four rows
// through integers then lost to the multi-row path from 8 rows on, and the table with vdpbf16ps ran one MXFP4 pass at
// most; with those passes back on the chain (tiled_fp4_takes_integers) the passes win again up to 48 rows
// (bench_linear --threads=2, w13 4608 x 2 x 5120 and w2 5120 x 2304 of SwiGLU outputs, the limit of 4 rows against
// a higher one alternated, min of 12 calls): 8 rows 1.01 -> 0.77 and 0.55 -> 0.38 ms, 12 rows 1.14 -> 0.94 and
// 0.61 -> 0.49, 16 rows 1.36 -> 1.25 and 0.73 / 0.74, 24 rows 2.05 -> 1.93 and 1.06 -> 0.98, 32 rows 2.67 -> 2.54
// and 1.38 -> 1.31, 64 rows 4.83 / 4.89 and 2.58 / 2.42 (a tie). Where the CPU has AMX, MXFP4 GEMMs of 5 rows or
// more run on tiles (kFp4AmxMinRows) before this limit applies. FP8 keeps its limit (at 6 and 8 rows the passes
// won by 2-15%, at 12 they tied; at 16, 2.76 -> 2.63 ms for wq_b and a tie for wo_b: left as it is).
constexpr int64_t tiled_passes_max_rows(bool fp4) {
  return (fp4 ? 12 : 3) * kTiledDecodeMaxRows;
}
// g.rows rows (up to tiled_passes_max_rows; passes of at most kTiledDecodeMaxRows rows run one after another on
// each group of tiles, so the second pass on reads them from the core's caches: alternated call by call against
// one pool pass per row pass, 4608 x 5120 MXFP4 1151 -> 1108 us at 12 rows, 1385 -> 1297 at 16, FP8 5120 x 8192
// 1423 -> 1301 at 8), tiles [tile_begin, tile_end) of y, from g.act (bf16 [rows, in], natural k order;
// act_scales apart), or with fma from g.act_f32 by fp32 FMAs in vdpbf16ps's order (RowsMultiply::kFp32Fma; only
// where no product or partial sum can be subnormal). MXFP4 rows also read the exact_* arrays where set
// (prepare_exact_fp4_rows): their blocks go through integers where every row of a pass can.
template <bool kFp4>
void tiled_decode_rows(const GemmArgs& g, bool fma, int64_t tile_begin, int64_t tile_end);

// ---- Decode paths on row-major weights (linear_avx512_row_major.cpp) ----
constexpr int64_t kFp4DecodeMaxRows = 4;  // up to here one register conversion beats the scratch path

// FP8, rows == 1: activation codes [1, k] -> bf16 in the weights' lane order, [npairs, 64] words; then tiles
// [tile_begin, tile_end) of y.
DSFLASH_AVX512 void prepare_activation_pairs(const Fp8Activations& x, int64_t npairs, uint16_t* out);
DSFLASH_AVX512 void fp8_decode_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end);
// MXFP4, rows 1..kFp4DecodeMaxRows: natural bf16 activations [k] -> the order fp4_decode_tiles reads; then tiles.
void fp4_decode_activation_order(const uint16_t* natural, int64_t k, uint16_t* out);
template <int R>
DSFLASH_AVX512 void fp4_decode_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end);

}  // namespace DSFLASH_AVX512_NAMESPACE
