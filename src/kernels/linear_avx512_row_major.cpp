// AVX-512 decode paths on row-major FP8 / MXFP4 weights (the checkpoint's order, kept for shapes the load-time
// tile-major copy does not take, or when it is turned off). Tiles of 16 outputs, lane = output in the results:
// - FP8, rows == 1 (fp8_decode_tiles): K walked in pairs of blocks; for one output, 64 codes become two zmm
//   of bf16 whose low 256 bits hold block b and high 256 bits block b+1 (activations prepared in the same
//   order), a transposing reduction of 16 outputs gives P_b, P_b+1. Convert and multiply in registers.
// - MXFP4, rows 1..4 (fp4_decode_tiles): one zmm = 64 packed bytes = 4 blocks of one output, converted
//   once for all rows; one 16x4 reduction per row and 128 K.
// Numerics and the other paths: linear_avx512.cpp.
#include <cstring>

#include "kernels/linear_avx512_impl.h"
#include "kernels/linear_tables.h"

namespace dsflash::linear_impl {

namespace {

constexpr int kChunkPairs = 16;   // block pairs per chunk of weight scales
constexpr int64_t kPrefetchPairs = 8;  // FP8: 8 pairs x 16 rows x 64 B = 8 KB ahead (FP4: twice the pairs)

// dot(i) for the 16 outputs i of a tile gives vectors whose lanes 0-7 sum to block b's partial and lanes
// 8-15 to block b+1's -> p0, p1 with lane i = output i. The vectors are folded as they are produced and
// only through named values (no array), which keeps them in registers.
template <class Dot>
DSFLASH_AVX512 inline void reduce_16x2(const Dot& dot, __m512* p0, __m512* p1) {
  auto s = [&](int m) DSFLASH_AVX512 {  // outputs 2m, 2m+1: per 128-bit lane [a0+a2, b0+b2, a1+a3, b1+b3]
    const __m512 a = dot(2 * m), b = dot(2 * m + 1);
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  };
  auto t = [&](int n) DSFLASH_AVX512 {  // outputs 4n..4n+3, one 4-lane sum per 128-bit lane
    const __m512d a = _mm512_castps_pd(s(2 * n)), b = _mm512_castps_pd(s(2 * n + 1));
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  };
  auto u = [&](int h) DSFLASH_AVX512 {  // lanes [b: 8h..8h+3, b+1: 8h..8h+3, b: 8h+4.., b+1: 8h+4..]
    const __m512 a = t(2 * h), b = t(2 * h + 1);
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  const __m512 u0 = u(0), u1 = u(1);
  *p0 = _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0));
  *p1 = _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1));
}

DSFLASH_AVX512 inline __m512 dot_pair(__m512i w0, __m512i w1, __m512i a0, __m512i a1) {
  __m512 v = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w0, (__m512bh)a0);
  return _mm512_dpbf16_ps(v, (__m512bh)w1, (__m512bh)a1);
}

}  // namespace

// FP8 decode: activation codes [1, k] -> bf16 in the weights' lane order, [npairs, 64] words (A0 = first 32,
// A1 = last 32 of each pair); a missing last block (odd block count) is zero. Code i of a pair ->
// A0[8*(i/16) + i%16] when i%16 < 8, else A1[8*(i/16) + i%16 - 8]: what fp8_to_bf16 makes of the codes.
DSFLASH_AVX512 void prepare_activation_pairs(const Fp8Activations& x, int64_t npairs, uint16_t* out) {
  const Avx512Tables& at = avx512_tables();
  const __m512i lo0 = _mm512_load_si512(at.fp8_lo), lo1 = _mm512_load_si512(at.fp8_lo + 64);
  const __m512i hi0 = _mm512_load_si512(at.fp8_hi), hi1 = _mm512_load_si512(at.fp8_hi + 64);
  const int64_t kb = x.k / 32;
  for (int64_t p = 0; p < npairs; ++p) {
    const __m512i c = 2 * p + 1 < kb ? _mm512_loadu_si512(x.codes + p * 64)
                                     : _mm512_maskz_loadu_epi8(0xffffffffull, x.codes + p * 64);  // lone block
    __m512i a0, a1;
    fp8_to_bf16(c, lo0, lo1, hi0, hi1, &a0, &a1);
    _mm512_storeu_si512(out + p * 64, a0);
    _mm512_storeu_si512(out + p * 64 + 32, a1);
  }
}

