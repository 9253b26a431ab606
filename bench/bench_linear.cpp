// Linear kernels at the real model's shapes (spec/MODEL.md §1-§4): decode (rows 1-4, 8, 12, 16, 24, 32, 64: where the
// AVX2 table's decode passes give way to its many-row path, linear_avx2_impl.h) and prefill
// (rows 256, 2048), for the reference and every fast kernel set this CPU runs.
//
// Decode is bound by reading the weights, so every benchmark also times a plain SIMD read of the same
// number of weight bytes in the same run, interleaved with the kernel calls (the read probe's loops in turn,
// kernels/peak_probe.h; the fastest loop's times count), and reports
//   weight_GBps  weight bytes / kernel time      read_GBps  the same bytes / read time
//   vs_read      weight_GBps / read_GBps          GFLOPs     2 * rows * out * in / kernel time
// from the median call of each (best_vs_read: from the fastest call of each). Rows >= 16 also time the table's
// GEMM peak (its gemm_peak: the bf16 dot, fp32 FMAs for "avx512fma", the AMX tile unit for "amx") on the same
// threads in the same run (peak_GFLOPs; vs_peak = GFLOPs / peak_GFLOPs): many rows are bound by the multiplies,
// not the read (best_vs_peak: from the fastest call). Rows 2048 (one prefill chunk) run for the tile-major FP8 /
// MXFP4 shapes only.
// Weights are several copies cycled (256 MB in all) so that each call reads from memory, not from a 32 MB L3; where
// the L3 is larger some of it may come from there, for the kernel and the read alike (a Xeon reporting 480 MB: 1 GB
// of copies lowered both by 5-10% and left vs_read where it was). The "_cached" shapes instead read one L2-resident
// copy, which shows what the kernel computes when memory is not the limit. exact_fp4_prepare/<shape>: the one-row
// MXFP4 activation preparation the AVX-512 tables run before each call. repack/<shape>: the load-time copy of the
// weight into the tile-major layout (GBps of weight bytes).
// Run: build-<you>/bench/bench_linear [--threads=N] [--benchmark_filter=avx512] [--benchmark_repetitions=3]
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/huge_page_buffer.h"
#include "core/thread_pool.h"
#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/linear.h"
#include "kernels/linear_impl.h"
#include "kernels/peak_probe.h"

