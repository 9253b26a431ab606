// The compute-peak probes: their FLOP accounting (12 chains x 64 FLOPs per vdpbf16ps, 32 / 16 per 16- / 8-lane
// FMA, 32 / 16 per 16- / 8-lane mul + add pair, 16384 per TDPBF16PS) and a positive, finite rate on one thread and
// on a pool (the rate itself is a measurement, never asserted); the read-bandwidth probe's byte count and a
// positive rate.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/linear_impl.h"
#include "kernels/peak_probe.h"

namespace dsflash {
namespace {

TEST(PeakProbe, CountsTheFlopsItRuns) {
  EXPECT_EQ(dot_probe_flops("avx512bf16 vdpbf16ps", 1000), 1000 * 12 * 64);
  EXPECT_EQ(dot_probe_flops("avx2 fp32 fma", 1000), 1000 * 12 * 16);
  EXPECT_EQ(dot_probe_flops("avx512 fp32 fma", 1000), 1000 * 12 * 32);
  EXPECT_EQ(dot_probe_flops("amx-bf16 tdpbf16ps", 1000), int64_t{1000} * 12 * 16 * 16 * 32 * 2);
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

}  // namespace
}  // namespace dsflash
