// The fn products of hc_mixes in vector lanes (kernels/hc.h HcMixDots): dots [tokens, mix_count] fp32.
//
// Each dot is one serial chain acc = acc + round(x[i] * w[i]), i ascending from 0.0f (the build has
// -ffp-contract=off and every step below is a separate mul then add, never an FMA), so a lane that runs one chain
// gives the reference's bits. The reference runs the chains one after another at the add latency; here a vector
// runs 8 or 16 of them at once:
//  - token lanes: a group of 8 (AVX2) / 16 (AVX-512) tokens, x transposed in registers per 8/16 values of i, each
//    fn value broadcast; up to 8 mixes (8 accumulator vectors) per work item. Prefill and batched decode.
//  - mix lanes: up to 8 (AVX2, __m256) / 16 (AVX-512) mixes per vector, the fn rows transposed in registers per
//    8/16 values of i, each x value broadcast; up to 4 tokens per work item share the transposes. The last few
//    tokens and single-token decode, where token lanes would be mostly padding.
// Work items (token group or token pass) x (block of mixes) are split over the pool; every item writes its own
// dots, so any split gives the same bits.
// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -W(maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/hc.h"
#include "kernels/transpose8.h"

#define DSFLASH_HC_AVX512 __attribute__((target("avx512f")))

namespace dsflash {
namespace {

constexpr int kMixBlock = 8;   // mixes per work item (accumulator vectors of a token-lane item; lanes of a mix-lane one)
constexpr int kMixLaneTokens = 4;  // tokens per mix-lane item: 4 chains of 8 lanes cover the add latency
// Mix-lane items read their fn rows (one decode token's dots: each row read once, from memory) this many floats
// ahead of the loads: 12 row streams per thread outrun the hardware prefetchers. bench_backend hc_mixes_cold
// tokens:1 (avx512, 2 threads, two runs): 0.66 of the read with none; 0.78-0.79 at 128 floats, 0.78-0.80 at 256,
// 0.77-0.80 at 512, 0.77-0.78 at 1024.
constexpr int64_t kFnPrefetchFloats = 256;

// One token-lane or mix-lane item: dots of tokens [t0, t0 + tokens) x mixes [m0, m0 + mixes).
struct DotItem {
  const float* streams;  // [num_tokens, flat]
  const float* fn;       // [mix_count, flat]
  float* dots;           // [num_tokens, mix_count]
  int64_t flat;
  int mix_count;
  int64_t t0;
  int tokens;  // valid tokens of the item (<= the lane count for token lanes, <= kMixLaneTokens for mix lanes)
  int m0;
  int mixes;   // <= kMixBlock
};

// Lanes i < n set: the mask of _mm256_maskload_ps.
inline __m256i first_lanes_mask(int64_t n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))), index);
}

// Loads 8 consecutive rows of `base` (row stride `stride`) at column k0, the first `valid_rows` of them real and
// the rest zero, columns past `cols` zero; returns them transposed: cols_out[c] = rows 0..7 at column k0 + c.
inline void load_transposed8(const float* base, int64_t stride, int valid_rows, int64_t k0, int64_t cols,
                             __m256 out[8]) {
  const __m256i mask = first_lanes_mask(cols - k0);
  for (int r = 0; r < 8; ++r)
    out[r] = r < valid_rows ? _mm256_maskload_ps(base + r * stride + k0, mask) : _mm256_setzero_ps();
  transpose8(out);
}

