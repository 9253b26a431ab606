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
// - other rows >= 2 (multi_row_tiles, linear_avx512_rows.cpp): weight tiles converted once per 32-K block into an
//   L1 scratch laid out [16 k-pairs][16 outputs] bf16 dwords; per row, 16 vdpbf16ps with broadcast activation
//   pairs leave the block partials of 16 outputs in one zmm (no horizontal reduction); the scratch serves every row.
// Tile-major (the load-time copy): each 64-byte vector decodes straight into that scratch layout (FP8: 2 pairs
// with the two byte lookups and unpacks, FP4: 4 pairs with a shift and vpermw each), so there is neither a
// gather nor a reduction. Rows 1..4 (tiled_decode_rows, linear_avx512_tiled.cpp) keep the pairs in registers,
// rows 5..12 (FP8) or 5..48 (MXFP4) in several such passes (tiled_passes_max_rows); more rows go through
// multi_row_tiles. Both sum a block's 16 pairs in one chain in pair order, so a row's result does not depend on the
// rows it runs with (MXFP4 passes take exact integer dots where they give those bits and pay:
// tiled_fp4_takes_integers).
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

constexpr int64_t kPrefillRowBlock = 256;  // rows per pass over the weights in prefill
// Folding the weight scales costs ~6 vector ops per converted scratch vector and saves one multiply per row and
// block: measured (bench_linear, tiled, 2 threads) 7% slower at 16 rows, even at 64, 1-6% faster at 256.
constexpr int64_t kFoldWeightScalesMinRows = 128;



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
    if (kFp4 && kAvx512Vnni && x.codes != nullptr &&
        tiled_fp4_takes_integers(x.rows / tiled_decode_pass_count(x.rows), 2, fma)) {
      // MXFP4: through integers wherever that is exact (prepare_exact_fp4_rows) and pays (the smallest pass's rows
      // decide), the bf16 chain elsewhere.
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
      multi_row_tiles<kFp4>(a, amx_rows, begin, end);
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
