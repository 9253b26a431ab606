#include "kernels/peak_probe.h"

#include "kernels/linear_impl.h"

// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -W(maybe-)uninitialized. chains() passes
// 512-bit vectors between always-inlined functions, which -Wpsabi flags although no call remains to have an ABI.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wpsabi"
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

namespace dsflash {
namespace {

// Independent accumulators per probe loop: more than the unit's latency x throughput, or the probe times the
// latency and reports a peak the kernels beat. On a Zen 5 VM (one thread, register-only loops) vdpbf16ps reached
// 6.0 G/s with 12 chains and 6.6 G/s with 16 or 24 (latency ~6 cycles at 2 per cycle); the 512-bit FMA 6.5-6.7 with
// 12 and 6.7 with 16-24. 24 leave room for a longer latency and fit the 32 zmm registers; the AVX2 loop keeps 12
// (16 ymm registers).
constexpr int kZmmChains = 24;
constexpr int kYmmChains = 12;
constexpr int kAmxStepsPerRound = 12;  // amx_dot_rounds: 4 accumulator tiles x 3 TDPBF16PS per round

using Floats16 = float __attribute__((vector_size(64)));
using Floats8 = float __attribute__((vector_size(32)));
// Unsigned lanes for the integer chains, which wrap around: chains() sums them with the vector + (signed lanes
// would make that sum's overflow undefined, which UBSan reported on the AVX2 int8 probe).
using Ints16 = uint32_t __attribute__((vector_size(64)));
using Shorts16 = uint16_t __attribute__((vector_size(32)));

// Register-only loops: kChains accumulators of V (a GCC vector of floats), each advanced `rounds` times by
// step(acc); the lane sum of their total feeds a sink, so the compiler keeps every instruction. Inlined into the
// callers below, whose target attributes (and their steps') pick the instructions. The inner loop is unrolled so
// that the accumulators live in registers (a rolled loop keeps them in memory and times store forwarding).
template <int kChains, class V, class Step>
__attribute__((always_inline)) inline float chains(int64_t rounds, Step step) {
  V acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = V{};
  for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) acc[c] = step(acc[c]);
  }
  V total = acc[0];
  for (int c = 1; c < kChains; ++c) total = total + acc[c];
  float sum = 0.0f;
  for (size_t lane = 0; lane < sizeof(V) / sizeof(float); ++lane) sum += total[lane];
  return sum;
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_rounds(int64_t rounds) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80);  // 1.0 bf16
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3C00);  // 2^-7: sums stay finite
  return chains<kZmmChains, Floats16>(rounds, [&](Floats16 acc) __attribute__((target("avx512f,avx512bf16"))) {
    return (Floats16)_mm512_dpbf16_ps((__m512)acc, a, b);
  });
}

__attribute__((target("avx512f"))) float fma_rounds_avx512(int64_t rounds) {
  const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1.0f / 128);
  return chains<kZmmChains, Floats16>(rounds, [&](Floats16 acc) __attribute__((target("avx512f"))) {
    return (Floats16)_mm512_fmadd_ps(a, b, (__m512)acc);
  });
}

__attribute__((target("avx2,fma"))) float fma_rounds(int64_t rounds) {
  const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1.0f / 128);
  return chains<kYmmChains, Floats8>(rounds, [&](Floats8 acc) __attribute__((target("avx2,fma"))) {
    return (Floats8)_mm256_fmadd_ps(a, b, (__m256)acc);
  });
}

// Integer chains wrap around by design (unsigned lanes); only their instructions count.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) float int8_dot_rounds_vnni(int64_t rounds) {
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
  return chains<kZmmChains, Ints16>(rounds, [&](Ints16 acc) __attribute__((target("avx512f,avx512bw,avx512vnni"))) {
    return (Ints16)_mm512_dpbusd_epi32((__m512i)acc, a, b);
  });
}

__attribute__((target("avx2"))) float int8_dot_rounds_avx2(int64_t rounds) {
  const __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(-1);
  return chains<kYmmChains, Shorts16>(rounds, [&](Shorts16 acc) __attribute__((target("avx2"))) {
    return (Shorts16)_mm256_add_epi16((__m256i)acc, _mm256_maddubs_epi16(a, b));
  });
}

bool has_avx512f() { return __builtin_cpu_supports("avx512f"); }

