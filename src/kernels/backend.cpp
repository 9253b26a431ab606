// The Backend tables: each entry is a kernel of its own file; this file only chooses which one a table holds.
#include "kernels/backend.h"

#include "core/thread_pool.h"
#include "formats/quant.h"
#include "kernels/linear_impl.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_rotate.h"
#include "kernels/topk.h"

namespace dsflash {
namespace {

// ---- Entries shared by the tables (the scalar kernel, run single-threaded or split over the pool by rows /
// tokens; rows are independent, so both give the same bits).

// Runs fn(begin, end) over [0, n) on the pool when there is more than one item.
template <class Fn>
void over_rows(int64_t n, ThreadPool* pool, Fn fn) {
  if (pool != nullptr && n > 1) {
    pool->parallel_for(n, [&](int64_t begin, int64_t end, int) { fn(begin, end); });
  } else if (n > 0) {
    fn(0, n);
  }
}

void act_quant_rows(const float* x, int64_t rows, int64_t k, uint8_t* codes, uint8_t* scales, ThreadPool* pool) {
  over_rows(rows, pool, [&](int64_t begin, int64_t end) {
    act_quant_block32(x + begin * k, (end - begin) * k, codes + begin * k, scales + begin * (k / 32));
  });
}
void act_quant_rows_single(const float* x, int64_t rows, int64_t k, uint8_t* codes, uint8_t* scales, ThreadPool*) {
  act_quant_rows(x, rows, k, codes, scales, nullptr);
}

void rmsnorm_threaded(const float* x, int64_t rows, int64_t dim, const uint16_t* weight, float eps, float* out,
                      ThreadPool* pool) {
  rmsnorm_bf16(x, rows, dim, weight, eps, out, pool);
}
void rmsnorm_single(const float* x, int64_t rows, int64_t dim, const uint16_t* weight, float eps, float* out,
                    ThreadPool*) {
  rmsnorm_bf16(x, rows, dim, weight, eps, out, nullptr);
}

void hc_mixes_single(const float* streams, int64_t num_tokens, const HcSiteWeights& site, const HcShape& shape,
                     float* pre, float* post, float* comb, ThreadPool*) {
  hc_mixes(streams, num_tokens, site, shape, pre, post, comb, nullptr);
}

// The SIMD tables' hc_mixes: the fn products in vector lanes (kernels/hc.h HcMixDots), the same bits.
void hc_mixes_avx2(const float* streams, int64_t num_tokens, const HcSiteWeights& site, const HcShape& shape,
                   float* pre, float* post, float* comb, ThreadPool* pool) {
  static const HcMixDots dots = hc_mix_dots_avx2();
  hc_mixes_with(dots, streams, num_tokens, site, shape, pre, post, comb, pool);
}
void hc_mixes_avx512(const float* streams, int64_t num_tokens, const HcSiteWeights& site, const HcShape& shape,
                     float* pre, float* post, float* comb, ThreadPool* pool) {
  static const HcMixDots dots = hc_mix_dots_avx512();
  hc_mixes_with(dots, streams, num_tokens, site, shape, pre, post, comb, pool);
}

// The SIMD tables' hc_pre / hc_post: the AVX2 kernels, tokens split over the pool.
void hc_pre_threaded(const float* streams, int64_t num_tokens, int hc, int64_t dim, const float* pre_mix, float* out,
                     ThreadPool* pool) {
  over_rows(num_tokens, pool, [&](int64_t begin, int64_t end) {
    hc_pre_avx2(streams + begin * hc * dim, end - begin, hc, dim, pre_mix + begin * hc, out + begin * dim);
  });
}
void hc_pre_single(const float* streams, int64_t num_tokens, int hc, int64_t dim, const float* pre_mix, float* out,
                   ThreadPool*) {
  hc_pre(streams, num_tokens, hc, dim, pre_mix, out);
}

void hc_post_threaded(const float* y, const float* residual, int64_t num_tokens, int hc, int64_t dim,
                      const float* post, const float* comb, float* out, ThreadPool* pool) {
  over_rows(num_tokens, pool, [&](int64_t begin, int64_t end) {
    hc_post_avx2(y + begin * dim, residual + begin * hc * dim, end - begin, hc, dim, post + begin * hc,
                 comb + begin * hc * hc, out + begin * hc * dim);
  });
}
void hc_post_single(const float* y, const float* residual, int64_t num_tokens, int hc, int64_t dim,
                    const float* post, const float* comb, float* out, ThreadPool*) {
  hc_post(y, residual, num_tokens, hc, dim, post, comb, out);
}

// ---- The fused quantise + GEMM of one linear kernel set.
using LinearTable = const LinearKernels* (*)();
const LinearKernels* reference_linear_table() { return &reference_linear_kernels(); }

template <LinearTable kTable>
void fused_linear_fp8(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* pool) {
  linear_fp8(x, rows, w, y, *kTable(), pool);
}
template <LinearTable kTable>
void fused_linear_fp4(const float* x, int64_t rows, const Fp4Weight& w, float* y, ThreadPool* pool) {
  linear_fp4(x, rows, w, y, *kTable(), pool);
}

template <LinearTable kTable>
void grouped_fp8_as_bf16(const float* x, int64_t rows, int64_t groups, const Fp8Weight& w, float* y,
                         ThreadPool* pool) {
  fp8_as_bf16_grouped_gemm(x, rows, groups, w, y, *kTable(), pool);
}

// A SIMD table: the linears of `kTable`, every other entry the threaded fast kernel.
template <LinearTable kTable>
Backend simd_backend(const char* name) {
  const LinearKernels& linear = *kTable();
  return Backend{
      .name = name,
      .prefers_tile_major = linear.prefers_tile_major,
      .fp8_gemm = linear.fp8_gemm,
      .fp4_gemm = linear.fp4_gemm,
      .bf16_gemm = linear.bf16_gemm,
      .fp8_as_bf16_gemm = linear.fp8_as_bf16_gemm,
      .fp8_as_bf16_grouped_gemm = grouped_fp8_as_bf16<kTable>,
      .act_quant = act_quant_rows,
      .linear_fp8 = fused_linear_fp8<kTable>,
      .linear_fp4 = fused_linear_fp4<kTable>,
      .rmsnorm_bf16 = rmsnorm_threaded,
      .hc_mixes = hc_mixes_avx2,
      .hc_pre = hc_pre_threaded,
      .hc_post = hc_post_threaded,
      .swiglu = swiglu_avx2,
      .rope_rotate = rope_rotate_pairs,
      .index_scores = index_scores_packed16,
      .index_scores_rows = index_scores_rows_avx2,
      .topk_select = best_topk().select,
      .sparse_attention = best_sparse_attention().attend,
      .dequant_window_row = reference_kv_dequant().window_row,
      .dequant_compressed_row = reference_kv_dequant().compressed_row,
      .gemm_peak = linear.gemm_peak,
      .fp4_amx_min_rows = linear.fp4_amx_min_rows,
  };
}

// The AVX-512 kernels of the entries other than the linears, where the CPU has them (each checks its own
// features; none needs AVX512-BF16). The indexer's dots take VNNI only where the table may (`vnni`), so that a
// table named for CPUs without it uses none anywhere. Every one gives the bits of the entry it replaces (the
// oracle's).
Backend with_avx512_entries(Backend b, bool vnni) {
  if (IndexScoreRowsKernel exact = vnni ? index_scores_rows_vnni() : index_scores_rows_avx512bw()) {
    b.index_scores_rows = exact;
  }
  if (hc_mix_dots_avx512() != nullptr) b.hc_mixes = hc_mixes_avx512;
  if (const KvDequantKernels* kv = avx512_kv_dequant()) {
    b.dequant_window_row = kv->window_row;
    b.dequant_compressed_row = kv->compressed_row;
  }
  return b;
}

// nullptr when the CPU lacks the table's features. (Every CPU with AVX-512 F/BW/VL/DQ has a table above it.)
const Backend* avx2_backend() {
  if (linear_impl::avx2_kernels() == nullptr) return nullptr;
  static const Backend backend = simd_backend<linear_impl::avx2_kernels>("avx2");
  return &backend;
}

// The Backend of an AVX-512 linear table (linear_impl.h: "avx512" with BF16, and its copies compiled without BF16,
// VBMI or VNNI), its other entries with_avx512_entries; nullptr when the CPU lacks the table's features.
template <LinearTable kTable, bool kVnni = true>
const Backend* avx512_class_backend(const char* name) {
  if (kTable() == nullptr) return nullptr;
  static const Backend backend = with_avx512_entries(simd_backend<kTable>(name), kVnni);
  return &backend;
}

const Backend* avx512_backend() { return avx512_class_backend<linear_impl::avx512_kernels>("avx512"); }

// "avx512" with the FP8 GEMMs on AMX tiles (its fp4_gemm is avx512's).
const Backend* amx_backend() {
  if (linear_impl::amx_kernels() == nullptr) return nullptr;
  static const Backend backend = [] {
    Backend b = *avx512_backend();
    const Backend amx_linears = simd_backend<linear_impl::amx_kernels>("amx");
    b.name = amx_linears.name;
    b.fp8_gemm = amx_linears.fp8_gemm;
    b.fp4_gemm = amx_linears.fp4_gemm;
    b.linear_fp8 = amx_linears.linear_fp8;
    b.linear_fp4 = amx_linears.linear_fp4;
    b.gemm_peak = amx_linears.gemm_peak;
    b.fp4_amx_min_rows = amx_linears.fp4_amx_min_rows;
    return b;
  }();
  return &backend;
}

}  // namespace

const Backend& reference_backend() {
  static const Backend backend{
      .name = "reference",
      .prefers_tile_major = reference_linear_kernels().prefers_tile_major,
      .fp8_gemm = reference_linear_kernels().fp8_gemm,
      .fp4_gemm = reference_linear_kernels().fp4_gemm,
      .bf16_gemm = reference_linear_kernels().bf16_gemm,
      .fp8_as_bf16_gemm = reference_linear_kernels().fp8_as_bf16_gemm,
      .fp8_as_bf16_grouped_gemm = grouped_fp8_as_bf16<reference_linear_table>,
      .act_quant = act_quant_rows_single,
      .linear_fp8 = fused_linear_fp8<reference_linear_table>,
      .linear_fp4 = fused_linear_fp4<reference_linear_table>,
      .rmsnorm_bf16 = rmsnorm_single,
      .hc_mixes = hc_mixes_single,
      .hc_pre = hc_pre_single,
      .hc_post = hc_post_single,
      .swiglu = swiglu_reference,
      .rope_rotate = rope_rotate_pairs,
      .index_scores = index_scores_reference,
      .index_scores_rows = index_scores_rows_reference,
      .topk_select = reference_topk().select,
      .sparse_attention = reference_sparse_attention().attend,
      .dequant_window_row = reference_kv_dequant().window_row,
      .dequant_compressed_row = reference_kv_dequant().compressed_row,
  };
  return backend;
}

std::vector<const Backend*> available_backends() {
  std::vector<const Backend*> all;
  if (const Backend* b = avx512_backend()) all.push_back(b);
  if (const Backend* b = amx_backend()) all.push_back(b);
  // The defaults without AVX512-BF16, without VBMI too, and without VNNI too; by name on CPUs with more.
  for (const Backend* b : {avx512_class_backend<linear_impl::avx512_no_bf16::kernels>("avx512-no-bf16"),
                           avx512_class_backend<linear_impl::avx512_no_vbmi::kernels>("avx512-no-vbmi"),
                           avx512_class_backend<linear_impl::avx512_no_vnni::kernels, false>("avx512-no-vnni")})
    if (b != nullptr) all.push_back(b);
  if (const Backend* b = avx2_backend()) all.push_back(b);
  all.push_back(&reference_backend());
  return all;
}

const Backend& best_backend() {
  static const Backend& best = *available_backends().front();
  return best;
}

const Backend* find_backend(std::string_view name) {
  for (const Backend* b : available_backends())
    if (name == b->name) return b;
  return nullptr;
}

}  // namespace dsflash
