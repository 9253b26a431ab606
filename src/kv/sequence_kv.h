// Everything one sequence holds in the KV cache: its global-KV page table (kv::SequencePages, grown by the
// manager as the sequence goes) and its fixed state, carved out of one arena of exactly
// KvLayout::fixed_bytes_per_sequence() bytes that KvCacheManager allocates and charges when the sequence opens:
//   [Engram history int64 [1 + engram_recent]]            (only with Engram layers)
//   [window slot tags int64 [num_window_layers, window]]
//   [compressor tails fp32, per ratio > 1 source in layout order: kv [ratio, head_dim], score [ratio, head_dim]]
//   [window rows per layer: codes [window, head_dim] e4m3, then scales [window, head_dim/32] ue8m0]
// Layers are indexed by layer id as in model::AttentionState (backbone then DSpark stages). Created and owned by
// KvCacheManager (open_sequence); not copyable, addresses stable until release.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "kv/kv_layout.h"
#include "kv/sequence_pages.h"
#include "kv/state_storage.h"

namespace dsflash::kv {

class SequenceKv {
 public:
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  int64_t id() const { return pages_.id(); }
  const KvLayout& layout() const { return pages_.layout(); }
  SequencePages& pages() { return pages_; }
  const SequencePages& pages() const { return pages_; }

  int num_layers() const { return static_cast<int>(windows_.size()); }
  WindowRing& window(int layer) { return windows_.at(static_cast<size_t>(layer)); }
  const WindowRing& window(int layer) const { return windows_.at(static_cast<size_t>(layer)); }
  // nullptr unless `layer` is a KV source.
  CompressedKv* compressed(int layer);
  const CompressedKv* compressed(int layer) const;
  // nullptr unless `layer` is a KV source with ratio > 1.
  CompressorTail* tail(int layer);
  const CompressorTail* tail(int layer) const;
  // nullptr when the model has no Engram layers.
  EngramHistory* engram() { return has_engram_ ? &engram_ : nullptr; }
  const EngramHistory* engram() const { return has_engram_ ? &engram_ : nullptr; }

  // Positions processed so far (the forward's start_pos for this sequence); the model advances it.
  int64_t num_positions() const { return num_positions_; }
  void advance(int64_t num_tokens) { num_positions_ += num_tokens; }

  // Bytes of the global KV entries held (every source's main entries + indexer keys; what a prefix cache keeps).
  int64_t global_kv_bytes() const;
  // Bytes of the fixed-state arena (== layout().fixed_bytes_per_sequence()).
  int64_t fixed_bytes() const { return fixed_bytes_; }
  // Forget the state (windows empty, tails reset, no compressed entries, empty history, 0 positions). The pages
  // keep their blocks; published blocks stay read-only, so a sequence with a cached prefix is released and
  // opened again rather than cleared.
  void clear();
  // After KvCacheManager::attach_cached_prefix: every compressed KV holds the entries of the frozen blocks and
  // num_positions() = pages().frozen_positions(). Window rings, tails and the Engram history are not in the
  // blocks: bounded replay (or EngramHistory::restore) rebuilds them.
  void adopt_frozen_prefix();
  // Encoder SWA Bounded Replay of a cached prefix (spec/MODEL.md §7): the sequence restarts at `position` (<=
  // the positions its compressed entries cover) with empty window rings, reset tails and an empty Engram history
  // (the caller restores it from the token ids); the compressed entries stay, so replaying [position, frozen end)
  // rebuilds the windows without touching the cached global KV.
  Status restart_at(int64_t position);

 private:
  friend class KvCacheManager;
  friend class SequenceSnapshot;  // rolls num_positions back
  struct ArenaDelete {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  SequenceKv(KvCacheManager* owner, const KvLayout* layout, int64_t id);

  SequencePages pages_;
  int64_t fixed_bytes_ = 0;
  std::unique_ptr<uint8_t[], ArenaDelete> arena_;  // [fixed_bytes_], 64-byte aligned
  std::vector<WindowRing> windows_;                // [num_window_layers]
  std::vector<int> source_of_layer_;               // [num_window_layers] index into compressed_, or -1
  std::vector<CompressedKv> compressed_;           // [layout sources]
  std::vector<int> tail_of_source_;                // [layout sources] index into tails_, or -1
  std::vector<CompressorTail> tails_;              // [ratio > 1 sources]
  EngramHistory engram_;
  bool has_engram_ = false;
  int64_t num_positions_ = 0;
};

}  // namespace dsflash::kv
