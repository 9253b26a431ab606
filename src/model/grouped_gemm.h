// Several MXFP4 GEMMs of few rows as one pool job: a decode step's routed experts. Each GEMM on its own is a pool
// job of microseconds of work (a V4.1 expert's gate/up weight is 2 x 2304 x 5120 at 4.25 bits, 12.5 MB: ~40 us at
// 300 GB/s), and a job's dispatch grows with the threads; six experts' GEMMs in one job pay it once.
#pragma once

#include <span>

#include "kernels/linear.h"
#include "model/compute_context.h"

namespace dsflash {

// y [x.rows, w.out] = x · Wᵀ (fp32, as Backend::fp4_gemm gives it).
struct Fp4GemmItem {
  Fp8Activations x;
  Fp4Weight w;
  float* y = nullptr;
};

// Every item's GEMM, in one pool job when ctx has a pool of several threads (else one call each); its bookkeeping
// from ctx.workspace's frame arena. Each weight's
// 16-output tiles are cut over the NUMA nodes as its GEMM alone cuts them (ThreadPool::parallel_for_nodes over the
// tiles, which is how the load-time copy placed its pages), and every piece a thread takes runs ctx.backend->fp4_gemm
// on that slice of the weight, inline on that thread. A row's outputs do not depend on the split, so the bits are
// those of one call per item.
void grouped_fp4_gemm(std::span<const Fp4GemmItem> items, const ComputeContext& ctx);

}  // namespace dsflash
