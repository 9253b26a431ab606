#include "kernels/reduce.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace dsflash {
namespace {

int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  uint64_t v = static_cast<uint64_t>(x) - 1;
  int64_t bits = 0;
  while (v) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

// One accumulator stream of the cascade: values fetch(0..size-1) summed into 4 levels; every 16 (or
// more for very long rows) additions level 0 is folded upwards. The schedule depends only on the
// index, so each lane/row stream can be evaluated on its own.
template <class Fetch>
float cascade_stream(int64_t size, const Fetch& fetch) {
  constexpr int kLevels = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  float acc[kLevels] = {0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  while (i + level_step <= size) {
    for (int64_t j = 0; j < level_step; ++j, ++i) acc[0] += fetch(i);
    for (int j = 1; j < kLevels; ++j) {
      acc[j] += acc[j - 1];
      acc[j - 1] = 0.0f;
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i) acc[0] += fetch(i);
  for (int j = 1; j < kLevels; ++j) acc[0] += acc[j];
  return acc[0];
}

template <class Load>
float cascade_sum_impl(int64_t n, int width, const Load& load) {
  constexpr int kIlp = 4;
  if (n < width) {
    // scalar path: four interleaved accumulators over groups of four elements, tail into the first.
    const int64_t groups = n / kIlp;
    float partial[kIlp];
    for (int k = 0; k < kIlp; ++k) {
      partial[k] = cascade_stream(groups, [&](int64_t i) { return load(i * kIlp + k); });
    }
    for (int64_t i = groups * kIlp; i < n; ++i) partial[0] += load(i);
    for (int k = 1; k < kIlp; ++k) partial[0] += partial[k];
    return partial[0];
  }
  const int64_t vectors = n / width;
  const int64_t groups = vectors / kIlp;
  // Per-lane totals on the stack (every width the kernels use); wider ones on the heap.
  constexpr int kStackLanes = 64;
  float stack_lanes[kStackLanes];
  std::vector<float> heap_lanes(width > kStackLanes ? static_cast<size_t>(width) : 0);
  float* lanes = width > kStackLanes ? heap_lanes.data() : stack_lanes;
  for (int lane = 0; lane < width; ++lane) {
    float partial[kIlp];
    for (int k = 0; k < kIlp; ++k) {
      partial[k] = cascade_stream(groups, [&](int64_t i) { return load((i * kIlp + k) * width + lane); });
    }
    for (int64_t v = groups * kIlp; v < vectors; ++v) partial[0] += load(v * width + lane);
    for (int k = 1; k < kIlp; ++k) partial[0] += partial[k];
    lanes[lane] = partial[0];
  }
  float total = 0.0f;
  for (int64_t i = vectors * width; i < n; ++i) total += load(i);
  for (int lane = 0; lane < width; ++lane) total += lanes[lane];
  return total;
}

}  // namespace

float cascade_sum(const float* x, int64_t n, int vector_width) {
  return cascade_sum_impl(n, vector_width, [x](int64_t i) { return x[i]; });
}

float cascade_sum_squares(const float* x, int64_t n, int vector_width) {
  return cascade_sum_impl(n, vector_width, [x](int64_t i) { return x[i] * x[i]; });
}

namespace {

// cascade_sum_impl at kReferenceReduceWidth with the 8 lanes as one AVX2 vector and the four interleaved
// accumulators side by side; kSquares: the values are x[i]² (each square rounded, no FMA).
template <bool kSquares>
float cascade_sum_avx2_impl(const float* x, int64_t n) {
  static_assert(kReferenceReduceWidth == 8, "one __m256 per lane set");
  constexpr int kWidth = 8;
  constexpr int kIlp = 4;
  constexpr int kLevels = 4;
  if (n < kWidth) return kSquares ? cascade_sum_squares(x, n, kWidth) : cascade_sum(x, n, kWidth);  // no vectors
  const int64_t vectors = n / kWidth;
  const int64_t groups = vectors / kIlp;
  // cascade_stream's schedule over `groups` steps, for the kIlp streams at once: acc[k][level], 8 lanes each.
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(groups) / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  __m256 acc[kIlp][kLevels];
  for (auto& stream : acc)
    for (__m256& level : stream) level = _mm256_setzero_ps();
  // Vector v holds x[v*8 .. v*8+7]; stream k of step i reads vector i*kIlp + k.
  auto value = [x](int64_t v) {
    const __m256 a = _mm256_loadu_ps(x + v * kWidth);
    return kSquares ? _mm256_mul_ps(a, a) : a;
  };
  int64_t i = 0;
  while (i + level_step <= groups) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < kIlp; ++k) acc[k][0] = _mm256_add_ps(acc[k][0], value(i * kIlp + k));
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kIlp; ++k) {
        acc[k][j] = _mm256_add_ps(acc[k][j], acc[k][j - 1]);
        acc[k][j - 1] = _mm256_setzero_ps();
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < groups; ++i)
    for (int k = 0; k < kIlp; ++k) acc[k][0] = _mm256_add_ps(acc[k][0], value(i * kIlp + k));
  for (int k = 0; k < kIlp; ++k)
    for (int j = 1; j < kLevels; ++j) acc[k][0] = _mm256_add_ps(acc[k][0], acc[k][j]);
  for (int64_t v = groups * kIlp; v < vectors; ++v) acc[0][0] = _mm256_add_ps(acc[0][0], value(v));
  for (int k = 1; k < kIlp; ++k) acc[0][0] = _mm256_add_ps(acc[0][0], acc[k][0]);
  alignas(32) float lanes[kWidth];
  _mm256_store_ps(lanes, acc[0][0]);
  float total = 0.0f;
  for (int64_t e = vectors * kWidth; e < n; ++e) total += kSquares ? x[e] * x[e] : x[e];
  for (float lane : lanes) total += lane;
  return total;
}

}  // namespace

float cascade_sum_avx2(const float* x, int64_t n) { return cascade_sum_avx2_impl<false>(x, n); }
float cascade_sum_squares_avx2(const float* x, int64_t n) { return cascade_sum_avx2_impl<true>(x, n); }

// multi_row_sum's order: see reduce.h.
float outer_cascade_sum(const float* values, int64_t n) {
  constexpr int kLevels = 4;
  int64_t ceil_log2 = 1;
  if (n > 2) {
    ceil_log2 = 0;
    for (uint64_t v = static_cast<uint64_t>(n) - 1; v != 0; v >>= 1) ++ceil_log2;
  }
  const int64_t level_power = std::max<int64_t>(4, ceil_log2 / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  float acc[kLevels] = {0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  while (i + level_step <= n) {
    for (int64_t j = 0; j < level_step; ++j, ++i) acc[0] += values[i];
    for (int j = 1; j < kLevels; ++j) {
      acc[j] += acc[j - 1];
      acc[j - 1] = 0.0f;
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < n; ++i) acc[0] += values[i];
  for (int j = 1; j < kLevels; ++j) acc[0] += acc[j];
  return acc[0];
}

}  // namespace dsflash
