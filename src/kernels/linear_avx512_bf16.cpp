// AVX-512 BF16 linear, y [rows, out] = x [rows, k] fp32 · W [out, k] bf16ᵀ (kernels/linear.h), compiled per
// function with target attributes so the rest of the binary stays x86-64-v3.
//
// Two paths, chosen per call from the activations:
// - bf16 activations (every x is a bf16 value and none is a bf16 subnormal: model.py's bf16 F.linear, e.g. wo_a,
//   the router gate, the head): x is narrowed to bf16 (exact) and `vdpbf16ps` multiplies 32 K per instruction.
//   Each product of two bf16 values is exact in fp32, so only the fp32 summation order differs from the
//   reference's K-order FMAs (the reordering bound of kernels/linear.h). vdpbf16ps treats subnormal inputs
//   as zero, hence the subnormal check; weights are not checked: a subnormal bf16 weight (|w| < 2^-126)
//   changes a product by less than |x| * 2^-126, far below that bound.
// - other activations (genuine fp32, the "fp32" linears): fp32 FMAs on weights widened to fp32.
// Both run tiles of 4 outputs x up to 4 rows (16 accumulators) over the whole K, one horizontal sum per
// output at the end, and walk the rows in blocks whose activations stay in L2 while a thread's groups of
// outputs pass over them.
// The bf16-free copy (DSFLASH_AVX512_NO_BF16, linear_avx512_impl.h) takes the fp32 path for every activation.
// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -Wmaybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "core/thread_pool.h"
#include "kernels/linear_avx512_impl.h"
#include "kernels/linear_impl.h"

namespace DSFLASH_AVX512_NAMESPACE {

namespace {

constexpr int64_t kSpan = 512;                // K elements per inner loop span (fp32 path)
constexpr int64_t kPrefetchElements = 2048;   // weight elements ahead of the walk: 4 rows x 4 KB
constexpr int64_t kRowBlockBytes = 256 << 10;  // activation bytes per row block (L2-resident)
constexpr int kTileRows = 4;

// Rows per block: the block's activations fit kRowBlockBytes; a multiple of the row tile.
int64_t rows_per_block(int64_t row_bytes) {
  return std::max<int64_t>(kTileRows, (kRowBlockBytes / std::max<int64_t>(row_bytes, 1)) / kTileRows * kTileRows);
}

}  // namespace

DSFLASH_AVX512 bool bf16_exact_avx512(const float* x, int64_t n) {
  const __m512i low = _mm512_set1_epi32(0xffff), magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i min_normal = _mm512_set1_epi32(0x00800000);
  int64_t i = 0;
  auto bad = [&](__m512i bits) DSFLASH_AVX512 {
    const __m512i a = _mm512_and_si512(bits, magnitude);
    const __mmask16 subnormal = _mm512_mask_cmplt_epi32_mask(_mm512_test_epi32_mask(a, a), a, min_normal);
    return _mm512_test_epi32_mask(bits, low) != 0 || subnormal != 0;
  };
  for (; i + 16 <= n; i += 16)
    if (bad(_mm512_loadu_si512(x + i))) return false;
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    if (bad(_mm512_maskz_loadu_epi32(m, x + i))) return false;
  }
  return true;
}

DSFLASH_AVX512 void narrow_bf16_rows_avx512(const float* x, int64_t x_stride, int64_t k, int64_t k_pad,
                                            uint16_t* out, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = x + r * x_stride;
    uint16_t* dst = out + r * k_pad;
    for (int64_t i = 0; i < k_pad; i += 16) {
      const int64_t left = std::clamp<int64_t>(k - i, 0, 16);
      const __mmask16 m = static_cast<__mmask16>((1u << left) - 1);
      const __m512i bits = _mm512_srli_epi32(_mm512_maskz_loadu_epi32(m, src + i), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
    }
  }
}

