// Attention kernels at the real model's shapes (spec/MODEL.md §1, §4.3, §4.5): sparse attention of one decode
// query (64 heads x 512, window 128 + top-k 512 = 640 entries) and of prefill tiles (32 and 128 queries), reference
// vs fast (1 and 2 threads); the top-k selection of the indexer (k 512 over 16K..1M scores, bf16-valued with
// ties; 1 and 2 threads) and of the candidate blocks (k 2048 over 131072); the indexer's q·k dot products (64 heads
// x 128 against 256 keys) and head weighting (32 heads x 16 keys). Prints time per call and the kernel's
// arithmetic rate; the sparse-attention rows also the fp32 FMA peak of the same threads measured in the same
// run (peak_GFLOPs) and the fraction of it reached (vs_peak): with these inputs every product is exact, so the
// kernel multiplies with FMAs, or, where the CPU has AVX512-BF16, with vdpbf16ps (twice the FMA rate: vs_peak can
// then pass 1). A benchmark, not a test.
// Run: build-<you>/bench/bench_attention [--benchmark_filter=sparse]
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/index_score.h"
#include "kernels/peak_probe.h"
#include "kernels/sparse_attention.h"
#include "kernels/topk.h"

namespace dsflash {
namespace {

constexpr int kHeads = 64;
constexpr int64_t kDim = 512;
constexpr int64_t kEntries = 640;

struct AttentionInputs {
  std::vector<float> q, kv, sink, out;
  std::vector<const float*> rows;
  AttentionInputs(int64_t queries) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    q.resize(static_cast<size_t>(queries * kHeads * kDim));
    for (float& v : q) v = round_to_bf16(normal(rng));
    kv.resize(static_cast<size_t>(kEntries * kDim));
    for (float& v : kv) v = round_to_bf16(normal(rng));
    sink.assign(kHeads, 0.5f);
    out.resize(q.size());
    for (int64_t t = 0; t < queries; ++t) {
      for (int64_t j = 0; j < kEntries; ++j) rows.push_back(j % 97 == 5 ? nullptr : &kv[static_cast<size_t>(j * kDim)]);
    }
  }
};

void run_sparse(benchmark::State& state, const SparseAttentionKernels& kernels, int64_t queries, int threads) {
  AttentionInputs in(queries);
  std::unique_ptr<ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
  SparseAttentionArgs a;
  a.q = in.q.data();
  a.rows = in.rows.data();
  a.sink = in.sink.data();
  a.out = in.out.data();
  a.num_queries = queries;
  a.num_entries = kEntries;
  a.heads = kHeads;
  a.dim = kDim;
  a.scale = 1.0f / 22.627417f;
  // The limit of this arithmetic (fp32 FMAs where the products are exact, as here), on the same threads, in this run.
  const DotPeak peak = measure_dot_peak(pool.get(), 0.1, PeakOps::kFp32Fma);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    kernels.attend(a, pool.get());
    benchmark::DoNotOptimize(in.out.data());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // q·k and P·V: 2 * 2 * entries * dim flops per (query, head)
  const double flops = static_cast<double>(4 * kEntries * kDim * kHeads * queries);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["peak_GFLOPs"] = peak.gflops;
  state.counters["vs_peak"] = flops * static_cast<double>(state.iterations()) / seconds * 1e-9 / peak.gflops;
}

void BM_SparseAttentionReference(benchmark::State& s) { run_sparse(s, reference_sparse_attention(), s.range(0), 1); }
void BM_SparseAttentionBest(benchmark::State& s) {
  run_sparse(s, best_sparse_attention(), s.range(0), static_cast<int>(s.range(1)));
}
BENCHMARK(BM_SparseAttentionReference)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SparseAttentionBest)
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({32, 2})
    ->Args({128, 1})
    ->Args({128, 2})
    ->Unit(benchmark::kMillisecond);
