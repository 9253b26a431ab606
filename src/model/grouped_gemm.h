// Several GEMMs of few rows as one pool job: a decode step's experts. Each GEMM on its own is a pool job of
// microseconds of work (a V4.1 routed expert's gate/up weight is 2 x 2304 x 5120 at 4.25 bits, 12.5 MB: ~40 us at
// 300 GB/s), and a job's dispatch grows with the threads; a layer's experts' GEMMs in one job pay it once.
#pragma once

#include <span>

#include "kernels/linear.h"
#include "model/compute_context.h"

namespace dsflash {

// y [x.rows, out] = x · Wᵀ (fp32, as Backend::fp8_gemm / fp4_gemm give it) for an FP8 or an MXFP4 weight (the
// other pointer null).
struct GroupedGemmItem {
  Fp8Activations x;
  const Fp8Weight* fp8 = nullptr;
  const Fp4Weight* fp4 = nullptr;
  float* y = nullptr;
};

// Every item's GEMM, in one pool job when ctx has a pool of several threads (else one call each); its bookkeeping
// from ctx.workspace's frame arena. Each weight's outputs are cut over the NUMA nodes as its GEMM alone cuts them
// (ThreadPool::parallel_for_nodes over its 16-output tiles, which is how the load-time copy placed its pages; FP8
// in pairs of tiles, its scales' 32-output blocks, so a node's part may differ by one tile), the nodes' parts of
// every weight side by side, and every piece a thread takes runs ctx.backend's GEMM on that slice of the weight,
// inline on that thread. A row's outputs do not depend on the split, so the bits are those of one call per item.
void grouped_gemm(std::span<const GroupedGemmItem> items, const ComputeContext& ctx);

}  // namespace dsflash
