// AVX-512 FP8 / MXFP4 decode and small batches (1..kTiledDecodeMaxRows rows per pass, passes up to
// tiled_passes_max_rows) on tile-major weights (kernels/linear.h): each 64-byte vector decodes in registers into
// bf16 pairs of 16 outputs, once for every row of a pass, and every (row, tile, block) sums its 16 pairs in one
// chain in pair order, as the multi-row path of linear_avx512_rows.cpp does, so a row's result does not depend on the
// rows it runs with. MXFP4 rows multiply in exact integers wherever that gives the same chain's bits and pays
// (tiled_fp4_takes_integers).
#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/linear_avx512_impl.h"
#include "kernels/linear_tables.h"

namespace DSFLASH_AVX512_NAMESPACE {

namespace {

// MXFP4 weight scales are prefetched this many blocks (16 bytes each per tile) at a time. One process alternating
// the variants call by call (one row, 2 threads, medians of 2000 calls): 32 -> 8 blocks took 4608 x 5120 from 300
// to 286 and 332 to 318 us, 5120 x 2304 from 185 to 179 and 213 to 205 us (smaller bursts of scale misses beside
// the four weight streams); 4 and 16 were no better than 8, and FP8 and four MXFP4 rows did not change.
constexpr int kTiledScaleBlocks = 8;
// Software prefetch distance along each tile's stream. The out-of-order window alone reaches ~2 KB ahead at ~15
// instructions per 64 bytes, less than the bytes in flight that the read bandwidth needs. Of 0-16 KB tried
// (bench_linear, wo_b / w2 tiled, rows:1), no prefetch was clearly slower. Once the streams also prefetched across
// calls (see tiled_decode), 2 and 3 KB beat 4 KB (vs_read, alternated 6x: wo_b 0.94 -> 0.98, wq_b 0.90 -> 0.93,
// w1 0.87 -> 0.90, w2 the same), 1 KB was mixed and 8 KB slower by 5-10%. With four streams per thread (one row,
// FP8 and MXFP4 alike: tiled_decode_range), 2 KB is as good as or better than 3, 4, 6 or 8 KB (MXFP4 w13 and w2
// shapes, the variants alternated call by call in one process: w13 274 us at 2 KB against 279 / 276 / 293 / 286
// at 3 / 4 / 6 / 8 KB, w2 139 us against 149-154); FP8 at 3 KB lost (wq_b 0.91 -> 0.86).
constexpr int64_t kTiledPrefetchBytes = 2048;

}  // namespace

// ---- Exact integer MXFP4 decode (rows 1..kTiledDecodeMaxRows per pass) ----
// On this project's Xeon (AMX, AVX-512) vpdpbusd (64 byte products into 16 int32) and vfmadd231ps both issue two
// per cycle, vdpbf16ps one every two, vpermb / vpermps one per cycle. Per 64 bytes of weights (128 MXFP4 codes, 8 k
// of 16 outputs) the integer path below takes 1 shift and 2 vpermb for all rows, then 2 vpdpbusd per row and byte
// piece of N (2 or 3 pieces), against the FMA recipe's 8 vpermps and 7 shifts, then 8 FMAs per row; one row's
// vdpbf16ps chain takes 4 vpermw, 3 shifts and 4 vdpbf16ps. So there every row's blocks go through integers
// wherever that gives the chain's bits; where vdpbf16ps issues two per cycle too (Zen 5), passes of three rows or
// more take the chain (tiled_fp4_takes_integers).
// Activation a = N * 2^(s-10) with N an integer: an e4m3 value is sig * 2^(e'-10) (sig = 8 + mantissa and e' = the
// exponent field for normals, sig = mantissa and e' = 1 for subnormals), and s = the smallest e' of the block's
// nonzero values. Weight w = W / 2 with W = 2 * e2m1 in [-12, 12]. A block's sum of a * w is then
// (Σ N * W) * 2^(s-11), Σ N * W an exact int32. Where 12 Σ |N| < 2^24 (and no code is NaN), every partial sum of
// any order is a multiple of 2^(s-11) below 2^24 of them, so the bf16 chain is exact at each step (and never
// subnormal: 2^(s-11) >= 2^-10) and gives (Σ N * W) * 2^(s-11) too: the same bits, whatever the weights. Other
// blocks (NaN codes; sums past that bound, a few in a thousand for act_quant'ed activations) keep the chain.
// vpdpbusd multiplies unsigned by signed bytes, so the weights enter as W + 12 in [0, 24] and N as signed bytes,
// N = 65536 * p2 + 256 * p1 + p0 with p0, p1 in [-128, 127] (|N| <= 15 << 14 < 2^18, so |p2| <= 4; p2 = 0 where
// every |N| < 2^15 - 128, and such a block takes two pieces):
// Σ N * W = 65536 Σ (W + 12) p2 + 256 Σ (W + 12) p1 + Σ (W + 12) p0 - 12 Σ N, every term far inside int32.
namespace {
// A block's activations as the integers N of the comment above, 16 per half h (k order), with s (smallest) in
// every lane of smallest_lanes, and lanes of magnitudes summing to Σ |N|.
struct ExactFp4Block {
  __m512i n[2];
  __m512i smallest_lanes, magnitudes;
  bool nan = false;
  // 12 Σ |N| < 2^24 and no NaN: every order of the block's products sums exactly.
  bool exact(int32_t magnitude_sum) const { return !nan && 12 * magnitude_sum < (1 << 24); }
};

// The minimum of v's lanes, in every lane (no trip through a general register: N's shifts wait on it).
DSFLASH_AVX512 inline __m512i min_in_every_lane(__m512i v) {
  v = _mm512_min_epi32(v, _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_min_epi32(v, _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_min_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  return _mm512_min_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
}

DSFLASH_AVX512 inline ExactFp4Block exact_fp4_block(const uint8_t* block) {
  // Masks only where they are needed (a NaN, the signs), each taken once for all 32 bytes; the rest in
  // arithmetic (compares into masks and the reductions' shuffles issue on the same port).
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
  const __m256i byte_magnitude_bits = _mm256_set1_epi8(0x7f);
  ExactFp4Block result;
  result.nan = _mm256_cmpeq_epi8_mask(_mm256_and_si256(bytes, byte_magnitude_bits), byte_magnitude_bits) != 0;
  const __mmask32 negative = _mm256_movepi8_mask(bytes);
  const __m512i magnitude_bits = _mm512_set1_epi32(0x7f), mantissa_bits = _mm512_set1_epi32(7);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i sig[2], step[2], nonzero_steps[2];
  for (int h = 0; h < 2; ++h) {
    const __m128i half = h == 0 ? _mm256_castsi256_si128(bytes) : _mm256_extracti128_si256(bytes, 1);
    const __m512i magnitude = _mm512_and_si512(_mm512_cvtepu8_epi32(half), magnitude_bits);
    const __m512i exponent = _mm512_srli_epi32(magnitude, 3);
    // sig = mantissa + 8 where the exponent field is not 0; e' = max(exponent, 1)
    sig[h] = _mm512_add_epi32(_mm512_and_si512(magnitude, mantissa_bits),
                              _mm512_slli_epi32(_mm512_min_epu32(exponent, one), 3));
    step[h] = _mm512_max_epi32(exponent, one);
    // zero codes at e' + 16 (above every nonzero code's)
    const __m512i zero = _mm512_sub_epi32(one, _mm512_min_epu32(magnitude, one));
    nonzero_steps[h] = _mm512_add_epi32(step[h], _mm512_slli_epi32(zero, 4));
  }
  // All zero: any unit; 15 keeps 2^(s - 11) in the nonzero codes' range.
  result.smallest_lanes =
      _mm512_min_epi32(min_in_every_lane(_mm512_min_epi32(nonzero_steps[0], nonzero_steps[1])), _mm512_set1_epi32(15));
  result.magnitudes = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    // Zero codes have sig 0; a negative shift count (a zero's e' of 1 below s) shifts everything out too.
    // |N| <= 15 << 14, Σ |N| < 2^23.
    const __m512i n = _mm512_sllv_epi32(sig[h], _mm512_sub_epi32(step[h], result.smallest_lanes));
    result.magnitudes = _mm512_add_epi32(result.magnitudes, n);
    result.n[h] = _mm512_mask_sub_epi32(n, static_cast<__mmask16>(negative >> (16 * h)), _mm512_setzero_si512(), n);
  }
  return result;
}

// The sums of a's lanes and of b's lanes (one reduction for both: their 256-bit halves side by side).
DSFLASH_AVX512 inline std::pair<int32_t, int32_t> sum_lanes_of_both(__m512i a, __m512i b) {
  __m512i v = _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)));  // a's 4 lanes, b's 4 lanes
  v = _mm512_add_epi32(v, _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
  return {_mm_cvtsi128_si32(_mm512_castsi512_si128(v)), _mm_cvtsi128_si32(_mm512_extracti32x4_epi32(v, 2))};
}

// The pieces come straight out of M = N + 0x8080 (no per-piece arithmetic): p0 = N mod 256 as a signed byte is
// M's byte 0 with its top bit flipped; p1 = ((N + 128) >> 8) mod 256 likewise M's byte 1 flipped; p2 = (N + 0x8080)
// >> 16 (in [-4, 4]) is M's byte 2. Index vpermt2b into the halves' M (16 dwords each, k order) for a block's
// kExactFp4PieceBlockBytes (96) bytes: byte 24 v + 8 p + i is piece p of k = 8 v + (0 4 1 5 2 6 3 7)[i], that is M's
// byte p of k; flip: 0x80 for p = 0, 1. [0, 64) first, then [64, 96) (the rest 0, unused).
struct PieceOrder {
  alignas(64) uint8_t index[2][64];
  alignas(64) uint8_t flip[2][64];
};
constexpr PieceOrder kPieceOrder = [] {
  PieceOrder order{};
  for (int out = 0; out < kExactFp4PieceBlockBytes; ++out) {
    const int v = out / 24, p = (out % 24) / 8, i = out % 8;
    const int k = 8 * v + (i / 2) + 4 * (i % 2);
    order.index[out / 64][out % 64] = static_cast<uint8_t>(64 * (k / 16) + 4 * (k % 16) + p);
    order.flip[out / 64][out % 64] = p < 2 ? 0x80 : 0;
  }
  return order;
}();
}  // namespace

