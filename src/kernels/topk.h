// Top-k selection with the reference's tie rule (spec/MODEL.md "Decisions for dsflash"; CUDA's radix
// top-k): the k largest values, ties at the k-th value go to the lowest index, +0.0 ranks above -0.0,
// -inf ranks lowest of the non-NaN values. Used by the indexer (bf16 scores that tie often), the candidate
// blocks and the MoE gate.
#pragma once

#include <cstdint>

namespace dsflash {

// The order key of the rule: a larger key ranks higher; equal keys fall back to the lower index.
// (IEEE bits mapped to an unsigned order: negative values flipped, positive ones with the sign bit set.)
uint32_t topk_order_key(float value);

struct TopkKernels {
  const char* name;
  // Selects min(k, n) indices of x [n]; writes them to out in descending rank (value desc, index asc).
  void (*select)(const float* x, int64_t n, int64_t k, int32_t* out);
};

// The oracle: a full stable sort by the rule.
const TopkKernels& reference_topk();
// Selection in a k-entry heap held in `out` (no scratch memory), then a sort of the k chosen; same result.
const TopkKernels& best_topk();

}  // namespace dsflash