// ---- Mix lanes (AVX2): lane j of acc[t] is the chain of (token t0 + t, mix m0 + j).
template <int kTokens>
void mix_lane_item(const DotItem& it) {
  __m256 acc[kTokens];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const float* w = it.fn + it.m0 * it.flat;
  const float* x = it.streams + it.t0 * it.flat;
  for (int64_t k0 = 0; k0 < it.flat; k0 += 8) {
    __m256 w_cols[8];  // w_cols[c] = fn[m0 .. m0+7][k0 + c]
    if (k0 % 16 == 0)  // a line per row
      for (int r = 0; r < it.mixes; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + r * it.flat + k0 + kFnPrefetchFloats), _MM_HINT_T0);
    load_transposed8(w, it.flat, it.mixes, k0, it.flat, w_cols);
    const int cols = static_cast<int>(std::min<int64_t>(8, it.flat - k0));
    for (int c = 0; c < cols; ++c)
      for (int t = 0; t < kTokens; ++t)
        acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(x[t * it.flat + k0 + c]), w_cols[c]));
  }
  for (int t = 0; t < kTokens; ++t) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[t]);
    std::copy_n(lanes, it.mixes, it.dots + (it.t0 + t) * it.mix_count + it.m0);
  }
}

// ---- Token lanes (AVX2): lane j of acc[m] is the chain of (token t0 + j, mix m0 + m).
template <int kMixes>
void token_lane_item8(const DotItem& it) {
  __m256 acc[kMixes];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const float* w = it.fn + it.m0 * it.flat;
  const float* x = it.streams + it.t0 * it.flat;
  for (int64_t k0 = 0; k0 < it.flat; k0 += 8) {
    __m256 x_cols[8];  // x_cols[c] = x[t0 .. t0+7][k0 + c]
    load_transposed8(x, it.flat, it.tokens, k0, it.flat, x_cols);
    const int cols = static_cast<int>(std::min<int64_t>(8, it.flat - k0));
    for (int c = 0; c < cols; ++c)
      for (int m = 0; m < kMixes; ++m)
        acc[m] = _mm256_add_ps(acc[m], _mm256_mul_ps(x_cols[c], _mm256_set1_ps(w[m * it.flat + k0 + c])));
  }
  for (int m = 0; m < kMixes; ++m) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[m]);
    for (int j = 0; j < it.tokens; ++j) it.dots[(it.t0 + j) * it.mix_count + it.m0 + m] = lanes[j];
  }
}

// ---- Token lanes (AVX-512): 16 tokens per vector.

