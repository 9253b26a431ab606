// grouped_fp4_gemm (src/model/grouped_gemm.h): several MXFP4 GEMMs in one pool job give each GEMM's own bits, on
// every kernel table, on pools of one to five threads and on simulated 2-node layouts (where each weight's tiles are
// cut per node as its GEMM alone cuts them), for one row and several, tile-major and row-major weights (a ragged
// last tile too).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/test_linear_util.h"
#include "model/grouped_gemm.h"

namespace dsflash {
namespace {

struct GemmCase {
  int64_t rows, out, in;
  bool tile_major;
};

TEST(GroupedFp4Gemm, GivesEachGemmItsOwnBits) {
  std::mt19937 rng(5);
  for (const std::vector<GemmCase>& cases : std::vector<std::vector<GemmCase>>{
           {{1, 64, 128, true}, {1, 96, 64, true}, {1, 32, 96, true}},     // decode: one row per expert
           {{3, 64, 128, true}, {1, 48, 128, true}, {6, 80, 64, true}},    // batched decode: a few rows
           {{2, 40, 64, false}, {1, 64, 96, false}, {5, 16, 32, false}}}) {  // row-major, 40: a ragged tile
    std::vector<test::Fp8ActData> acts;
    std::vector<test::Fp4WeightData> weights;
    for (const GemmCase& c : cases) {
      acts.push_back(test::random_fp8_acts(rng, c.rows, c.in));
      test::Fp4WeightData w = test::random_fp4_weight(rng, c.out, c.in);
      if (c.tile_major) {
        test::Fp4WeightData tiled = w;
        repack_fp4_tile_major(w.packed.data(), c.out, c.in, tiled.packed.data());
        repack_fp4_scales_tile_major(w.scales.data(), c.out, c.in, tiled.scales.data());
        w = tiled;
      }
      weights.push_back(std::move(w));
    }
    auto weight = [&](size_t i) {
      Fp4Weight w = weights[i].view();
      w.tile_major = cases[i].tile_major;
      return w;
    };
    for (const Backend* b : available_backends()) {
      std::vector<std::vector<float>> want;
      for (size_t i = 0; i < cases.size(); ++i) {
        want.emplace_back(static_cast<size_t>(cases[i].rows * cases[i].out));
        b->fp4_gemm(acts[i].view(), weight(i), want.back().data(), nullptr);
      }
      for (const std::vector<int>& node_of_thread : std::vector<std::vector<int>>{
               {0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0, 0}, {0, 1}, {0, 0, 1}, {0, 0, 0, 1, 1}}) {
        ThreadPool pool(static_cast<int>(node_of_thread.size()), {}, node_of_thread);
        Workspace workspace;
        ComputeContext ctx = ComputeContext::for_backend(*b, &pool);
        ctx.workspace = &workspace;
        std::vector<std::vector<float>> got;
        std::vector<Fp4GemmItem> items;
        for (size_t i = 0; i < cases.size(); ++i) got.emplace_back(want[i].size(), -1.0f);
        for (size_t i = 0; i < cases.size(); ++i) items.push_back({acts[i].view(), weight(i), got[i].data()});
        for (int rep = 0; rep < 3; ++rep) {  // late workers happen on some repetitions
          grouped_fp4_gemm(items, ctx);
          for (size_t i = 0; i < cases.size(); ++i) {
            ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0)
                << b->name << " item " << i << " rows " << cases[i].rows << " out " << cases[i].out << " threads "
                << node_of_thread.size() << " nodes " << pool.num_nodes();
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsflash
