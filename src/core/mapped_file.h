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
  // on_fault: lock each page only when it is first touched (mlock2 MLOCK_ONFAULT), for a mapping part of which
  // was given back (release) and must not be read in again.
  Status lock_in_memory(bool on_fault = false) const;
  bool contains(const uint8_t* p, size_t n) const {
    return p >= data_ && n <= size_ && p - data_ <= static_cast<std::ptrdiff_t>(size_ - n);
  }
  // Gives the whole pages inside [p, p + n) back (unmapped from this view, dropped from the page cache; call it
  // before locking, since locked pages cannot be given back):
  // for bytes that were copied elsewhere at load, so that memory does not hold them twice. Reading them again
  // is still correct (they come back from the file). Advice: a refusal changes nothing but memory use.
  void release(const uint8_t* p, size_t n) const;

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace dsflash
