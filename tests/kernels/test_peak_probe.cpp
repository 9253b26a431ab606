// The compute-peak probe: its FLOP accounting (12 chains x 64 FLOPs per vdpbf16ps, 16 per 8-lane FMA) and a
// positive, finite rate on one thread and on a pool (the rate itself is a measurement, never asserted).
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

}  // namespace
}  // namespace dsflash
