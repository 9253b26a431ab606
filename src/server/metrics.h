// The server's Prometheus metrics (prometheus.io/docs/instrumenting/exposition_formats, text format 0.0.4):
//   dsflash_requests_running / dsflash_requests_waiting            gauges (engine)
//   dsflash_kv_cache_usage_ratio                                    gauge, KV bytes in use / budget (engine)
//   dsflash_prompt_tokens_total, dsflash_prompt_tokens_cached_total, dsflash_generation_tokens_total   counters
//   dsflash_time_to_first_token_seconds, dsflash_inter_token_latency_seconds                          histograms
//   dsflash_prefix_cache_hits_total / _misses_total / _bytes {tier}  per prefix-cache tier (engine)
//   dsflash_http_requests_total {endpoint, code}
// Counters and histograms are updated from any request thread; render() reads a consistent copy of each.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dsflash/engine.h"

namespace dsflash::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // HELP/TYPE lines, the cumulative buckets (+Inf last), _sum and _count.
  void render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); last = above every bound
  double sum_ = 0.0;
  int64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  void add_usage(const Usage& usage);
  void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token_latency(double seconds) { itl_.observe(seconds); }
  void count_http(const std::string& endpoint, int status);

  std::string render(const EngineStats& engine) const;

 private:
  std::atomic<int64_t> prompt_tokens_{0}, cached_tokens_{0}, generation_tokens_{0};
  Histogram ttft_, itl_;
  mutable std::mutex http_mutex_;
  std::map<std::pair<std::string, int>, int64_t> http_;
};

}  // namespace dsflash::server
