// Each layer's role in CSA2 / CED (spec/MODEL.md §4.5 table, §5). Mirrors how model.py hands state down
// the stack: a compressed layer reads the compressed KV and index keys published by the most recent KV
// source, and the top-k published by the most recent index source (SharedAttentionRuntime).
#include <algorithm>

#include "io/model_config.h"

namespace dsflash {

const char* attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kWindowOnly:
      return "window";
    case AttentionKind::kFull:
      return "full";
    case AttentionKind::kReindex:
      return "reindex";
    case AttentionKind::kReuse:
      return "reuse";
  }
  return "?";
}

void ModelConfig::derive_roles() {
  roles.clear();
  const int decoder_start = ced_decoder_start();
  int latest_kv = -1, latest_index = -1;
  for (int l = 0; l < total_layers(); ++l) {
    LayerRole role;
    role.layer = l;
    role.compress_ratio = compress_ratio(l);
    role.dspark = l >= n_layers;
    role.engram = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), l) != engram_layer_ids.end();
    // model.py: only backbone layers (is_backbone) own a compressor or an indexer.
    role.kv_source = !role.dspark &&
                     std::find(kv_source_layers.begin(), kv_source_layers.end(), l) != kv_source_layers.end();
    role.index_source = !role.dspark && std::find(index_source_layers.begin(), index_source_layers.end(), l) !=
                                            index_source_layers.end();
    if (role.kv_source) latest_kv = l;
    if (role.index_source) latest_index = l;
    role.candidate_source = !role.dspark && l == candidate_source_layer;
    // Indexer.uses_candidates: 0 <= candidate_source_layer < layer_id.
    role.candidate_restricted = role.index_source && candidate_source_layer >= 0 && candidate_source_layer < l;
    role.decoder = !role.dspark && l >= decoder_start;
    if (role.compress_ratio > 0 && !role.dspark) {
      role.kv_source_layer = latest_kv;
      role.index_source_layer = latest_index;
      if (role.kv_source) {
        role.attention = AttentionKind::kFull;
      } else if (role.index_source) {
        role.attention = AttentionKind::kReindex;
      } else {
        role.attention = AttentionKind::kReuse;
      }
    } else {
      role.attention = AttentionKind::kWindowOnly;
    }
    roles.push_back(role);
  }
}

}  // namespace dsflash