DSFLASH_AVX512 void prepare_exact_fp4_rows(const uint8_t* codes, int64_t rows, int64_t k, int8_t* pieces,
                                           int32_t* biases, float* units, uint8_t* piece_counts) {
#if !DSFLASH_AVX512_NO_VBMI
  const __m512i flip_low = _mm512_load_si512(kPieceOrder.flip[0]);
  const __m512i flip_high = _mm512_load_si512(kPieceOrder.flip[1]);
  const __m512i order_low = _mm512_load_si512(kPieceOrder.index[0]);
  const __m512i order_high = _mm512_load_si512(kPieceOrder.index[1]);
#endif
  const __m512i piece_bias = _mm512_set1_epi32(0x8080);
  const int64_t kb = k / 32;
  for (int64_t rb = 0; rb < rows * kb; ++rb) {
    const ExactFp4Block block = exact_fp4_block(codes + 32 * rb);
    const __m512i m0 = _mm512_add_epi32(block.n[0], piece_bias), m1 = _mm512_add_epi32(block.n[1], piece_bias);
    int8_t* block_pieces = pieces + kExactFp4PieceBlockBytes * rb;
#if DSFLASH_AVX512_NO_VBMI
    // The same byte order without vpermt2b: through memory (96 bytes per block and row, beside the weights' MBs).
    alignas(64) uint8_t both[128];
    _mm512_store_si512(both, m0);
    _mm512_store_si512(both + 64, m1);
    for (int i = 0; i < kExactFp4PieceBlockBytes; ++i)
      block_pieces[i] = static_cast<int8_t>(both[kPieceOrder.index[i / 64][i % 64]] ^ kPieceOrder.flip[i / 64][i % 64]);
#else
    _mm512_storeu_si512(block_pieces, _mm512_xor_si512(_mm512_permutex2var_epi8(m0, order_low, m1), flip_low));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(block_pieces + 64),
                        _mm512_castsi512_si256(_mm512_xor_si512(_mm512_permutex2var_epi8(m0, order_high, m1),
                                                                flip_high)));
#endif
    const auto [n_sum, magnitude_sum] = sum_lanes_of_both(_mm512_add_epi32(block.n[0], block.n[1]), block.magnitudes);
    biases[rb] = -kExactFp4WeightBias * n_sum;
    const bool exact = block.exact(magnitude_sum);
    // 2^(s - 11), s - 11 in [-10, 4]: a normal float's bits.
    const uint32_t unit_bits =
        static_cast<uint32_t>(_mm_cvtsi128_si32(_mm512_castsi512_si128(block.smallest_lanes)) - 11 + 127) << 23;
    float unit;
    std::memcpy(&unit, &unit_bits, sizeof(unit));
    units[rb] = exact ? unit : 0.0f;
    // p2 = 0 for every k: every M in [0, 2^16).
    const bool third = _mm512_test_epi32_mask(_mm512_or_si512(m0, m1), _mm512_set1_epi32(~0xffff)) != 0;
    piece_counts[rb] = static_cast<uint8_t>(!exact ? 0 : third ? 3 : 2);
  }
}

