#include "io/model_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

namespace dsflash {

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

int64_t logical_elements(const ExpectedTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

// "layers.17.attn.wq_a.weight" -> 17 and "attn.wq_a.weight"; -1 for other names.
int backbone_layer(const std::string& name, std::string* rest) {
  if (!starts_with(name, "layers.")) return -1;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos) return -1;
  *rest = name.substr(dot + 1);
  return std::stoi(name.substr(7, dot - 7));
}

// Elements of `t` that one text token uses (see model_stats.h for the definitions).
long double activated_elements(const ExpectedTensor& t, const ModelConfig& c, bool prefill, int decoder_start) {
  if (t.dtype == DType::kF8_E8M0) return 0;  // block scales are not parameters
  const long double elements = static_cast<long double>(logical_elements(t));
  if (t.name == "embed.weight") return static_cast<long double>(c.dim);  // one row
  if (t.name == "head.weight" || t.name == "norm.weight") return prefill ? 0 : elements;
  std::string rest;
  const int layer = backbone_layer(t.name, &rest);
  if (layer < 0) return 0;  // vision, aligner, image delimiters, DSpark
  if (prefill) {
    if (layer > decoder_start) return 0;
    if (layer == decoder_start) {
      // The decoder's global-KV path: attention input norm, compressor, indexer keys (and Engram on
      // the streams entering the block). Its query side, attention, MoE and mHC run only on the tail.
      const bool global_path = rest == "attn_norm.weight" || starts_with(rest, "attn.compressor.") ||
                               rest == "attn.indexer.wk.weight" || rest == "attn.indexer.k_norm.weight" ||
                               starts_with(rest, "engram.");
      if (!global_path) return 0;
    }
  }
  if (rest == "ffn.gate.bias_vl") return 0;  // image tokens only
  if (starts_with(rest, "ffn.experts.")) {
    const int routed = c.routed_experts(layer);
    return routed > 0 ? elements * c.activated_experts(layer) / routed : 0;
  }
  if (rest == "engram.embed.weight") {
    const long double rows_per_token = static_cast<long double>(c.engram_max_ngram_size - 1) * c.engram_n_heads;
    return rows_per_token * static_cast<long double>(c.engram_head_dim);
  }
  return elements;
}

void add_totals(TensorTotals* totals, DType dtype, int64_t bytes) {
  ++totals->num_tensors;
  totals->num_bytes += bytes;
  for (auto& d : totals->by_dtype) {
    if (d.dtype == dtype) {
      ++d.num_tensors;
      d.num_bytes += bytes;
      return;
    }
  }
  totals->by_dtype.push_back({dtype, 1, bytes});
}

void sort_by_dtype(TensorTotals* totals) {
  std::sort(totals->by_dtype.begin(), totals->by_dtype.end(),
            [](const DTypeTotals& a, const DTypeTotals& b) { return a.dtype < b.dtype; });
}

// Integral doubles print as integers (890, not 890.0).
nlohmann::json number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 9e15) return static_cast<int64_t>(v);
  return v;
}

// 763.21B / 6.46M / 5,120: two decimals in the largest unit that fits.
std::string billions(int64_t n) {
  char buf[64];
  const double v = static_cast<double>(n);
  if (v >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  }
  return buf;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

std::string fmt(double v) {
  char buf[64];
  if (std::floor(v) == v) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  }
  return buf;
}

// "L7" / "mtp.0". (Built with append: GCC 12 warns falsely (-Wrestrict) on "L" + std::to_string.)
std::string layer_label(const ModelConfig& c, int layer) {
  std::string out = layer < c.n_layers ? "L" : "mtp.";
  out.append(std::to_string(layer < c.n_layers ? layer : layer - c.n_layers));
  return out;
}

