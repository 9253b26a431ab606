#include "core/workspace.h"

#include <algorithm>

namespace dsflash {

namespace {
constexpr size_t kMinBlockBytes = size_t{64} << 10;

size_t round_up(size_t bytes) { return (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment; }
}  // namespace

void Arena::add_block(size_t size) {
  Block block;
  block.data.reset(static_cast<std::byte*>(::operator new[](size, std::align_val_t(kAlignment))));
  block.size = size;
  blocks_.push_back(std::move(block));
  ++growths_;
}

void* Arena::take_bytes(size_t bytes) {
  bytes = round_up(bytes);
  // The current block, then the blocks after it (left by a rewind), then a new one.
  for (; block_ < blocks_.size(); ++block_, offset_ = 0) {
    if (blocks_[block_].size - offset_ >= bytes) {
      void* p = blocks_[block_].data.get() + offset_;
      offset_ += bytes;
      return p;
    }
  }
  add_block(std::max({bytes, 2 * capacity_bytes(), kMinBlockBytes}));
  block_ = blocks_.size() - 1;
  offset_ = bytes;
  return blocks_[block_].data.get();
}

void Arena::reserve(size_t bytes) {
  reset();
  if (capacity_bytes() >= bytes) return;
  blocks_.clear();
  add_block(round_up(bytes));
}

size_t Arena::capacity_bytes() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.size;
  return total;
}

}  // namespace dsflash
