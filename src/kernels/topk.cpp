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

// A min-heap of the k best seen so far (root = the lowest ranked of them) in `out` itself: no scratch memory.
// The rule is a total order (key, then index), so any correct selection gives the oracle's result.
void select_best(const float* x, int64_t n, int64_t k, int32_t* out) {
  const int64_t count = std::min(k, n);
  if (count <= 0) return;
  auto rank_of = [x](int32_t i) { return Ranked{topk_order_key(x[i]), i}; };
  // std's heap keeps the "largest" by its comparator at the root: with "ranks higher" as "less", the root is the
  // lowest ranked of the k.
  auto heap_cmp = [&](int32_t a, int32_t b) { return ranks_higher(rank_of(a), rank_of(b)); };
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(i);
  std::make_heap(out, out + count, heap_cmp);
  for (int64_t i = count; i < n; ++i) {
    const Ranked candidate{topk_order_key(x[i]), static_cast<int32_t>(i)};
    if (!ranks_higher(candidate, rank_of(out[0]))) continue;
    std::pop_heap(out, out + count, heap_cmp);
    out[count - 1] = static_cast<int32_t>(i);
    std::push_heap(out, out + count, heap_cmp);
  }
  std::sort(out, out + count, heap_cmp);
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