namespace dsflash {
namespace {

constexpr int64_t kMinCycledBytes = int64_t{256} << 20;

// kBf16 takes bf16 activations (the bf16 F.linear case); kBf16Fp32x genuine fp32 ones (the "fp32" linears);
// kFp8AsBf16 FP8 weights run as their bf16 values against bf16 activations (wo_a, fp8_as_bf16_gemm).
enum class Format { kFp8, kFp4, kBf16, kBf16Fp32x, kFp8AsBf16 };

struct LinearShape {
  const char* name;
  Format format;
  int64_t out, in;
  bool cached = false;  // one copy, small enough to stay in L2: the kernel's compute ceiling, not a memory figure
  // kFp8AsBf16 only: out / groups outputs per group from in inputs each (fp8_as_bf16_grouped_gemm, x [rows,
  // groups * in]); by_group: one fp8_as_bf16_gemm per group instead, on gathered columns, as the model ran wo_a
  // before its grouped call.
  int64_t groups = 1;
  bool by_group = false;
  // The activations are SwiGLU outputs silu(g) * u of normal g and u, as a routed expert's w2 reads (their blocks
  // spread wider than hidden states', which decides how many take exact_fp4_partials).
  bool swiglu_input = false;
};

// Real V4.1-Flash projections (hidden 5120, q_lora 1280, 8 output groups x 1024, MoE inter 2304).
const LinearShape kShapes[] = {
    {"wq_b_fp8", Format::kFp8, 32768, 1280},   // 64 heads x 512 from q_lora 1280
    {"wo_b_fp8", Format::kFp8, 5120, 8192},    // 8 groups x 1024 -> hidden
    {"w1_mxfp4", Format::kFp4, 2304, 5120},    // routed expert gate/up
    {"w13_mxfp4", Format::kFp4, 4608, 5120},   // its w1 and w3 paired at load (repack_fp4_pair_tile_major): one call
    {.name = "w2_mxfp4", .format = Format::kFp4, .out = 5120, .in = 2304, .swiglu_input = true},  // routed expert down
    {"head_bf16", Format::kBf16, 16384, 5120},  // a 16K-row slice of the 129,280-row head
    {"wo_a_bf16", Format::kBf16, 1024, 4096},   // one of the 8 output groups (64 heads x 512 / 8 -> 1024) in bf16
    {"wo_a_fp8", Format::kFp8AsBf16, 1024, 4096},  // the same group from the stored FP8 codes
    {"wo_a_fp8_grouped", Format::kFp8AsBf16, 8192, 4096, false, 8},  // all 8 groups in one call, as the model runs it
    {"wo_a_fp8_by_group", Format::kFp8AsBf16, 8192, 4096, false, 8, true},  // the same as 8 calls
    {"head_bf16_fp32x", Format::kBf16Fp32x, 16384, 5120},  // the head slice with fp32 activations
    // 288 KB / 512 KB slices of w2's and wo_b's shapes, read from L2 call after call (wo_b's four tiles: one FP8 row
    // reads four at a time).
    {.name = "w2_mxfp4_cached", .format = Format::kFp4, .out = 256, .in = 2304, .cached = true, .swiglu_input = true},
    {"wo_b_fp8_cached", Format::kFp8, 64, 8192, true},
};

uint64_t next_random(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

void fill_random(uint8_t* p, size_t n, uint64_t seed, uint8_t and_mask) {
  uint64_t s = seed | 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = next_random(s);
    for (int b = 0; b < 8; ++b) p[i + b] = static_cast<uint8_t>((v >> (8 * b)) & and_mask);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(next_random(s) & and_mask);
}

// One weight copy in huge-page memory, as the engine holds its rewritten weights (core/huge_page_buffer.h; the plain
// read below reads the same bytes): its codes (or bf16 values), then its scales from the next cache line on, as the
// engine places an MXFP4 weight's scales after its codes.
struct WeightCopy {
  HugePageBuffer data;
  uint8_t* scales = nullptr;
  bool may_hold_nan = true;  // FP8: false once the tile-major copy found no NaN code, as at load
  std::vector<uint8_t> plain_code_blocks;  // FP8 tile-major: Fp8Weight::plain_code_blocks, as at load
};

HugePageBuffer huge_bytes(int64_t n) {
  auto buffer = HugePageBuffer::allocate(static_cast<size_t>(n));
  if (!buffer.ok()) {
    std::fprintf(stderr, "bench_linear: %s\n", buffer.status().message().c_str());
    std::exit(1);
  }
  return std::move(*buffer);
}

int64_t weight_bytes(const LinearShape& s) {
  switch (s.format) {
    case Format::kFp8:
    case Format::kFp8AsBf16: return s.out * s.in + ((s.out + 31) / 32) * (s.in / 32);
    case Format::kFp4: return s.out * s.in / 2 + s.out * (s.in / 32);
    case Format::kBf16:
    case Format::kBf16Fp32x: return s.out * s.in * 2;
  }
  return 0;
}

// Sum of 64-bit words of [p, p+n) over the pool with one of the read probe's loops (kernels/peak_probe.h): what
// the kernels must at least do to the weight bytes.
uint64_t read_bytes(const uint8_t* p, int64_t n, ThreadPool& pool, ReadLoop loop) {
  std::vector<uint64_t> partial(static_cast<size_t>(pool.num_threads()) * 8, 0);
  const int64_t lines = n / 256;
  pool.parallel_for(lines, [&](int64_t b, int64_t e, int t) {
    partial[static_cast<size_t>(t) * 8] += loop(reinterpret_cast<const uint64_t*>(p + b * 256), (e - b) * 32);
  }, 64);
  uint64_t total = 0;
  for (uint64_t v : partial) total += v;
  return total;
}

// Activations as the model makes them: act_quant of bf16 values of one scale (normal, as hidden states are, or
// SwiGLU outputs), so the codes' magnitudes within a block spread as real ones do (exact_fp4_partials depends on
// that spread). codes [rows, in] e4m3, scales [rows, in / 32] ue8m0.
void make_activations(const LinearShape& shape, int64_t rows, std::vector<uint8_t>& codes,
                      std::vector<uint8_t>& scales) {
  codes.resize(static_cast<size_t>(rows * shape.in));
  scales.resize(static_cast<size_t>(rows * shape.in / 32));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> hidden(static_cast<size_t>(shape.in));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : hidden) {
      v = normal(rng);
      if (shape.swiglu_input) v = v / (1.0f + std::exp(-v)) * normal(rng);
      v = round_to_bf16(v);
    }
    act_quant_block32(hidden.data(), shape.in, codes.data() + r * shape.in, scales.data() + r * (shape.in / 32));
  }
}

// tile_major: FP8/FP4 weights repacked as the engine does at load for a table that prefers it (kernels/linear.h).
void run_linear(benchmark::State& state, const LinearKernels* kernels, LinearShape shape, int64_t rows,
                int threads, bool tile_major) {
  ThreadPool pool(threads);
  const int64_t bytes = weight_bytes(shape);
  const int copies = shape.cached ? 1 : static_cast<int>(std::max<int64_t>(2, (kMinCycledBytes + bytes - 1) / bytes));
  std::vector<WeightCopy> w(static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    if (shape.format == Format::kBf16 || shape.format == Format::kBf16Fp32x) {
      w[c].data = huge_bytes(shape.out * shape.in * 2);
      fill_random(w[c].data.data(), w[c].data.size(), 1000 + c, 0xff);
      // Keep bf16 values finite and moderate, as trained weights are: exponents 112..127 (|w| in [2^-15, 2)), so
      // that no product with the activations below is subnormal (fp32 FMAs would take microcode assists on them,
      // which real weights never cause; uniformly random exponents made the fp32 path look ~10x slower).
      for (size_t i = 1; i < w[c].data.size(); i += 2) {
        uint8_t& high = w[c].data.data()[i];
        high = static_cast<uint8_t>((high & 0x80) | 0x38 | (high & 0x07));
      }
    } else {
      const bool fp8 = shape.format != Format::kFp4;
      const int64_t n = fp8 ? shape.out * shape.in : shape.out * shape.in / 2;
      const int64_t ns = fp8 ? ((shape.out + 31) / 32) * (shape.in / 32) : shape.out * (shape.in / 32);
      const int64_t scales_at = (n + 63) / 64 * 64;
      w[c].data = huge_bytes(scales_at + ns);
      fill_random(w[c].data.data(), static_cast<size_t>(n), 1000 + c, fp8 ? 0x77 : 0xff);
      if (fp8)  // Subnormal codes at ~1e-4, about one 512-code block in 20 (estimated for normal-like weights)
        for (int64_t i = 0; i < n; ++i) {
          uint8_t& code = w[c].data.data()[i];
          if (i % 9973 == 0) code = 0x01;
          else if ((code & 0x78) == 0) code = static_cast<uint8_t>(code | 0x08);
        }
      w[c].scales = w[c].data.data() + scales_at;
      std::fill_n(w[c].scales, ns, uint8_t{120});
      if (tile_major) {
        const std::vector<uint8_t> row_major(w[c].data.data(), w[c].data.data() + n);
        if (fp8) {
          w[c].plain_code_blocks.resize(static_cast<size_t>(fp8_plain_code_block_count(shape.out, shape.in)));
          w[c].may_hold_nan = repack_fp8_tile_major(row_major.data(), shape.out, shape.in, w[c].data.data(), nullptr,
                                                    w[c].plain_code_blocks.data());
        }
        else {
          repack_fp4_tile_major(row_major.data(), shape.out, shape.in, w[c].data.data());
          const std::vector<uint8_t> scales(w[c].scales, w[c].scales + ns);  // all equal here, moved anyway as the engine does
          repack_fp4_scales_tile_major(scales.data(), shape.out, shape.in, w[c].scales);
        }
      }
    }
  }
  std::vector<uint8_t> x_codes, x_scales;
  make_activations(shape, rows, x_codes, x_scales);
  std::vector<float> x_f32(static_cast<size_t>(rows * shape.groups * shape.in));
  for (size_t i = 0; i < x_f32.size(); ++i)  // (the groups' inputs repeat the codes' pattern)
    x_f32[i] = static_cast<float>(static_cast<int>(x_codes[i % x_codes.size()] % 17) - 8) * 0.125f;
  if (shape.format == Format::kBf16Fp32x)  // not bf16 values: a bit below bf16 precision set in every one
    for (float& v : x_f32) v = v * (1.0f + 0x1p-20f) + 0x1p-20f;
  std::vector<float> y(static_cast<size_t>(rows * shape.out));
  const Fp8Activations x{x_codes.data(), x_scales.data(), rows, shape.in};
  LinearKernels by_group = *kernels;  // one fp8_as_bf16_gemm per group (the fallback of tables without their own)
  by_group.fp8_as_bf16_grouped_gemm = nullptr;

  auto fp8_weight = [&](const WeightCopy& wc) {
    Fp8Weight weight{wc.data.data(), wc.scales, shape.out, shape.in, tile_major, wc.may_hold_nan};
    if (!wc.plain_code_blocks.empty()) weight.plain_code_blocks = wc.plain_code_blocks.data();
    return weight;
  };
  auto call = [&](const WeightCopy& wc) {
    switch (shape.format) {
      case Format::kFp8:
        kernels->fp8_gemm(x, fp8_weight(wc), y.data(), &pool);
        break;
      case Format::kFp4:
        kernels->fp4_gemm(x, Fp4Weight{wc.data.data(), wc.scales, shape.out, shape.in, tile_major}, y.data(),
                          &pool);
        break;
      case Format::kFp8AsBf16:
        fp8_as_bf16_grouped_gemm(x_f32.data(), rows, shape.groups, fp8_weight(wc), y.data(),
                                 shape.by_group ? by_group : *kernels, &pool);
        break;
      case Format::kBf16:
      case Format::kBf16Fp32x: {
        const uint16_t* d = reinterpret_cast<const uint16_t*>(wc.data.data());
        kernels->bf16_gemm(x_f32.data(), rows, Bf16Weight{d, shape.out, shape.in}, y.data(), &pool);
        break;
      }
    }
  };

  using Clock = std::chrono::steady_clock;
  // Calls alternate between the read loops; each loop's times are kept apart and the fastest loop counts.
  const std::vector<ReadLoop> loops = read_loops();
  std::vector<double> kernel_s;
  std::vector<std::vector<double>> read_s(loops.size());
  uint64_t sink = 0;
  int c = 0;
  size_t reads = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    call(w[c]);
    auto t1 = Clock::now();
    const WeightCopy& other = w[(c + copies / 2) % copies];  // a different, equally cold copy
    const size_t loop = reads++ % loops.size();
    sink += read_bytes(other.data.data(), static_cast<int64_t>(other.data.size()), pool, loops[loop]);
    auto t2 = Clock::now();
    kernel_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    read_s[loop].push_back(std::chrono::duration<double>(t2 - t1).count());
    state.SetIterationTime(kernel_s.back());
    c = (c + 1) % copies;
  }
  benchmark::DoNotOptimize(sink);
  benchmark::DoNotOptimize(y.data());
  // Medians resist the other load on a shared machine; the best calls show what the code can do.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  const double data_bytes = static_cast<double>(w[0].data.size());
  const double kernel_gbps = static_cast<double>(bytes) / median(kernel_s) / 1e9;
  double read_median_s = 1e30, read_best_s = 1e30;
  for (const std::vector<double>& times : read_s) {
    if (times.empty()) continue;
    read_median_s = std::min(read_median_s, median(times));
    read_best_s = std::min(read_best_s, best(times));
  }
  const double read_gbps = data_bytes / read_median_s / 1e9;
  state.counters["weight_GBps"] = kernel_gbps;
  state.counters["read_GBps"] = read_gbps;
  state.counters["vs_read"] = kernel_gbps / read_gbps;
  state.counters["best_vs_read"] = (static_cast<double>(bytes) / best(kernel_s)) / (data_bytes / read_best_s);
  const double gflops = 2.0 * static_cast<double>(rows * shape.out * shape.in) / median(kernel_s) / 1e9;
  state.counters["GFLOPs"] = gflops;
  if (rows >= 12) {
    // The limit of this table's GEMMs: the AMX tile unit for "amx", fp32 FMAs for "avx512fma", the bf16 dot otherwise.
    const DotPeak peak = measure_dot_peak(&pool, 0.1, kernels->gemm_peak);
    state.counters["peak_GFLOPs"] = peak.gflops;
    state.counters["vs_peak"] = gflops / peak.gflops;
    state.counters["best_vs_peak"] = gflops * median(kernel_s) / best(kernel_s) / peak.gflops;
  }
}