bool has_bf16_dot() { return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f"); }

const char* kBf16Kernel = "avx512bf16 vdpbf16ps";
const char* kFmaKernel = "avx2 fp32 fma";
const char* kFma512Kernel = "avx512 fp32 fma";
const char* kAmxKernel = "amx-bf16 tdpbf16ps";
const char* kVnniKernel = "avx512vnni vpdpbusd";
const char* kMaddubsKernel = "avx2 vpmaddubsw";

bool has_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
}

// Sum of the buffer's 64-bit words (a value the compiler must compute, so every load stays), with 256-bit loads,
// optionally prefetching kPrefetchBytes ahead in software as the kernels do.
constexpr int64_t kPrefetchBytes = 4096;
template <bool kPrefetch>
__attribute__((target("avx2"))) uint64_t sum_words(const uint64_t* data, int64_t words) {
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  int64_t i = 0;
  for (; i + 16 <= words; i += 16) {
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(data + i) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(data + i) + kPrefetchBytes + 64, _MM_HINT_T0);
    }
    for (int c = 0; c < 4; ++c)
      acc[c] = _mm256_add_epi64(acc[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 4 * c)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3])));
  uint64_t total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < words; ++i) total += data[i];
  return total;
}
// The same with 512-bit loads and the prefetch kAheadBytes ahead (on one Xeon, 512-bit loads read ~20% faster than
// 256-bit ones), over kStreams equal parts of the range read in turn, 128 bytes of each at a time, as the tile-major
// decode kernels read four tiles (linear_avx512_tiled.cpp: 2 KB ahead; with it they outran the one-stream loops).
template <int64_t kAheadBytes, int kStreams>
__attribute__((target("avx512f"))) uint64_t sum_words_avx512(const uint64_t* data, int64_t words) {
  __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  const int64_t part = words / kStreams / 16 * 16;
  for (int64_t i = 0; i < part; i += 16)
    for (int s = 0; s < kStreams; ++s) {
      const uint64_t* step = data + s * part + i;
      _mm_prefetch(reinterpret_cast<const char*>(step) + kAheadBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(step) + kAheadBytes + 64, _MM_HINT_T0);
      for (int c = 0; c < 2; ++c) acc[c] = _mm512_add_epi64(acc[c], _mm512_loadu_si512(step + 8 * c));
    }
  // (Lane by lane in uint64_t: _mm512_reduce_add_epi64 adds as signed, and the sums wrap by design.)
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(acc[0], acc[1]));
  uint64_t total = 0;
  for (const uint64_t lane : lanes) total += lane;
  for (int64_t i = kStreams * part; i < words; ++i) total += data[i];
  return total;
}

}  // namespace

std::vector<ReadLoop> read_loops() {
  std::vector<ReadLoop> loops = {sum_words<false>, sum_words<true>};
  if (has_avx512f()) {
    loops.push_back(sum_words_avx512<kPrefetchBytes, 1>);
    loops.push_back(sum_words_avx512<2048, 1>);
    loops.push_back(sum_words_avx512<2048, 4>);
  }
  return loops;
}

ReadPeak measure_read_bandwidth(ThreadPool* pool, int64_t bytes, int passes) {
  ReadPeak peak;
  const int64_t words = std::max<int64_t>(16, bytes / 8 / 16 * 16);  // whole 128-byte steps
  peak.bytes = words * 8;
  // Uninitialised (no page touched here): written once by the threads that read it, so that first touch places
  // the pages where they are read.
  const std::unique_ptr<uint64_t[]> buffer(new uint64_t[static_cast<size_t>(words)]);
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  auto share = [&](int64_t t, int64_t* begin, int64_t* end) {
    const int64_t per = (words / threads + 15) / 16 * 16;
    *begin = std::min(words, t * per);
    *end = t + 1 == threads ? words : std::min(words, (t + 1) * per);
  };
  auto over_threads = [&](auto fn) {
    if (pool != nullptr) {
      pool->parallel_for(threads, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) fn(t);
      });
    } else {
      fn(0);
    }
  };
  over_threads([&](int64_t t) {
    int64_t begin, end;
    share(t, &begin, &end);
    for (int64_t i = begin; i < end; ++i) buffer[static_cast<size_t>(i)] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  });
  std::vector<uint64_t> sinks(static_cast<size_t>(threads) * 8, 0);
  using Clock = std::chrono::steady_clock;
  // Every pass times each read loop this CPU runs; the fastest counts (CPUs differ in which one reads fastest).
  const std::vector<ReadLoop> loops = read_loops();
  peak.seconds = 1e30;
  for (int pass = 0; pass < std::max(passes, 1); ++pass) {
    for (const auto loop : loops) {
      const auto t0 = Clock::now();
      over_threads([&](int64_t t) {
        int64_t begin, end;
        share(t, &begin, &end);
        sinks[static_cast<size_t>(t) * 8] += loop(buffer.get() + begin, end - begin);
      });
      peak.seconds = std::min(peak.seconds, std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  volatile uint64_t sink = 0;
  for (uint64_t v : sinks) sink = sink + v;
  peak.gbps = static_cast<double>(peak.bytes) / peak.seconds * 1e-9;
  return peak;
}

int64_t dot_probe_flops(const std::string& kernel, int64_t iterations) {
  // FLOPs per chain step: a vdpbf16ps (32 products + 32 sums), a 16- or 8-lane FMA, a TDPBF16PS of 16 x 16 outputs
  // x 32 products; integer ops: a vpdpbusd (64 products + 64 sums), a vpmaddubsw + vpaddw (32 + 32).
  // Steps per round: the loop's chains (amx_dot_rounds: its TDPBF16PS per round).
  if (kernel == kAmxKernel) return iterations * kAmxStepsPerRound * (2 * 16 * 16 * 32);
  if (kernel == kBf16Kernel) return iterations * kZmmChains * 64;
  if (kernel == kFma512Kernel) return iterations * kZmmChains * 32;
  if (kernel == kVnniKernel) return iterations * kZmmChains * 128;
  if (kernel == kMaddubsKernel) return iterations * kYmmChains * 64;
  return iterations * kYmmChains * 16;
}

namespace {
struct DotProbe {
  const char* kernel;
  float (*rounds)(int64_t);
};
// The instruction measure_dot_peak times for `ops` on this CPU, and its loop.
DotProbe dot_probe(PeakOps ops) {
  if (ops == PeakOps::kAmxBf16 && linear_impl::amx_usable()) return {kAmxKernel, linear_impl::amx_dot_rounds};
  if (ops == PeakOps::kInt8Dot) {
    return has_vnni() ? DotProbe{kVnniKernel, int8_dot_rounds_vnni} : DotProbe{kMaddubsKernel, int8_dot_rounds_avx2};
  }
  if (ops == PeakOps::kFp32Fma256) return {kFmaKernel, fma_rounds};
  if (ops == PeakOps::kFp32Fma) {
    return has_avx512f() ? DotProbe{kFma512Kernel, fma_rounds_avx512} : DotProbe{kFmaKernel, fma_rounds};
  }
  return has_bf16_dot() ? DotProbe{kBf16Kernel, bf16_dot_rounds} : DotProbe{kFmaKernel, fma_rounds};
}
}  // namespace

std::string dot_peak_kernel(PeakOps ops) { return dot_probe(ops).kernel; }

DotPeak measure_dot_peak(ThreadPool* pool, double seconds, PeakOps ops) {
  DotPeak peak;
  const DotProbe probe = dot_probe(ops);
  peak.kernel = probe.kernel;
  float (*rounds_fn)(int64_t) = probe.rounds;
  // Calibrate on one thread so the timed run lasts about `seconds`.
  using Clock = std::chrono::steady_clock;
  int64_t rounds = 1 << 16;
  volatile float sink = 0;
  for (;;) {
    const auto t0 = Clock::now();
    sink = sink + rounds_fn(rounds);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (t > seconds / 8 || rounds > (int64_t{1} << 40)) {
      rounds = static_cast<int64_t>(static_cast<double>(rounds) * seconds / std::max(t, 1e-9));
      break;
    }
    rounds *= 4;
  }
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  std::vector<float> sinks(static_cast<size_t>(threads) * 16, 0.0f);
  const auto t0 = Clock::now();
  if (pool != nullptr) {
    pool->parallel_for(threads, [&](int64_t begin, int64_t end, int) {
      for (int64_t t = begin; t < end; ++t) sinks[static_cast<size_t>(t) * 16] = rounds_fn(rounds);
    });
  } else {
    sinks[0] = rounds_fn(rounds);
  }
  peak.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (float v : sinks) sink = sink + v;
  peak.flops_per_thread = dot_probe_flops(peak.kernel, rounds);
  peak.gflops = static_cast<double>(peak.flops_per_thread) * threads / peak.seconds * 1e-9;
  return peak;
}

}  // namespace dsflash