// rows[r] = a[r][0..15] -> rows[c] = a[0..15][c] (16x16 fp32 transpose in registers).
DSFLASH_HC_AVX512 inline void transpose16(__m512 rows[16]) {
  __m512 t[16], u[16], v[16];
  for (int p = 0; p < 8; ++p) {
    t[2 * p] = _mm512_unpacklo_ps(rows[2 * p], rows[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_ps(rows[2 * p], rows[2 * p + 1]);
  }
  // u[4h + s], 128-bit lane q: column 4q + s of rows 4h .. 4h+3.
  for (int h = 0; h < 4; ++h) {
    u[4 * h + 0] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  // v[s] / v[4+s] (rows 0-7): lanes (col s | col 8+s) / (col 4+s | col 12+s), rows 0-3 then 4-7; v[8+..]: rows 8-15.
  for (int s = 0; s < 4; ++s) {
    v[s] = _mm512_shuffle_f32x4(u[s], u[4 + s], 0x88);
    v[4 + s] = _mm512_shuffle_f32x4(u[s], u[4 + s], 0xDD);
    v[8 + s] = _mm512_shuffle_f32x4(u[8 + s], u[12 + s], 0x88);
    v[12 + s] = _mm512_shuffle_f32x4(u[8 + s], u[12 + s], 0xDD);
  }
  for (int s = 0; s < 4; ++s) {
    rows[s] = _mm512_shuffle_f32x4(v[s], v[8 + s], 0x88);
    rows[8 + s] = _mm512_shuffle_f32x4(v[s], v[8 + s], 0xDD);
    rows[4 + s] = _mm512_shuffle_f32x4(v[4 + s], v[12 + s], 0x88);
    rows[12 + s] = _mm512_shuffle_f32x4(v[4 + s], v[12 + s], 0xDD);
  }
}

template <int kMixes>
DSFLASH_HC_AVX512 void token_lane_item16(const DotItem& it) {
  __m512 acc[kMixes];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const float* w = it.fn + it.m0 * it.flat;
  const float* x = it.streams + it.t0 * it.flat;
  for (int64_t k0 = 0; k0 < it.flat; k0 += 16) {
    const int cols = static_cast<int>(std::min<int64_t>(16, it.flat - k0));
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    __m512 x_cols[16];  // x_cols[c] = x[t0 .. t0+15][k0 + c]
    for (int r = 0; r < 16; ++r)
      x_cols[r] = r < it.tokens ? _mm512_maskz_loadu_ps(mask, x + r * it.flat + k0) : _mm512_setzero_ps();
    transpose16(x_cols);
    for (int c = 0; c < cols; ++c)
      for (int m = 0; m < kMixes; ++m)
        acc[m] = _mm512_add_ps(acc[m], _mm512_mul_ps(x_cols[c], _mm512_set1_ps(w[m * it.flat + k0 + c])));
  }
  for (int m = 0; m < kMixes; ++m) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[m]);
    for (int j = 0; j < it.tokens; ++j) it.dots[(it.t0 + j) * it.mix_count + it.m0 + m] = lanes[j];
  }
}

// ---- Mix lanes (AVX-512): lane j of acc[t] is the chain of (token t0 + t, mix m0 + j), up to 16 mixes. One
// decode token's 24 mixes are then two items of 12, one per thread of a two-thread pool (three items of 8 left one
// thread with two thirds of the fn rows, which a decode step reads from memory).
template <int kTokens>
DSFLASH_HC_AVX512 void mix_lane_item16(const DotItem& it) {
  __m512 acc[kTokens];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const float* w = it.fn + it.m0 * it.flat;
  const float* x = it.streams + it.t0 * it.flat;
  for (int64_t k0 = 0; k0 < it.flat; k0 += 16) {
    const int cols = static_cast<int>(std::min<int64_t>(16, it.flat - k0));
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    __m512 w_cols[16];  // w_cols[c] = fn[m0 .. m0+15][k0 + c]
    for (int r = 0; r < it.mixes; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(w + r * it.flat + k0 + kFnPrefetchFloats), _MM_HINT_T0);
    for (int r = 0; r < 16; ++r)
      w_cols[r] = r >= it.mixes ? _mm512_setzero_ps()
                  : cols == 16  ? _mm512_loadu_ps(w + r * it.flat + k0)
                                : _mm512_maskz_loadu_ps(mask, w + r * it.flat + k0);
    transpose16(w_cols);
    for (int c = 0; c < cols; ++c)
      for (int t = 0; t < kTokens; ++t)
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(x[t * it.flat + k0 + c]), w_cols[c]));
  }
  for (int t = 0; t < kTokens; ++t) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[t]);
    std::copy_n(lanes, it.mixes, it.dots + (it.t0 + t) * it.mix_count + it.m0);
  }
}

// item.mixes (1..kMixBlock) as a compile-time count, so the accumulators stay in registers.
template <template <int> class Kernel>
void by_mix_count(const DotItem& it) {
  switch (it.mixes) {
    case 1: return Kernel<1>::run(it);
    case 2: return Kernel<2>::run(it);
    case 3: return Kernel<3>::run(it);
    case 4: return Kernel<4>::run(it);
    case 5: return Kernel<5>::run(it);
    case 6: return Kernel<6>::run(it);
    case 7: return Kernel<7>::run(it);
    default: return Kernel<8>::run(it);
  }
}
// item.tokens (1..kMixLaneTokens) as a compile-time count, for the mix-lane items.
template <template <int> class Kernel>
void by_token_count(const DotItem& it) {
  switch (it.tokens) {
    case 1: return Kernel<1>::run(it);
    case 2: return Kernel<2>::run(it);
    case 3: return Kernel<3>::run(it);
    default: return Kernel<4>::run(it);
  }
}
template <int kTokens>
struct MixLanes8 {
  static void run(const DotItem& it) { mix_lane_item<kTokens>(it); }
};
template <int kTokens>
struct MixLanes16 {
  static void run(const DotItem& it) { mix_lane_item16<kTokens>(it); }
};
template <int kMixes>
struct TokenLanes8 {
  static void run(const DotItem& it) { token_lane_item8<kMixes>(it); }
};
template <int kMixes>
struct TokenLanes16 {
  static void run(const DotItem& it) { token_lane_item16<kMixes>(it); }
};

