#include "server/metrics.h"

#include <cstdio>

namespace dsflash::server {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void family(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, double value, const std::string& labels = "") {
  out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(value) + "\n";
}

// A label value with \, " and newlines escaped.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  family(out, name, "histogram", help);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    sample(out, name + "_bucket", static_cast<double>(cumulative), "le=\"" + number(bounds_[i]) + "\"");
  }
  sample(out, name + "_bucket", static_cast<double>(count_), "le=\"+Inf\"");
  sample(out, name + "_sum", sum_);
  sample(out, name + "_count", static_cast<double>(count_));
}

ServerMetrics::ServerMetrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void ServerMetrics::add_usage(const Usage& usage) {
  prompt_tokens_ += usage.prompt_tokens;
  cached_tokens_ += usage.cached_tokens;
  generation_tokens_ += usage.generated_tokens;
}

void ServerMetrics::count_http(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(http_mutex_);
  ++http_[{endpoint, status}];
}

std::string ServerMetrics::render(const EngineStats& engine) const {
  std::string out;
  family(out, "dsflash_requests_running", "gauge", "Requests prefilling or decoding.");
  sample(out, "dsflash_requests_running", static_cast<double>(engine.requests_running));
  family(out, "dsflash_requests_waiting", "gauge", "Requests queued, not yet admitted.");
  sample(out, "dsflash_requests_waiting", static_cast<double>(engine.requests_waiting));
  family(out, "dsflash_kv_cache_usage_ratio", "gauge", "KV cache bytes in use over the KV budget.");
  sample(out, "dsflash_kv_cache_usage_ratio",
         engine.kv_budget_bytes > 0 ? static_cast<double>(engine.kv_used_bytes) / static_cast<double>(engine.kv_budget_bytes) : 0.0);
  family(out, "dsflash_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  sample(out, "dsflash_prompt_tokens_total", static_cast<double>(prompt_tokens_.load()));
  family(out, "dsflash_prompt_tokens_cached_total", "counter", "Prompt tokens restored from the prefix cache.");
  sample(out, "dsflash_prompt_tokens_cached_total", static_cast<double>(cached_tokens_.load()));
  family(out, "dsflash_generation_tokens_total", "counter", "Generated tokens of finished requests.");
  sample(out, "dsflash_generation_tokens_total", static_cast<double>(generation_tokens_.load()));
  ttft_.render("dsflash_time_to_first_token_seconds", "Time from request arrival to its first generated token.", out);
  itl_.render("dsflash_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", out);
  family(out, "dsflash_prefix_cache_hits_total", "counter", "Prefix-cache lookups served by a tier.");
  for (const auto& t : engine.prefix_tiers) sample(out, "dsflash_prefix_cache_hits_total", static_cast<double>(t.hits), "tier=\"" + label(t.tier) + "\"");
  family(out, "dsflash_prefix_cache_misses_total", "counter", "Prefix-cache lookups a tier could not serve.");
  for (const auto& t : engine.prefix_tiers) sample(out, "dsflash_prefix_cache_misses_total", static_cast<double>(t.misses), "tier=\"" + label(t.tier) + "\"");
  family(out, "dsflash_prefix_cache_bytes", "gauge", "Bytes held by a prefix-cache tier.");
  for (const auto& t : engine.prefix_tiers) sample(out, "dsflash_prefix_cache_bytes", static_cast<double>(t.bytes), "tier=\"" + label(t.tier) + "\"");
  family(out, "dsflash_http_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
  std::lock_guard<std::mutex> lock(http_mutex_);
  for (const auto& [key, n] : http_) {
    sample(out, "dsflash_http_requests_total", static_cast<double>(n),
           "endpoint=\"" + label(key.first) + "\",code=\"" + std::to_string(key.second) + "\"");
  }
  return out;
}

}  // namespace dsflash::server
