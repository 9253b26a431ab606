// ModelConfig parsing (root config.json and flat inference/config.json) and validation.
// Roles are derived in model_roles.cpp.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>

#include "io/model_config.h"

namespace dsflash {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using Member = std::variant<int ModelConfig::*, int64_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*,
                            std::string ModelConfig::*, std::vector<int> ModelConfig::*,
                            std::vector<int64_t> ModelConfig::*>;

// One config field: its flat (ModelArgs) key and its path in the root config.json. Paths starting with
// "text_config." are looked up in text_config (or in the root object when it is not nested).
struct Field {
  const char* flat;
  const char* root;
  Member member;
  bool required;
};

using C = ModelConfig;
const Field kFields[] = {
    {"vocab_size", "text_config.vocab_size", &C::vocab_size, true},
    {"dim", "text_config.hidden_size", &C::dim, true},
    {"moe_inter_dim", "text_config.moe_intermediate_size", &C::moe_inter_dim, true},
    {"n_layers", "text_config.num_hidden_layers", &C::n_layers, true},
    {"n_mtp_layers", "text_config.num_nextn_predict_layers", &C::n_mtp_layers, false},
    {"n_heads", "text_config.num_attention_heads", &C::n_heads, true},
    {"n_routed_experts", "text_config.n_routed_experts", &C::n_routed_experts, true},
    {"n_shared_experts", "text_config.n_shared_experts", &C::n_shared_experts, false},
    {"n_activated_experts", "text_config.num_experts_per_tok", &C::n_activated_experts, true},
    {"score_func", "text_config.scoring_func", &C::score_func, false},
    {"gate_temp", "text_config.gate_temp", &C::gate_temp, false},
    {"norm_topk_prob", "text_config.norm_topk_prob", &C::norm_topk_prob, false},
    {"route_scale", "text_config.routed_scaling_factor", &C::route_scale, false},
    {"swiglu_limit", "text_config.swiglu_limit", &C::swiglu_limit, false},
    {"q_lora_rank", "text_config.q_lora_rank", &C::q_lora_rank, true},
    {"head_dim", "text_config.head_dim", &C::head_dim, true},
    {"rope_head_dim", "text_config.qk_rope_head_dim", &C::rope_head_dim, true},
    {"norm_eps", "text_config.rms_norm_eps", &C::norm_eps, false},
    {"o_groups", "text_config.o_groups", &C::o_groups, true},
    {"o_lora_rank", "text_config.o_lora_rank", &C::o_lora_rank, true},
    {"window_size", "text_config.sliding_window", &C::window_size, true},
    {"compress_ratios", "text_config.compress_ratios", &C::compress_ratios, true},
    {"kv_source_layers", "text_config.kv_source_layer_ids", &C::kv_source_layers, false},
    {"index_source_layers", "text_config.index_source_layer_ids", &C::index_source_layers, false},
    {"compress_rope_theta", "text_config.compress_rope_theta", &C::compress_rope_theta, false},
    {"original_seq_len", "text_config.rope_scaling.original_max_position_embeddings", &C::original_seq_len, false},
    {"rope_theta", "text_config.rope_theta", &C::rope_theta, false},
    {"rope_factor", "text_config.rope_scaling.factor", &C::rope_factor, false},
    {"beta_fast", "text_config.rope_scaling.beta_fast", &C::beta_fast, false},
    {"beta_slow", "text_config.rope_scaling.beta_slow", &C::beta_slow, false},
    {"index_n_heads", "text_config.index_n_heads", &C::index_n_heads, false},
    {"index_head_dim", "text_config.index_head_dim", &C::index_head_dim, false},
    {"index_topk", "text_config.index_topk", &C::index_topk, false},
    {"candidate_source_layer", "text_config.candidate_source_layer_id", &C::candidate_source_layer, false},
    {"candidate_topk_blocks", "text_config.candidate_topk_blocks", &C::candidate_topk_blocks, false},
    {"candidate_block_size", "text_config.candidate_block_size", &C::candidate_block_size, false},
    {"hc_mult", "text_config.hc_mult", &C::hc_mult, false},
    {"hc_sinkhorn_iters", "text_config.hc_sinkhorn_iters", &C::hc_sinkhorn_iters, false},
    {"hc_eps", "text_config.hc_eps", &C::hc_eps, false},
    {"engram_layer_ids", "text_config.engram_layer_ids", &C::engram_layer_ids, false},
    {"engram_num_embeddings", "text_config.engram_num_embeddings", &C::engram_num_embeddings, false},
    {"engram_max_ngram_size", "text_config.engram_max_ngram_size", &C::engram_max_ngram_size, false},
    {"engram_vocab_size", "text_config.engram_vocab_size", &C::engram_vocab_size, false},
    {"engram_n_heads", "text_config.engram_n_heads", &C::engram_n_heads, false},
    {"engram_head_dim", "text_config.engram_head_dim", &C::engram_head_dim, false},
    {"engram_pad_id", "text_config.engram_pad_token_id", &C::engram_pad_id, false},
    {"engram_compressed_vocab_size", "text_config.engram_compressed_vocab_size", &C::engram_compressed_vocab_size,
     false},
    {"dspark_block_size", "text_config.dspark_block_size", &C::dspark_block_size, false},
    {"dspark_noise_token_id", "text_config.dspark_noise_token_id", &C::dspark_noise_token_id, false},
    {"dspark_target_layer_ids", "text_config.dspark_target_layer_ids", &C::dspark_target_layer_ids, false},
    {"dspark_markov_rank", "text_config.dspark_markov_rank", &C::dspark_markov_rank, false},
    {"dspark_n_routed_experts", "text_config.dspark_n_routed_experts", &C::dspark_n_routed_experts, false},
    {"dspark_n_activated_experts", "text_config.dspark_num_experts_per_tok", &C::dspark_n_activated_experts, false},
    {"image_token_id", "image_token_id", &C::image_token_id, false},
    {"vision_n_layers", "vision_config.num_hidden_layers", &C::vision_n_layers, false},
    {"vision_dim", "vision_config.hidden_size", &C::vision_dim, false},
    {"vision_n_heads", "vision_config.num_attention_heads", &C::vision_n_heads, false},
    {"vision_inter_dim", "vision_config.intermediate_size", &C::vision_inter_dim, false},
    {"vision_patch_size", "vision_config.patch_size", &C::vision_patch_size, false},
    {"vision_rope_theta", "vision_config.rope_theta", &C::vision_rope_theta, false},
    {"vision_downsample_ratio", "vision_config.downsample_ratio", &C::vision_downsample_ratio, false},
    {"vision_max_n_token", "vision_config.max_image_tokens", &C::vision_max_n_token, false},
    {"vision_min_pixels", "vision_config.min_pixels", &C::vision_min_pixels, false},
    {"bos_token_id", "bos_token_id", &C::bos_token_id, false},
    {"eos_token_id", "eos_token_id", &C::eos_token_id, false},
    {"pad_token_id", "pad_token_id", &C::pad_token_id, false},
    {"max_position_embeddings", "text_config.max_position_embeddings", &C::max_position_embeddings, false},
};

// Walks a dotted path; "text_config." paths start at `text`. nullptr when a component is missing or null.
const json* resolve(const json& root, const json& text, const std::string& path) {
  const json* node = &root;
  std::stringstream ss(path);
  std::string part;
  bool first = true;
  while (std::getline(ss, part, '.')) {
    if (first && part == "text_config") {
      node = &text;
      first = false;
      continue;
    }
    first = false;
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end() || it->is_null()) return nullptr;
    node = &*it;
  }
  return node;
}

