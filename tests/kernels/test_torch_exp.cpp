// exp as the reference's PyTorch evaluates it (src/kernels/torch_exp.h): SLEEF expf_u10 within 1 ulp of the
// correctly rounded exp, its range limits, and which elements of a tensor take the vector path.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/torch_exp.h"

namespace dsflash {
namespace {

TEST(TorchExp, SleefWithinOneUlp) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> range(-87.0f, 88.0f);
  int differ = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = range(rng);
    const float got = sleef_expf_u10(x);
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    ASSERT_LE(std::fabs(got - want), std::fabs(std::nextafter(want, INFINITY) - want)) << x;
    differ += got != want;
  }
  EXPECT_LT(differ, 200000 / 4);  // mostly correctly rounded
  EXPECT_EQ(sleef_expf_u10(0.0f), 1.0f);
  EXPECT_EQ(sleef_expf_u10(-INFINITY), 0.0f);
  EXPECT_EQ(sleef_expf_u10(-104.5f), 0.0f);
  EXPECT_EQ(sleef_expf_u10(101.0f), INFINITY);
  EXPECT_TRUE(std::isnan(sleef_expf_u10(NAN)));
  EXPECT_GT(sleef_expf_u10(-100.0f), 0.0f);  // subnormal results survive the two-step scaling
}

TEST(TorchExp, VectorChunksThenScalarTail) {
  // 4 heads x 7 entries = 28 elements: the first 16 vectorised, the last 12 scalar.
  EXPECT_TRUE(torch_exp_vector_path(0, 28));
  EXPECT_TRUE(torch_exp_vector_path(15, 28));
  EXPECT_FALSE(torch_exp_vector_path(16, 28));
  EXPECT_FALSE(torch_exp_vector_path(3, 4));  // a 4-element tensor is all tail
  EXPECT_TRUE(torch_exp_vector_path(63, 64));
  EXPECT_EQ(torch_exp_element(0.3f, 20, 28), std::exp(0.3f));
  EXPECT_EQ(torch_exp_element(0.3f, 0, 28), sleef_expf_u10(0.3f));
}

}  // namespace
}  // namespace dsflash