namespace {

// 4 weight rows' prefetch: row j prefetches kPrefetchElements ahead of kk in its own row, or past the row's
// end at the same distance into `next` (the next group's first row), which short rows need: they end before
// the hardware prefetchers ramp up.
inline void prefetch_ahead(const uint16_t* const* rows, const uint16_t* next, int64_t kk, int64_t k) {
  const int64_t target = kk + kPrefetchElements;  // prefetching never faults, even past the end
  for (int j = 0; j < 4; ++j) {
    const uint16_t* a = target < k ? rows[j] + target : next + j * k + (target - k);
    _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
  }
}

// bf16 path tile: outputs o[0..3] (the last repeated past n_out) x RT rows of xb [rows, k_pad] bf16.
// Accumulators stay in registers: no lambda or pointer may capture them (__m512 aliases float).
template <int RT>
DSFLASH_AVX512 void dot_tile(const uint16_t* xb, int64_t k_pad, const uint16_t* w, int64_t k, const int64_t* o,
                             int n_out, int64_t out, float* y, const uint16_t* next) {
  const uint16_t* rows[4];
  for (int j = 0; j < 4; ++j) rows[j] = w + o[j] * k;
  __m512 acc[RT][4];
  for (int r = 0; r < RT; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t k_full = k - k % 32;
  for (int64_t kk = 0; kk < k_full; kk += 32) {
    if (next) prefetch_ahead(rows, next, kk, k);
    __m512bh wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(rows[j] + kk);
    for (int r = 0; r < RT; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + r * k_pad + kk);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[j], xv);
    }
  }
  if (k_full < k) {  // ragged K: masked weights; the activations are zero-padded to k_pad
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << (k - k_full)) - 1);
    __m512bh wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, rows[j] + k_full);
    for (int r = 0; r < RT; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + r * k_pad + k_full);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[j], xv);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int j = 0; j < 4; ++j) {
      const float total = _mm512_reduce_add_ps(acc[r][j]);  // constant indices keep acc in registers
      if (j < n_out) y[r * out + o[j]] = total;
    }
}

// fp32 path tile: fp32 FMAs, 16 lanes per (row, output), weights widened once per tile step. The prefetches
// sit in the span loop, whose body uses plain loads only, so that GCC keeps the accumulators in registers.
template <int RT>
DSFLASH_AVX512 void fma_tile(const float* x, int64_t k, const uint16_t* w, const int64_t* o, int n_out,
                             int64_t out, float* y, const uint16_t* next) {
  const uint16_t* rows[4];
  for (int j = 0; j < 4; ++j) rows[j] = w + o[j] * k;
  __m512 acc[RT][4];
  for (int r = 0; r < RT; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t k_full = k - k % 16;
  for (int64_t k0 = 0; k0 < k_full; k0 += kSpan) {
    const int64_t k1 = std::min(k_full, k0 + kSpan);
    for (int64_t kk = k0; kk < k1; kk += 16) {
      if (next && kk % 32 == 0) prefetch_ahead(rows, next, kk, k);
      __m512 wv[4];
      for (int j = 0; j < 4; ++j)
        wv[j] = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + kk))), 16));
      for (int r = 0; r < RT; ++r) {
        const __m512 xv = _mm512_loadu_ps(x + r * k + kk);
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(xv, wv[j], acc[r][j]);
      }
    }
  }
  if (k_full < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - k_full)) - 1);
    __m512 wv[4];
    for (int j = 0; j < 4; ++j)
      wv[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, rows[j] + k_full)), 16));
    for (int r = 0; r < RT; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * k + k_full);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int j = 0; j < 4; ++j) {
      const float total = _mm512_reduce_add_ps(acc[r][j]);
      if (j < n_out) y[r * out + o[j]] = total;
    }
}

// Activations of one path: row r at data + r * stride (elements of T).
template <class T>
struct Rows {
  const T* data;
  int64_t stride;
};

