#include "kv/kv_cache.h"

#include <sstream>

namespace dsflash::kv {

int64_t SequencePages::capacity_entries(int source) const {
  return num_blocks() * layout_->sources[static_cast<size_t>(source)].entries_per_block;
}

uint8_t* SequencePages::address(int source, int64_t entry, bool index_key) {
  const GlobalSource& s = layout_->sources[static_cast<size_t>(source)];
  const int64_t block = entry / s.entries_per_block;
  const int64_t within = entry % s.entries_per_block;
  uint8_t* base = block_data_[static_cast<size_t>(block)];
  return index_key ? base + s.index_offset + within * s.index_key_bytes
                   : base + s.main_offset + within * s.main_entry_bytes;
}

Status SequencePages::reserve_positions(int64_t num_positions) { return owner_->reserve(*this, num_positions); }

std::string KvStats::describe() const {
  std::ostringstream out;
  out << "KV cache: " << num_sequences << " sequences, " << used_bytes << " of " << budget_bytes
      << " B used (global " << global_bytes << " B in " << used_blocks << " blocks for " << reserved_positions
      << " positions; fixed " << fixed_bytes << " B, of which window rings " << window_bytes
      << " B); formula global " << formula_global_bytes_per_token << " B/token";
  return out.str();
}

KvCacheManager::KvCacheManager(const KvLayout& layout, int64_t budget_bytes)
    : layout_(layout),
      budget_bytes_(budget_bytes),
      pool_(layout.block_bytes, layout.block_bytes > 0 ? budget_bytes / layout.block_bytes : 0) {}

Result<std::unique_ptr<KvCacheManager>> KvCacheManager::create(const KvLayout& layout, int64_t budget_bytes) {
  if (budget_bytes <= 0) {
    return Status::Error("KV cache: budget " + std::to_string(budget_bytes) + " B must be > 0");
  }
  if (layout.block_tokens <= 0) return Status::Error("KV cache: layout has no block size (KvLayout::from_config)");
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(layout, budget_bytes));
}

int64_t KvCacheManager::used_bytes() const {
  return pool_.used_blocks() * layout_.block_bytes +
         static_cast<int64_t>(sequences_.size()) * layout_.fixed_bytes_per_sequence();
}

int64_t KvCacheManager::bytes_for_sequence(int64_t num_positions) const {
  return layout_.fixed_bytes_per_sequence() + layout_.global_bytes_for_positions(num_positions);
}

Result<SequencePages*> KvCacheManager::open(int64_t num_positions) {
  if (num_positions < 0) return Status::Error("KV cache: cannot reserve " + std::to_string(num_positions) + " positions");
  const int64_t need = bytes_for_sequence(num_positions);
  if (need > free_bytes()) {
    return Status::Error("KV cache full: a sequence of " + std::to_string(num_positions) + " positions needs " +
                         std::to_string(need) + " B (" + std::to_string(layout_.fixed_bytes_per_sequence()) +
                         " B window rings/tails/history + " +
                         std::to_string(layout_.blocks_for_positions(num_positions)) + " global blocks of " +
                         std::to_string(layout_.block_bytes) + " B), " + std::to_string(free_bytes()) + " of " +
                         std::to_string(budget_bytes_) + " B free");
  }
  const int64_t id = next_id_++;
  std::unique_ptr<SequencePages> seq(new SequencePages(this, &layout_, id));
  SequencePages* raw = seq.get();
  sequences_.emplace(id, std::move(seq));
  Status s = reserve(*raw, num_positions);
  if (!s.ok()) {  // unreachable given the check above; kept so that a failure never leaks the fixed charge
    sequences_.erase(id);
    return s;
  }
  return raw;
}

Status KvCacheManager::reserve(SequencePages& seq, int64_t num_positions) {
  if (seq.owner_ != this || sequences_.count(seq.id_) == 0) {
    return Status::Error("KV cache: sequence " + std::to_string(seq.id_) + " does not belong to this manager");
  }
  const int64_t want = layout_.blocks_for_positions(num_positions);
  const int64_t extra = want - seq.num_blocks();
  if (extra <= 0) return Status::Ok();
  const int64_t need = extra * layout_.block_bytes;
  if (need > free_bytes()) {
    return Status::Error("KV cache full: sequence " + std::to_string(seq.id_) + " growing from " +
                         std::to_string(seq.capacity_positions()) + " to " + std::to_string(num_positions) +
                         " positions needs " + std::to_string(extra) + " more global blocks (" + std::to_string(need) +
                         " B), " + std::to_string(free_bytes()) + " of " + std::to_string(budget_bytes_) + " B free");
  }
  auto ids = pool_.allocate(extra);
  if (!ids.ok()) return ids.status().with_context("KV cache: sequence " + std::to_string(seq.id_));
  for (int32_t id : *ids) {
    seq.block_ids_.push_back(id);
    seq.block_data_.push_back(pool_.data(id));
  }
  return Status::Ok();
}

Status KvCacheManager::release(SequencePages* seq) {
  if (seq == nullptr) return Status::Error("KV cache: release of a null sequence");
  auto it = sequences_.find(seq->id_);
  if (it == sequences_.end() || it->second.get() != seq) {
    return Status::Error("KV cache: release of sequence " + std::to_string(seq->id_) +
                         " that is not live in this manager");
  }
  Status s = pool_.release(seq->block_ids_);
  if (!s.ok()) return s.with_context("KV cache: releasing sequence " + std::to_string(seq->id_));
  sequences_.erase(it);
  return Status::Ok();
}

KvStats KvCacheManager::stats() const {
  KvStats st;
  st.budget_bytes = budget_bytes_;
  st.used_blocks = pool_.used_blocks();
  st.global_bytes = pool_.used_blocks() * layout_.block_bytes;
  st.num_sequences = static_cast<int64_t>(sequences_.size());
  st.fixed_bytes = st.num_sequences * layout_.fixed_bytes_per_sequence();
  st.window_bytes = st.num_sequences * layout_.window_bytes_per_sequence();
  st.used_bytes = st.global_bytes + st.fixed_bytes;
  st.free_bytes = budget_bytes_ - st.used_bytes;
  for (const auto& [id, seq] : sequences_) st.reserved_positions += seq->capacity_positions();
  st.formula_global_bytes_per_token = layout_.global_bytes_per_token();
  return st;
}

}  // namespace dsflash::kv
