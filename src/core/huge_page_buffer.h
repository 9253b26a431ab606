// Anonymous memory for data read by streaming every step (weights rewritten at load): 2 MB-aligned and advised
// MADV_HUGEPAGE, so that transparent huge pages back it where the kernel allows (the setting `madvise` or
// `always`). A decode step streams gigabytes of weights; on 4 KB pages every 4 KB costs a TLB walk, and the fast
// matmuls and the plain read of the same bytes both run ~40% faster on huge pages here (bench_linear).
// Owns the memory (storage only); the bytes start uninitialised.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace dsflash {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  // bytes > 0; the error says why the memory was refused.
  static Result<HugePageBuffer> allocate(size_t bytes);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // mlock: the pages stay in RAM (read in now). The error names the size and the limit to raise.
  Status lock_in_memory() const;

 private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;     // as asked
  size_t mapped_ = 0;   // rounded up to whole 2 MB pages
};

}  // namespace dsflash
