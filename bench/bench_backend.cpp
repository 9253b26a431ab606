// The Backend entries that had no benchmark of their own, for every table this CPU runs (kernels/backend.h):
// act_quant and the fused FP8 linear, rmsnorm, mHC (mixes, pre, post), RoPE rotation, SwiGLU, the indexer's scoring
// call and the KV row dequantisation, at the model's shapes (dim 4096, hc 4, 64 heads x 512 with a 64-wide rope
// tail, indexer 64 heads x 128 against 256 keys, per token the 128 window + 512 compressed rows of 512 that one
// decode query of one layer attends to). Rows: "<entry>/<backend>/tokens:N"; a benchmark, not a test.
// Run: build-<you>/bench/bench_backend [--benchmark_filter=rmsnorm]
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/backend.h"
#include "kernels/peak_probe.h"

namespace dsflash {
namespace {

constexpr int64_t kDim = 4096;
constexpr int kHc = 4;

std::vector<float> bf16_normals(int64_t n, float spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to_bf16(normal(rng));
  return v;
}

ThreadPool* shared_pool() {
  static ThreadPool pool(2);
  return &pool;
}

void bm_act_quant(benchmark::State& state, const Backend* b, int64_t tokens) {
  const std::vector<float> x = bf16_normals(tokens * kDim, 1.0f, 1);
  std::vector<uint8_t> codes(x.size()), scales(x.size() / 32);
  for (auto _ : state) {
    b->act_quant(x.data(), tokens, kDim, codes.data(), scales.data(), shared_pool());
    benchmark::DoNotOptimize(codes.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens * kDim);
}

void bm_linear_fp8(benchmark::State& state, const Backend* b, int64_t tokens) {
  constexpr int64_t kOut = 1024;
  const std::vector<float> x = bf16_normals(tokens * kDim, 1.0f, 2);
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(static_cast<size_t>(kOut * kDim)), scales(static_cast<size_t>(kOut / 32 * kDim / 32), 120);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() & 0x7e);
  const Fp8Weight w{codes.data(), scales.data(), kOut, kDim};
  std::vector<float> y(static_cast<size_t>(tokens * kOut));
  for (auto _ : state) {
    b->linear_fp8(x.data(), tokens, w, y.data(), shared_pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(static_cast<double>(2 * tokens * kOut * kDim),
                                                benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void bm_rmsnorm(benchmark::State& state, const Backend* b, int64_t tokens) {
  const std::vector<float> x = bf16_normals(tokens * kDim, 1.0f, 4);
  std::vector<uint16_t> w(static_cast<size_t>(kDim), f32_to_bf16(1.0f));
  std::vector<float> out(x.size());
  for (auto _ : state) {
    b->rmsnorm_bf16(x.data(), tokens, kDim, w.data(), 1e-6f, out.data(), shared_pool());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens * kDim);
}

struct HcInputs {
  HcShape shape;
  std::vector<float> streams, fn, base, scale, pre, post, comb, x, out;
  explicit HcInputs(int64_t tokens)
      : streams(bf16_normals(tokens * kHc * kDim, 1.0f, 5)),
        fn(bf16_normals((2 + kHc) * kHc * kHc * kDim, 0.01f, 6)),
        base(bf16_normals((2 + kHc) * kHc, 0.5f, 7)),
        scale{0.5f, 0.5f, 0.5f},
        pre(static_cast<size_t>(tokens * kHc)),
        post(pre.size()),
        comb(static_cast<size_t>(tokens * kHc * kHc)),
        x(static_cast<size_t>(tokens * kDim)),
        out(streams.size()) {
    shape.hc = kHc;
    shape.dim = kDim;
  }
  HcSiteWeights site() const { return {fn.data(), base.data(), scale.data()}; }
};

void bm_hc_mixes(benchmark::State& state, const Backend* b, int64_t tokens) {
  HcInputs in(tokens);
  for (auto _ : state) {
    b->hc_mixes(in.streams.data(), tokens, in.site(), in.shape, in.pre.data(), in.post.data(), in.comb.data(),
                shared_pool());
    benchmark::DoNotOptimize(in.comb.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}

// hc_mixes as a decode step meets it: the site's fn [24, hc * dim] fp32 read from memory (copies cycled past the
// caches, 1.5 MB each), against the machine's read bandwidth measured in the same run (fn_GBps / read_GBps).
void bm_hc_mixes_cold(benchmark::State& state, const Backend* b, int64_t tokens) {
  HcInputs in(tokens);
  constexpr int64_t kCycledBytes = int64_t{512} << 20;
  const int64_t fn_bytes = static_cast<int64_t>(in.fn.size() * sizeof(float));
  std::vector<std::vector<float>> copies(static_cast<size_t>(kCycledBytes / fn_bytes), in.fn);
  size_t c = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const HcSiteWeights site{copies[c].data(), in.base.data(), in.scale.data()};
    b->hc_mixes(in.streams.data(), tokens, site, in.shape, in.pre.data(), in.post.data(), in.comb.data(),
                shared_pool());
    benchmark::DoNotOptimize(in.comb.data());
    c = (c + 1) % copies.size();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double fn_gbps = static_cast<double>(fn_bytes) * static_cast<double>(state.iterations()) / seconds / 1e9;
  const double read_gbps = measure_read_bandwidth(shared_pool()).gbps;
  state.counters["fn_GBps"] = fn_gbps;
  state.counters["read_GBps"] = read_gbps;
  state.counters["vs_read"] = fn_gbps / read_gbps;
}

void bm_hc_pre(benchmark::State& state, const Backend* b, int64_t tokens) {
  HcInputs in(tokens);
  for (float& p : in.pre) p = 0.25f;
  for (auto _ : state) {
    b->hc_pre(in.streams.data(), tokens, kHc, kDim, in.pre.data(), in.x.data(), shared_pool());
    benchmark::DoNotOptimize(in.x.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}

void bm_hc_post(benchmark::State& state, const Backend* b, int64_t tokens) {
  HcInputs in(tokens);
  for (float& p : in.post) p = 1.0f;
  for (float& c : in.comb) c = 0.25f;
  for (auto _ : state) {
    b->hc_post(in.x.data(), in.streams.data(), tokens, kHc, kDim, in.post.data(), in.comb.data(), in.out.data(),
               shared_pool());
    benchmark::DoNotOptimize(in.out.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}

// The query heads of one token: 64 heads x 512, the last 64 channels rotated.
void bm_rope_rotate(benchmark::State& state, const Backend* b, int64_t tokens) {
  constexpr int64_t kHeads = 64, kHeadDim = 512, kPairs = 32;
  std::vector<float> q = bf16_normals(tokens * kHeads * kHeadDim, 1.0f, 8);
  std::vector<float> c(kPairs), s(kPairs);
  for (int64_t i = 0; i < kPairs; ++i) {
    c[static_cast<size_t>(i)] = std::cos(0.1f * static_cast<float>(i));
    s[static_cast<size_t>(i)] = std::sin(0.1f * static_cast<float>(i));
  }
  for (auto _ : state) {
    b->rope_rotate(q.data() + kHeadDim - 2 * kPairs, tokens * kHeads, kHeadDim, c.data(), s.data(), kPairs, false);
    benchmark::DoNotOptimize(q.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens * kHeads);
}

// The SwiGLU of one routed expert's rows: `tokens` rows of 2048 (V4.1's moe_intermediate_size), limit 10.
void bm_swiglu(benchmark::State& state, const Backend* b, int64_t tokens) {
  constexpr int64_t kInter = 2048;
  const std::vector<float> gate = bf16_normals(tokens * kInter, 3.0f, 9), up = bf16_normals(tokens * kInter, 3.0f, 10);
  std::vector<float> out(gate.size());
  for (auto _ : state) {
    b->swiglu(gate.data(), up.data(), tokens * kInter, 10.0f, 0.37f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens * kInter);
}

// One indexer call: `tokens` queries (64 heads x 128) against a block of 256 keys.
void bm_index_scores(benchmark::State& state, const Backend* b, int64_t tokens) {
  constexpr int kHeads = 64;
  constexpr int64_t kIndexDim = 128, kKeys = 256;
  const std::vector<float> q = bf16_normals(tokens * kHeads * kIndexDim, 1.0f, 9);
  const std::vector<float> w = bf16_normals(tokens * kHeads, 0.1f, 10);
  const std::vector<float> keys = bf16_normals(kKeys * kIndexDim, 1.0f, 11);
  std::vector<float> scores(static_cast<size_t>(tokens * kKeys));
  IndexScoreArgs args;
  args.q = q.data();
  args.weights = w.data();
  args.keys = keys.data();
  args.scores = scores.data();
  args.num_queries = tokens;
  args.num_keys = kKeys;
  args.score_stride = kKeys;
  args.heads = kHeads;
  args.dim = kIndexDim;
  for (auto _ : state) {
    b->index_scores(args);
    benchmark::DoNotOptimize(scores.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(static_cast<double>(2 * tokens * kHeads * kIndexDim * kKeys),
                                                benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// The same call from stored MXFP4 key rows (index_scores_rows): 32 heads x 128 (V4.1's indexer), 4096 keys (the
// block one call gets on a long context) with random nibbles and scales 2^-3 .. 2^0, q through the MXFP4 fake
// quantiser (what the indexer feeds). vs_int8_peak: the dots' integer ops (2 x heads x 128 per key and query) per
// second over the one-thread int8 dot peak measured in the same run (peak_probe.h PeakOps::kInt8Dot: vpdpbusd where
// the CPU has it, whatever the table), the indexer's compute limit.
void bm_index_scores_rows(benchmark::State& state, const Backend* b, int64_t tokens) {
  constexpr int kHeads = 32;
  constexpr int64_t kIndexDim = 128, kKeys = 4096, kRowBytes = kIndexDim / 2 + kIndexDim / 32;
  std::vector<float> q = bf16_normals(tokens * kHeads * kIndexDim, 1.0f, 12);
  fake_quant_fp4_ue8m0_block32(q.data(), static_cast<int64_t>(q.size()));
  const std::vector<float> w = bf16_normals(tokens * kHeads, 0.1f, 13);
  std::vector<uint8_t> bytes(static_cast<size_t>(kKeys * kRowBytes));
  std::mt19937 rng(14);
  for (int64_t j = 0; j < kKeys; ++j) {
    for (int64_t i = 0; i < kRowBytes; ++i) {
      bytes[static_cast<size_t>(j * kRowBytes + i)] =
          static_cast<uint8_t>(i < kIndexDim / 2 ? rng() & 255 : 124 + rng() % 4);
    }
  }
  std::vector<const uint8_t*> rows;
  for (int64_t j = 0; j < kKeys; ++j) rows.push_back(&bytes[static_cast<size_t>(j * kRowBytes)]);
  std::vector<float> scores(static_cast<size_t>(tokens * kKeys));
  Arena scratch;
  IndexScoreRowsArgs args;
  args.q = q.data();
  args.weights = w.data();
  args.key_rows = rows.data();
  args.scores = scores.data();
  args.num_queries = tokens;
  args.num_keys = kKeys;
  args.score_stride = kKeys;
  args.heads = kHeads;
  args.dim = kIndexDim;
  args.scratch = &scratch;
  // The same thread's int8 dot peak, measured just before the timed loop.
  const DotPeak peak = measure_dot_peak(nullptr, 0.1, PeakOps::kInt8Dot);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    b->index_scores_rows(args);
    benchmark::DoNotOptimize(scores.data());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ops = static_cast<double>(2 * kHeads * kIndexDim * tokens * kKeys);  // the dots' products and sums
  state.counters["keys/s"] = benchmark::Counter(static_cast<double>(tokens * kKeys),
                                                benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["int8_peak_Gops"] = peak.gflops;
  state.counters["vs_int8_peak"] = ops * static_cast<double>(state.iterations()) / seconds * 1e-9 / peak.gflops;
}

// One decode query's attention rows per token: 128 window rows (e4m3, ue8m0 per 32) and 512 compressed rows
// (e2m1, e4m3 per 16) of 512 values each, dequantised to fp32 row by row as the attention gathers them.
void bm_kv_rows(benchmark::State& state, const Backend* b, int64_t tokens) {
  constexpr int64_t kHeadDim = 512, kWindowRows = 128, kCompressedRows = 512;
  std::mt19937 rng(7);
  const int64_t window_rows = tokens * kWindowRows, compressed_rows = tokens * kCompressedRows;
  std::vector<uint8_t> codes(static_cast<size_t>(window_rows * kHeadDim)), window_scales(static_cast<size_t>(window_rows * kHeadDim / 32));
  std::vector<uint8_t> packed(static_cast<size_t>(compressed_rows * kHeadDim / 2)), compressed_scales(static_cast<size_t>(compressed_rows * kHeadDim / 16));
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % 0x7f);
  for (uint8_t& s : window_scales) s = static_cast<uint8_t>(110 + rng() % 20);
  for (uint8_t& c : packed) c = static_cast<uint8_t>(rng());
  for (uint8_t& s : compressed_scales) s = static_cast<uint8_t>(rng() % 0x7f);
  std::vector<float> out(static_cast<size_t>((window_rows + compressed_rows) * kHeadDim));
  for (auto _ : state) {
    for (int64_t r = 0; r < window_rows; ++r) {
      b->dequant_window_row(&codes[static_cast<size_t>(r * kHeadDim)], &window_scales[static_cast<size_t>(r * kHeadDim / 32)],
                            kHeadDim, &out[static_cast<size_t>(r * kHeadDim)]);
    }
    for (int64_t r = 0; r < compressed_rows; ++r) {
      b->dequant_compressed_row(&packed[static_cast<size_t>(r * kHeadDim / 2)],
                                &compressed_scales[static_cast<size_t>(r * kHeadDim / 16)], kHeadDim,
                                &out[static_cast<size_t>((window_rows + r) * kHeadDim)]);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(window_rows + compressed_rows),
                                                benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

using BackendBench = void (*)(benchmark::State&, const Backend*, int64_t);

void register_all() {
  const std::pair<const char*, BackendBench> entries[] = {
      {"act_quant", bm_act_quant}, {"linear_fp8", bm_linear_fp8}, {"rmsnorm", bm_rmsnorm},
      {"hc_mixes", bm_hc_mixes},   {"hc_mixes_cold", bm_hc_mixes_cold}, {"hc_pre", bm_hc_pre},
      {"hc_post", bm_hc_post},
      {"rope_rotate", bm_rope_rotate}, {"swiglu", bm_swiglu}, {"index_scores", bm_index_scores},
      {"index_scores_rows", bm_index_scores_rows}, {"kv_rows", bm_kv_rows},
  };
  for (const auto& [entry, fn] : entries) {
    for (const Backend* b : available_backends()) {
      // hc_mixes also at a batched-decode and two prefill sizes: its SIMD kernel picks lanes by token count.
      const std::vector<int64_t> token_counts =
          std::string(entry) == "hc_mixes" ? std::vector<int64_t>{1, 16, 32, 64, 256} : std::vector<int64_t>{1, 32};
      for (int64_t tokens : token_counts) {
        const std::string name = std::string(entry) + "/" + b->name + "/tokens:" + std::to_string(tokens);
        benchmark::RegisterBenchmark(name.c_str(), fn, b, tokens)->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace
}  // namespace dsflash

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  dsflash::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
