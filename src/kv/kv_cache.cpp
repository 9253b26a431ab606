#include "kv/kv_cache.h"

#include <cstring>

#include <algorithm>
#include <sstream>

namespace dsflash::kv {

std::string KvStats::describe() const {
  std::ostringstream out;
  out << "KV cache: " << num_sequences << " sequences, " << used_bytes << " of " << budget_bytes
      << " B used (global " << global_bytes << " B in " << used_blocks << " blocks, " << shared_blocks
      << " shared, for " << reserved_positions << " positions; fixed " << fixed_bytes
      << " B, of which window rows " << window_bytes << " B); cached " << cached_blocks << " blocks ("
      << cached_bytes << " B, reclaimable), " << committed_blocks << " committed; formula global "
      << formula_global_bytes_per_token << " B/token";
  return out.str();
}

KvCacheManager::KvCacheManager(const KvLayout& layout, int64_t budget_bytes)
    : layout_(layout), budget_bytes_(budget_bytes), pool_(layout.block_bytes, max_blocks_for(0)) {}

int64_t KvCacheManager::max_blocks_for(int64_t fixed_total) const {
  if (layout_.block_bytes <= 0) return 0;
  return std::max<int64_t>(budget_bytes_ - fixed_total, 0) / layout_.block_bytes;
}

Result<std::unique_ptr<KvCacheManager>> KvCacheManager::create(const KvLayout& layout, int64_t budget_bytes) {
  if (budget_bytes <= 0) {
    return Status::Error("KV cache: budget " + std::to_string(budget_bytes) + " B must be > 0");
  }
  if (layout.block_tokens <= 0) return Status::Error("KV cache: layout has no block size (KvLayout::from_config)");
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(layout, budget_bytes));
}

int64_t KvCacheManager::bytes_for_sequence(int64_t num_positions) const {
  return layout_.fixed_bytes_per_sequence() + layout_.global_bytes_for_positions(num_positions);
}

Status KvCacheManager::check_owned(const SequencePages& seq) const {
  auto it = sequences_.find(seq.id_);
  if (seq.owner_ != this || it == sequences_.end() || &it->second->pages() != &seq) {
    return Status::Error("KV cache: sequence " + std::to_string(seq.id_) + " is not live in this manager");
  }
  return Status::Ok();
}

Result<SequenceKv*> KvCacheManager::open_sequence() {
  const int64_t fixed = layout_.fixed_bytes_per_sequence();
  if (fixed > free_bytes()) {
    return Status::Error("KV cache full: a new sequence needs " + std::to_string(fixed) +
                         " B of fixed state (window rings, tails, Engram history), " + std::to_string(free_bytes()) +
                         " of " + std::to_string(budget_bytes_) + " B free");
  }
  // Lowering the pool's limit evicts cached blocks that no longer fit beside the new fixed state; it cannot fail
  // (blocks in use fit, checked above).
  Status s = pool_.set_max_blocks(max_blocks_for(fixed_total_ + fixed));
  if (!s.ok()) return s.with_context("KV cache: opening a sequence");
  fixed_total_ += fixed;
  const int64_t id = next_id_++;
  std::unique_ptr<SequenceKv> seq(new SequenceKv(this, &layout_, id));
  SequenceKv* raw = seq.get();
  sequences_.emplace(id, std::move(seq));
  return raw;
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
  auto seq = open_sequence();
  if (!seq.ok()) return seq.status();
  Status s = reserve((*seq)->pages(), num_positions);
  if (!s.ok()) {  // unreachable given the check above; kept so that a failure never leaks the fixed charge
    (void)release(**seq);
    return s;
  }
  return &(*seq)->pages();
}

int64_t KvCacheManager::bytes_to_reserve(const SequencePages& seq, int64_t num_positions) const {
  return std::max<int64_t>(layout_.blocks_for_positions(num_positions) - seq.num_blocks(), 0) * layout_.block_bytes;
}