// FP8 decode (rows == 1): tiles [tile_begin, tile_end) of y.
DSFLASH_AVX512 void fp8_decode_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const Avx512Tables& at = avx512_tables();
  const __m512i lo0 = _mm512_load_si512(at.fp8_lo), lo1 = _mm512_load_si512(at.fp8_lo + 64);
  const __m512i hi0 = _mm512_load_si512(at.fp8_hi), hi1 = _mm512_load_si512(at.fp8_hi + 64);
  const int64_t row_bytes = g.in;

  // Weights of output `row` (its first byte), block pair p -> W0, W1 (a lone last block reads only its own bytes).
  auto convert = [&](const uint8_t* row, int64_t p, bool half, __m512i* w0, __m512i* w1) DSFLASH_AVX512 {
    const uint8_t* src = row + p * kGroupBytes;
    __m512i codes = half ? _mm512_maskz_loadu_epi8(0xffffffffull, src) : _mm512_loadu_si512(src);
    fp8_to_bf16(codes, lo0, lo1, hi0, hi1, w0, w1);
  };

  // Software prefetch: the 16 row streams of a tile defeat the hardware prefetchers (short rows end before
  // they train, long ones exceed the streams they track). While at (tile, pair p) we prefetch the bytes
  // used kPrefetchPairs pairs later in the same walk order (possibly in a later tile of this range):
  // base of row 0 of that tile at that pair, or nullptr past the range. ~8 KB ahead, within L1.
  const int64_t prefetch_pairs = kPrefetchPairs;
  auto prefetch_base = [&](int64_t tile, int64_t p) -> const uint8_t* {
    const int64_t q = p + prefetch_pairs;
    const int64_t t = tile + q / g.npairs;
    if (t >= tile_end) return nullptr;
    const int64_t row0 = std::min(t * kTile, g.out - kTile >= 0 ? g.out - kTile : 0);
    return g.w + row0 * row_bytes + (q % g.npairs) * kGroupBytes;
  };

  alignas(64) float sw[2 * kChunkPairs][kTile];                  // weight scales of the chunk's blocks
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t o0 = tile * kTile;
    const int n = static_cast<int>(std::min<int64_t>(kTile, g.out - o0));
    const __mmask16 store_mask = static_cast<__mmask16>((1u << n) - 1);
    const uint8_t* rows[kTile];  // outputs past the end repeat the last one; their lanes are not stored
    for (int i = 0; i < kTile; ++i) rows[i] = g.w + (o0 + std::min(i, n - 1)) * row_bytes;

    for (int64_t p0 = 0; p0 < g.npairs; p0 += kChunkPairs) {
      const int64_t p1 = std::min(g.npairs, p0 + kChunkPairs);
      const int64_t b_end = std::min(2 * p1, g.kb);
      for (int64_t b = 2 * p0; b < b_end; ++b)
        _mm512_store_ps(sw[b - 2 * p0], _mm512_set1_ps(dt.e8m0_f32[g.w_scales[(o0 / 32) * g.kb + b]]));

      __m512 y = p0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(store_mask, g.y + o0);
      for (int64_t p = p0; p < p1; ++p) {
        const bool half = 2 * p + 1 == g.kb;
        const __m512i a0 = _mm512_loadu_si512(g.act + p * 64), a1 = _mm512_loadu_si512(g.act + p * 64 + 32);
        const uint8_t* ahead = prefetch_base(tile, p);
        auto dot = [&](int i) DSFLASH_AVX512 {
          __m512i w0, w1;
          if (ahead) _mm_prefetch(reinterpret_cast<const char*>(ahead + i * row_bytes), _MM_HINT_T0);
          convert(rows[i], p, half, &w0, &w1);
          return dot_pair(w0, w1, a0, a1);
        };
        __m512 pb, pb1;
        reduce_16x2(dot, &pb, &pb1);
        const int64_t bi = 2 * (p - p0);
        y = _mm512_add_ps(y, _mm512_mul_ps(_mm512_mul_ps(pb, _mm512_set1_ps(dt.e8m0_f32[g.act_scales[2 * p]])),
                                           _mm512_load_ps(sw[bi])));
        if (!half)
          y = _mm512_add_ps(y, _mm512_mul_ps(_mm512_mul_ps(pb1, _mm512_set1_ps(dt.e8m0_f32[g.act_scales[2 * p + 1]])),
                                             _mm512_load_ps(sw[bi + 1])));
      }
      _mm512_mask_storeu_ps(g.y + o0, store_mask, y);
    }
  }
}

