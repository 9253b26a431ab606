// Top-k selection with the reference's tie rule (spec/MODEL.md "Decisions for dsflash"; CUDA's radix
// top-k): the k largest values, ties at the k-th value go to the lowest index, +0.0 ranks above -0.0,
// -inf ranks lowest of the non-NaN values. Used by the indexer (bf16 scores that tie often, rows of up to ~1M),
// the candidate blocks and the MoE gate.
#pragma once

#include <cstdint>

namespace dsflash {

class Arena;
class ThreadPool;

// The order key of the rule: a larger key ranks higher; equal keys fall back to the lower index.
// (IEEE bits mapped to an unsigned order: negative values flipped, positive ones with the sign bit set.)
uint32_t topk_order_key(float value);

struct TopkKernels {
  const char* name;
  // Selects min(k, n) indices of x [n]; writes them to out in descending rank (value desc, index asc). The result
  // does not depend on the pool (nullptr: single-threaded). scratch: memory for the per-chunk picks when the row is
  // split over the pool, taken and given back inside the call (nullptr: a private arena, which allocates).
  void (*select)(const float* x, int64_t n, int64_t k, int32_t* out, ThreadPool* pool, Arena* scratch);
};

// The oracle: a full stable sort by the rule (single-threaded; ignores pool and scratch).
const TopkKernels& reference_topk();
// The row in chunks (one per pool thread for long rows, else one): each chunk keeps its k best in a min-heap and
// skips, eight values per AVX2 compare, every value whose key is not above the heap's lowest (a later index never
// wins a tie); the chunks' picks are merged by the rule. The rule is a total order, so any correct selection is
// the oracle's: same indices, same order, for every chunking and thread count.
const TopkKernels& best_topk();

}  // namespace dsflash