// The AVX-512 table with vdpbf16ps wherever it keeps the bits (Best takes it only where the CPU runs it faster than
// fp32 FMAs).
void BM_SparseAttentionAvx512Bf16(benchmark::State& s) {
  const SparseAttentionKernels* pairs = avx512_pairs_sparse_attention();
  if (pairs == nullptr) {
    s.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  run_sparse(s, *pairs, s.range(0), static_cast<int>(s.range(1)));
}
BENCHMARK(BM_SparseAttentionAvx512Bf16)->Args({1, 2})->Args({128, 2})->Unit(benchmark::kMillisecond);
// The AVX2 table (what CPUs without AVX-512 run) on the same shapes.
void BM_SparseAttentionAvx2(benchmark::State& s) {
  run_sparse(s, avx2_sparse_attention(), s.range(0), static_cast<int>(s.range(1)));
}
BENCHMARK(BM_SparseAttentionAvx2)->Args({1, 1})->Args({128, 1})->Unit(benchmark::kMillisecond);

// Indexer q·k for one query against a block of 256 dequantised keys (64 index heads x 128): the reference's
// in-order scalar dot per (key, head) vs 16 keys in the vector lanes (same bits, kernels/index_score.h),
// including the packing of the keys.
constexpr int kIndexHeads = 64;
constexpr int64_t kIndexDim = 128, kIndexKeys = 256;

struct IndexInputs {
  std::vector<float> q, keys, packed, dots;
  IndexInputs() {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    q.resize(static_cast<size_t>(kIndexHeads * kIndexDim));
    for (float& v : q) v = round_to_bf16(normal(rng));
    keys.resize(static_cast<size_t>(kIndexKeys * kIndexDim));
    for (float& v : keys) v = round_to_bf16(normal(rng));
    packed.resize(keys.size());
    dots.resize(static_cast<size_t>(kIndexHeads * kIndexKeys));
  }
};

void index_counters(benchmark::State& state) {
  state.counters["GFLOPs"] = benchmark::Counter(static_cast<double>(2 * kIndexHeads * kIndexDim * kIndexKeys),
                                                benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_IndexDotsInOrder(benchmark::State& state) {
  IndexInputs in;
  for (auto _ : state) {
    for (int64_t j = 0; j < kIndexKeys; ++j) {
      for (int h = 0; h < kIndexHeads; ++h) {
        in.dots[static_cast<size_t>(j * kIndexHeads + h)] =
            dot_in_order(&in.q[static_cast<size_t>(h * kIndexDim)], &in.keys[static_cast<size_t>(j * kIndexDim)], kIndexDim);
      }
    }
    benchmark::DoNotOptimize(in.dots.data());
  }
  index_counters(state);
}
void BM_IndexDots16(benchmark::State& state) {
  IndexInputs in;
  for (auto _ : state) {
    for (int64_t j = 0; j < kIndexKeys; j += kIndexKeyLanes) {
      float* packed = &in.packed[static_cast<size_t>(j * kIndexDim)];
      pack_index_keys(&in.keys[static_cast<size_t>(j * kIndexDim)], kIndexKeyLanes, kIndexDim, packed);
      index_dots16(packed, in.q.data(), kIndexHeads, kIndexDim, &in.dots[static_cast<size_t>(j * kIndexHeads)]);
    }
    benchmark::DoNotOptimize(in.dots.data());
  }
  index_counters(state);
}
BENCHMARK(BM_IndexDotsInOrder)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_IndexDots16)->Unit(benchmark::kMicrosecond);

// The head weighting of 16 keys' dot products (32 heads, V4.1's indexer): scalar formula vs the 16-lane twins.
void run_weigh_heads16(benchmark::State& state, WeighHeads16Kernel kernel) {
  constexpr int kWeighHeads = 32;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dots(static_cast<size_t>(kWeighHeads * kIndexKeyLanes)), w(kWeighHeads);
  for (float& v : dots) v = normal(rng);
  for (float& v : w) v = round_to_bf16(normal(rng) * 0.1f);
  float out[kIndexKeyLanes];
  for (auto _ : state) {
    kernel(dots.data(), w.data(), kWeighHeads, out);
    benchmark::DoNotOptimize(out);
  }
  state.counters["keys/s"] =
      benchmark::Counter(kIndexKeyLanes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
void BM_WeighHeads16Reference(benchmark::State& s) { run_weigh_heads16(s, weigh_heads16_reference); }
void BM_WeighHeads16Avx2(benchmark::State& s) { run_weigh_heads16(s, weigh_heads16_avx2); }
void BM_WeighHeads16Avx512(benchmark::State& s) {
  if (WeighHeads16Kernel k = weigh_heads16_avx512()) {
    run_weigh_heads16(s, k);
  } else {
    s.SkipWithError("no AVX-512 F on this CPU");
  }
}
BENCHMARK(BM_WeighHeads16Reference);
BENCHMARK(BM_WeighHeads16Avx2);
BENCHMARK(BM_WeighHeads16Avx512);

// range(0) scores, range(1) = k, range(2) = threads (0: single-threaded, no pool).
void run_topk(benchmark::State& state, const TopkKernels& kernels) {
  const int64_t n = state.range(0), k = state.range(1);
  std::unique_ptr<ThreadPool> pool = state.range(2) > 0 ? std::make_unique<ThreadPool>(static_cast<int>(state.range(2)))
                                                        : nullptr;
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = round_to_bf16(normal(rng));  // bf16 values: many ties
  std::vector<int32_t> out(static_cast<size_t>(k));
  Arena scratch;
  for (auto _ : state) {
    kernels.select(x.data(), n, k, out.data(), pool.get(), &scratch);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
void BM_TopkReference(benchmark::State& s) { run_topk(s, reference_topk()); }
void BM_TopkBest(benchmark::State& s) { run_topk(s, best_topk()); }
// The indexer's rows: k 512 over 16K and 1M scores; the candidate blocks, k 2048 over 131072 block maxima.
BENCHMARK(BM_TopkReference)->Args({16384, 512, 0})->Args({1 << 20, 512, 0})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopkBest)
    ->Args({16384, 512, 0})
    ->Args({1 << 20, 512, 0})
    ->Args({1 << 20, 512, 2})
    ->Args({131072, 2048, 0})
    ->Args({131072, 2048, 2})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dsflash

BENCHMARK_MAIN();
