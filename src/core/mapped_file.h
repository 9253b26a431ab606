// Read-only memory map of a whole file (checkpoint shards are mapped, never copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace dsflash {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  static Result<MappedFile> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Keeps the mapped pages in RAM (mlock: read in now if they are not, never paged out or reclaimed while the
  // mapping lives). The error names the file and says why (e.g. RLIMIT_MEMLOCK: `ulimit -l`).
  Status lock_in_memory() const;
  // The bytes [p, p + n) of this mapping made writable, for rewriting weights in place at load. The mapping is
  // private: a written page becomes this process's own copy (the file and other processes never see it), and
  // the file's page in the page cache is left clean and reclaimable, so memory does not double. The first call
  // makes the whole mapping writable (one mprotect: per-range calls would split it into thousands of VMAs on a
  // real checkpoint). Error when the range is not inside the mapping or mprotect refuses.
  Result<uint8_t*> writable(const uint8_t* p, size_t n);
  bool contains(const uint8_t* p, size_t n) const { return p >= data_ && n <= size_ && p - data_ <= static_cast<std::ptrdiff_t>(size_ - n); }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  bool writable_ = false;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace dsflash