// Splits the dots into items and runs them: full groups of kLanes tokens in token lanes (blocks of up to kMixBlock
// mixes); a last partial group too when it has at least kLanes/2 tokens (padding lanes cost less than the mix-lane
// transposes there), else its tokens in mix lanes, kMixLaneTokens at a time, in blocks of up to kMixLanes mixes.
// Blocks are balanced: 24 mixes -> 3 x 8 token-lane blocks, 2 x 12 in 16 mix lanes.
template <int kLanes, void (*kTokenItem)(const DotItem&), int kMixLanes, void (*kMixItem)(const DotItem&)>
void mix_dots_simd(const float* streams, int64_t num_tokens, const float* fn, int mix_count, int64_t flat,
                   float* dots, ThreadPool* pool) {
  if (num_tokens <= 0 || mix_count <= 0) return;
  const int mix_blocks = (mix_count + kMixBlock - 1) / kMixBlock;
  const int block_size = (mix_count + mix_blocks - 1) / mix_blocks;
  const int lane_blocks = (mix_count + kMixLanes - 1) / kMixLanes;
  const int lane_block_size = (mix_count + lane_blocks - 1) / lane_blocks;
  const int64_t rest = num_tokens % kLanes;
  const int64_t token_groups = num_tokens / kLanes + (rest >= kLanes / 2 ? 1 : 0);
  const int64_t lane_tokens = std::min(num_tokens, token_groups * kLanes);  // tokens done in token lanes
  const int64_t passes = (num_tokens - lane_tokens + kMixLaneTokens - 1) / kMixLaneTokens;
  const int64_t token_items = token_groups * mix_blocks;
  const int64_t items = token_items + passes * lane_blocks;
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      DotItem it{streams, fn, dots, flat, mix_count, 0, 0, 0, 0};
      if (i < token_items) {
        it.m0 = static_cast<int>(i % mix_blocks) * block_size;
        it.mixes = std::min(block_size, mix_count - it.m0);
        it.t0 = i / mix_blocks * kLanes;
        it.tokens = static_cast<int>(std::min<int64_t>(kLanes, num_tokens - it.t0));
        kTokenItem(it);
      } else {
        const int64_t j = i - token_items;
        it.m0 = static_cast<int>(j % lane_blocks) * lane_block_size;
        it.mixes = std::min(lane_block_size, mix_count - it.m0);
        it.t0 = lane_tokens + j / lane_blocks * kMixLaneTokens;
        it.tokens = static_cast<int>(std::min<int64_t>(kMixLaneTokens, num_tokens - it.t0));
        kMixItem(it);
      }
    }
  };
  if (pool != nullptr && items > 1) {
    pool->parallel_for(items, run);
  } else {
    run(0, items, 0);
  }
}

}  // namespace

HcMixDots hc_mix_dots_avx2() { return mix_dots_simd<8, by_mix_count<TokenLanes8>, 8, by_token_count<MixLanes8>>; }

HcMixDots hc_mix_dots_avx512() {
  if (!__builtin_cpu_supports("avx512f")) return nullptr;
  return mix_dots_simd<16, by_mix_count<TokenLanes16>, 16, by_token_count<MixLanes16>>;
}

}  // namespace dsflash
