// One table of every kernel the forward runs (DESIGN.md, src/kernels): a Backend per target, filled once at
// start. The model calls kernels only through a Backend (ComputeContext::backend), so the table choice is the only
// dispatch: no ISA #if and no "reference?" branches in model code.
//
// Tables: reference_backend() is the scalar oracle of every entry (single-threaded: it ignores the pool); the SIMD
// tables ("avx2", the x86-64-v3 build baseline; "avx512" where the CPU has F/BW/VL/DQ/BF16/VBMI/VNNI) agree with it
// bit for bit on every entry except the three matmuls, which agree within the reordering bound documented in
// kernels/linear.h. An entry without an AVX-512 version is the AVX2 one (the KV row dequantisation of the AVX2
// table is the scalar oracle: a table lookup and a multiply per value, compiled for the build baseline).
// "avx512" runs MXFP4 GEMMs of 5 rows or more on AMX tiles where the CPU has them, with its own bits: the tile unit
// forms only the blocks whose sums are exact in any order (kernels/linear_impl.h, exact_fp4_blocks).
// "amx" (CPUs with AMX-BF16, chosen by name, never by default) is "avx512" with the FP8 GEMMs of every row count on
// AMX tiles too: faster from 16 rows up (prefill, batched decode), slower for one row (figures in linear_amx.cpp).
// Their in-block summation order is the tile unit's, so its FP8 bits differ from "avx512"'s where a block's fp32 sum
// is inexact (within the same bound; a row's result still never depends on its batch).
// "avx512-no-bf16" (F/BW/VL/DQ/VBMI/VNNI without BF16: Ice Lake-SP; the default there, by name elsewhere) is
// "avx512" compiled without AVX512-BF16, multiplying with fp32 FMAs only, without AMX (kernels/linear_impl.h);
// "avx512-no-vbmi" (F/BW/VL/DQ/VNNI: Cascade Lake) the same without VBMI, its row-major weights on "avx2"'s linears;
// "avx512-no-vnni" (F/BW/VL/DQ: Skylake-SP) that without VNNI's exact MXFP4 dots.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/hc.h"
#include "kernels/index_score.h"
#include "kernels/kv_dequant.h"
#include "kernels/linear.h"
#include "kernels/peak_probe.h"
#include "kernels/sparse_attention.h"
#include "kernels/swiglu.h"

namespace dsflash {

class ThreadPool;

// Every pointer below is set in every table. pool may be nullptr (single-threaded) wherever it is taken.
struct Backend {
  const char* name;  // "reference", "avx2", "avx512"

  // --- linears (kernels/linear.h): y fp32 [rows, w.out] before any bf16 rounding.
  // The linear table's LinearKernels::prefers_tile_major: the formats whose weights run fastest in tile-major order.
  TileMajorFormats prefers_tile_major;
  void (*fp8_gemm)(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* pool);
  void (*fp4_gemm)(const Fp8Activations& x, const Fp4Weight& w, float* y, ThreadPool* pool);
  // x fp32 [rows, w.in].
  void (*bf16_gemm)(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool);
  // The BF16 linear of an FP8 weight's exact bf16 values (wo_a), read from its codes; x fp32 [rows, w.in].
  void (*fp8_as_bf16_gemm)(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* pool);
  // Its grouped (block-diagonal) form, wo_a's einsum (kernels/linear.h fp8_as_bf16_grouped_gemm): x fp32
  // [rows, groups * w.in], y [rows, w.out].
  void (*fp8_as_bf16_grouped_gemm)(const float* x, int64_t rows, int64_t groups, const Fp8Weight& w, float* y,
                                   ThreadPool* pool);

  // --- activation quantisation (formats/quant.h act_quant_block32, row by row):
  // x fp32 [rows, k] (k % 32 == 0) -> codes [rows, k] e4m3, scales [rows, k/32] ue8m0.
  void (*act_quant)(const float* x, int64_t rows, int64_t k, uint8_t* codes, uint8_t* scales, ThreadPool* pool);
  // model.py linear() on FP8 / MXFP4 weights: act_quant of x [rows, w.in] fp32, then this table's fp8_gemm /
  // fp4_gemm -> y fp32 [rows, w.out].
  void (*linear_fp8)(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* pool);
  void (*linear_fp4)(const float* x, int64_t rows, const Fp4Weight& w, float* y, ThreadPool* pool);

