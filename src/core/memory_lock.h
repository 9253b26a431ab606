// Locking a range of this process's memory in RAM, shared by the mapped checkpoint shards (MappedFile) and the
// load-time weight copies (HugePageBuffer).
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace dsflash {

// mlock of [p, p + n), or mlock2 MLOCK_ONFAULT when on_fault (each page locked when first touched). The error
// names `what`, the size and why; for the locked-memory limit it says to raise `ulimit -l`.
Status lock_memory(const void* p, size_t n, bool on_fault, const std::string& what);

}  // namespace dsflash