std::string describe(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

template <class T>
Status read_integer(const json& v, T* out, const std::string& where) {
  if (!v.is_number_integer()) return Status::Error(where + ": expected an integer, got " + describe(v));
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return Status::Error(where + ": out of range");
    *out = static_cast<T>(u);
    return Status::Ok();
  }
  int64_t s = v.get<int64_t>();
  if (s < std::numeric_limits<T>::min() || s > std::numeric_limits<T>::max()) {
    return Status::Error(where + ": out of range");
  }
  *out = static_cast<T>(s);
  return Status::Ok();
}

template <class T>
Status read_integer_list(const json& v, std::vector<T>* out, const std::string& where) {
  if (!v.is_array()) return Status::Error(where + ": expected a list of integers, got " + describe(v));
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    T x{};
    Status s = read_integer(v[i], &x, where + "[" + std::to_string(i) + "]");
    if (!s.ok()) return s;
    out->push_back(x);
  }
  return Status::Ok();
}

Status read_field(const json& v, const Member& member, ModelConfig* c, const std::string& where) {
  return std::visit(
      [&](auto ptr) -> Status {
        using T = std::remove_reference_t<decltype(c->*ptr)>;
        T& dst = c->*ptr;
        if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) return Status::Error(where + ": expected true/false, got " + describe(v));
          dst = v.get<bool>();
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, double>) {
          if (!v.is_number()) return Status::Error(where + ": expected a number, got " + describe(v));
          dst = v.get<double>();
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) return Status::Error(where + ": expected a string, got " + describe(v));
          dst = v.get<std::string>();
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, std::vector<int64_t>>) {
          return read_integer_list(v, &dst, where);
        } else {
          return read_integer(v, &dst, where);
        }
      },
      member);
}