// Groups [g0, g1) (4 outputs each) for `rows` rows, row block by row block: a block's activations stay in
// L2 while the groups pass over them; within a group the 4 weight rows serve every row tile of the block.
template <class T, class Tile>
void run_groups(Rows<T> x, int64_t rows, const Bf16Weight& w, float* y, int64_t g0, int64_t g1, Tile tile) {
  const int64_t block_rows = rows_per_block(x.stride * static_cast<int64_t>(sizeof(T)));
  for (int64_t rb = 0; rb < rows; rb += block_rows) {
    const int64_t rb_end = std::min(rows, rb + block_rows);
    for (int64_t g = g0; g < g1; ++g) {
      int64_t o[4];
      const int n_out = static_cast<int>(std::min<int64_t>(4, w.out - 4 * g));
      for (int j = 0; j < 4; ++j) o[j] = 4 * g + std::min(j, n_out - 1);
      // Only the block's first row tile reads the weights from memory: it prefetches ahead of itself.
      const uint16_t* ahead = g + 1 < g1 ? w.data + 4 * (g + 1) * w.in : nullptr;
      int64_t r = rb;
      for (; r + 4 <= rb_end; r += 4, ahead = nullptr) tile.template operator()<4>(x.data + r * x.stride, r, o, n_out, ahead);
      switch (rb_end - r) {
        case 3: tile.template operator()<3>(x.data + r * x.stride, r, o, n_out, ahead); break;
        case 2: tile.template operator()<2>(x.data + r * x.stride, r, o, n_out, ahead); break;
        case 1: tile.template operator()<1>(x.data + r * x.stride, r, o, n_out, ahead); break;
        default: break;
      }
    }
  }
}

}  // namespace

void bf16_gemm_avx512(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool) {
  if (rows <= 0 || w.out <= 0) return;
  if (!kAvx512Bf16 || !bf16_exact_avx512(x, rows * w.in)) {
    run_bf16_gemm(x, rows, w, y, pool, [](const float* xs, int64_t n, const Bf16Weight& wt, float* ys, int64_t g0,
                                          int64_t g1) {
      run_groups(Rows<float>{xs, wt.in}, n, wt, ys, g0, g1,
                 [&]<int RT>(const float* xr, int64_t r, const int64_t* o, int n_out, const uint16_t* next)
                     DSFLASH_AVX512 { fma_tile<RT>(xr, wt.in, wt.data, o, n_out, wt.out, ys + r * wt.out, next); });
    });
    return;
  }
#if !DSFLASH_AVX512_NO_BF16
  const int64_t k_pad = (w.in + 31) / 32 * 32;
  ThreadScratch scratch(pool);
  const std::span<uint16_t> narrow = scratch.take<uint16_t>(static_cast<size_t>(rows * k_pad));  // [rows, k_pad] bf16
  if (pool && rows > 1)
    pool->parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      narrow_bf16_rows_avx512(x, w.in, w.in, k_pad, narrow.data(), r0, r1);
    });
  else
    narrow_bf16_rows_avx512(x, w.in, w.in, k_pad, narrow.data(), 0, rows);
  // run_bf16_gemm hands out row ranges as x + r0 * w.in; map them back to the narrowed rows.
  const uint16_t* base = narrow.data();
  run_bf16_gemm(x, rows, w, y, pool, [&](const float* xs, int64_t n, const Bf16Weight& wt, float* ys, int64_t g0,
                                         int64_t g1) {
    const uint16_t* xb = base + ((xs - x) / wt.in) * k_pad;
    run_groups(Rows<uint16_t>{xb, k_pad}, n, wt, ys, g0, g1,
               [&]<int RT>(const uint16_t* xr, int64_t r, const int64_t* o, int n_out, const uint16_t* next)
                   DSFLASH_AVX512 { dot_tile<RT>(xr, k_pad, wt.data, wt.in, o, n_out, wt.out, ys + r * wt.out, next); });
  });
#endif
}

}  // namespace DSFLASH_AVX512_NAMESPACE
