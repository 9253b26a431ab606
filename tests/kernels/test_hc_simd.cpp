// The SIMD fn products of hc_mixes (kernels/hc.h HcMixDots), the vectorised RMS statistic
// (cascade_sum_squares_avx2; its plain twin cascade_sum_avx2) and the AVX2 hc_pre / hc_post against their scalar references, bit for bit, on
// ragged shapes. The data is chosen so
// that summing in another order, or fusing a product into its add (FMA), changes the bits; the test checks that
// too, so it cannot pass on data that would hide such a kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/hc.h"
#include "kernels/reduce.h"
#include "test_backend_util.h"

namespace dsflash {
namespace {

// Values of varied sign and magnitude (2^-12 .. 2^12, full 24-bit mantissas): sums of their products cancel and
// round a lot, so any change of order or rounding shows up in the result bits.
std::vector<float> ragged_values(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng)) * ((rng() & 1) != 0 ? -1.0f : 1.0f);
  return v;
}

struct NamedDots {
  std::string name;
  HcMixDots kernel;
};

std::vector<NamedDots> simd_dot_kernels() {
  std::vector<NamedDots> all{{"avx2", hc_mix_dots_avx2()}};
  if (HcMixDots k = hc_mix_dots_avx512()) all.push_back({"avx512", k});
  return all;
}

using test::same_bits;

// Wrong variants a kernel could be: the chain with FMA steps, and the chain summed from the top index down.
float fma_chain(const float* x, const float* w, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(x[i], w[i], acc);
  return acc;
}
float reversed_chain(const float* x, const float* w, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = n - 1; i >= 0; --i) acc += x[i] * w[i];
  return acc;
}

TEST(HcMixDots, SimdEqualsReferenceBitForBit) {
  ThreadPool one(1), two(2), three(3);
  ThreadPool* pools[] = {nullptr, &one, &two, &three};
  std::mt19937 rng(41);
  int64_t fma_differs = 0, order_differs = 0, checked = 0;
  // mix_count: hc 4 (24), hc 1 (3), hc 2 (8) and two counts no hc gives (odd block splits).
  for (int mix_count : {24, 3, 8, 13, 17}) {
    for (int64_t flat : {1, 7, 16, 33, 4 * 37, 4 * 128 + 3}) {
      for (int64_t tokens : {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 33}) {
        const std::vector<float> streams = ragged_values(rng, tokens * flat);
        const std::vector<float> fn = ragged_values(rng, mix_count * flat);
        std::vector<float> want(static_cast<size_t>(tokens * mix_count));
        hc_mix_dots_reference(streams.data(), tokens, fn.data(), mix_count, flat, want.data(), nullptr);
        for (int64_t t = 0; t < tokens && flat >= 16; ++t) {  // shorter chains rarely round differently
          for (int m = 0; m < mix_count; ++m) {
            const float* x = streams.data() + t * flat;
            const float* w = fn.data() + m * flat;
            const float ref = want[static_cast<size_t>(t * mix_count + m)];
            fma_differs += same_bits(fma_chain(x, w, flat), ref) ? 0 : 1;
            order_differs += same_bits(reversed_chain(x, w, flat), ref) ? 0 : 1;
            ++checked;
          }
        }
        for (const NamedDots& k : simd_dot_kernels()) {
          for (ThreadPool* pool : pools) {
            std::vector<float> got(want.size(), -1.0f);
            k.kernel(streams.data(), tokens, fn.data(), mix_count, flat, got.data(), pool);
            const std::string what = k.name + " mixes " + std::to_string(mix_count) + " flat " + std::to_string(flat) +
                                     " tokens " + std::to_string(tokens) + " threads " +
                                     std::to_string(pool != nullptr ? pool->num_threads() : 0);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << what;
          }
        }
      }
    }
  }
  // The data must be able to tell: many long chains change under FMA, most under another order.
  EXPECT_GT(fma_differs, checked / 4);
  EXPECT_GT(order_differs, checked / 2);
}