Status parse_into(const json& j, const std::string& origin, ModelConfig* c) {
  if (!j.is_object()) return Status::Error(origin + ": the config is not a JSON object");
  const bool root_form = j.contains("text_config") || j.contains("hidden_size");
  const bool flat_form = j.contains("dim");
  if (!root_form && !flat_form) {
    return Status::Error(origin + ": neither a root config.json (text_config / hidden_size) nor a flat "
                                  "inference/config.json (dim)");
  }
  const json empty = json::object();
  const json* text = &j;
  if (root_form && j.contains("text_config")) {
    text = &j["text_config"];
    if (!text->is_object()) return Status::Error(origin + ": field text_config is not an object");
  }
  c->n_shared_experts = 1;  // model.py's ModelArgs default (it asserts exactly one shared expert)

  for (const Field& f : kFields) {
    const std::string key = root_form ? f.root : f.flat;
    const json* v = root_form ? resolve(j, *text, key) : resolve(j, empty, key);
    if (v == nullptr) {
      if (f.required) return Status::Error(origin + ": field " + key + " is missing");
      continue;
    }
    Status s = read_field(*v, f.member, c, origin + ": field " + key);
    if (!s.ok()) return s;
  }

  if (root_form) {
    // Token ids live at the root in the released file; accept them inside text_config too.
    const std::pair<const char*, int ModelConfig::*> token_fields[] = {
        {"bos_token_id", &C::bos_token_id}, {"eos_token_id", &C::eos_token_id}, {"pad_token_id", &C::pad_token_id}};
    for (const auto& [key, member] : token_fields) {
      if (resolve(j, empty, key) != nullptr || text == &j) continue;
      if (const json* v = resolve(*text, empty, key)) {
        Status s = read_integer(*v, &(c->*member), origin + ": field text_config." + key);
        if (!s.ok()) return s;
      }
    }
    if (const json* kvh = resolve(j, *text, "text_config.num_key_value_heads")) {
      int heads = 0;
      Status s = read_integer(*kvh, &heads, origin + ": field text_config.num_key_value_heads");
      if (!s.ok()) return s;
      if (heads != 1) {
        return Status::Error(origin + ": field text_config.num_key_value_heads = " + std::to_string(heads) +
                             ": V4.1 attention has one shared K=V latent (must be 1)");
      }
    }
    if (const json* rs = resolve(j, *text, "text_config.rope_scaling")) {
      const json* type = resolve(*rs, empty, "rope_type");
      if (type != nullptr && (!type->is_string() || type->get<std::string>() != "yarn")) {
        return Status::Error(origin + ": field text_config.rope_scaling.rope_type = " + describe(*type) +
                             ": only \"yarn\" is supported");
      }
    }
    // Quantisation: quant_method fp8 means FP8 linears; no quantization_config means bf16 linears.
    const json* q = resolve(j, *text, "quantization_config");
    if (q == nullptr) {
      c->dtype = "bf16";
      c->expert_dtype = "";
    } else {
      const json* method = resolve(*q, empty, "quant_method");
      if (method == nullptr || !method->is_string()) {
        return Status::Error(origin + ": field quantization_config.quant_method missing or not a string");
      }
      c->dtype = method->get<std::string>();
      const json* ed = resolve(*q, empty, "expert_dtype");
      if (ed == nullptr) {
        c->expert_dtype = "";
      } else if (!ed->is_string()) {
        return Status::Error(origin + ": field quantization_config.expert_dtype: expected a string, got " +
                             describe(*ed));
      } else {
        c->expert_dtype = ed->get<std::string>();
      }
      if (const json* wbs = resolve(*q, empty, "weight_block_size")) {
        std::vector<int> blocks;
        Status s = read_integer_list(*wbs, &blocks, origin + ": field quantization_config.weight_block_size");
        if (!s.ok()) return s;
        if (blocks.size() != 2 || blocks[0] != blocks[1]) {
          return Status::Error(origin + ": field quantization_config.weight_block_size = " + describe(*wbs) +
                               ": expected a square block [b, b]");
        }
        c->weight_block_size = blocks[0];
      }
      if (const json* sf = resolve(*q, empty, "scale_fmt")) {
        if (!sf->is_string() || sf->get<std::string>() != "ue8m0") {
          return Status::Error(origin + ": field quantization_config.scale_fmt = " + describe(*sf) +
                               ": only \"ue8m0\" is supported");
        }
      }
    }
  } else {
    const json* dt = resolve(j, empty, "dtype");
    if (dt != nullptr) {
      if (!dt->is_string()) return Status::Error(origin + ": field dtype: expected a string, got " + describe(*dt));
      c->dtype = dt->get<std::string>();
    }
    if (j.contains("expert_dtype")) {
      const json& ed = j["expert_dtype"];
      if (ed.is_null()) {
        c->expert_dtype = "";
      } else if (!ed.is_string()) {
        return Status::Error(origin + ": field expert_dtype: expected a string or null, got " + describe(ed));
      } else {
        c->expert_dtype = ed.get<std::string>();
      }
    }
    // The flat ModelArgs has no max_position_embeddings: YaRN extends original_seq_len by rope_factor.
    if (!j.contains("max_position_embeddings") && c->original_seq_len > 0 && c->rope_factor >= 1) {
      c->max_position_embeddings = static_cast<int64_t>(static_cast<double>(c->original_seq_len) * c->rope_factor);
    }
  }
  return Status::Ok();
}

