// The machine's dense-compute peak, measured now (DESIGN.md "Speed": a speed figure is printed next to the
// same-run machine limit). bf16 dot peak: every worker thread runs independent chains of the widest bf16 dot
// instruction the CPU has on registers only (AVX-512 BF16 `vdpbf16ps`: 32 bf16 products summed pairwise into 16
// fp32 lanes = 64 FLOPs per instruction), so nothing but the dot units is timed. Without AVX-512 BF16 the probe
// times fp32 FMAs on 8 lanes (16 FLOPs per instruction) and says so. Not a model kernel: it has no reference twin;
// tests check its accounting and that it reports a positive rate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace dsflash {

struct DotPeak {
  double gflops = 0.0;          // all threads together
  std::string kernel;           // "avx512bf16 vdpbf16ps", "avx2 fp32 fma", "avx512 fp32 fma", "amx-bf16 tdpbf16ps",
                                // "avx512vnni vpdpbusd", "avx2 vpmaddubsw"
  int64_t flops_per_thread = 0; // FLOPs each thread executed in the timed run
  double seconds = 0.0;
};

// What the probe times: the bf16 dot peak above (the dense-GEMM limit), or:
// kAmxBf16: the AMX tile unit's bf16 dot (TDPBF16PS, 16 x 16 x 32 = 16384 FLOPs per instruction; the "amx"
// kernel table's GEMM limit); the bf16 dot peak above on CPUs without it.
// kFp32Fma: fused fp32 multiply-adds, 16 lanes (32 FLOPs per instruction; 8 lanes without AVX-512 F), the limit
// of the FP8 / MXFP4 GEMMs where they multiply bf16 values as fp32 (kernels/linear_impl.h, RowsMultiply) and of
// sparse attention (exact products).
// kFp32Fma256: fused fp32 multiply-adds on 8 lanes whatever else the CPU has: the limit of the avx2 table's GEMMs,
// which multiply with them on every CPU.
// kInt8Dot: u8 x s8 dots into int32 lanes (AVX-512 VNNI `vpdpbusd`: 64 products and their sums = 128 ops per
// instruction; without VNNI, AVX2 `vpmaddubsw` + `vpaddw`: 32 products and sums = 64 ops per pair), the limit of the
// indexer's exact-integer scores (kernels/index_score.h). `gflops` then counts these integer ops.
enum class PeakOps { kBf16Dot, kAmxBf16, kFp32Fma, kFp32Fma256, kInt8Dot };

// Runs for about `seconds` on every thread of `pool` (null: the calling thread only).
DotPeak measure_dot_peak(ThreadPool* pool, double seconds = 0.25, PeakOps ops = PeakOps::kBf16Dot);
// The instruction measure_dot_peak(…, ops) times on this CPU (its DotPeak::kernel), without timing anything.
std::string dot_peak_kernel(PeakOps ops);

// The machine's memory read bandwidth, measured now: every thread of `pool` sums its contiguous share of a
// `bytes`-long buffer (far larger than the caches), `passes` times, each time with every read loop the CPU runs
// (256-bit loads, the same with a 4 KB software prefetch, 512-bit loads with it, with a 2 KB one, and with that over
// four streams at once as the tile-major decode kernels read); the best pass
// counts (other load on a shared machine only ever slows a pass; CPUs differ in which loop reads fastest). The
// roofline of a memory-bound step is its weight bytes over this rate.
struct ReadPeak {
  double gbps = 0.0;      // bytes / second / 1e9, all threads together
  int64_t bytes = 0;      // bytes read per pass
  double seconds = 0.0;   // the best pass
};
ReadPeak measure_read_bandwidth(ThreadPool* pool, int64_t bytes = int64_t{512} << 20, int passes = 3);
// Those read loops, for benchmarks that time a read of particular bytes: each sums `words` 64-bit words from `data`
// (wrapping; a value the compiler must compute, so every load stays).
using ReadLoop = uint64_t (*)(const uint64_t* data, int64_t words);
std::vector<ReadLoop> read_loops();

// FLOPs of one call of the probe's inner loop of `iterations` rounds for `kernel` (what measure_dot_peak counts).
int64_t dot_probe_flops(const std::string& kernel, int64_t iterations);

}  // namespace dsflash