std::string role_flags(const LayerRole& r) {
  std::string f = r.dspark ? "dspark" : r.decoder ? "decoder" : "encoder";
  if (r.kv_source) f += " kv-source";
  if (r.index_source) f += " index-source";
  if (r.candidate_source) f += " candidate-source";
  if (r.candidate_restricted) f += " candidate-restricted";
  if (r.engram) f += " engram";
  return f;
}

nlohmann::json totals_json(const TensorTotals& t) {
  nlohmann::json by = nlohmann::json::object();
  for (const auto& d : t.by_dtype) by[dtype_name(d.dtype)] = {{"tensors", d.num_tensors}, {"bytes", d.num_bytes}};
  return by;
}

}  // namespace

ParameterCounts count_parameters(const ModelConfig& config) {
  ParameterCounts p;
  const int decoder_start = config.ced_decoder_start();
  long double prefill = 0, decode = 0, prefill_fp4 = 0, decode_fp4 = 0;
  for (const ExpectedTensor& t : expected_tensors(config)) {
    const int64_t n = logical_elements(t);
    if (t.dtype == DType::kF8_E8M0) {
      p.scale_elements += n;
      continue;
    }
    p.total += n;
    if (starts_with(t.name, "layers.") && t.name.find(".engram.") != std::string::npos) {
      p.engram += n;
    } else if (starts_with(t.name, "layers.") || t.name == "embed.weight" || t.name == "head.weight" ||
               t.name == "norm.weight") {
      p.backbone += n;
    } else if (starts_with(t.name, "mtp.")) {
      p.dspark += n;
    } else {
      p.vision += n;
    }
    const long double token_prefill = activated_elements(t, config, true, decoder_start);
    const long double token_decode = activated_elements(t, config, false, decoder_start);
    prefill += token_prefill;
    decode += token_decode;
    if (t.dtype == DType::kF4) {
      prefill_fp4 += token_prefill;
      decode_fp4 += token_decode;
    }
  }
  p.activated_prefill = static_cast<int64_t>(std::llround(prefill));
  p.activated_decode = static_cast<int64_t>(std::llround(decode));
  p.activated_prefill_fp4 = static_cast<int64_t>(std::llround(prefill_fp4));
  p.activated_decode_fp4 = static_cast<int64_t>(std::llround(decode_fp4));
  return p;
}

KvFigures kv_figures(const ModelConfig& c) {
  KvFigures k;
  k.main_entry_bytes = c.head_dim / 2 + c.head_dim / 16;
  k.indexer_entry_bytes = c.index_head_dim / 2 + c.index_head_dim / 32;
  for (int layer : c.kv_source_layers) {
    const int ratio = c.compress_ratio(layer);
    if (ratio <= 0) continue;
    k.global_main_bytes_per_token += static_cast<double>(k.main_entry_bytes) / ratio;
    k.global_indexer_bytes_per_token += static_cast<double>(k.indexer_entry_bytes) / ratio;
  }
  k.global_kv_bytes_per_token = k.global_main_bytes_per_token + k.global_indexer_bytes_per_token;
  k.window_bytes_per_row = c.head_dim + c.head_dim / 32;
  k.window_rows = c.window_size;
  k.window_bytes_per_sequence = static_cast<int64_t>(c.n_layers) * k.window_rows * k.window_bytes_per_row;
  k.dspark_window_bytes_per_sequence = static_cast<int64_t>(c.dspark_stages()) * k.window_rows * k.window_bytes_per_row;
  k.persistent_bytes_per_token = k.global_kv_bytes_per_token;
  return k;
}

TensorTotals expected_tensor_totals(const ModelConfig& config, const StorageConventions& conventions) {
  TensorTotals t;
  for (const ExpectedTensor& e : expected_tensors(config, conventions)) {
    add_totals(&t, e.dtype, static_cast<int64_t>(e.num_bytes()));
  }
  sort_by_dtype(&t);
  return t;
}