Status KvCacheManager::reserve(SequencePages& seq, int64_t num_positions) {
  Status owned = check_owned(seq);
  if (!owned.ok()) return owned;
  const int64_t extra = layout_.blocks_for_positions(num_positions) - seq.num_blocks();
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

int64_t KvCacheManager::cached_prefix_blocks(std::span<const BlockHash> hashes) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(hashes.size()) && pool_.find_cached(hashes[static_cast<size_t>(n)])) ++n;
  return n;
}

Result<int64_t> KvCacheManager::attach_cached_prefix(SequencePages& seq, std::span<const BlockHash> hashes,
                                                     uint64_t seed) {
  Status owned = check_owned(seq);
  if (!owned.ok()) return owned;
  if (seq.num_blocks() != 0) {
    return Status::Error("KV cache: attach_cached_prefix on sequence " + std::to_string(seq.id_) + " that holds " +
                         std::to_string(seq.num_blocks()) + " blocks (only a new sequence can take a cached prefix)");
  }
  const int64_t n = cached_prefix_blocks(hashes);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = *pool_.find_cached(hashes[static_cast<size_t>(i)]);
    (void)pool_.retain(id);  // cannot fail: the block is in use or cached; the held bytes do not change
    seq.block_ids_.push_back(id);
    seq.block_data_.push_back(pool_.data(id));
    seq.block_hashes_.push_back(hashes[static_cast<size_t>(i)]);
  }
  if (n > 0) seq.hash_seed_ = seed;
  return n;
}

Result<int64_t> KvCacheManager::attach_cached_prefix(SequenceKv& seq, std::span<const BlockHash> hashes,
                                                     uint64_t seed) {
  auto n = attach_cached_prefix(seq.pages(), hashes, seed);
  if (n.ok()) seq.adopt_frozen_prefix();
  return n;
}

Result<int64_t> KvCacheManager::commit_full_blocks(SequencePages& seq, std::span<const int32_t> tokens,
                                                   uint64_t seed) {
  Status owned = check_owned(seq);
  if (!owned.ok()) return owned;
  if (seq.num_frozen_blocks() > 0 && seed != seq.hash_seed_) {
    return Status::Error("KV cache: sequence " + std::to_string(seq.id_) + " commits with hash seed " +
                         std::to_string(seed) + ", its frozen blocks were hashed with " +
                         std::to_string(seq.hash_seed_));
  }
  const int64_t bt = layout_.block_tokens;
  const int64_t full = std::min<int64_t>(static_cast<int64_t>(tokens.size()) / bt, seq.num_blocks());
  const int64_t first = seq.num_frozen_blocks();
  for (int64_t i = first; i < full; ++i) {
    const BlockHash parent = i == 0 ? kRootBlockHash : seq.block_hashes_.back();
    const BlockHash h = compute_block_hash(parent, tokens.subspan(static_cast<size_t>(i * bt), static_cast<size_t>(bt)), seed);
    // Cannot fail: the block is in use by seq and not hashed (it is past the frozen ones).
    (void)pool_.commit_block(seq.block_ids_[static_cast<size_t>(i)], h);
    seq.block_hashes_.push_back(h);
  }
  if (full > first) seq.hash_seed_ = seed;
  return std::max<int64_t>(full - first, 0);
}

Status KvCacheManager::release(SequencePages* seq) {
  if (seq == nullptr) return Status::Error("KV cache: release of a null sequence");
  Status owned = check_owned(*seq);
  if (!owned.ok()) return owned.with_context("KV cache: release");
  std::vector<int32_t> reversed(seq->block_ids_.rbegin(), seq->block_ids_.rend());
  Status s = pool_.release(reversed);
  if (!s.ok()) return s.with_context("KV cache: releasing sequence " + std::to_string(seq->id_));
  fixed_total_ -= layout_.fixed_bytes_per_sequence();
  (void)pool_.set_max_blocks(max_blocks_for(fixed_total_));  // raising the limit cannot fail
  const int64_t id = seq->id_;
  sequences_.erase(id);
  return Status::Ok();
}

SequenceKv* KvCacheManager::sequence(const SequencePages* pages) {
  if (pages == nullptr || !check_owned(*pages).ok()) return nullptr;
  return sequences_.at(pages->id_).get();
}