// The vector cascade sums (RMSNorm / mHC statistics, the attention softmax denominator) against the scalar ones.
TEST(HcMixDots, CascadeSumsAvx2BitForBit) {
  std::mt19937 rng(42);
  std::vector<int64_t> sizes;
  for (int64_t n = 0; n <= 300; ++n) sizes.push_back(n);
  // The model's flat sizes (hc 4 x 4096 / 5120), odd ones around them, and one long enough for a deeper cascade
  // level step (more than 2^16 groups of 32 values).
  for (int64_t n : {int64_t{16384}, int64_t{20480}, int64_t{20480 + 31}, int64_t{65536 + 5}, (int64_t{1} << 22) + 8 * 37 + 3}) sizes.push_back(n);
  for (int64_t n : sizes) {
    const std::vector<float> x = ragged_values(rng, n);
    const float want = cascade_sum_squares(x.data(), n, kReferenceReduceWidth);
    const float got = cascade_sum_squares_avx2(x.data(), n);
    ASSERT_TRUE(same_bits(got, want)) << "squares, n " << n << ": " << got << " vs " << want;
    const float want_sum = cascade_sum(x.data(), n, kReferenceReduceWidth);
    const float got_sum = cascade_sum_avx2(x.data(), n);
    ASSERT_TRUE(same_bits(got_sum, want_sum)) << "sum, n " << n << ": " << got_sum << " vs " << want_sum;
  }
}

// Ragged values plus the cases bf16 rounding treats apart: signed zeros, infinities, NaN, fp32 values just below
// the bf16 overflow, exact ties between two bf16 values.
std::vector<float> edgy_values(std::mt19937& rng, int64_t n) {
  std::vector<float> v = ragged_values(rng, n);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3.3895e38f, -3.3895e38f, 1.00390625f, -1.01171875f};
  for (size_t i = 0; i < v.size(); i += 5) v[i] = specials[rng() % std::size(specials)];
  return v;
}

// Bit for bit, except that any NaN matches any NaN (NanBits::kAnyNan): when both operands of an add are NaN, x86
// returns the first one, and which operand of the scalar reference's commutative `acc += p * x` comes first is the
// compiler's choice (with this build the reference keeps the product's NaN where the AVX2 kernel keeps the sum's),
// so the reference itself does not fix a NaN's sign or payload.
TEST(HcPrePostSimd, Avx2EqualsReferenceBitForBit) {
  std::mt19937 rng(43);
  for (int hc : {1, 2, 4}) {
    for (int64_t dim : {1, 7, 8, 9, 33, 100}) {
      for (int64_t tokens : {1, 3, 17}) {
        const std::string what = "hc " + std::to_string(hc) + " dim " + std::to_string(dim) + " tokens " +
                                 std::to_string(tokens);
        const std::vector<float> streams = edgy_values(rng, tokens * hc * dim);
        const std::vector<float> mix = ragged_values(rng, tokens * hc);
        const std::vector<float> comb = ragged_values(rng, tokens * hc * hc);
        const std::vector<float> y = edgy_values(rng, tokens * dim);
        std::vector<float> want(static_cast<size_t>(tokens * dim)), got(want.size(), -1.0f);
        hc_pre(streams.data(), tokens, hc, dim, mix.data(), want.data());
        hc_pre_avx2(streams.data(), tokens, hc, dim, mix.data(), got.data());
        test::expect_same_bits(got, want, "hc_pre " + what, test::NanBits::kAnyNan);
        want.assign(streams.size(), 0.0f);
        got.assign(streams.size(), -1.0f);
        hc_post(y.data(), streams.data(), tokens, hc, dim, mix.data(), comb.data(), want.data());
        hc_post_avx2(y.data(), streams.data(), tokens, hc, dim, mix.data(), comb.data(), got.data());
        test::expect_same_bits(got, want, "hc_post " + what, test::NanBits::kAnyNan);
      }
    }
  }
}

}  // namespace
}  // namespace dsflash