TensorTotals stored_tensor_totals(const Checkpoint& checkpoint) {
  TensorTotals t;
  for (const TensorView* v : checkpoint.all_tensors()) add_totals(&t, v->dtype, static_cast<int64_t>(v->num_bytes));
  sort_by_dtype(&t);
  return t;
}

ModelStats compute_model_stats(const ModelConfig& config) {
  ModelStats s;
  s.params = count_parameters(config);
  s.kv = kv_figures(config);
  s.expected = expected_tensor_totals(config, s.conventions);
  return s;
}

ModelStats compute_model_stats(const Checkpoint& checkpoint) {
  ModelStats s;
  s.params = count_parameters(checkpoint.config());
  s.kv = kv_figures(checkpoint.config());
  s.conventions = checkpoint.conventions();
  s.expected = expected_tensor_totals(checkpoint.config(), s.conventions);
  s.has_checkpoint = true;
  s.stored = stored_tensor_totals(checkpoint);
  return s;
}

std::string model_stats_json(const ModelConfig& c, const ModelStats& s, bool list_expected, int indent) {
  nlohmann::ordered_json j;
  j["n_layers"] = c.n_layers;
  j["dspark_stages"] = c.dspark_stages();
  j["ced_decoder_start"] = c.ced_decoder_start();
  j["params_total"] = s.params.total;
  j["params_backbone"] = s.params.backbone;
  j["params_engram"] = s.params.engram;
  j["params_dspark"] = s.params.dspark;
  j["params_vision"] = s.params.vision;
  j["scale_elements"] = s.params.scale_elements;
  j["activated_params_prefill"] = s.params.activated_prefill;
  j["activated_params_decode"] = s.params.activated_decode;
  j["activated_params_prefill_fp4"] = s.params.activated_prefill_fp4;
  j["activated_params_decode_fp4"] = s.params.activated_decode_fp4;
  j["global_main_kv_bytes_per_token"] = number(s.kv.global_main_bytes_per_token);
  j["global_indexer_bytes_per_token"] = number(s.kv.global_indexer_bytes_per_token);
  j["global_kv_bytes_per_token"] = number(s.kv.global_kv_bytes_per_token);
  j["main_entry_bytes"] = s.kv.main_entry_bytes;
  j["indexer_entry_bytes"] = s.kv.indexer_entry_bytes;
  j["window_bytes_per_row"] = s.kv.window_bytes_per_row;
  j["window_rows"] = s.kv.window_rows;
  j["window_bytes_per_sequence"] = s.kv.window_bytes_per_sequence;
  j["dspark_window_bytes_per_sequence"] = s.kv.dspark_window_bytes_per_sequence;
  j["persistent_bytes_per_token"] = number(s.kv.persistent_bytes_per_token);
  j["num_tensors_expected"] = s.expected.num_tensors;
  j["bytes_expected"] = s.expected.num_bytes;
  j["expected_by_dtype"] = totals_json(s.expected);
  if (s.has_checkpoint) {
    j["num_tensors"] = s.stored.num_tensors;
    j["bytes"] = s.stored.num_bytes;
    j["by_dtype"] = totals_json(s.stored);
  }
  nlohmann::json roles = nlohmann::json::array();
  for (const LayerRole& r : c.roles) {
    roles.push_back({{"layer", layer_label(c, r.layer)},
                     {"compress_ratio", r.compress_ratio},
                     {"attention", attention_kind_name(r.attention)},
                     {"kv_source_layer", r.kv_source_layer},
                     {"index_source_layer", r.index_source_layer},
                     {"kv_source", r.kv_source},
                     {"index_source", r.index_source},
                     {"candidate_source", r.candidate_source},
                     {"candidate_restricted", r.candidate_restricted},
                     {"engram", r.engram},
                     {"decoder", r.decoder},
                     {"dspark", r.dspark}});
  }
  j["roles"] = roles;
  if (list_expected) {
    nlohmann::json list = nlohmann::json::array();
    for (const ExpectedTensor& t : expected_tensors(c, s.conventions)) {
      list.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}});
    }
    j["expected_tensors"] = list;
  }
  return j.dump(indent);
}

