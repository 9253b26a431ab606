// Figures `dsflash inspect` reports for a config (and optionally a loaded checkpoint): parameter counts,
// activated parameters per token, tensor counts/bytes by dtype, KV-cache bytes (spec/MODEL.md §6,
// DESIGN.md "Memory formats").
//
// Parameters are the logical elements of weight tensors (an FP4 [out, in] weight counts out*in);
// the e8m0 block scales of FP8/FP4 linears and Engram tables are storage, not parameters.
//   backbone = embed + head + final norm + layers.* except Engram   (V4.1: 551.6B, the report's "552B")
//   engram   = layers.*.engram.*                                     (V4.1: 196.9B, "+196B Engram")
//   dspark   = mtp.*;  vision = vision.*, aligner.*, image_*
//   total    = all of them                                           (V4.1: 763.2B, HF's "763B stored")
//
// Activated parameters per token count each weight element that takes part in one text token's
// computation: every non-expert tensor of a layer that runs, activated/routed of each routed expert
// tensor (= top-k experts' worth), Engram's looked-up table rows ((max_ngram-1) * n_heads rows of
// head_dim) plus its projections, one embedding row; never gate.bias_vl (image tokens), vision or DSpark.
//   decode:  every backbone layer + the head (logits every step)      (V4.1: 16.1B; report "16B decode")
//   prefill: the per-token cost of CED prefill for a long prompt (spec/MODEL.md §5): the encoder layers
//            (L < ced_decoder_start()) run on every token, plus the decoder start layer's global-KV path
//            (attn_norm, compressor, indexer wk + k_norm; its Engram if any). The rest of the decoder runs
//            on only the last window_size tokens and the head on the last token: both amortise to zero
//            per prompt token as the prompt grows, so they are left out.
//                                                                    (V4.1: 7.9B; report "8B prefill")
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"

namespace dsflash {

struct DTypeTotals {
  DType dtype = DType::kBF16;
  int64_t num_tensors = 0;
  int64_t num_bytes = 0;
};

struct ParameterCounts {
  int64_t total = 0;
  int64_t backbone = 0;
  int64_t engram = 0;
  int64_t dspark = 0;
  int64_t vision = 0;
  int64_t scale_elements = 0;  // block scales (storage, not parameters)
  int64_t activated_prefill = 0;
  int64_t activated_decode = 0;
  // Of which in MXFP4 weights (the routed experts).
  int64_t activated_prefill_fp4 = 0;
  int64_t activated_decode_fp4 = 0;
};

// KV-cache byte figures (spec/MODEL.md §6). Entries per token on a KV source = 1 / its compress ratio.
struct KvFigures {
  int64_t main_entry_bytes = 0;     // head_dim e2m1 + head_dim/16 e4m3 scales (V4.1: 256 + 32 = 288)
  int64_t indexer_entry_bytes = 0;  // index_head_dim e2m1 + index_head_dim/32 ue8m0 (64 + 4 = 68)
  double global_main_bytes_per_token = 0;     // V4.1: 288 + 3 * 288 / 2 = 720
  double global_indexer_bytes_per_token = 0;  // V4.1: 68 + 3 * 68 / 2 = 102 + 68 = 170
  double global_kv_bytes_per_token = 0;       // V4.1: 890
  int64_t window_bytes_per_row = 0;           // head_dim e4m3 + head_dim/32 ue8m0 (V4.1: 528)
  int64_t window_rows = 0;                    // window_size per layer
  int64_t window_bytes_per_sequence = 0;      // backbone layers x window rows x row (V4.1: 2,703,360)
  int64_t dspark_window_bytes_per_sequence = 0;  // DSpark stages' rings, same rows
  // What a persistent prefix cache stores per token: only the global KV (spec/MODEL.md §7).
  double persistent_bytes_per_token = 0;
};

struct TensorTotals {
  int64_t num_tensors = 0;
  int64_t num_bytes = 0;
  std::vector<DTypeTotals> by_dtype;  // dtypes present, in DType order
};

struct ModelStats {
  ParameterCounts params;
  KvFigures kv;
  StorageConventions conventions;  // the checkpoint's (or the defaults with a config alone)
  TensorTotals expected;           // from expected_tensors(config, conventions)
  bool has_checkpoint = false;
  TensorTotals stored;    // the checkpoint's tensors (when one was opened)
};

ParameterCounts count_parameters(const ModelConfig& config);
KvFigures kv_figures(const ModelConfig& config);
TensorTotals expected_tensor_totals(const ModelConfig& config, const StorageConventions& conventions);
TensorTotals stored_tensor_totals(const Checkpoint& checkpoint);

// Config only (no weights): expected tensors with the default conventions.
ModelStats compute_model_stats(const ModelConfig& config);
// A validated checkpoint: expected tensors with its conventions, plus what it stores.
ModelStats compute_model_stats(const Checkpoint& checkpoint);

// The report as one JSON object (keys: global_kv_bytes_per_token, window_bytes_per_row,
// persistent_bytes_per_token, num_tensors_expected, bytes_expected, activated_params_prefill,
// activated_params_decode, ... and the layer roles). `list_expected` adds every expected tensor
// (name, dtype, shape) as "expected_tensors".
std::string model_stats_json(const ModelConfig& config, const ModelStats& stats, bool list_expected, int indent = 2);
// The same as human-readable text (the expected list as one "name dtype shape" line each).
std::string model_stats_text(const ModelConfig& config, const ModelStats& stats, bool list_expected);

}  // namespace dsflash