// Every partial sum of a block's products, in any order and grouping, is a multiple of 2^(s-11) of magnitude at
// most 12 Σ |N| of them: exact in fp32 below 2^24 of them.
DSFLASH_AVX512 void exact_fp4_blocks(const uint8_t* codes, int64_t k, uint8_t* exact) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const ExactFp4Block block = exact_fp4_block(codes + 32 * b);
    exact[b] = block.exact(_mm512_reduce_add_epi32(block.magnitudes)) ? 1 : 0;
  }
}

namespace {

// Blocks [b, b + NB) of NT tiles for R rows from g.exact_pieces (every row's blocks exact, P byte pieces; see
// prepare_exact_fp4_rows). Per 64-byte vector (8 k of 16 outputs): vpermb on the bytes and on the bytes shifted
// right by 4 gives W + 12 of the low and the high nibbles (dword lane i = output i's k 0 4 1 5 and 2 6 3 7 of the
// vector), each multiplied by every row's broadcast piece bytes in that order. Sums of integers, exact in any order.
// The tiles go kTilesAtOnce at a time through a block, so that the R x P integer sums of each stay in registers,
// and each group hands its tiles' block partials (fp32 [R], the chain's value of the block) to add_tile_block(n,
// tile, partials) at once: holding NT x R partials until the block's last tile (besides y's R x NT) spilled from 3
// rows on. The tile groups' broadcasts are left in place (see `pieces`).
template <int NB, int R, int NT, int P, typename AddTileBlock>
DSFLASH_AVX512 inline void exact_fp4_blocks(const GemmArgs& g, const uint8_t* w, int64_t tile_bytes, int64_t b,
                                            int64_t prefetch_bytes, __m512i biased_table,
                                            AddTileBlock&& add_tile_block) {
  constexpr int kVectors = kTiledVectors<true>;
  constexpr int64_t kBlockBytes = kVectors * kTileMajorVectorBytes;
  constexpr int kTilesAtOnce = R * P * NT <= 16 ? NT : R * P * 2 <= 12 ? 2 : 1;
  for (int n = 0; n < NB; ++n)
    for (int t0 = 0; t0 < NT; t0 += kTilesAtOnce) {
      __m512i sums[R][kTilesAtOnce][P];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < kTilesAtOnce; ++t) {
          sums[r][t][0] = _mm512_set1_epi32(g.exact_biases[r * g.kb + b + n]);
          for (int p = 1; p < P; ++p) sums[r][t][p] = _mm512_setzero_si512();
        }
      // Row r's pieces of this block: per vector, per piece, 4 bytes of k 0 4 1 5 then 4 of k 2 6 3 7. The empty
      // asm hides that the tile groups read the same bytes: hoisted out of the groups, the R x P x 2 x kVectors
      // broadcasts spilled; left in place, each is a load folded into its vpdpbusd.
      const int8_t* pieces = g.exact_pieces + (b + n) * kExactFp4PieceBlockBytes;
      asm("" : "+r"(pieces));
      auto piece = [&](int r, int v, int i) DSFLASH_AVX512 {
        int32_t bytes;
        std::memcpy(&bytes, pieces + r * g.kb * kExactFp4PieceBlockBytes + v * kExactFp4PieceVectorBytes + 4 * i, 4);
        return _mm512_set1_epi32(bytes);
      };
      for (int v = 0; v < kVectors; ++v) {
        __m512i first[kTilesAtOnce], second[kTilesAtOnce];
        for (int t = 0; t < kTilesAtOnce; ++t) {
          const uint8_t* vector = w + (t0 + t) * tile_bytes + (b + n) * kBlockBytes + v * kTileMajorVectorBytes;
          _mm_prefetch(reinterpret_cast<const char*>(vector + prefetch_bytes), _MM_HINT_T0);
          const __m512i raw = _mm512_loadu_si512(vector);
          if constexpr (kAvx512Vbmi) {
            first[t] = _mm512_permutexvar_epi8(raw, biased_table);
            second[t] = _mm512_permutexvar_epi8(_mm512_srli_epi16(raw, 4), biased_table);
          } else {  // vpshufb looks up 16 entries per 128-bit lane (the table repeats them): the nibbles alone
            const __m512i nibble = _mm512_set1_epi8(0x0f);
            first[t] = _mm512_shuffle_epi8(biased_table, _mm512_and_si512(raw, nibble));
            second[t] = _mm512_shuffle_epi8(biased_table, _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble));
          }
        }
        for (int r = 0; r < R; ++r)
          for (int p = 0; p < P; ++p)
            for (int t = 0; t < kTilesAtOnce; ++t) {
              sums[r][t][p] = _mm512_dpbusd_epi32(sums[r][t][p], first[t], piece(r, v, 2 * p));
              sums[r][t][p] = _mm512_dpbusd_epi32(sums[r][t][p], second[t], piece(r, v, 2 * p + 1));
            }
      }
      for (int t = 0; t < kTilesAtOnce; ++t) {
        __m512 partials[R];
        for (int r = 0; r < R; ++r) {
          __m512i total = _mm512_add_epi32(sums[r][t][0], _mm512_slli_epi32(sums[r][t][1], 8));
          if constexpr (P == 3) total = _mm512_add_epi32(total, _mm512_slli_epi32(sums[r][t][2], 16));
          partials[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(g.exact_units[r * g.kb + b + n]));
        }
        add_tile_block(n, t0 + t, partials);
      }
    }
}

