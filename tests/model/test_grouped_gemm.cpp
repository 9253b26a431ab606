// grouped_gemm (src/model/grouped_gemm.h): several FP8 and MXFP4 GEMMs in one pool job give each GEMM's own bits,
// on every kernel table, on pools of one to five threads and on simulated 2-node layouts (where each weight's
// outputs are cut per node as its GEMM alone cuts them), for one row and several, tile-major and row-major weights
// (ragged last tiles and scale blocks too), and FP8 units that weigh several indices of the job.
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
  bool fp8, tile_major;
};

TEST(GroupedGemm, GivesEachGemmItsOwnBits) {
  std::mt19937 rng(5);
  for (const std::vector<GemmCase>& cases : std::vector<std::vector<GemmCase>>{
           // decode: one row per expert (the shared one FP8)
           {{1, 64, 128, false, true}, {1, 96, 64, false, true}, {1, 32, 96, false, true}, {1, 96, 128, true, true}},
           // batched decode: a few rows
           {{3, 64, 128, false, true}, {1, 48, 128, true, true}, {6, 80, 64, false, true}, {5, 64, 64, true, true}},
           // row-major; 40 and 48: a ragged last tile or scale block
           {{2, 40, 64, false, false}, {1, 48, 96, true, false}, {5, 16, 32, false, false}, {2, 40, 64, true, false}},
           // wide enough that an FP8 unit counts as several indices of the job (its bytes)
           {{1, 64, 1024, false, true}, {1, 96, 1024, true, true}, {3, 64, 1024, true, true}, {1, 48, 1024, true, false}}}) {
    std::vector<test::Fp8ActData> acts;
    std::vector<test::Fp8WeightData> fp8;
    std::vector<test::Fp4WeightData> fp4;
    for (const GemmCase& c : cases) {
      acts.push_back(test::random_fp8_acts(rng, c.rows, c.in));
      fp8.push_back(test::random_fp8_weight(rng, c.out, c.in));
      fp4.push_back(test::random_fp4_weight(rng, c.out, c.in));
      if (c.tile_major) {
        std::vector<uint8_t> codes(fp8.back().codes.size()), packed(fp4.back().packed.size()),
            scales(fp4.back().scales.size());
        repack_fp8_tile_major(fp8.back().codes.data(), c.out, c.in, codes.data());
        repack_fp4_tile_major(fp4.back().packed.data(), c.out, c.in, packed.data());
        repack_fp4_scales_tile_major(fp4.back().scales.data(), c.out, c.in, scales.data());
        fp8.back().codes = codes;
        fp4.back().packed = packed;
        fp4.back().scales = scales;
      }
    }
    std::vector<Fp8Weight> fp8_views;
    std::vector<Fp4Weight> fp4_views;
    for (size_t i = 0; i < cases.size(); ++i) {
      fp8_views.push_back(fp8[i].view());
      fp4_views.push_back(fp4[i].view());
      fp8_views.back().tile_major = fp4_views.back().tile_major = cases[i].tile_major;
    }
    for (const Backend* b : available_backends()) {
      std::vector<std::vector<float>> want;
      for (size_t i = 0; i < cases.size(); ++i) {
        want.emplace_back(static_cast<size_t>(cases[i].rows * cases[i].out));
        if (cases[i].fp8) b->fp8_gemm(acts[i].view(), fp8_views[i], want.back().data(), nullptr);
        else b->fp4_gemm(acts[i].view(), fp4_views[i], want.back().data(), nullptr);
      }
      for (const std::vector<int>& node_of_thread : std::vector<std::vector<int>>{
               {0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0, 0}, {0, 1}, {0, 0, 1}, {0, 0, 0, 1, 1}}) {
        ThreadPool pool(static_cast<int>(node_of_thread.size()), {}, node_of_thread);
        Workspace workspace;
        ComputeContext ctx = ComputeContext::for_backend(*b, &pool);
        ctx.workspace = &workspace;
        std::vector<std::vector<float>> got;
        std::vector<GroupedGemmItem> items;
        for (size_t i = 0; i < cases.size(); ++i) got.emplace_back(want[i].size(), -1.0f);
        for (size_t i = 0; i < cases.size(); ++i) {
          items.push_back({acts[i].view(), cases[i].fp8 ? &fp8_views[i] : nullptr,
                           cases[i].fp8 ? nullptr : &fp4_views[i], got[i].data()});
        }
        for (int rep = 0; rep < 3; ++rep) {  // late workers happen on some repetitions
          grouped_gemm(items, ctx);
          for (size_t i = 0; i < cases.size(); ++i) {
            ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0)
                << b->name << " item " << i << (cases[i].fp8 ? " fp8" : " fp4") << " rows " << cases[i].rows
                << " out " << cases[i].out << " threads " << node_of_thread.size() << " nodes " << pool.num_nodes();
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsflash
