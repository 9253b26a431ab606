// Block quantisers (src/formats/quant.h): elements per second on one thread, for row widths the model uses
// (5120 = hidden, 512 = head_dim / KV latent, 128 = indexer head). Inputs are bf16-representable activations.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "formats/formats.h"
#include "formats/quant.h"

namespace {

std::vector<float> activations(int64_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dsflash::round_to_bf16(normal(rng));
  return x;
}

void BM_act_quant_block32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto x = activations(n);
  std::vector<uint8_t> codes(static_cast<size_t>(n)), scales(static_cast<size_t>(n / 32));
  for (auto _ : state) {
    dsflash::act_quant_block32(x.data(), n, codes.data(), scales.data());
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_fp4_quant_ue8m0_block32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto x = activations(n);
  std::vector<uint8_t> packed(static_cast<size_t>(n / 2)), scales(static_cast<size_t>(n / 32));
  for (auto _ : state) {
    dsflash::fp4_quant_ue8m0_block32(x.data(), n, packed.data(), scales.data());
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_fp4_quant_e4m3_block16(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto x = activations(n);
  std::vector<uint8_t> packed(static_cast<size_t>(n / 2)), scales(static_cast<size_t>(n / 16));
  for (auto _ : state) {
    dsflash::fp4_quant_e4m3_block16(x.data(), n, packed.data(), scales.data());
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_fake_quant_act_block32(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto x = activations(n);
  std::vector<float> work(x);
  for (auto _ : state) {
    work = x;
    dsflash::fake_quant_act_block32(work.data(), n);
    benchmark::DoNotOptimize(work.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_dequant_e4m3_ue8m0(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto x = activations(n);
  std::vector<uint8_t> codes(static_cast<size_t>(n)), scales(static_cast<size_t>(n / 32));
  dsflash::act_quant_block32(x.data(), n, codes.data(), scales.data());
  std::vector<float> out(static_cast<size_t>(n));
  for (auto _ : state) {
    dsflash::dequant_e4m3_ue8m0(codes.data(), scales.data(), n, 32, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

}  // namespace

BENCHMARK(BM_act_quant_block32)->Arg(5120)->Arg(16 * 5120);
BENCHMARK(BM_fp4_quant_ue8m0_block32)->Arg(128)->Arg(32 * 128);
BENCHMARK(BM_fp4_quant_e4m3_block16)->Arg(512)->Arg(64 * 512);
BENCHMARK(BM_fake_quant_act_block32)->Arg(512)->Arg(64 * 512);
BENCHMARK(BM_dequant_e4m3_ue8m0)->Arg(5120);

BENCHMARK_MAIN();
