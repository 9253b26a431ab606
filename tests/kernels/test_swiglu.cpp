// The MoE SwiGLU kernels (kernels/swiglu.h): the AVX2 table path gives the oracle's bits for every bf16 gate value,
// with and without the clamps, at the clamps' edges, for NaN / infinity / subnormal inputs, unrounded fp32 inputs,
// any length (the tail) and in place; a limit that is not a bf16 value takes the oracle's path.
#include <gtest/gtest.h>

#include <string>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "formats/formats.h"
#include "kernels/swiglu.h"
#include "test_backend_util.h"

namespace dsflash {
namespace {

using test::expect_same_bits;
using test::NanBits;

// Both kernels on the same inputs. Where gate and up are both NaN, which payload a product keeps is the
// compiler's choice of operand order: any NaN is accepted for a NaN.
void expect_oracle_bits(const std::vector<float>& gate, const std::vector<float>& up, float limit, float weight,
                        const std::string& what) {
  std::vector<float> want(gate.size()), got(gate.size());
  swiglu_reference(gate.data(), up.data(), static_cast<int64_t>(gate.size()), limit, weight, want.data());
  swiglu_avx2(gate.data(), up.data(), static_cast<int64_t>(gate.size()), limit, weight, got.data());
  expect_same_bits(got, want, what, NanBits::kAnyNan);
}

TEST(Swiglu, EveryBf16GateAndEdgeUpValuesGiveTheOraclesBits) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> ups = {0.0f, -0.0f, 1.0f, -3.25f, 9.96875f, 10.0f, -10.0f, 10.5f, -1e30f, 7.0f,
                                  1e-40f, inf, -inf, nan, 0.123456789f, 5e-3f};
  std::vector<float> gate, up;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    for (size_t k = 0; k < 3; ++k) {  // three up values per gate value, cycling through the list
      gate.push_back(bf16_to_f32(static_cast<uint16_t>(bits)));
      up.push_back(ups[(bits * 3 + k) % ups.size()]);
    }
  }
  for (float limit : {0.0f, 10.0f, 7.0f, 0.5f}) {
    for (float weight : {1.0f, 0.3671875f, -2.5f}) {
      const std::string what = "limit " + std::to_string(limit) + " weight " + std::to_string(weight);
      expect_oracle_bits(gate, up, limit, weight, what);
    }
  }
}

TEST(Swiglu, UnroundedInputsAnyLengthAndInPlace) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  for (int64_t n : {0, 1, 7, 8, 9, 16, 23, 2304}) {
    std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
    for (float& v : gate) v = normal(rng);
    for (float& v : up) v = normal(rng);
    expect_oracle_bits(gate, up, 10.0f, 0.75f, "n " + std::to_string(n));
    std::vector<float> want(gate.size()), in_place = gate;
    swiglu_reference(gate.data(), up.data(), n, 10.0f, 0.75f, want.data());
    swiglu_avx2(in_place.data(), up.data(), n, 10.0f, 0.75f, in_place.data());
    expect_same_bits(in_place, want, "in place, n " + std::to_string(n));
  }
}

TEST(Swiglu, ALimitThatIsNotABf16ValueStillGivesTheOraclesBits) {
  // min(g, 10.1) can be 10.1, which no bf16 table entry holds: the kernel must not look it up.
  std::vector<float> gate, up;
  for (float g = -12.0f; g <= 12.0f; g += 0.0625f) {
    gate.push_back(g);
    up.push_back(1.0f);
  }
  ASSERT_NE(round_to_bf16(10.1f), 10.1f);
  expect_oracle_bits(gate, up, 10.1f, 1.0f, "limit 10.1");
}

}  // namespace
}  // namespace dsflash
