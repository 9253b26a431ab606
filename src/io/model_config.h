// One ModelConfig from either the official root config.json (nested text_config, quantization_config;
// spec/config_v41_flash.json) or the flat inference/config.json (ModelArgs names; spec/inference_config_v41_flash.json),
// plus each layer's derived role (spec/MODEL.md §4.5 table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsflash {

enum class AttentionKind {
  kWindowOnly,  // compress ratio 0: sliding window only (L0, L1, DSpark stages)
  kFull,        // KV source: owns compressor + indexer keys + its own indexer queries
  kReindex,     // own indexer queries on the latest KV source's keys (restricted to the candidate pool)
  kReuse,       // takes the latest KV source's KV and the latest index source's top-k
};

struct LayerRole {
  int layer = 0;
  int compress_ratio = 0;
  AttentionKind attention = AttentionKind::kWindowOnly;
  bool kv_source = false;         // owns a compressor and indexer keys (writes global KV)
  bool index_source = false;      // owns indexer queries (Full or Reindex)
  bool candidate_source = false;  // builds the candidate pool (L20)
  bool candidate_restricted = false;  // index source after the candidate source: scores masked to the pool
  bool engram = false;            // Engram applied to the streams before this block
  bool decoder = false;           // CED half: L >= ced_decoder_start() (V4.1: L20..L39 = the second half)
  bool dspark = false;            // DSpark draft stage (index >= n_layers)
  int kv_source_layer = -1;       // the layer whose compressed KV this one reads (-1: none)
  int index_source_layer = -1;    // the layer whose top-k this one uses (-1: none)

  bool operator==(const LayerRole&) const = default;
};

const char* attention_kind_name(AttentionKind kind);  // "window", "full", "reindex", "reuse"

struct ModelConfig {
  // model shape (ModelArgs names)
  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t moe_inter_dim = 0;
  int n_layers = 0;
  int n_mtp_layers = 0;
  int n_heads = 0;
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int n_activated_experts = 0;
  std::string score_func = "sqrtsoftplus";
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double route_scale = 1.0;
  double swiglu_limit = 0.0;
  int64_t q_lora_rank = 0;
  int64_t head_dim = 0;
  int64_t rope_head_dim = 0;
  double norm_eps = 1e-20;
  int o_groups = 0;
  int64_t o_lora_rank = 0;
  int window_size = 0;
  std::vector<int> compress_ratios;  // n_layers + n_mtp_layers entries
  std::vector<int> kv_source_layers;
  std::vector<int> index_source_layers;
  double compress_rope_theta = 0;
  int64_t original_seq_len = 0;
  double rope_theta = 10000;
  double rope_factor = 1;
  int beta_fast = 32;
  int beta_slow = 1;
  int index_n_heads = 0;
  int64_t index_head_dim = 0;
  int index_topk = 0;
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram_size = 1;
  int64_t engram_vocab_size = 0;
  int engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  int engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 0;
  int dspark_block_size = 0;
  int dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 0;
  int dspark_n_routed_experts = 0;
  int dspark_n_activated_experts = 0;
  int64_t image_token_id = -1;  // -1: none configured (root config without image_token_id)
  int vision_n_layers = 0;      // 0: vision disabled (model.py `vision_enabled`)
  int64_t vision_dim = 1024;
  int vision_n_heads = 16;
  int64_t vision_inter_dim = 2816;
  int vision_patch_size = 14;
  double vision_rope_theta = 10000.0;
  int vision_downsample_ratio = 3;
  int vision_max_n_token = 1024;
  int64_t vision_min_pixels = 544 * 544;
  // tokens and limits
  int bos_token_id = 0;
  int eos_token_id = 1;
  int pad_token_id = 2;
  int64_t max_position_embeddings = 1048576;
  // quantisation
  std::string dtype = "fp8";         // linear weights
  std::string expert_dtype = "fp4";  // routed experts ("" = null: experts use `dtype`)
  int weight_block_size = 32;

  std::vector<LayerRole> roles;  // n_layers + n_mtp_layers entries, filled by derive_roles()

  // Parses either form (detected by the presence of "text_config" / "hidden_size" vs "dim"), then
  // validates and derives the roles. The flat form has no max_position_embeddings: it is taken as
  // original_seq_len * rope_factor (the YaRN-extended context; 1,048,576 on V4.1) when YaRN is on.
  static Result<ModelConfig> from_json_text(const std::string& text, const std::string& origin);
  // A checkpoint directory's config.json (or inference/config.json if that is all there is), or a file.
  static Result<ModelConfig> load(const std::string& path);

  // Lengths of per-layer lists, ids in range, dims divisible by the quant blocks, roles consistent.
  Status validate() const;
  void derive_roles();

  int total_layers() const { return n_layers + n_mtp_layers; }
  bool vision_enabled() const { return vision_n_layers > 0; }
  // DSpark stages that exist as modules (model.py builds mtp.* only when dspark_block_size > 0).
  int dspark_stages() const { return dspark_block_size > 0 ? n_mtp_layers : 0; }
  // First CED decoder layer: the last KV source. Every later layer reads only its global KV, so the
  // layers before it (the encoder) plus its global-KV path are all that prefill must run on every
  // token (spec/MODEL.md §5). n_layers when there is no KV source.
  int ced_decoder_start() const;
  // Compress ratio of a layer (0 for an index out of range).
  int compress_ratio(int layer) const;
  // Routed experts / activated experts of a layer (DSpark stages may have their own counts).
  int routed_experts(int layer) const;
  int activated_experts(int layer) const;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace dsflash
