#include "kernels/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/reduce.h"
#include "kernels/torch_exp.h"

namespace dsflash {
namespace {

constexpr float kInitialMax = -1e30f;  // the reference's running max starts here, not at -inf

// fp32 dot product in K order (the scalar oracle).
float dot_in_order(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// fp32 dot product with 16 independent lanes (vectorisable), lanes added in order at the end.
float dot_lanes(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// One (query, head): the online softmax over the list in blocks of 64. `dot` picks the summation order.
// exp evaluated as the reference's torch.exp on its [heads, block] (probabilities) and [heads] (correction,
// sink) tensors: SLEEF on whole vector chunks, std::exp on the tail of the tensor (kernels/torch_exp.h).
template <float (*Dot)(const float*, const float*, int64_t)>
void attend_head(const float* q, const float* const* rows, int64_t num_entries, int64_t dim, float scale, float sink,
                 int head, int heads, float* out, float* num, float* mm, float* probs) {
  float maximum = kInitialMax;
  float denominator = 0.0f;
  std::fill(num, num + dim, 0.0f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t begin = 0; begin < num_entries; begin += kSparseAttentionBlock) {
    const int64_t count = std::min<int64_t>(kSparseAttentionBlock, num_entries - begin);
    const float* const* block = rows + begin;
    float block_max = neg_inf;
    for (int64_t j = 0; j < count; ++j) {
      // masked_fill(-inf) comes before the scale multiply in the reference: -inf * scale = -inf.
      const float score = block[j] != nullptr ? Dot(q, block[j], dim) * scale : neg_inf;
      probs[j] = score;
      block_max = std::max(block_max, score);
    }
    const float next_max = std::max(maximum, block_max);
    const float correction = torch_exp_element(maximum - next_max, head, heads);
    for (int64_t j = 0; j < count; ++j) probs[j] = torch_exp_element(probs[j] - next_max, head * count + j, heads * count);
    denominator = denominator * correction + cascade_sum(probs, count);
    // P·V with bf16-rounded probabilities into a fresh accumulator, then num = num * c + P·V.
    std::fill(mm, mm + dim, 0.0f);
    for (int64_t j = 0; j < count; ++j) {
      if (block[j] == nullptr) continue;  // p_j = 0 and the row is zero in the reference
      const float p = round_to_bf16(probs[j]);
      const float* row = block[j];
      for (int64_t d = 0; d < dim; ++d) mm[d] += p * row[d];
    }
    for (int64_t d = 0; d < dim; ++d) num[d] = num[d] * correction + mm[d];
    maximum = next_max;
  }
  denominator += torch_exp_element(sink - maximum, head, heads);
  for (int64_t d = 0; d < dim; ++d) out[d] = round_to_bf16(num[d] / denominator);
}

template <float (*Dot)(const float*, const float*, int64_t)>
void attend_range(const SparseAttentionArgs& a, int64_t begin, int64_t end) {
  std::vector<float> num(static_cast<size_t>(a.dim)), mm(static_cast<size_t>(a.dim));
  float probs[kSparseAttentionBlock];
  for (int64_t item = begin; item < end; ++item) {
    const int64_t query = item / a.heads;
    const int head = static_cast<int>(item % a.heads);
    const float* q = a.q + (query * a.heads + head) * a.dim;
    float* out = a.out + (query * a.heads + head) * a.dim;
    attend_head<Dot>(q, a.rows + query * a.num_entries, a.num_entries, a.dim, a.scale, a.sink[head], head, a.heads, out,
                     num.data(), mm.data(), probs);
  }
}

void attend_reference(const SparseAttentionArgs& args, ThreadPool*) {
  attend_range<dot_in_order>(args, 0, args.num_queries * args.heads);
}

void attend_best(const SparseAttentionArgs& args, ThreadPool* pool) {
  const int64_t items = args.num_queries * args.heads;
  if (pool == nullptr || items < 2) {
    attend_range<dot_lanes>(args, 0, items);
    return;
  }
  pool->parallel_for(items, [&](int64_t begin, int64_t end, int) { attend_range<dot_lanes>(args, begin, end); });
}

}  // namespace

const SparseAttentionKernels& reference_sparse_attention() {
  static const SparseAttentionKernels kernels{"reference", attend_reference};
  return kernels;
}

const SparseAttentionKernels& best_sparse_attention() {
  static const SparseAttentionKernels kernels{"lanes16-threads", attend_best};
  return kernels;
}

}  // namespace dsflash