  // --- RMSNorm (kernels/rmsnorm.h): x fp32 [rows, dim], weight bf16 bits [dim] -> out [rows, dim] bf16 values
  // (out may alias x).
  void (*rmsnorm_bf16)(const float* x, int64_t rows, int64_t dim, const uint16_t* weight, float eps, float* out,
                       ThreadPool* pool);

  // --- mHC (kernels/hc.h): streams [tokens, hc, dim] -> pre/post [tokens, hc], comb [tokens, hc, hc].
  void (*hc_mixes)(const float* streams, int64_t num_tokens, const HcSiteWeights& site, const HcShape& shape,
                   float* pre, float* post, float* comb, ThreadPool* pool);
  // out [tokens, dim] = bf16(Σ_j pre_mix[t][j] * streams[t][j]).
  void (*hc_pre)(const float* streams, int64_t num_tokens, int hc, int64_t dim, const float* pre_mix, float* out,
                 ThreadPool* pool);
  // out [tokens, hc, dim] = bf16(post[k] * y + Σ_j comb[j][k] * residual[j]); out must not alias residual.
  void (*hc_post)(const float* y, const float* residual, int64_t num_tokens, int hc, int64_t dim, const float* post,
                  const float* comb, float* out, ThreadPool* pool);

  // --- the MoE experts' SwiGLU (kernels/swiglu.h): gate, up, out [n] fp32, out = bf16 values. Single-threaded.
  SwigluKernel swiglu;

  // --- RoPE rotation (kernels/rope_rotate.h): `count` vectors at x + i*stride, each rope_dim = 2*pairs fp32
  // (bf16 values) rotated in place by the shared angles cos/sin [pairs], rounded to bf16; inverse = conjugate.
  void (*rope_rotate)(float* x, int64_t count, int64_t stride, const float* cos, const float* sin, int64_t pairs,
                      bool inverse);

  // --- indexer scores of a block of keys for a tile of queries (kernels/index_score.h IndexScoreArgs).
  // Single-threaded; callers split key blocks over threads.
  void (*index_scores)(const IndexScoreArgs& args);
  // The same scores from the stored (packed MXFP4) key rows (kernels/index_score.h IndexScoreRowsArgs): the
  // reference dequantises them; "avx512" runs exact integer dots (VNNI) where the CPU has AVX-512 VNNI.
  void (*index_scores_rows)(const IndexScoreRowsArgs& args);

  // --- top-k (kernels/topk.h): min(k, n) indices of x [n] in descending rank (value desc, index asc), the same
  // for any pool; the SIMD tables split long rows over it. scratch: memory for the per-thread picks (taken and given
  // back inside the call; nullptr: a private arena, which allocates).
  void (*topk_select)(const float* x, int64_t n, int64_t k, int32_t* out, ThreadPool* pool, Arena* scratch);

  // --- sparse attention with the per-head sink (kernels/sparse_attention.h).
  void (*sparse_attention)(const SparseAttentionArgs& args, ThreadPool* pool);
  // --- its rows from the KV cache bytes (kernels/kv_dequant.h), one row per call: window rows (e4m3, ue8m0
  // scales per 32) and compressed rows (e2m1, e4m3 scales per 16) -> fp32.
  WindowRowDequant dequant_window_row;
  CompressedRowDequant dequant_compressed_row;

  // The dense-compute limit of this table's GEMMs, for speed figures (kernels/peak_probe.h): its linear table's.
  PeakOps gemm_peak = PeakOps::kBf16Dot;
  // From how many rows its MXFP4 GEMMs multiply on the AMX tile unit instead (LinearKernels::fp4_amx_min_rows).
  int64_t fp4_amx_min_rows = 0;
};

// The scalar oracles, single-threaded.
const Backend& reference_backend();
// The fastest table this CPU runs (chosen once, at first use).
const Backend& best_backend();
// Every table this CPU runs, the default first; always ends with the reference (for tests and benchmarks).
std::vector<const Backend*> available_backends();
// The table of that name among available_backends(); nullptr when this CPU lacks it or no table has the name.
const Backend* find_backend(std::string_view name);

}  // namespace dsflash
