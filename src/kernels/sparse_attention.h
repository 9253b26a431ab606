// Sparse attention with the per-head sink (spec/MODEL.md §4.3 "sparse_attn", numerics of the official
// kernel.py as its CPU port computes them). One query token attends to a list of KV rows (K == V) given in
// list order; -1 entries are listed as nullptr and take part in the block layout but in nothing else.
//
// Per head h, over the list in blocks of 64 entries:
//   s_j  = (q_h · row_j) * scale in fp32 (-inf for -1 entries)
//   m'   = max(m, max_j s_j)      (m starts at -1e30)
//   c    = exp(m - m');  p_j = exp(s_j - m')
//   den  = den * c + Σ_j p_j                      (fp32, the reference's cascade order)
//   num  = num * c + Σ_j bf16(p_j) * row_j       (probabilities rounded to bf16 before P·V)
//   m    = m'
// then den += exp(sink_h - m) and out_h = bf16(num / den). exp is the reference's torch.exp (SLEEF on whole
// vector chunks of the [heads, block] / [heads] tensors, std::exp on their tails; kernels/torch_exp.h).
// The order of the list matters (blocks of 64 and the online max), so callers keep the reference's layout.
#pragma once

#include <cstdint>

namespace dsflash {

class ThreadPool;

inline constexpr int kSparseAttentionBlock = 64;

// A batch of queries. q [num_queries, heads, dim] bf16 values in fp32; rows [num_queries, num_entries]
// pointers to dim-long fp32 rows (bf16 values; nullptr = a -1 entry); sink [heads] fp32;
// out [num_queries, heads, dim] bf16 values in fp32.
struct SparseAttentionArgs {
  const float* q = nullptr;
  const float* const* rows = nullptr;
  const float* sink = nullptr;
  float* out = nullptr;
  int64_t num_queries = 0;
  int64_t num_entries = 0;
  int heads = 0;
  int64_t dim = 0;
  float scale = 1.0f;
};

struct SparseAttentionKernels {
  const char* name;
  void (*attend)(const SparseAttentionArgs& args, ThreadPool* pool);
};

// The scalar oracle: dot products and P·V summed in K order (the reference uses BLAS there), the
// denominator's Σ p_j in the reference's cascade order, single-threaded.
const SparseAttentionKernels& reference_sparse_attention();
// The oracle's bits, faster. Scores: 32 heads in the vector lanes (each lane the oracle's in-order dot
// product), 8 rows per pass. Softmax and P·V per group of 8 heads: per block of 64 entries each head's softmax
// step as the oracle's (exp vectorised with the same operations), then the group's P·V with each row chunk
// loaded once for the 8 heads and the accumulators [heads x dims] in registers, every element summed in list
// order. Both phases multiply-add with one FMA where every product of the pass / block is exact in fp32 (bf16
// values whose products are normal and finite, from per-row magnitude bounds taken first), which rounds as the
// oracle's product-then-sum does; elsewhere they round each product first. Where the CPU has AVX512-BF16 and the
// bounds also rule out subnormal inputs and sums, vdpbf16ps takes two elements per instruction in the same order
// (sparse_attention_impl.h bf16_dot_exact), on CPUs where it runs faster than two FMAs (the timing of
// linear_impl::fastest_rows_multiply: on a Xeon with AMX it ran at half their rate, and the FMAs took the attention
// phase of a 16-sequence decode step from 64 to 41 ms). Threads take (query, group of 32
// heads) items and run both phases on them, or, when the pool has more threads than those items, the scores over
// them and then softmax and P·V over (query, group of 8 heads).
// best: the AVX-512 table where the CPU has AVX-512 F/BW/VL/DQ, else the AVX2 one (the build baseline).
const SparseAttentionKernels& best_sparse_attention();
const SparseAttentionKernels& avx2_sparse_attention();
const SparseAttentionKernels* avx512_sparse_attention();  // nullptr when the CPU lacks AVX-512
// The AVX-512 table taking vdpbf16ps wherever it keeps the bits, whichever is faster (the same bits as the others);
// nullptr when the CPU lacks AVX512-BF16.
const SparseAttentionKernels* avx512_pairs_sparse_attention();

}  // namespace dsflash