// NT (1, 2 or 4) adjacent tiles from `tile` on, all of K, for R rows of plain bf16 activations (g.act [R, in]).
// Each vector is decoded once for the R rows, and each activation broadcast serves the NT tiles. Per (row,
// tile, block) one accumulator takes the 16 pairs in order, as rows_chunk does; the tiles give independent
// chains, and the blocks' chains overlap out of order. MXFP4: blocks exact in integers for every row of the pass
// (g.exact_piece_counts) take exact_fp4_blocks, several at a time where a group is all exact.
// kFma: fp32 FMAs in vdpbf16ps's order instead, on g.act_f32 [R, in] (RowsMultiply::kFp32Fma; run_block_gemm
// checks that no product or sum can be subnormal). FP8: each bf16 pair vector splits into fp32 weights
// (pair_as_fp32). MXFP4: vector v's dword lane i holds output i's pairs 4v..4v+3 as
// nibbles, the even elements in the low word and the odd ones in the high word, so the pair q element comes out of
// vpermps on the dword shifted right by 4q (even) or 16 + 4q (odd): 8 lookups of 16 fp32 weights and 7 shifts per
// 64 bytes, against 4 vpermw, 3 shifts and 4 vdpbf16ps. Either way the conversion costs more and the multiplies
// less, which pays from 2 rows on (R = 1 keeps vdpbf16ps, see run_block_gemm, except in the bf16-free table).
// MXFP4 blocks take either only where some row's block cannot take the integers.
template <bool kFp4, int R, int NT, bool kFma = false>
DSFLASH_AVX512 void tiled_decode(const GemmArgs& g, int64_t tile) {
  static_assert(kAvx512Bf16 || kFma, "vdpbf16ps in the bf16-free copy");
  constexpr int kVectors = kTiledVectors<kFp4>, kPairs = kTiledPairs<kFp4>;
  constexpr int64_t kBlockBytes = kVectors * kTileMajorVectorBytes;  // one block of a tile
  const float* e8m0 = linear_decode_tables().e8m0_f32;
  __m512i tables[4];
  load_tiled_tables<kFp4>(tables);
  const __m512 fp4_f32 = _mm512_load_ps(avx512_tables().fp4_f32);
  const __m512i biased_table = _mm512_load_si512(avx512_tables().fp4_biased);
  const int64_t tile_bytes = kTile * (kFp4 ? g.in / 2 : g.in);
  const uint8_t* w = g.w + tile * tile_bytes;
  __m512 y[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) y[r][t] = _mm512_setzero_ps();
  if constexpr (!kFp4) {
    // The next call's FP8 scale rows ([out / 32, kb], one per 32 outputs): a few lines that would otherwise each
    // wait for memory where that call scales its first blocks.
    const int64_t next_first = (tile + NT) * kTile, next_end = std::min<int64_t>(g.out, (tile + 2 * NT) * kTile);
    for (int64_t row = next_first / 32; row * 32 < next_end; ++row)
      for (int64_t off = 0; off < g.kb; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(g.w_scales + row * g.kb + off), _MM_HINT_T0);
  }
  for (int64_t b0 = 0; b0 < g.kb; b0 += kTiledScaleBlocks) {
    const int64_t b1 = std::min<int64_t>(g.kb, b0 + kTiledScaleBlocks);
    if constexpr (kFp4)  // the scales of the next chunk, or of the next call's first one: 16 bytes per block
      for (int t = 0; t < NT; ++t) {
        const int64_t next_tile = b1 < g.kb ? tile + t : tile + NT + t, next_b = b1 < g.kb ? b1 : 0;
        if (next_tile * kTile >= g.out) continue;
        const uint8_t* next = g.w_scales + next_tile * kTile * g.kb + kTile * next_b;
        for (int64_t off = 0; off < kTile * std::min<int64_t>(kTiledScaleBlocks, g.kb - next_b); off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + off), _MM_HINT_T0);
      }
    // NB blocks at a time: their chains are independent, so NB x NT x R of them are in flight (one chain alone
    // would wait ~6 cycles per pair on the previous vdpbf16ps).
    // pieces: 2 or 3 where every row's NB blocks take the integers (exact_fp4_blocks with that many byte pieces),
    // 0 where they take the chain.
    // kPlain: FP8 blocks that all hold only zero and normal codes (Fp8Weight::plain_code_blocks), decoded from the
    // 64-entry tables.
    auto blocks_of = [&]<int NB, bool kPlain>(int64_t b, int pieces) DSFLASH_AVX512 {
      // In a tile's last kAhead bytes, each stream prefetches the start of the tile it reads next (NT tiles
      // on, the next call's), so that the next call's streams do not start cold.
      constexpr int64_t kAhead = kTiledPrefetchBytes;
      const int64_t prefetch_bytes = kAhead + (b * kBlockBytes + kAhead < tile_bytes
                                                                ? 0 : (NT - 1) * tile_bytes);
      // Block b + n's scales: tile + t's 16 weight scales (MXFP4: converted here, straight from the scale stream),
      // row r's activation scale.
      auto weight_scales = [&](int n, int t) DSFLASH_AVX512 {
        if constexpr (kFp4) return fp4_tiled_block_scales(g, tile + t, b + n);
        else return _mm512_set1_ps(e8m0[g.w_scales[((tile + t) * kTile / 32) * g.kb + b + n]]);
      };
      auto act_scale = [&](int n, int r) DSFLASH_AVX512 {
        return _mm512_set1_ps(e8m0[g.act_scales[r * g.kb + b + n]]);
      };
      // Block b + n's partial (fp32, its dot products) of row r and tile + t into y, times both scales.
      auto add_block = [&](int r, int t, __m512 partial, __m512 sa, __m512 w_scale) DSFLASH_AVX512 {
        y[r][t] = _mm512_add_ps(y[r][t], _mm512_mul_ps(_mm512_mul_ps(partial, sa), w_scale));
      };
      // The integer path hands over one tile's partials at a time (fp32 [R]).
      auto add_tile_block = [&](int n, int t, const __m512 (&partials)[R]) DSFLASH_AVX512 {
        const __m512 w_scale = weight_scales(n, t);
        for (int r = 0; r < R; ++r) add_block(r, t, partials[r], act_scale(n, r), w_scale);
      };
      auto exact = [&]<int P>() DSFLASH_AVX512 {
        // (Without VNNI no block is given pieces: run_block_gemm leaves exact_piece_counts unset.)
        if constexpr (kFp4 && kAvx512Vnni)
          exact_fp4_blocks<NB, R, NT, P>(g, w, tile_bytes, b, prefetch_bytes, biased_table, add_tile_block);
      };
      if (pieces == 2) return exact.template operator()<2>();
      if (pieces == 3) return exact.template operator()<3>();
      __m512 acc[NB][R][NT];
      for (int n = 0; n < NB; ++n)
        for (int r = 0; r < R; ++r)
          for (int t = 0; t < NT; ++t) acc[n][r][t] = _mm512_setzero_ps();
      __m512i plain_tables[2];
      if constexpr (kPlain) load_plain_fp8_tables(plain_tables);
      if constexpr (kFma) {
        // FMA: vector by vector across the NB blocks, so that consecutive FMAs feed different chains (each waits
        // ~4 cycles on its previous one, 2 * kPairs times per vector).
        for (int v = 0; v < kVectors; ++v)
          for (int n = 0; n < NB; ++n) {
            // MXFP4: the raw vector; FP8: its kPairs bf16 pair vectors (dword lane = output).
            __m512i src[NT][kFp4 ? 1 : kPairs];
            for (int t = 0; t < NT; ++t) {
              const uint8_t* vector = w + t * tile_bytes + (b + n) * kBlockBytes + v * kTileMajorVectorBytes;
              _mm_prefetch(reinterpret_cast<const char*>(vector + prefetch_bytes), _MM_HINT_T0);
              if constexpr (kFp4) src[t][0] = _mm512_loadu_si512(vector);
              else if constexpr (kPlain) tiled_plain_fp8_pairs(vector, plain_tables, src[t]);
              else tiled_pairs<false>(vector, tables, src[t]);
            }
            auto pair = [&]<int q>() DSFLASH_AVX512 {
              __m512 even[NT], odd[NT];
              for (int t = 0; t < NT; ++t) {
                if constexpr (kFp4) {
                  even[t] = _mm512_permutexvar_ps(q == 0 ? src[t][0] : _mm512_srli_epi32(src[t][0], 4 * q), fp4_f32);
                  odd[t] = _mm512_permutexvar_ps(_mm512_srli_epi32(src[t][0], 16 + 4 * q), fp4_f32);
                } else {
                  pair_as_fp32(src[t][q], &odd[t], &even[t]);
                }
              }
              for (int r = 0; r < R; ++r) {
                const float* a = g.act_f32 + r * g.in + 32 * (b + n) + 2 * (kPairs * v + q);
                const __m512 x_odd = _mm512_set1_ps(a[1]), x_even = _mm512_set1_ps(a[0]);
                for (int t = 0; t < NT; ++t) acc[n][r][t] = _mm512_fmadd_ps(odd[t], x_odd, acc[n][r][t]);
                for (int t = 0; t < NT; ++t) acc[n][r][t] = _mm512_fmadd_ps(even[t], x_even, acc[n][r][t]);
              }
            };
            pair.template operator()<0>();
            pair.template operator()<1>();
            if constexpr (kPairs == 4) {
              pair.template operator()<2>();
              pair.template operator()<3>();
            }
          }
      } else {
        for (int n = 0; n < NB; ++n)
          for (int v = 0; v < kVectors; ++v) {
            __m512i pairs[NT][kPairs];
            for (int t = 0; t < NT; ++t) {
              const uint8_t* vector = w + t * tile_bytes + (b + n) * kBlockBytes + v * kTileMajorVectorBytes;
              _mm_prefetch(reinterpret_cast<const char*>(vector + prefetch_bytes), _MM_HINT_T0);
              if constexpr (kPlain) tiled_plain_fp8_pairs(vector, plain_tables, pairs[t]);
              else tiled_pairs<kFp4>(vector, tables, pairs[t]);
            }
            for (int p = 0; p < kPairs; ++p)
              for (int r = 0; r < R; ++r) {
                const __m512bh x = activation_pair(g.act + r * g.in + 32 * (b + n), kPairs * v + p);
                for (int t = 0; t < NT; ++t)
                  acc[n][r][t] = _mm512_dpbf16_ps(acc[n][r][t], (__m512bh)pairs[t][p], x);
              }
          }
      }
      for (int n = 0; n < NB; ++n) {  // blocks in K order
        __m512 w_scale[NT];
        for (int t = 0; t < NT; ++t) w_scale[t] = weight_scales(n, t);
        for (int r = 0; r < R; ++r) {
          const __m512 sa = act_scale(n, r);
          for (int t = 0; t < NT; ++t) add_block(r, t, acc[n][r][t], sa, w_scale[t]);
        }
      }
    };
    // Blocks [b, b + NB) of the NT tiles, from the 64-entry tables where every one of them allows it: one choice
    // for the group, outside the loops (a choice per block and tile inside them lost 2-3% on one row).
    auto blocks = [&]<int NB>(int64_t b, int pieces) DSFLASH_AVX512 {
      if constexpr (!kFp4 && kAvx512Vbmi) {
        bool plain = g.plain_code_blocks != nullptr;
        for (int n = 0; n < NB && plain; ++n)
          for (int t = 0; t < NT && plain; ++t) plain = g.plain_block(tile + t, b + n);
        if (plain) return blocks_of.template operator()<NB, true>(b, pieces);
      }
      blocks_of.template operator()<NB, false>(b, pieces);
    };
    // Four tiles: one MXFP4 row two blocks at once (4 x 4 partials and the integer sums in registers; four would
    // spill them), several rows one. One FP8 row with FMAs (the bf16-free table) also two: with four, the 16
    // accumulators, 8 pair vectors and their 8 fp32 halves spilled (bench_linear rows:1, avx512-no-bf16, 2
    // threads: wq_b 1.29 -> 1.08 ms, wo_b 1.21 -> 1.06-1.07 ms, as fast as the vdpbf16ps chain's 1.08-1.13).
    // One FP8 row on vdpbf16ps one block at a time (four tiles' chains are enough in flight), so that the 64-entry
    // tables' choice covers 4 tile blocks, not 16: at subnormal codes ~1e-4 of all (one 512-code block in 20) 81%
    // of the groups take them, against 44%. Its loop is bound by the conversion: from L2 (bench_linear, 64 x 8192
    // and 256 x 2048 FP8 copies read over and over, one thread) 21 GB/s with four blocks and the full tables, 22-25
    // with the choice per 16 blocks, 26-27.5 per 4, barely above one core's share of the memory read (18-20 GB/s).
    constexpr int kBlocksAtOnce = R == 1 ? (kFma || (kFp4 && NT == 4) ? 2 : kFp4 ? 4 : 1) : R == 2 && NT < 4 ? 2 : 1;
    // The byte pieces block b takes for all R rows (the most any row needs), 0 if the block takes the chain: a row's
    // block cannot take the integers, or they cost more than the chain here (tiled_fp4_takes_integers).
    auto block_pieces = [&](int64_t b) {
      // (A pass that never takes them skips reading the counts: dropping this check cost 3 and 4 rows ~5%.)
      if (!kFp4 || g.exact_piece_counts == nullptr || !tiled_fp4_takes_integers(R, 2, kFma)) return 0;
      int most = 0;
      for (int r = 0; r < R; ++r) {
        const int count = g.exact_piece_counts[r * g.kb + b];
        if (count == 0) return 0;
        most = std::max(most, count);
      }
      return tiled_fp4_takes_integers(R, most, kFma) ? most : 0;
    };
    int64_t b = b0;
    for (; b + kBlocksAtOnce <= b1; b += kBlocksAtOnce) {
      int exact = 0, most = 0;
      for (int n = 0; n < kBlocksAtOnce; ++n) {
        const int pieces = block_pieces(b + n);
        exact += pieces != 0;
        most = std::max(most, pieces);
      }
      // A group that mixes exact blocks with others goes block by block, so that its exact ones still take the
      // integers (the partials reach y in K order either way).
      if (exact == 0 || exact == kBlocksAtOnce)
        blocks.template operator()<kBlocksAtOnce>(b, most);
      else
        for (int n = 0; n < kBlocksAtOnce; ++n) blocks.template operator()<1>(b + n, block_pieces(b + n));
    }
    for (; b < b1; ++b) blocks.template operator()<1>(b, block_pieces(b));
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) _mm512_storeu_ps(g.y + r * g.out + (tile + t) * kTile, y[r][t]);
}