KvStats KvCacheManager::stats() const {
  KvStats st;
  st.budget_bytes = budget_bytes_;
  st.used_blocks = pool_.used_blocks();
  st.shared_blocks = pool_.shared_blocks();
  st.cached_blocks = pool_.cached_blocks();
  st.committed_blocks = pool_.hashed_blocks();
  st.global_bytes = pool_.used_blocks() * layout_.block_bytes;
  st.cached_bytes = pool_.cached_blocks() * layout_.block_bytes;
  st.backing_bytes = pool_.backing_bytes();
  st.num_sequences = static_cast<int64_t>(sequences_.size());
  st.fixed_bytes = fixed_total_;
  st.window_bytes = st.num_sequences * layout_.window_bytes_per_sequence();
  st.used_bytes = st.global_bytes + st.fixed_bytes;
  st.free_bytes = budget_bytes_ - st.used_bytes;
  for (const auto& [id, seq] : sequences_) st.reserved_positions += seq->pages().capacity_positions();
  st.formula_global_bytes_per_token = layout_.global_bytes_per_token();
  return st;
}

Status KvCacheManager::import_cached_block(const BlockHash& hash, std::span<const uint8_t> bytes) {
  if (static_cast<int64_t>(bytes.size()) != layout_.block_bytes) {
    return Status::Error("KV cache: an imported block has " + std::to_string(bytes.size()) + " bytes, blocks hold " +
                         std::to_string(layout_.block_bytes));
  }
  if (pool_.find_cached(hash).has_value()) return Status::Ok();
  auto ids = pool_.allocate(1);
  if (!ids.ok()) return ids.status().with_context("KV cache: importing a cached block");
  const int32_t id = (*ids)[0];
  std::memcpy(pool_.data(id), bytes.data(), bytes.size());
  Status s = pool_.commit_block(id, hash);
  Status released = pool_.release(id);  // refcount 0: cached, findable, evictable
  if (!s.ok()) return s;
  return released;
}

Result<SequenceKv*> KvCacheManager::fork(const SequenceKv& source) {
  Status owned = check_owned(source.pages());
  if (!owned.ok()) return owned;
  auto made = open_sequence();
  if (!made.ok()) return made.status().with_context("KV cache: forking sequence " + std::to_string(source.id()));
  SequenceKv& copy = **made;
  const SequencePages& from = source.pages();
  SequencePages& to = copy.pages();
  // Frozen blocks are read-only: share them (refcount + 1) instead of copying.
  for (int64_t b = 0; b < from.num_frozen_blocks(); ++b) {
    const int32_t id = from.block_ids_[static_cast<size_t>(b)];
    Status s = pool_.retain(id);
    if (!s.ok()) {
      (void)release(copy);
      return s.with_context("KV cache: forking sequence " + std::to_string(source.id()));
    }
    to.block_ids_.push_back(id);
    to.block_data_.push_back(pool_.data(id));
  }
  to.block_hashes_ = from.block_hashes_;
  to.hash_seed_ = from.hash_seed_;
  Status s = reserve(to, from.capacity_positions());
  if (!s.ok()) {
    (void)release(copy);
    return s.with_context("KV cache: forking sequence " + std::to_string(source.id()));
  }
  for (int64_t b = from.num_frozen_blocks(); b < from.num_blocks(); ++b) {
    std::memcpy(to.block_data_[static_cast<size_t>(b)], from.block_data_[static_cast<size_t>(b)],
                static_cast<size_t>(layout_.block_bytes));
  }
  std::memcpy(copy.arena_.get(), source.arena_.get(), static_cast<size_t>(source.fixed_bytes_));
  for (size_t i = 0; i < copy.compressed_.size(); ++i) {
    s = copy.compressed_[i].set_num_entries(source.compressed_[i].num_entries());
    if (!s.ok()) {
      (void)release(copy);
      return s;
    }
  }
  copy.num_positions_ = source.num_positions_;
  return &copy;
}

}  // namespace dsflash::kv
