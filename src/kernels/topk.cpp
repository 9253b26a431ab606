#include "kernels/topk.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "core/workspace.h"

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

void select_reference(const float* x, int64_t n, int64_t k, int32_t* out, ThreadPool*, Arena*) {
  std::vector<Ranked> items(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) items[static_cast<size_t>(i)] = {topk_order_key(x[i]), static_cast<int32_t>(i)};
  std::stable_sort(items.begin(), items.end(), ranks_higher);
  const int64_t count = std::min(k, n);
  for (int64_t i = 0; i < count; ++i) out[i] = items[static_cast<size_t>(i)].index;
}

// "a ranks higher than b" on indices into x; as std's heap comparator ("less") it keeps the lowest ranked of a heap
// at the root.
struct RanksHigher {
  const float* x;
  bool operator()(int32_t a, int32_t b) const {
    return ranks_higher(Ranked{topk_order_key(x[a]), a}, Ranked{topk_order_key(x[b]), b});
  }
};

// The `count` best of x[begin, end) (count <= end - begin) into heap [count], unordered. Every index scanned after
// the heap's first fill is larger than every index in it, so it ranks higher than the root exactly when its key is
// larger: the vector compare of eight keys against the root's key rejects the rest, and the few that pass are
// checked again against the root as it rises. Keys as signed ints: order key ^ 2^31 = bits ^ (sign ? 0x7fffffff : 0).
void select_chunk(const float* x, int64_t begin, int64_t end, int64_t count, int32_t* heap) {
  const RanksHigher cmp{x};
  for (int64_t i = 0; i < count; ++i) heap[i] = static_cast<int32_t>(begin + i);
  std::make_heap(heap, heap + count, cmp);
  uint32_t root_key = topk_order_key(x[heap[0]]);
  auto offer = [&](int64_t i) {
    if (topk_order_key(x[i]) <= root_key) return;
    std::pop_heap(heap, heap + count, cmp);
    heap[count - 1] = static_cast<int32_t>(i);
    std::push_heap(heap, heap + count, cmp);
    root_key = topk_order_key(x[heap[0]]);
  };
  int64_t i = begin + count;
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  for (; i + 8 <= end; i += 8) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i keys = _mm256_xor_si256(bits, _mm256_and_si256(_mm256_srai_epi32(bits, 31), magnitude));
    const __m256i root = _mm256_set1_epi32(static_cast<int32_t>(root_key ^ 0x80000000u));
    unsigned above = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(keys, root))));
    while (above != 0) {
      offer(i + __builtin_ctz(above));
      above &= above - 1;
    }
  }
  for (; i < end; ++i) offer(i);
}

// Values per chunk at least (and 4 k): the vector scan takes ~0.5 ns a value, so a shorter chunk would not pay for
// the pool's hand-off and the merge. A 1M-score row splits over up to 8 threads, a 131072-block row stays whole
// (its cost is the heap's replacements, which a split does not divide).
constexpr int64_t kMinChunk = 131072;

void select_best(const float* x, int64_t n, int64_t k, int32_t* out, ThreadPool* pool, Arena* scratch) {
  const int64_t count = std::min(k, n);
  if (count <= 0) return;
  const RanksHigher cmp{x};
  const int64_t threads = pool != nullptr ? pool->num_threads() : 1;
  const int64_t chunks = std::clamp<int64_t>(n / std::max(kMinChunk, 4 * count), 1, threads);
  if (chunks == 1) {
    select_chunk(x, 0, n, count, out);
    std::sort(out, out + count, cmp);
    return;
  }
  Arena own;
  Arena& arena = scratch != nullptr ? *scratch : own;
  ArenaScope scope(arena);
  const int64_t length = (n + chunks - 1) / chunks;
  const std::span<int32_t> picks = arena.take<int32_t>(static_cast<size_t>(chunks * count));  // [chunks][count]
  const std::span<int64_t> picked = arena.take<int64_t>(static_cast<size_t>(chunks));
  pool->parallel_for(chunks, [&](int64_t c_begin, int64_t c_end, int) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int64_t begin = c * length, end = std::min(n, begin + length);
      const int64_t m = std::clamp<int64_t>(end - begin, 0, count);
      if (m > 0) select_chunk(x, begin, end, m, &picks[static_cast<size_t>(c * count)]);
      picked[static_cast<size_t>(c)] = m;
    }
  });
  int64_t merged = 0;  // the chunks' picks packed to the front: >= count of them
  for (int64_t c = 0; c < chunks; ++c) {
    const int32_t* from = &picks[static_cast<size_t>(c * count)];
    if (merged != c * count) std::copy(from, from + picked[static_cast<size_t>(c)], &picks[static_cast<size_t>(merged)]);
    merged += picked[static_cast<size_t>(c)];
  }
  std::nth_element(picks.begin(), picks.begin() + (count - 1), picks.begin() + merged, cmp);
  std::sort(picks.begin(), picks.begin() + count, cmp);
  std::copy(picks.begin(), picks.begin() + count, out);
}

}  // namespace

const TopkKernels& reference_topk() {
  static const TopkKernels kernels{"reference", select_reference};
  return kernels;
}

const TopkKernels& best_topk() {
  static const TopkKernels kernels{"chunked_heap", select_best};
  return kernels;
}

}  // namespace dsflash
