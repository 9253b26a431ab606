// Internals shared by the SIMD linear kernels (not part of the contract; tests use it to reach every
// version this CPU can run). Each ISA file returns its table, or nullptr when the CPU lacks the features.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/linear.h"

namespace dsflash::linear_impl {

// x86-64-v3: AVX2 + FMA + F16C (the build baseline). nullptr on other CPUs.
const LinearKernels* avx2_kernels();
// AVX-512 F/BW/VL/DQ + BF16 + VBMI + VNNI (Zen 4/5, Sapphire Rapids and later). nullptr when absent.
// How its FP8 / MXFP4 GEMM multiplies where several rows share each decoded weight (the multi-row path, and 2-4
// rows on tile-major weights, where MXFP4 blocks take exact integer dots wherever they can; one row uses
// vdpbf16ps): vdpbf16ps on bf16 pairs, or fp32 FMAs on the same values in vdpbf16ps's order (each pair's odd
// product, then its even one, one rounding each). Both give the same bits: the products are exact and, in what
// this GEMM feeds them, never subnormal (vdpbf16ps would flush them; the GEMM checks bf16 activations and keeps
// vdpbf16ps where it cannot tell). CPUs differ in which is faster: on one Xeon vdpbf16ps took 2.1 cycles per 32
// products and an FMA 0.5 per 16.
enum class RowsMultiply { kBf16Dot, kFp32Fma };
const LinearKernels* avx512_kernels_multiplying(RowsMultiply multiply);  // "avx512" / "avx512fma"
// The faster of the two on this CPU (timed once, ~16 ms); avx512_kernels() is that table.
RowsMultiply fastest_rows_multiply();
const LinearKernels* avx512_kernels();
// The AVX-512 tables' MXFP4 decode (tile-major weights, passes of 1..4 rows) multiplies blocks in integers where that
// gives the bits of the bf16 chain (linear_avx512_tiled.cpp): e4m3 codes [rows, k] -> the integers N (a = N * unit *
// 2) as signed bytes, N = 65536 * p2 + 256 * p1 + p0 with p0, p1 in [-128, 127], in pieces
// [rows, k / 32, kExactFp4PieceBlockBytes]: per 8 k (k0 + 0..7) kExactFp4PieceVectorBytes, for p = 0, 1, 2 the bytes
// of piece p of k0 + 0 4 1 5 2 6 3 7; biases [rows, k/32] int32 = -12 * (Σ N of the block); units [rows, k/32] (a
// power of two); piece_counts [rows, k/32]: 2 where every p2 is 0, else 3, and 0 where the block keeps the bf16 chain
// (a NaN code, or 12 Σ |N| >= 2^24: then units is 0 and pieces and biases are unspecified). Only where
// avx512_kernels() is not nullptr.
constexpr int64_t kExactFp4PieceVectorBytes = 24;
constexpr int64_t kExactFp4PieceBlockBytes = 4 * kExactFp4PieceVectorBytes;
void prepare_exact_fp4_rows(const uint8_t* codes, int64_t rows, int64_t k, int8_t* pieces, int32_t* biases,
                            float* units, uint8_t* piece_counts);
// Whether the products of each 32-K block of e4m3 codes [k] with any MXFP4 weight block sum exactly in fp32 in any
// order (exact [k/32], 1 or 0: no NaN code, and 12 Σ |N| < 2^24 with N as above, the blocks where piece_counts is not
// 0), so that the AMX tile unit gives the bf16 chain's bits there (the multi-row MXFP4 GEMM on tiles, linear_amx.cpp).
void exact_fp4_blocks(const uint8_t* codes, int64_t k, uint8_t* exact);
// The AVX-512 table with the FP8 GEMMs of every row count on AMX-BF16 tiles (Sapphire Rapids and later, where the OS
// grants tile data). nullptr when absent.
const LinearKernels* amx_kernels();
// The CPU has AMX-BF16 and the OS lets this process use tile data (asked once, process-wide).
bool amx_usable();
// The peak probe's AMX loop (kernels/peak_probe.h): `rounds` x 12 TDPBF16PS of 16 x 16 x 32 on 4 independent
// accumulator tiles, registers only; returns a value that depends on the results. Only where amx_usable().
float amx_dot_rounds(int64_t rounds);

// AVX-512 F/BW/VL/DQ + VBMI + VNNI without BF16 (Ice Lake-SP and its client siblings; listed on any CPU with
// those features): the AVX-512 table compiled without avx512bf16 (linear_avx512_no_bf16.cpp), every multiply an
// fp32 FMA (in vdpbf16ps's order: the same bits as "avx512" on tile-major weights and e4m3 activations), no AMX.
// nullptr when absent.
namespace avx512_no_bf16 {
const LinearKernels* kernels();
}
// AVX-512 F/BW/VL/DQ + VNNI without VBMI or BF16 (Cascade Lake): the same compiled a third time
// (linear_avx512_no_vbmi.cpp), its byte lookups on vpermt2w / vpshufb (the same values, so the same bits), its
// row-major weights on the avx2 table. nullptr when absent.
namespace avx512_no_vbmi {
const LinearKernels* kernels();
}
// AVX-512 F/BW/VL/DQ alone (Skylake-SP): the same compiled a fourth time (linear_avx512_no_vnni.cpp), its MXFP4
// blocks on the FMA chain instead of VNNI's exact integer dots (the same bits). nullptr when absent.
namespace avx512_no_vnni {
const LinearKernels* kernels();
}

// The AVX-512 BF16 linear (linear_avx512_bf16.cpp): vdpbf16ps when every activation is a bf16 value, fp32 FMAs
// otherwise. Call only where avx512_kernels() is not nullptr.
void bf16_gemm_avx512(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool);
// True when every x[i] is a bf16 value that vdpbf16ps takes as it is: low 16 bits zero, not subnormal (vdpbf16ps
// reads subnormal inputs as zero).
bool bf16_exact_avx512(const float* x, int64_t n);
// x rows [r0, r1) (fp32 holding bf16 values, k of them at x + r * x_stride) -> their bf16 bits, out [rows, k_pad],
// zero past k (exact).
void narrow_bf16_rows_avx512(const float* x, int64_t x_stride, int64_t k, int64_t k_pad, uint16_t* out, int64_t r0,
                             int64_t r1);

// Every table this CPU runs, the default first (always ends with the reference).
std::vector<const LinearKernels*> available_kernels();

// Threading of the BF16 GEMMs, shared by the ISA files: outputs in groups of 4, split over threads in chunks
// of 8 groups; with few outputs and several rows, the rows are split instead.
// groups_fn(x, rows, w, y, group_begin, group_end) computes y's outputs [4*group_begin, 4*group_end).
template <class GroupsFn>
void run_bf16_gemm(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool,
                   GroupsFn groups_fn) {
  if (rows <= 0 || w.out <= 0) return;
  const int64_t groups = (w.out + 3) / 4;
  if (pool && rows > 1 && groups < 16 * pool->num_threads()) {
    pool->parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      groups_fn(x + r0 * w.in, r1 - r0, w, y + r0 * w.out, 0, groups);
    });
    return;
  }
  auto body = [&](int64_t begin, int64_t end, int) { groups_fn(x, rows, w, y, begin, end); };
  if (pool) pool->parallel_for_nodes(groups, body, 8);
  else body(0, groups, 0);
}

}  // namespace dsflash::linear_impl