// The AVX-512 tables' preparation of one MXFP4 row's activations for the integer decode (prepare_exact_fp4_rows):
// one thread, before every one-row call, while the other threads wait. us: microseconds per call.
void run_exact_fp4_prepare(benchmark::State& state, LinearShape shape) {
  std::vector<uint8_t> codes, scales;
  make_activations(shape, 1, codes, scales);
  const int64_t kb = shape.in / 32;
  std::vector<int8_t> pieces(static_cast<size_t>(kb * linear_impl::kExactFp4PieceBlockBytes));
  std::vector<int32_t> biases(static_cast<size_t>(kb));
  std::vector<float> units(static_cast<size_t>(kb));
  std::vector<uint8_t> counts(static_cast<size_t>(kb));
  for (auto _ : state) {
    linear_impl::prepare_exact_fp4_rows(codes.data(), 1, shape.in, pieces.data(), biases.data(), units.data(),
                                        counts.data());
    benchmark::DoNotOptimize(pieces.data());
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(kb), benchmark::Counter::kIsIterationInvariantRate |
                                                       benchmark::Counter::kInvert);
}

// The load-time copy of one weight into the tile-major layout (repack_fp8_tile_major with its NaN and plain-block
// checks, or repack_fp4_tile_major with its scales) on the pool, into memory already touched, so only the copy is
// timed (a load also faults in the destination). GBps: weight bytes copied per second.
void run_repack(benchmark::State& state, LinearShape shape, int threads) {
  ThreadPool pool(threads);
  const bool fp8 = shape.format == Format::kFp8;
  const int64_t bytes = fp8 ? shape.out * shape.in : shape.out * shape.in / 2;
  std::vector<uint8_t> from(static_cast<size_t>(bytes)), to(from.size());
  // FP8: normal codes only (no NaN, no subnormal), as in most blocks of real weights, so the checks scan every code.
  std::mt19937 rng(3);
  for (auto& b : from) {
    b = fp8 ? static_cast<uint8_t>((rng() % 0x77 + 8) | rng() % 2 * 0x80) : static_cast<uint8_t>(rng());
  }
  std::vector<uint8_t> scales(static_cast<size_t>(shape.out * (shape.in / 32)), 127), scales_to(scales.size());
  std::vector<uint8_t> plain(static_cast<size_t>(fp8_plain_code_block_count(shape.out, shape.in)));
  for (auto _ : state) {
    if (fp8) {
      benchmark::DoNotOptimize(repack_fp8_tile_major(from.data(), shape.out, shape.in, to.data(), &pool, plain.data()));
    } else {
      repack_fp4_tile_major(from.data(), shape.out, shape.in, to.data(), &pool);
      repack_fp4_scales_tile_major(scales.data(), shape.out, shape.in, scales_to.data(), &pool);
    }
    benchmark::ClobberMemory();
  }
  state.counters["GBps"] =
      benchmark::Counter(static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all(int threads) {
  for (const LinearShape& s : kShapes)
    if ((s.format == Format::kFp8 || s.format == Format::kFp4) && !s.cached && tile_major_possible(s.out, s.in))
      benchmark::RegisterBenchmark((std::string("repack/") + s.name).c_str(), run_repack, s, threads)
          ->Unit(benchmark::kMillisecond);
  if (linear_impl::avx512_kernels() != nullptr)
    for (const LinearShape& s : kShapes)
      if (s.format == Format::kFp4 && !s.cached)
        benchmark::RegisterBenchmark((std::string("exact_fp4_prepare/") + s.name).c_str(), run_exact_fp4_prepare, s)
            ->Unit(benchmark::kMicrosecond);
  std::vector<const LinearKernels*> sets = linear_impl::available_kernels();
  for (const LinearKernels* k : sets) {
    const bool reference = std::string(k->name) == "reference";
    for (const LinearShape& s : kShapes)
      for (const bool tiled : {false, true}) {
        // "_tiled": the layout the engine gives this table's FP8/FP4 weights at load.
        // wo_a's FP8 codes too, which every table runs; wo_a_bf16 times an exact bf16 copy of one group, which no
        // table keeps: twice the bytes against decoding the codes.
        const bool fp8_codes = s.format == Format::kFp8 || s.format == Format::kFp8AsBf16;
        const bool tile_major_format = (fp8_codes && k->prefers_tile_major.fp8) ||
                                       (s.format == Format::kFp4 && k->prefers_tile_major.fp4);
        if (tiled && !tile_major_format) continue;
        // 2-4: a routed expert's rows in a batch-4 decode step; 12: in a batch-16 one (16 tokens x 6 of 8 experts,
        // wide preset).
        for (int64_t rows : {1, 2, 3, 4, 8, 12, 16, 24, 32, 64, 256, 2048}) {
          if (reference && rows > 1) continue;  // the scalar oracle is only timed at rows = 1
          if (rows == 2048 && (!tiled || s.cached)) continue;
          std::string name =
              std::string(k->name) + "/" + s.name + (tiled ? "_tiled" : "") + "/rows:" + std::to_string(rows);
          benchmark::RegisterBenchmark(name.c_str(), run_linear, k, s, rows, threads, tiled)
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond)
              ->MinTime(rows >= 256 ? 1.0 : 0.5);
        }
      }
  }
}

}  // namespace
}  // namespace dsflash

// --threads=N (default: one per hardware thread) sizes the pool of both the kernels and the read loop.
int main(int argc, char** argv) {
  int threads = 0;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = std::atoi(argv[i] + 10);
    else argv[kept++] = argv[i];
  }
  argc = kept;
  dsflash::register_all(threads);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