// ---- MXFP4 decode (rows == 1) ----
// One output's 64 packed bytes (4 blocks, 128 K) are one zmm; word i holds the codes of k = 4i..4i+3, so
// vpermw on (word >> 4q) looks up code q of every word (the table repeats its 16 entries: the index's bit 4
// is the next nibble's). W_q word i = bf16 of k = 4i + q, and dword d of dp(W_q, A_q) sums k = 8d + q and
// 8d + 4 + q: 128-bit lane b of the accumulator holds block b's partial in 4 pieces. The activations are
// prepared in that order: A_q word i = a[4i + q] per 128-K group. The 16 outputs' accumulators fold into
// 4 vectors P_b (lane = output) with 2 in-lane levels and a lane transpose: one reduction per 4 blocks.
constexpr int64_t kFp4DecodePrefetchGroups = 8;  // 8 x 16 rows x 64 B = 8 KB ahead
constexpr int kFp4DecodeChunkGroups = 8;         // weight scales are transposed 32 blocks at a time
constexpr int64_t kFp4DecodeScaleLeadGroups = 6;  // next tile's scales are fetched ~6 groups before its start

// Natural bf16 activations [k] -> [ceil(k/128)][4][32] words in the order above (zero past k).
void fp4_decode_activation_order(const uint16_t* natural, int64_t k, uint16_t* out) {
  const int64_t groups = (k + 127) / 128;
  for (int64_t g = 0; g < groups; ++g)
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < 32; ++i) {
        const int64_t kk = 128 * g + 4 * i + q;
        out[g * 128 + q * 32 + i] = kk < k ? natural[kk] : 0;
      }
}

// One vector per activation row (the decode path runs 1..kFp4DecodeMaxRows rows on one conversion).
template <int R>
struct RowVecs {
  __m512 v[R];
};

