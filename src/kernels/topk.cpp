#include "kernels/topk.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

namespace dsflash {

uint32_t topk_order_key(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  // Negative: flip all bits (more negative = smaller); positive: set the sign bit (above every negative).
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

namespace {

struct Ranked {
  uint32_t key;
  int32_t index;
};

bool ranks_higher(const Ranked& a, const Ranked& b) {
  return a.key != b.key ? a.key > b.key : a.index < b.index;
}

std::vector<Ranked> ranked(const float* x, int64_t n) {
  std::vector<Ranked> items(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) items[static_cast<size_t>(i)] = {topk_order_key(x[i]), static_cast<int32_t>(i)};
  return items;
}

void select_reference(const float* x, int64_t n, int64_t k, int32_t* out) {
  std::vector<Ranked> items = ranked(x, n);
  std::stable_sort(items.begin(), items.end(), ranks_higher);
  const int64_t count = std::min(k, n);
  for (int64_t i = 0; i < count; ++i) out[i] = items[static_cast<size_t>(i)].index;
}

void select_best(const float* x, int64_t n, int64_t k, int32_t* out) {
  std::vector<Ranked> items = ranked(x, n);
  const int64_t count = std::min(k, n);
  if (count <= 0) return;
  if (count < n) std::nth_element(items.begin(), items.begin() + (count - 1), items.end(), ranks_higher);
  std::sort(items.begin(), items.begin() + count, ranks_higher);
  for (int64_t i = 0; i < count; ++i) out[i] = items[static_cast<size_t>(i)].index;
}

}  // namespace

const TopkKernels& reference_topk() {
  static const TopkKernels kernels{"reference", select_reference};
  return kernels;
}

const TopkKernels& best_topk() {
  static const TopkKernels kernels{"nth_element", select_best};
  return kernels;
}

}  // namespace dsflash
