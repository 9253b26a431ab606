#include "kv/sequence_pages.h"

#include <algorithm>

#include "kv/kv_cache.h"

namespace dsflash::kv {

int64_t SequencePages::capacity_entries(int source) const {
  return num_blocks() * layout_->sources[static_cast<size_t>(source)].entries_per_block;
}

bool SequencePages::entry_frozen(int source, int64_t entry) const {
  return entry / layout_->sources[static_cast<size_t>(source)].entries_per_block < num_frozen_blocks();
}

uint8_t* SequencePages::address(int source, int64_t entry, bool index_key) {
  const GlobalSource& s = layout_->sources[static_cast<size_t>(source)];
  const int64_t block = entry / s.entries_per_block;
  const int64_t within = entry % s.entries_per_block;
  uint8_t* base = block_data_[static_cast<size_t>(block)];
  return index_key ? base + s.index_offset + within * s.index_key_bytes
                   : base + s.main_offset + within * s.main_entry_bytes;
}

void SequencePages::index_keys(int source, int64_t first, int64_t count, const uint8_t** rows) const {
  const GlobalSource& s = layout_->sources[static_cast<size_t>(source)];
  for (int64_t i = 0; i < count;) {  // one run per block: its first key's address, then a stride
    const uint8_t* key = index_key(source, first + i);
    const int64_t run = std::min(count - i, s.entries_per_block - (first + i) % s.entries_per_block);
    for (int64_t j = 0; j < run; ++j, ++i, key += s.index_key_bytes) rows[i] = key;
  }
}

Status SequencePages::reserve_positions(int64_t num_positions) { return owner_->reserve(*this, num_positions); }

}  // namespace dsflash::kv
