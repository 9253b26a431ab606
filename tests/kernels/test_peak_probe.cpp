// The compute-peak probe: its FLOP accounting (12 chains x 64 FLOPs per vdpbf16ps, 16 per 8-lane FMA) and a
// positive, finite rate on one thread and on a pool (the rate itself is a measurement, never asserted); the
// read-bandwidth probe's byte count and a positive rate.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/peak_probe.h"

namespace dsflash {
namespace {

TEST(PeakProbe, CountsTheFlopsItRuns) {
  EXPECT_EQ(dot_probe_flops("avx512bf16 vdpbf16ps", 1000), 1000 * 12 * 64);
  EXPECT_EQ(dot_probe_flops("avx2 fp32 fma", 1000), 1000 * 12 * 16);
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