std::string model_stats_text(const ModelConfig& c, const ModelStats& s, bool list_expected) {
  std::string out;
  char line[256];
  out += "Layer roles (CED decoder starts at " + layer_label(c, c.ced_decoder_start()) + ")\n";
  std::snprintf(line, sizeof line, "  %-7s %-5s %-8s %-6s %-7s %s\n", "layer", "ratio", "attn", "kv", "topk", "role");
  out += line;
  for (const LayerRole& r : c.roles) {
    const std::string kv = r.kv_source_layer >= 0 ? layer_label(c, r.kv_source_layer) : "-";
    const std::string ix = r.index_source_layer >= 0 ? layer_label(c, r.index_source_layer) : "-";
    std::snprintf(line, sizeof line, "  %-7s %-5d %-8s %-6s %-7s %s\n", layer_label(c, r.layer).c_str(),
                  r.compress_ratio, attention_kind_name(r.attention), kv.c_str(), ix.c_str(), role_flags(r).c_str());
    out += line;
  }
  const ParameterCounts& p = s.params;
  out += "\nParameters (logical weight elements; block scales excluded)\n";
  out += "  total      " + billions(p.total) + " (" + with_commas(p.total) + ")\n";
  out += "  backbone   " + billions(p.backbone) + "\n";
  out += "  engram     " + billions(p.engram) + "\n";
  out += "  dspark     " + billions(p.dspark) + "\n";
  out += "  vision     " + billions(p.vision) + "\n";
  out += "  activated per decode token   " + billions(p.activated_decode) + " (every layer, top-k experts, head)\n";
  out += "  activated per prefill token  " + billions(p.activated_prefill) +
         " (CED: encoder + decoder-start global-KV path; decoder tail and head amortised)\n";
  const KvFigures& k = s.kv;
  out += "\nKV cache\n";
  out += "  global main KV      " + fmt(k.global_main_bytes_per_token) + " B/token (" +
         std::to_string(k.main_entry_bytes) + " B/entry)\n";
  out += "  global indexer K    " + fmt(k.global_indexer_bytes_per_token) + " B/token (" +
         std::to_string(k.indexer_entry_bytes) + " B/entry)\n";
  out += "  global total        " + fmt(k.global_kv_bytes_per_token) + " B/token\n";
  out += "  window row          " + std::to_string(k.window_bytes_per_row) + " B; " + std::to_string(k.window_rows) +
         " rows x " + std::to_string(c.n_layers) + " layers = " + with_commas(k.window_bytes_per_sequence) +
         " B/sequence (+ DSpark " + with_commas(k.dspark_window_bytes_per_sequence) + " B)\n";
  out += "  persistent          " + fmt(k.persistent_bytes_per_token) + " B/token (global KV only)\n";
  auto totals = [&](const char* title, const TensorTotals& t) {
    out += std::string("\n") + title + ": " + with_commas(t.num_tensors) + " tensors, " + with_commas(t.num_bytes) +
           " bytes\n";
    for (const auto& d : t.by_dtype) {
      std::snprintf(line, sizeof line, "  %-8s %10s tensors %20s bytes\n", dtype_name(d.dtype),
                    with_commas(d.num_tensors).c_str(), with_commas(d.num_bytes).c_str());
      out += line;
    }
  };
  if (s.has_checkpoint) totals("Checkpoint tensors", s.stored);
  totals("Expected tensors", s.expected);
  if (list_expected) {
    out += "\nExpected tensor list\n";
    for (const ExpectedTensor& t : expected_tensors(c, s.conventions)) {
      out += "  " + t.name + "\t" + dtype_name(t.dtype) + "\t" + shape_to_string(t.shape) + "\n";
    }
  }
  return out;
}

}  // namespace dsflash
