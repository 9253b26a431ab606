#include "core/huge_page_buffer.h"

#include "core/memory_lock.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace dsflash {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}

HugePageBuffer::~HugePageBuffer() { release(); }

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

void HugePageBuffer::release() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = 0;
}

Result<HugePageBuffer> HugePageBuffer::allocate(size_t bytes) {
  if (bytes == 0) return Status::Error("huge-page buffer: zero bytes asked");
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Map one huge page more and trim both ends to a 2 MB boundary (mmap itself only promises 4 KB alignment).
  void* raw = mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    const int err = errno;
    return Status::Error("cannot map " + std::to_string(bytes) + " bytes of memory: " + std::strerror(err));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + rounded + kHugePage;
  if (end > aligned + rounded) munmap(reinterpret_cast<void*>(aligned + rounded), end - (aligned + rounded));
  // Advice only: without transparent huge pages the buffer is plain memory and everything still works.
  (void)madvise(reinterpret_cast<void*>(aligned), rounded, MADV_HUGEPAGE);
  HugePageBuffer buffer;
  buffer.data_ = reinterpret_cast<uint8_t*>(aligned);
  buffer.size_ = bytes;
  buffer.mapped_ = rounded;
  return buffer;
}

Status HugePageBuffer::lock_in_memory() const {
  return lock_memory(data_, mapped_, false, "the tile-major weight copies");
}

}  // namespace dsflash
