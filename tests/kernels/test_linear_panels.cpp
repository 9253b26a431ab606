// The multi-row path's step order (linear_avx512_rows.cpp, gemm_tiles_rows): where a GEMM's activations outgrow the L2
// budget it walks panels of tile groups chunk by chunk; otherwise each tile group's chunks in turn. A row's result
// does not depend on the rows it runs with, so the GEMM of all rows (panels) must give the bits of the same GEMM on
// row slices small enough for one group per panel, whatever the operands' rounding, on every kernel table, with and
// without threads (each thread walks its own tiles).
#include <gtest/gtest.h>

#include <string>

#include "core/thread_pool.h"
#include "kernels/linear.h"
#include "kernels/linear_impl.h"
#include "test_linear_util.h"

namespace dsflash {
namespace {

// rows x in large enough for panels: fp32 activations past 1 MB from 160 rows at in 1664, bf16 ones (vdpbf16ps,
// AMX tiles) from 256 rows at in 2176. Outputs: several panels on one thread at 160 rows (panels of 50 tiles), an
// odd tile count, a ragged last tile (row-major weights only); K with a ragged last chunk (52 and 68 blocks).
struct PanelShape {
  int rows, out, in, slice_rows;
};
const PanelShape kPanelShapes[] = {{160, 1648, 1664, 40}, {256, 520, 2176, 64}, {256, 528, 2176, 64}};

// y of rows [r0, r1) of x.
std::vector<float> run_rows(const LinearKernels& k, const test::Fp8ActData& x, int64_t r0, int64_t r1,
                            const Fp8Weight* w8, const Fp4Weight* w4, int64_t out, ThreadPool* pool) {
  const Fp8Activations rows{x.codes.data() + r0 * x.k, x.scales.data() + r0 * (x.k / 32), r1 - r0, x.k};
  std::vector<float> y(static_cast<size_t>((r1 - r0) * out), -7.0f);
  if (w8 != nullptr) k.fp8_gemm(rows, *w8, y.data(), pool);
  else k.fp4_gemm(rows, *w4, y.data(), pool);
  return y;
}

TEST(LinearPanels, PanelsGiveTheBitsOfRowSlices) {
  ThreadPool pool(2);
  for (const LinearKernels* k : linear_impl::available_kernels()) {
    if (k == &reference_linear_kernels() || k == linear_impl::avx2_kernels()) continue;  // no multi-row path
    std::mt19937 rng(5);
    for (const PanelShape& s : kPanelShapes) {
      const auto x = test::random_fp8_acts(rng, s.rows, s.in);
      const auto w8 = test::random_fp8_weight(rng, s.out, s.in);
      const auto w4 = test::random_fp4_weight(rng, s.out, s.in);
      for (const bool tile_major : {false, true}) {
        if (tile_major && !tile_major_possible(s.out, s.in)) continue;
        const test::OrderedWeights ordered = test::in_order(w8, w4, tile_major);
        const Fp8Weight v8 = ordered.fp8();
        const Fp4Weight v4 = ordered.fp4();
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool})
          for (const bool fp4 : {false, true}) {
            const std::string where = std::string(k->name) + (fp4 ? " fp4" : " fp8") + " rows " +
                                      std::to_string(s.rows) + " out " + std::to_string(s.out) + " in " +
                                      std::to_string(s.in) + (tile_major ? " tile-major" : " row-major") +
                                      (p != nullptr ? " threaded" : "");
            const Fp8Weight* w8p = fp4 ? nullptr : &v8;
            const Fp4Weight* w4p = fp4 ? &v4 : nullptr;
            const std::vector<float> all = run_rows(*k, x, 0, s.rows, w8p, w4p, s.out, p);
            for (int r0 = 0; r0 < s.rows; r0 += s.slice_rows) {
              const std::vector<float> slice = run_rows(*k, x, r0, r0 + s.slice_rows, w8p, w4p, s.out, p);
              ASSERT_TRUE(std::equal(slice.begin(), slice.end(), all.begin() + r0 * s.out))
                  << where << ", rows from " << r0;
            }
          }
      }
    }
  }
}

}  // namespace
}  // namespace dsflash
