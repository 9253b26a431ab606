// Tokenizer throughput (tokens/s) on a large mixed text: encode with a warm BPE cache, without the cache, and
// decode. Text: the spec and design documents plus the tokenizer test corpus, repeated to ~4 MB.
// Tokenizer: $DSFLASH_TOKENIZER, default <repo>/../shared/tokenizer/deepseek_v41_tokenizer.reconstructed.json.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;

fs::path repo_root() { return fs::path(__FILE__).parent_path().parent_path(); }

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const dsflash::Tokenizer& tokenizer() {
  static const dsflash::Tokenizer* t = [] {
    const char* env = std::getenv("DSFLASH_TOKENIZER");
    const fs::path path = env ? fs::path(env)
                              : repo_root() / ".." / "shared" / "tokenizer" / "deepseek_v41_tokenizer.reconstructed.json";
    auto r = dsflash::Tokenizer::from_file(path.string());
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().message().c_str());
      std::exit(1);
    }
    return new dsflash::Tokenizer(std::move(*r));
  }();
  return *t;
}

const std::string& big_text() {
  static const std::string text = [] {
    std::string base;
    const fs::path shared = repo_root() / ".." / "shared";
    for (const char* doc : {"spec/MODEL.md", "DESIGN.md", "spec/CHECKPOINT.md"}) base += read(shared / doc);
    const auto corpus = nlohmann::json::parse(read(repo_root() / "tests/data/tokenizer/encode_goldens.json"));
    for (const auto& c : corpus["cases"])
      if (c.contains("text")) base += c["text"].get<std::string>() + "\n";
    std::string out;
    while (out.size() < (4u << 20)) out += base;
    return out;
  }();
  return text;
}

void BM_EncodeCached(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto& text = big_text();
  (void)tok.encode(text);  // warm the cache
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text);
    tokens += ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void BM_EncodeUncached(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto& text = big_text();
  dsflash::EncodeOptions options;
  options.use_cache = false;
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text, options);
    tokens += ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void BM_Decode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto ids = *tok.encode(big_text());
  for (auto _ : state) {
    auto text = tok.decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(ids.size() * state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK(BM_EncodeCached)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeUncached)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
