// The compute-peak probes: their FLOP accounting (12 chains x 64 FLOPs per vdpbf16ps, 32 / 16 per 16- / 8-lane
// FMA, 32 / 16 per 16- / 8-lane mul + add pair, 16384 per TDPBF16PS, 128 integer ops per vpdpbusd, 64 per
// vpmaddubsw + vpaddw) and a positive, finite rate on one thread and
// on a pool (the rate itself is a measurement, never asserted); the read-bandwidth probe's byte count and a
// positive rate; every read loop reads every word it is given.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/linear_impl.h"
#include "kernels/peak_probe.h"

namespace dsflash {
namespace {

TEST(PeakProbe, CountsTheFlopsItRuns) {
  EXPECT_EQ(dot_probe_flops("avx512bf16 vdpbf16ps", 1000), 1000 * 24 * 64);
  EXPECT_EQ(dot_probe_flops("avx2 fp32 fma", 1000), 1000 * 12 * 16);
  EXPECT_EQ(dot_probe_flops("avx512 fp32 fma", 1000), 1000 * 24 * 32);
  EXPECT_EQ(dot_probe_flops("amx-bf16 tdpbf16ps", 1000), int64_t{1000} * 12 * 16 * 16 * 32 * 2);
  EXPECT_EQ(dot_probe_flops("avx512vnni vpdpbusd", 1000), 1000 * 24 * 128);
  EXPECT_EQ(dot_probe_flops("avx2 vpmaddubsw", 1000), 1000 * 12 * 64);
}

// The AMX probe where the CPU and OS allow tiles, the bf16 dot probe (and says so) elsewhere.
TEST(PeakProbe, AmxProbeRunsWhereTilesAreUsableAndFallsBackElsewhere) {
  ThreadPool pool(2);
  const DotPeak amx = measure_dot_peak(&pool, 0.02, PeakOps::kAmxBf16);
  EXPECT_EQ(amx.kernel, linear_impl::amx_usable() ? "amx-bf16 tdpbf16ps" : measure_dot_peak(nullptr, 0.01).kernel);
  EXPECT_GT(amx.gflops, 0.0);
  EXPECT_TRUE(std::isfinite(amx.gflops));
  EXPECT_EQ(amx.flops_per_thread % dot_probe_flops(amx.kernel, 1), 0);
}

TEST(PeakProbe, ReportsAPositiveRateAndItsKernel) {
  const DotPeak one = measure_dot_peak(nullptr, 0.02);
  EXPECT_FALSE(one.kernel.empty());
  EXPECT_GT(one.gflops, 0.0);
  EXPECT_TRUE(std::isfinite(one.gflops));
  EXPECT_EQ(one.flops_per_thread % dot_probe_flops(one.kernel, 1), 0);
  ThreadPool pool(2);
  const DotPeak two = measure_dot_peak(&pool, 0.02);
  EXPECT_EQ(two.kernel, one.kernel);
  EXPECT_GT(two.gflops, 0.0);
  // The fused fp32 FMA probe (the "avx512fma" GEMM limit).
  const DotPeak fma = measure_dot_peak(&pool, 0.02, PeakOps::kFp32Fma);
  EXPECT_NE(fma.kernel.find("fp32 fma"), std::string::npos) << fma.kernel;
  EXPECT_GT(fma.gflops, 0.0);
  EXPECT_TRUE(std::isfinite(fma.gflops));
  EXPECT_EQ(fma.flops_per_thread % dot_probe_flops(fma.kernel, 1), 0);
  // The avx2 table's limit: 8-lane FMAs on every CPU, AVX-512 ones included.
  const DotPeak fma256 = measure_dot_peak(&pool, 0.02, PeakOps::kFp32Fma256);
  EXPECT_EQ(fma256.kernel, "avx2 fp32 fma");
  EXPECT_GT(fma256.gflops, 0.0);
  EXPECT_EQ(fma256.flops_per_thread % dot_probe_flops(fma256.kernel, 1), 0);
  // The int8 dot probe (the indexer's exact-integer limit): VNNI where the CPU has it.
  const DotPeak int8 = measure_dot_peak(&pool, 0.02, PeakOps::kInt8Dot);
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vnni");
  EXPECT_EQ(int8.kernel, vnni ? "avx512vnni vpdpbusd" : "avx2 vpmaddubsw");
  EXPECT_GT(int8.gflops, 0.0);
  EXPECT_TRUE(std::isfinite(int8.gflops));
  EXPECT_EQ(int8.flops_per_thread % dot_probe_flops(int8.kernel, 1), 0);
}

// What the bench asks before deciding whether a second probe would time anything new.
TEST(PeakProbe, NamesTheKernelItWouldTimeWithoutTimingIt) {
  for (PeakOps ops : {PeakOps::kBf16Dot, PeakOps::kAmxBf16, PeakOps::kFp32Fma, PeakOps::kFp32Fma256,
                      PeakOps::kInt8Dot}) {
    EXPECT_EQ(dot_peak_kernel(ops), measure_dot_peak(nullptr, 0.002, ops).kernel) << static_cast<int>(ops);
  }
  EXPECT_EQ(dot_peak_kernel(PeakOps::kFp32Fma256), "avx2 fp32 fma");
}

TEST(PeakProbe, ReadBandwidthCountsWholeStepsAndIsPositive) {
  const ReadPeak one = measure_read_bandwidth(nullptr, (1 << 20) + 24, 2);
  EXPECT_EQ(one.bytes, 1 << 20);  // rounded down to whole 128-byte steps
  EXPECT_GT(one.gbps, 0.0);
  EXPECT_TRUE(std::isfinite(one.gbps));
  ThreadPool pool(3);
  const ReadPeak three = measure_read_bandwidth(&pool, 3 << 20, 1);
  EXPECT_EQ(three.bytes, 3 << 20);
  EXPECT_GT(three.gbps, 0.0);
}

// Each loop's wrapping sum equals the plain one at lengths around its 16-word steps and its four streams' parts,
// so no word is skipped or read twice (a loop that dropped its tail would time fewer bytes than it claims).
TEST(PeakProbe, EveryReadLoopSumsEveryWord) {
  std::vector<uint64_t> words(4096 + 80);
  for (size_t i = 0; i < words.size(); ++i) words[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
  const std::vector<ReadLoop> loops = read_loops();
  ASSERT_GE(loops.size(), 2u);
  for (const int64_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 200, 4096, 4096 + 79}) {
    uint64_t want = 0;
    for (int64_t i = 0; i < n; ++i) want += words[static_cast<size_t>(i)];
    for (size_t l = 0; l < loops.size(); ++l) EXPECT_EQ(loops[l](words.data(), n), want) << "loop " << l << " words " << n;
  }
}

}  // namespace
}  // namespace dsflash
