#include "core/memory_lock.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

namespace dsflash {

Status lock_memory(const void* p, size_t n, bool on_fault, const std::string& what) {
  if (p == nullptr || n == 0) return Status::Ok();
  if ((on_fault ? mlock2(p, n, MLOCK_ONFAULT) : mlock(p, n)) != 0) {
    const int err = errno;
    return Status::Error(what + ": cannot lock " + std::to_string(n) + " bytes in memory: " + std::strerror(err) +
                         (err == ENOMEM || err == EPERM ? " (the locked-memory limit, ulimit -l, is too low)" : ""));
  }
  return Status::Ok();
}

}  // namespace dsflash
