// The AVX-512 multi-row GEMM step (rows >= 2 beyond the tile-major decode passes: prefill, large batches), for
// run_block_gemm in linear_avx512.cpp. Weights in either order of kernels/linear.h.
//
// A tile's weights (16 outputs) are converted once per 32-K block into an L1 scratch of 16 zmm, one per
// code pair j = 0..15, lane o = output o's bf16 pair (k = 2j, 2j+1) as a dword. For one row,
// dp(acc, W_j, broadcast(activation pair j)) over the 16 j leaves output o's block partial in lane o (no
// horizontal reduction), and one converted block serves every row. Activations are plain bf16 [rows, k].

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/linear_avx512_impl.h"
#include "kernels/linear_impl.h"
#include "kernels/linear_tables.h"

namespace DSFLASH_AVX512_NAMESPACE {

namespace {

constexpr int kRowTile = 8;  // rows sharing each scratch load: 8 x 2 accumulators
// From kWideRowTileMinRows rows on, 12 (24 accumulators): each converted scratch load, and in the FMA path its
// split into fp32 halves, then serves 12 rows. bench_linear --threads=1 avx512fma, medians of 5, alternated 2x:
// 256 rows wq_b 134-136 -> 140-143 GFLOP/s, wo_b 127-132 -> 137; at 16 rows 12 + 4 lost to 8 + 8 (wq_b 126-128 ->
// 119), at 64 within noise.
constexpr int kWideRowTile = 12;
constexpr int64_t kWideRowTileMinRows = 48;

// FP8: one block (32 codes) of 16 outputs, output i's block at base + offsets[i] -> dst[16] (see above).
// z[n] = outputs 2n, 2n+1 (16 code-pair words each). vpermt2w gathers, for 4 outputs, the 8 code pairs
// j = 8s + 2m, 8s + 2m + 1 into lane m of y[l]; the lane transpose makes c lane l = outputs 4l..4l+3, in
// the word order [4 outputs at j even][4 outputs at j odd], which vpunpck{l,h}bw in fp8_to_bf16 turns
// into W_j (outputs in lane order) and W_j+1.
DSFLASH_AVX512 inline void convert_block_fp8(const uint8_t* base, const int64_t* offsets, __m512i* dst,
                                             const Avx512Tables& at, __m512i lo0, __m512i lo1, __m512i hi0,
                                             __m512i hi1) {
  auto ld = [&](int i) DSFLASH_AVX512 {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + offsets[i]));
  };
  __m512i z[8];
  for (int n = 0; n < 8; ++n) z[n] = _mm512_inserti64x4(_mm512_castsi256_si512(ld(2 * n)), ld(2 * n + 1), 1);
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
    auto ld = [&](int i) DSFLASH_AVX512 {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + offsets[4 * n + i]));
    };
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

}  // namespace

template <bool kFp4>
void multi_row_tiles(const GemmArgs& g, bool amx, int64_t tile_begin, int64_t tile_end) {
  if constexpr (!kAvx512Bf16) gemm_tiles_rows<kFp4, false>(g, tile_begin, tile_end);
  else if (!amx) gemm_tiles_rows<kFp4, false>(g, tile_begin, tile_end);
  else if (g.rows >= kAmxWideRows) gemm_tiles_rows<kFp4, true, kAmxTilesPerPass>(g, tile_begin, tile_end);
  else gemm_tiles_rows<kFp4, true>(g, tile_begin, tile_end);
}
template void multi_row_tiles<false>(const GemmArgs&, bool, int64_t, int64_t);
template void multi_row_tiles<true>(const GemmArgs&, bool, int64_t, int64_t);

}  // namespace DSFLASH_AVX512_NAMESPACE
