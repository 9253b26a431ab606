// Prefix-cache SSD tier: the index rebuild at open (a directory scan: names, sizes, times) over 100k records, and
// a record's encode/decode (checksum included). Records are small here (the scan never reads contents, so their
// size does not matter to it); the figure is records indexed per second.
//   bench_prefix [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "prefix/disk_tier.h"

namespace dsflash::prefix {
namespace {

RecordExpectation expectation() { return {Fingerprint{1, 2}, 512, 64}; }

BlockRecord record(uint64_t hash, size_t kv_bytes) {
  BlockRecord r;
  r.fingerprint = Fingerprint{1, 2};
  r.block_hash = hash;
  r.tokens.assign(64, 7);
  r.kv.assign(kv_bytes, static_cast<uint8_t>(hash));
  return r;
}

// A directory of `count` record files for model {1, 2}, made once per process and removed at exit.
struct RemovedAtExit {
  std::string path;
  ~RemovedAtExit() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

const std::string& populated_dir(int64_t count) {
  static RemovedAtExit dir{[count] {
    std::string pattern = (std::filesystem::temp_directory_path() / "dsflash-bench-prefix-XXXXXX").string();
    std::string root = ::mkdtemp(pattern.data());
    const std::string model = root + "/" + Fingerprint{1, 2}.hex();
    std::filesystem::create_directories(model);
    for (int64_t i = 0; i < count; ++i) {
      const auto bytes = encode_record(record(static_cast<uint64_t>(i) + 1, 512));
      char name[40];
      std::snprintf(name, sizeof(name), "/%016llx.kvb", static_cast<unsigned long long>(i + 1));
      std::ofstream(model + name, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    return root;
  }()};
  return dir.path;
}

void BM_IndexRebuildAtOpen(benchmark::State& state) {
  const int64_t count = state.range(0);
  const std::string& dir = populated_dir(count);
  for (auto _ : state) {
    DiskTierOptions options;
    options.dir = dir;
    auto tier = DiskTier::open(options, expectation());
    if (tier->stats().records != count) state.SkipWithError("wrong record count");
    benchmark::DoNotOptimize(tier);
  }
  state.counters["records_per_s"] = benchmark::Counter(static_cast<double>(count), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_IndexRebuildAtOpen)->Arg(100000)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_RecordDecode(benchmark::State& state) {
  const auto bytes = encode_record(record(5, static_cast<size_t>(state.range(0))));
  const RecordExpectation expect{Fingerprint{1, 2}, static_cast<uint64_t>(state.range(0)), 64};
  for (auto _ : state) benchmark::DoNotOptimize(decode_record(bytes, expect, "bench"));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes.size()));
}
BENCHMARK(BM_RecordDecode)->Arg(56960);  // one V4.1 block: 64 tokens x 890 B

}  // namespace
}  // namespace dsflash::prefix

BENCHMARK_MAIN();