// Tiles [tile, tile + NT) for every row of g: passes of at most kTiledDecodeMaxRows rows (balanced: 5 rows run
// 3 + 2), one after another on the same tiles, so that a pass after the first reads them from the core's caches.
template <bool kFp4, int NT, bool kFma>
DSFLASH_AVX512 void tiled_decode_passes(const GemmArgs& g, int64_t tile) {
  const int64_t passes = tiled_decode_pass_count(g.rows);
  for (int64_t pass = 0, r0 = 0; pass < passes; ++pass) {
    const int64_t r1 = g.rows * (pass + 1) / passes;
    GemmArgs rows = g;  // rows [r0, r1)
    rows.rows = r1 - r0;
    rows.advance_rows(r0);
    switch (rows.rows) {
      case 1: tiled_decode<kFp4, 1, NT, kFma>(rows, tile); break;
      case 2: tiled_decode<kFp4, 2, NT, kFma>(rows, tile); break;
      case 3: tiled_decode<kFp4, 3, NT, kFma>(rows, tile); break;
      default: tiled_decode<kFp4, 4, NT, kFma>(rows, tile); break;
    }
    r0 = r1;
  }
}

template <bool kFp4, bool kFma>
DSFLASH_AVX512 void tiled_decode_range(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  int64_t tile = tile_begin;
  // Four tiles at a time, so each thread reads four streams. One FP8 row (16 accumulators; bench_linear, tiled,
  // rows:1, 2 threads, alternated 3x): vs_read 0.93-1.00 against 0.87-0.93 with two; eight (two blocks at a time)
  // was slower again. Measured in one process alternating two and four tiles call by call on cold copies (medians
  // of 2000-3000 calls, 2 threads; across processes this VM's bandwidth swings too much): one MXFP4 row (the
  // integer path), 4608 x 5120 (w13) 252 -> 230 and 315 -> 279 us, 5120 x 2304 (w2) 166 -> 149 us; 2, 3 and 4
  // rows: w13 362 -> 280 us (2 rows) and 488 -> 439 us (4), w2 237 -> 187 us (3 rows of SwiGLU outputs), FP8
  // 5120 x 8192 (wo_b) 976 -> 718 (2), 1102 -> 843 (3), 1115 -> 977 us (4), 32768 x 1280 (wq_b) 1326 -> 969 us (2).
  for (; tile + 4 <= tile_end; tile += 4) tiled_decode_passes<kFp4, 4, kFma>(g, tile);
  for (; tile + 2 <= tile_end; tile += 2) tiled_decode_passes<kFp4, 2, kFma>(g, tile);
  if (tile < tile_end) tiled_decode_passes<kFp4, 1, kFma>(g, tile);
}

}  // namespace

template <bool kFp4>
void tiled_decode_rows(const GemmArgs& g, bool fma, int64_t tile_begin, int64_t tile_end) {
  if constexpr (!kAvx512Bf16) tiled_decode_range<kFp4, true>(g, tile_begin, tile_end);  // fma, always
  else if (fma) tiled_decode_range<kFp4, true>(g, tile_begin, tile_end);
  else tiled_decode_range<kFp4, false>(g, tile_begin, tile_end);
}
template void tiled_decode_rows<false>(const GemmArgs&, bool, int64_t, int64_t);
template void tiled_decode_rows<true>(const GemmArgs&, bool, int64_t, int64_t);

}  // namespace DSFLASH_AVX512_NAMESPACE