template <int R, class Dot>
DSFLASH_AVX512 inline void reduce_16x4(const Dot& dot, RowVecs<R>* p) {
  auto s = [&](int m) DSFLASH_AVX512 {  // outputs 2m, 2m+1: per 128-bit lane [a0+a2, b0+b2, a1+a3, b1+b3]
    const RowVecs<R> a = dot(2 * m), b = dot(2 * m + 1);
    RowVecs<R> r;
    for (int k = 0; k < R; ++k)
      r.v[k] = _mm512_add_ps(_mm512_unpacklo_ps(a.v[k], b.v[k]), _mm512_unpackhi_ps(a.v[k], b.v[k]));
    return r;
  };
  auto t = [&](int n) DSFLASH_AVX512 {  // outputs 4n..4n+3, full sums, per 128-bit lane (= block)
    const RowVecs<R> a = s(2 * n), b = s(2 * n + 1);
    RowVecs<R> r;
    for (int k = 0; k < R; ++k) {
      const __m512d x = _mm512_castps_pd(a.v[k]), y = _mm512_castps_pd(b.v[k]);
      r.v[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    return r;
  };
  const RowVecs<R> t0 = t(0), t1 = t(1), t2 = t(2), t3 = t(3);
  for (int k = 0; k < R; ++k) {
    const __m512 u0 = _mm512_shuffle_f32x4(t0.v[k], t1.v[k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u1 = _mm512_shuffle_f32x4(t0.v[k], t1.v[k], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 u2 = _mm512_shuffle_f32x4(t2.v[k], t3.v[k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u3 = _mm512_shuffle_f32x4(t2.v[k], t3.v[k], _MM_SHUFFLE(3, 2, 3, 2));
    p[0].v[k] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(2, 0, 2, 0));
    p[1].v[k] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(3, 1, 3, 1));
    p[2].v[k] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(2, 0, 2, 0));
    p[3].v[k] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// g.act: the decode-order activations of R rows, [R][groups][128] words; y, act_scales: R rows.
template <int R>
DSFLASH_AVX512 void fp4_decode_tiles(const GemmArgs& g, int64_t tile_begin, int64_t tile_end) {
  const LinearDecodeTables& dt = linear_decode_tables();
  const __m512i table = _mm512_load_si512(avx512_tables().fp4);
  const int64_t row_bytes = g.in / 2;
  const int64_t groups = (g.kb + 3) / 4;
  auto ahead_base = [&](int64_t tile, int64_t gi) -> const uint8_t* {
    const int64_t q = gi + kFp4DecodePrefetchGroups;
    const int64_t t = tile + q / groups;
    if (t >= tile_end) return nullptr;
    const int64_t row0 = std::min(t * kTile, g.out - kTile >= 0 ? g.out - kTile : 0);
    return g.w + row0 * row_bytes + (q % groups) * kGroupBytes;
  };
  alignas(64) float sw[4 * kFp4DecodeChunkGroups][kTile];
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t o0 = tile * kTile;
    const int n = static_cast<int>(std::min<int64_t>(kTile, g.out - o0));
    const __mmask16 store_mask = static_cast<__mmask16>((1u << n) - 1);
    int64_t rows_o[kTile];
    const uint8_t* rows[kTile];  // first bytes
    for (int i = 0; i < kTile; ++i) {
      rows_o[i] = o0 + std::min(i, n - 1);
      rows[i] = g.w + (o0 + std::min(i, n - 1)) * row_bytes;
    }
    if (tile == tile_begin) prefetch_fp4_scales(g, tile);
    RowVecs<R> y;
    for (int k = 0; k < R; ++k) y.v[k] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < groups; g0 += kFp4DecodeChunkGroups) {
      const int64_t g1 = std::min(groups, g0 + kFp4DecodeChunkGroups);
      fp4_weight_scales(g, rows_o, 4 * g0, std::min(4 * g1, g.kb), sw);
      for (int64_t gi = g0; gi < g1; ++gi) {
        const int nblocks = static_cast<int>(std::min<int64_t>(4, g.kb - 4 * gi));
        const __mmask64 load_mask = nblocks == 4 ? ~__mmask64{0} : (__mmask64{1} << (16 * nblocks)) - 1;
        const uint16_t* a = g.act + gi * 128;
        const int64_t act_stride = groups * 128;
        const uint8_t* ahead = ahead_base(tile, gi);
        // The next tile's scales: late enough that this tile's weight stream does not evict them first.
        if (gi == std::max<int64_t>(0, groups - kFp4DecodeScaleLeadGroups) && tile + 1 < tile_end)
          prefetch_fp4_scales(g, tile + 1);
        auto dot = [&](int i) DSFLASH_AVX512 {
          if (ahead) _mm_prefetch(reinterpret_cast<const char*>(ahead + i * row_bytes), _MM_HINT_T0);
          const uint8_t* src = rows[i] + gi * kGroupBytes;
          const __m512i raw = nblocks == 4 ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(load_mask, src);
          const __m512i w0 = _mm512_permutexvar_epi16(raw, table);
          const __m512i w1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 4), table);
          const __m512i w2 = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 8), table);
          const __m512i w3 = _mm512_permutexvar_epi16(_mm512_srli_epi16(raw, 12), table);
          RowVecs<R> v;
          for (int k = 0; k < R; ++k) {
            const uint16_t* ak = a + k * act_stride;
            v.v[k] = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)w0, (__m512bh)_mm512_loadu_si512(ak));
            v.v[k] = _mm512_dpbf16_ps(v.v[k], (__m512bh)w1, (__m512bh)_mm512_loadu_si512(ak + 32));
            v.v[k] = _mm512_dpbf16_ps(v.v[k], (__m512bh)w2, (__m512bh)_mm512_loadu_si512(ak + 64));
            v.v[k] = _mm512_dpbf16_ps(v.v[k], (__m512bh)w3, (__m512bh)_mm512_loadu_si512(ak + 96));
          }
          return v;
        };
        RowVecs<R> p[4];
        reduce_16x4<R>(dot, p);
        for (int b = 0; b < nblocks; ++b) {
          const int64_t blk = 4 * gi + b;
          const __m512 swb = _mm512_load_ps(sw[blk - 4 * g0]);
          for (int k = 0; k < R; ++k)
            y.v[k] = _mm512_add_ps(
                y.v[k], _mm512_mul_ps(_mm512_mul_ps(p[b].v[k], _mm512_set1_ps(dt.e8m0_f32[g.act_scales[k * g.kb + blk]])),
                                      swb));
        }
      }
    }
    for (int k = 0; k < R; ++k) _mm512_mask_storeu_ps(g.y + k * g.out + o0, store_mask, y.v[k]);
  }
}


template void fp4_decode_tiles<1>(const GemmArgs&, int64_t, int64_t);
template void fp4_decode_tiles<2>(const GemmArgs&, int64_t, int64_t);
template void fp4_decode_tiles<3>(const GemmArgs&, int64_t, int64_t);
template void fp4_decode_tiles<4>(const GemmArgs&, int64_t, int64_t);

}  // namespace dsflash::linear_impl