Status field_error(const std::string& field, const std::string& what) {
  return Status::Error("config field " + field + ": " + what);
}

std::string list_string(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// A layer-id list: every id in [0, limit), strictly increasing.
Status check_layer_list(const std::string& field, const std::vector<int>& ids, int limit) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limit) {
      return field_error(field, list_string(ids) + ": id " + std::to_string(ids[i]) + " is outside [0, " +
                                    std::to_string(limit) + ")");
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      return field_error(field, list_string(ids) + ": ids must be strictly increasing");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ModelConfig::from_json_text(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return Status::Error(origin + ": malformed JSON: " + e.what());
  }
  ModelConfig c;
  Status s = parse_into(j, origin, &c);
  if (!s.ok()) return s;
  s = c.validate();
  if (!s.ok()) {
    // validate() names fields by their flat (ModelArgs) names; say where the root form keeps them.
    std::string msg = s.message();
    const std::string prefix = "config field ";
    if (!j.contains("dim") && msg.rfind(prefix, 0) == 0) {
      const std::string name = msg.substr(prefix.size(), msg.find_first_of(":[ ", prefix.size()) - prefix.size());
      for (const Field& f : kFields) {
        if (name == f.flat) msg += " (" + std::string(f.root) + " in this file)";
      }
    }
    return Status::Error(origin + ": " + msg);
  }
  c.derive_roles();
  return c;
}

Result<ModelConfig> ModelConfig::load(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "config.json", ec)) {
      file = (dir / "config.json").string();
    } else if (fs::exists(dir / "inference" / "config.json", ec)) {
      file = (dir / "inference" / "config.json").string();
    } else {
      return Status::Error(path + ": no config.json (nor inference/config.json) in this directory");
    }
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::Error(file + ": cannot open the config");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::Error(file + ": read failed");
  return from_json_text(ss.str(), file);
}

int ModelConfig::compress_ratio(int layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= compress_ratios.size()) return 0;
  return compress_ratios[static_cast<size_t>(layer)];
}

