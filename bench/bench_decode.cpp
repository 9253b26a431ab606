// Decode speed of the whole model against the machine's memory bandwidth, measured side by side in one run
// (DESIGN.md "Speed": decode is bound by reading the weights). Prints, from the median of the repetitions:
//   decode_tok_s       single-sequence decode steps per second (fast kernels, all threads)
//   weight_MB_step     bytes of weights one decode step reads (ModelWeights::decode_weight_bytes)
//   achieved_GBps      weight bytes / step time
//   read_GBps          the engine's read probe (Engine::measure_read_bandwidth: the best of several read loops,
//                      the one `dsflash bench` divides by), timed before the decode request
//   plain_read_GBps / triad_GBps  a plain multithreaded sum and a STREAM triad a = b + s*c over 1 GiB, timed
//                      before the decode request (a plain sum reads slower than the probe's prefetching loops on
//                      some CPUs: on one Zen 5 VM 55-63 against 78-86 GB/s)
//   vs_read            achieved_GBps / read_GBps
// Runs through the Engine (include/dsflash/engine.h): one request with the exact plan (the official forward), its
// decode steps timed by the engine's step records. The bandwidth probes run before the request (the engine's loop
// thread owns the steps, so probes can no longer sit between them).
// Needs a checkpoint, e.g. `dsflash make-tiny --preset wide -o /tmp/wide`, then
//   bench_decode --model=DIR [--steps=16] [--threads=0] [--context=32] [--mlock=1] [--tile_major=0]
// --tile_major=0 keeps the checkpoint's weight order (LoadOptions::tile_major_weights), to compare the two.
// --mlock=1 locks the weights in RAM (LoadOptions::lock_weights), so that a kernel reclaiming cold file pages
// between runs cannot put disk reads into the timed steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "dsflash/engine.h"

namespace dsflash {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Sum of a buffer, split over the pool: GB/s of reading it.
double plain_read_gbps(const std::vector<float>& buffer, ThreadPool& pool) {
  std::vector<double> partial(static_cast<size_t>(pool.num_threads()) * 8, 0.0);
  const auto start = Clock::now();
  pool.parallel_for(
      static_cast<int64_t>(buffer.size()),
      [&](int64_t begin, int64_t end, int thread) {
        float acc[16] = {};
        for (int64_t i = begin; i + 16 <= end; i += 16)
          for (int l = 0; l < 16; ++l) acc[l] += buffer[static_cast<size_t>(i + l)];
        float sum = 0;
        for (float a : acc) sum += a;
        partial[static_cast<size_t>(thread) * 8] += sum;
      },
      4096);
  const double t = seconds_since(start);
  if (partial[0] == 12345.678) std::printf(" ");  // keep the sum alive
  return static_cast<double>(buffer.size() * sizeof(float)) / t / 1e9;
}

// STREAM triad a = b + s * c: 3 arrays touched per element (2 read, 1 written).
double triad_gbps(std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c, ThreadPool& pool) {
  const auto start = Clock::now();
  pool.parallel_for(
      static_cast<int64_t>(a.size()),
      [&](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) {
          a[static_cast<size_t>(i)] = b[static_cast<size_t>(i)] + 3.0f * c[static_cast<size_t>(i)];
        }
      },
      4096);
  const double t = seconds_since(start);
  return static_cast<double>(3 * a.size() * sizeof(float)) / t / 1e9;
}

std::string flag_value(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

int run(int argc, char** argv) {
  const std::string model = flag_value(argc, argv, "model", "");
  const int steps = std::atoi(flag_value(argc, argv, "steps", "16").c_str());
  const int threads = std::atoi(flag_value(argc, argv, "threads", "0").c_str());
  const int context = std::atoi(flag_value(argc, argv, "context", "32").c_str());
  const bool lock_weights = flag_value(argc, argv, "mlock", "0") == "1";
  const bool tile_major = flag_value(argc, argv, "tile_major", "1") == "1";
  if (model.empty() || steps <= 0 || context <= 0) {
    std::fprintf(stderr,
                 "usage: bench_decode --model=DIR [--steps=16] [--threads=0] [--context=32] [--mlock=1]\n"
                 "                    [--tile_major=0]\n"
                 "  (make a model with: dsflash make-tiny --preset wide -o DIR)\n");
    return 2;
  }
  LoadOptions options;
  options.num_threads = threads;
  options.lock_weights = lock_weights;
  options.tile_major_weights = tile_major;
  auto engine = Engine::load(model, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "bench_decode: %s\n", engine.error().message.c_str());
    return 1;
  }
  const ModelInfo& info = (*engine)->info();
  ThreadPool pool(threads);
  const size_t floats = (size_t{1} << 30) / sizeof(float);  // 1 GiB per array
  std::vector<float> a(floats, 1.0f), b(floats, 2.0f), c(floats, 0.5f);

  std::vector<int32_t> prompt(static_cast<size_t>(context));
  for (int i = 0; i < context; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 3) % static_cast<int>(info.vocab_size);
  // The bandwidth probes, then the decode: the engine's steps are timed on its own (step records), so the probes
  // run before the request (the plain ones `steps` times, the engine's three times: medians), and the decode
  // request runs `steps` + 1 decode steps after its prefill (the first is the warm-up: first touch of every mapped
  // weight page).
  std::vector<double> step_s, read, plain_read, triad;
  for (int i = 0; i < steps; ++i) {
    plain_read.push_back(plain_read_gbps(b, pool));
    triad.push_back(triad_gbps(a, b, c, pool));
  }
  for (int i = 0; i < 3; ++i) read.push_back((*engine)->measure_read_bandwidth().gbps);
  (void)(*engine)->take_step_records();
  GenerationRequest request;
  request.prompt_ids = prompt;
  request.max_tokens = steps + 2;
  request.stop_at_eos = false;
  request.detokenize = false;
  request.plan = Plan::kExact;
  auto done = (*engine)->generate(std::move(request));
  if (!done.ok()) {
    std::fprintf(stderr, "bench_decode: %s\n", done.error().message.c_str());
    return 1;
  }
  bool warm = false;
  for (const StepRecord& record : (*engine)->take_step_records()) {
    if (record.prefill_tokens != 0 || record.decode_batch != 1) continue;
    if (warm) step_s.push_back(record.seconds);
    warm = true;
  }
  const double step = median(step_s);
  const double bytes = static_cast<double>(info.decode_weight_bytes);
  const double achieved = bytes / step / 1e9;
  const double read_bw = median(read);
  std::printf("model %s: %d layers, dim %lld, kernels %s, %lld tile-major linears, %d threads, context %d, "
              "%d steps (medians)\n",
              model.c_str(), info.n_layers, static_cast<long long>(info.dim), info.kernels.c_str(),
              static_cast<long long>(info.tile_major_linears), pool.num_threads(), context, steps);
  std::printf("decode_tok_s %.3f  step_ms %.1f  weight_MB_step %.1f  achieved_GBps %.2f  read_GBps %.2f  "
              "plain_read_GBps %.2f  triad_GBps %.2f  vs_read %.3f\n",
              1.0 / step, step * 1e3, bytes / 1e6, achieved, read_bw, median(plain_read), median(triad),
              achieved / read_bw);
  return 0;
}

}  // namespace
}  // namespace dsflash

int main(int argc, char** argv) { return dsflash::run(argc, argv); }