int ModelConfig::routed_experts(int layer) const {
  if (layer < n_layers) return n_routed_experts;
  return dspark_n_routed_experts > 0 ? dspark_n_routed_experts : n_routed_experts;
}

int ModelConfig::activated_experts(int layer) const {
  if (layer < n_layers) return n_activated_experts;
  return dspark_n_activated_experts > 0 ? dspark_n_activated_experts : n_activated_experts;
}

int ModelConfig::ced_decoder_start() const {
  int last = -1;
  for (int id : kv_source_layers) {
    if (id < n_layers) last = std::max(last, id);
  }
  return last < 0 ? n_layers : last;
}

Status ModelConfig::validate() const {
  auto positive = [](const std::string& f, int64_t v) -> Status {
    if (v <= 0) return field_error(f, std::to_string(v) + " must be > 0");
    return Status::Ok();
  };
  const std::pair<const char*, int64_t> must_be_positive[] = {
      {"vocab_size", vocab_size},   {"dim", dim},
      {"moe_inter_dim", moe_inter_dim}, {"n_layers", n_layers},
      {"n_heads", n_heads},         {"n_routed_experts", n_routed_experts},
      {"n_activated_experts", n_activated_experts}, {"q_lora_rank", q_lora_rank},
      {"head_dim", head_dim},       {"rope_head_dim", rope_head_dim},
      {"o_groups", o_groups},       {"o_lora_rank", o_lora_rank},
      {"window_size", window_size}, {"hc_mult", hc_mult},
      {"hc_sinkhorn_iters", hc_sinkhorn_iters}, {"max_position_embeddings", max_position_embeddings},
      {"weight_block_size", weight_block_size},
  };
  for (const auto& [name, value] : must_be_positive) {
    Status s = positive(name, value);
    if (!s.ok()) return s;
  }
  if (n_mtp_layers < 0) return field_error("n_mtp_layers", std::to_string(n_mtp_layers) + " must be >= 0");
  if (n_shared_experts != 1) {
    return field_error("n_shared_experts", std::to_string(n_shared_experts) + ": model.py supports exactly 1");
  }
  if (n_activated_experts > n_routed_experts) {
    return field_error("n_activated_experts", std::to_string(n_activated_experts) + " exceeds n_routed_experts " +
                                                  std::to_string(n_routed_experts));
  }
  if (score_func != "softmax" && score_func != "sigmoid" && score_func != "sqrtsoftplus") {
    return field_error("score_func", "'" + score_func + "' is not softmax, sigmoid or sqrtsoftplus");
  }
  if (!(norm_eps > 0)) return field_error("norm_eps", "must be > 0");
  if (!(hc_eps > 0)) return field_error("hc_eps", "must be > 0");
  if (dtype != "fp8" && dtype != "bf16") return field_error("dtype", "'" + dtype + "' is not fp8 or bf16");
  if (!expert_dtype.empty() && expert_dtype != "fp4") {
    return field_error("expert_dtype", "'" + expert_dtype + "' is not fp4 (or null)");
  }
  if (weight_block_size != 32) {
    return field_error("weight_block_size", std::to_string(weight_block_size) +
                                                ": the kernels use 32x32 weight blocks and 32-wide activation blocks");
  }
  // Shapes the quantised formats need (spec/MODEL.md §4.9): every FP8/FP4 linear input is quantised in
  // blocks of 32, the window KV row too, the compressed KV in blocks of 16.
  const std::pair<const char*, int64_t> block32[] = {
      {"dim", dim},
      {"q_lora_rank", q_lora_rank},
      {"head_dim", head_dim},
      {"moe_inter_dim", moe_inter_dim},
      {"o_lora_rank * o_groups", o_lora_rank * o_groups},
  };
  for (const auto& [name, value] : block32) {
    if (value % 32 != 0) return field_error(name, std::to_string(value) + " is not a multiple of the quant block 32");
  }
  if (n_heads % o_groups != 0) {
    return field_error("o_groups", std::to_string(o_groups) + " does not divide n_heads " + std::to_string(n_heads));
  }
  if ((n_heads / o_groups) * head_dim % 32 != 0) {
    return field_error("o_groups", "the per-group input n_heads/o_groups*head_dim is not a multiple of 32");
  }
  if (rope_head_dim > head_dim) {
    return field_error("rope_head_dim", std::to_string(rope_head_dim) + " exceeds head_dim " + std::to_string(head_dim));
  }
  if (rope_head_dim % 2 != 0) return field_error("rope_head_dim", "must be even (rotated in pairs)");

  // Per-layer lists.
  const int total = total_layers();
  if (static_cast<int>(compress_ratios.size()) != total) {
    return field_error("compress_ratios", "has " + std::to_string(compress_ratios.size()) +
                                              " entries, expected n_layers + n_mtp_layers = " + std::to_string(total));
  }
  for (int l = 0; l < total; ++l) {
    const int r = compress_ratios[static_cast<size_t>(l)];
    if (r < 0) return field_error("compress_ratios[" + std::to_string(l) + "]", "negative ratio");
    if (l >= n_layers && r != 0) {
      return field_error("compress_ratios[" + std::to_string(l) + "]",
                         "DSpark stage " + std::to_string(l - n_layers) + " must be window-only (ratio 0)");
    }
  }
  Status s = check_layer_list("kv_source_layers", kv_source_layers, n_layers);
  if (!s.ok()) return s;
  s = check_layer_list("index_source_layers", index_source_layers, n_layers);
  if (!s.ok()) return s;
  for (int l : kv_source_layers) {
    if (compress_ratio(l) == 0) {
      return field_error("kv_source_layers", "layer " + std::to_string(l) + " has compress ratio 0 (no compressor)");
    }
    if (std::ranges::find(index_source_layers, l) == index_source_layers.end()) {
      return field_error("kv_source_layers", "layer " + std::to_string(l) +
                                                 " is not an index source (its indexer owns the index keys)");
    }
  }
  for (int l : index_source_layers) {
    if (compress_ratio(l) == 0) {
      return field_error("index_source_layers", "layer " + std::to_string(l) + " has compress ratio 0");
    }
  }
  const bool any_compressed = [&] {
    for (int l = 0; l < n_layers; ++l) {
      if (compress_ratio(l) > 0) return true;
    }
    return false;
  }();
  if (any_compressed) {
    for (const auto& [name, value] : std::initializer_list<std::pair<const char*, int64_t>>{
             {"index_n_heads", index_n_heads}, {"index_head_dim", index_head_dim}, {"index_topk", index_topk}}) {
      s = positive(name, value);
      if (!s.ok()) return s;
    }
    if (index_head_dim % 32 != 0) {
      return field_error("index_head_dim", std::to_string(index_head_dim) + " is not a multiple of the MXFP4 block 32");
    }
    if (rope_head_dim > index_head_dim) {
      return field_error("rope_head_dim", std::to_string(rope_head_dim) + " exceeds index_head_dim " +
                                              std::to_string(index_head_dim) + " (indexer q/k are rotated too)");
    }
  }
  // Every compressed layer reads the latest KV source and the latest index source, which must compress
  // at its own ratio and agree on the KV (model.py's shared_attn slots).
  int latest_kv = -1, latest_index = -1;
  for (int l = 0; l < n_layers; ++l) {
    if (std::ranges::find(kv_source_layers, l) != kv_source_layers.end()) latest_kv = l;
    if (std::ranges::find(index_source_layers, l) != index_source_layers.end()) latest_index = l;
    const int r = compress_ratio(l);
    if (r == 0) continue;
    const std::string layer = "compress_ratios[" + std::to_string(l) + "]";
    if (latest_kv < 0) return field_error(layer, "layer " + std::to_string(l) + " compresses but no KV source precedes it");
    if (compress_ratio(latest_kv) != r) {
      return field_error(layer, "layer " + std::to_string(l) + " has ratio " + std::to_string(r) +
                                    " but its KV source L" + std::to_string(latest_kv) + " has ratio " +
                                    std::to_string(compress_ratio(latest_kv)));
    }
    if (latest_index < latest_kv) {
      return field_error("index_source_layers", "layer " + std::to_string(l) + " reads KV source L" +
                                                    std::to_string(latest_kv) +
                                                    " but the latest index source precedes it");
    }
  }
  if (candidate_source_layer >= 0) {
    if (std::ranges::find(index_source_layers, candidate_source_layer) == index_source_layers.end()) {
      return field_error("candidate_source_layer", std::to_string(candidate_source_layer) + " is not an index source");
    }
    s = positive("candidate_topk_blocks", candidate_topk_blocks);
    if (!s.ok()) return s;
    s = positive("candidate_block_size", candidate_block_size);
    if (!s.ok()) return s;
  } else if (candidate_source_layer != -1) {
    return field_error("candidate_source_layer", std::to_string(candidate_source_layer) + " must be -1 or a layer id");
  }

  // Engram.
  s = check_layer_list("engram_layer_ids", engram_layer_ids, n_layers);
  if (!s.ok()) return s;
  if (!engram_layer_ids.empty()) {
    if (engram_num_embeddings.size() != engram_layer_ids.size()) {
      return field_error("engram_num_embeddings", "has " + std::to_string(engram_num_embeddings.size()) +
                                                      " entries, expected one per engram layer (" +
                                                      std::to_string(engram_layer_ids.size()) + ")");
    }
    for (size_t i = 0; i < engram_num_embeddings.size(); ++i) {
      s = positive("engram_num_embeddings[" + std::to_string(i) + "]", engram_num_embeddings[i]);
      if (!s.ok()) return s;
    }
    if (engram_max_ngram_size < 2) return field_error("engram_max_ngram_size", "must be >= 2 with engram layers");
    s = positive("engram_n_heads", engram_n_heads);
    if (!s.ok()) return s;
    s = positive("engram_head_dim", engram_head_dim);
    if (!s.ok()) return s;
    if (engram_head_dim % 32 != 0) {
      return field_error("engram_head_dim", std::to_string(engram_head_dim) + " is not a multiple of the scale block 32");
    }
    s = positive("engram_compressed_vocab_size", engram_compressed_vocab_size);
    if (!s.ok()) return s;
    if (engram_pad_id < 0 || engram_pad_id >= vocab_size) {
      return field_error("engram_pad_id", std::to_string(engram_pad_id) + " is outside the vocabulary");
    }
  }

  // DSpark.
  if (dspark_block_size < 0) return field_error("dspark_block_size", "must be >= 0");
  if (dspark_block_size > 0) {
    if (n_mtp_layers <= 0) return field_error("n_mtp_layers", "DSpark (dspark_block_size > 0) needs >= 1 stage");
    if (dspark_target_layer_ids.empty()) return field_error("dspark_target_layer_ids", "empty: DSpark needs targets");
    s = check_layer_list("dspark_target_layer_ids", dspark_target_layer_ids, n_layers);
    if (!s.ok()) return s;
    s = positive("dspark_markov_rank", dspark_markov_rank);
    if (!s.ok()) return s;
    if (dspark_noise_token_id < 0 || dspark_noise_token_id >= vocab_size) {
      return field_error("dspark_noise_token_id", std::to_string(dspark_noise_token_id) + " is outside the vocabulary");
    }
    if (dspark_n_routed_experts < 0 || dspark_n_activated_experts < 0) {
      return field_error("dspark_n_routed_experts", "expert counts must be >= 0");
    }
    if (routed_experts(n_layers) < activated_experts(n_layers)) {
      return field_error("dspark_n_activated_experts", "exceeds the DSpark routed experts");
    }
  }

  // Token ids and vision.
  const std::pair<const char*, int64_t> tokens[] = {
      {"bos_token_id", bos_token_id}, {"eos_token_id", eos_token_id}, {"pad_token_id", pad_token_id}};
  for (const auto& [name, id] : tokens) {
    if (id < 0 || id >= vocab_size) {
      return field_error(name, std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
  if (vision_n_layers < 0) return field_error("vision_n_layers", "must be >= 0");
  if (vision_enabled()) {
    if (image_token_id < 0 || image_token_id >= vocab_size) {
      return field_error("image_token_id", std::to_string(image_token_id) + " is outside the vocabulary");
    }
    for (const auto& [name, value] : std::initializer_list<std::pair<const char*, int64_t>>{
             {"vision_dim", vision_dim}, {"vision_n_heads", vision_n_heads}, {"vision_inter_dim", vision_inter_dim},
             {"vision_patch_size", vision_patch_size}, {"vision_downsample_ratio", vision_downsample_ratio}}) {
      s = positive(name, value);
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

}  // namespace dsflash
