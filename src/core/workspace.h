// Scratch memory without per-step heap traffic (DESIGN.md: "no allocation" in the forward).
//
// Arena: an aligned bump allocator. take<T>(n) hands out n uninitialised T (trivial types only) from the current
// block; when the blocks cannot hold a take, the arena grows by a new block (counted: growths()) of at least twice
// its capacity. mark()/rewind() give stack-ordered scopes (ArenaScope); reset() rewinds to the start and keeps
// every block, so a later step of the same shape replays the same takes into the same, already touched, pages:
// after one step of a given shape, later steps of that shape take no new memory and fault in no page. (Merging the
// blocks into one fresh block at reset, as this once did, made the second step fault in all of it again: ~0.2 s
// per 512-token prefill step on the wide preset.)
//
// Workspace: the per-step arenas of one caller (the Engine's scheduler, a ModelRunner): step() for memory that
// lives through the whole step (published top-k, segment lists), frame() for scoped scratch (a layer's buffers,
// taken inside an ArenaScope and given back at its end). begin_step() resets both. One thread uses a Workspace;
// per-thread scratch of the pool's workers is ThreadScratch (core/thread_pool.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

namespace dsflash {

class Arena {
 public:
  static constexpr size_t kAlignment = 64;  // every take starts on a cache line

  Arena() = default;  // holds no memory until the first take
  Arena(Arena&&) noexcept = default;
  Arena& operator=(Arena&&) noexcept = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // n uninitialised T, kAlignment-aligned; valid until the arena is rewound past this take or reset.
  template <class T>
  std::span<T> take(size_t n) {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                  "arena memory is never constructed or destroyed: the caller writes every element");
    if (n == 0) return {};
    return {static_cast<T*>(take_bytes(n * sizeof(T))), n};
  }
  // n copies of value.
  template <class T>
  std::span<T> take_filled(size_t n, T value) {
    std::span<T> s = take<T>(n);
    for (T& v : s) v = value;
    return s;
  }

  struct Mark {
    size_t block = 0;
    size_t offset = 0;
  };
  Mark mark() const { return Mark{block_, offset_}; }
  // Gives back every take made since `m` (stack order).
  void rewind(Mark m) {
    block_ = m.block;
    offset_ = m.offset;
  }
  // Gives back everything (the blocks stay).
  void reset() {
    block_ = 0;
    offset_ = 0;
  }
  // Gives back everything and makes one block of at least `bytes` (a growth only when it holds less).
  void reserve(size_t bytes);

  int64_t growths() const { return growths_; }  // blocks obtained from the heap so far
  size_t capacity_bytes() const;

 private:
  struct FreeBytes {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(kAlignment)); }
  };
  struct Block {
    std::unique_ptr<std::byte[], FreeBytes> data;
    size_t size = 0;
  };
  void* take_bytes(size_t bytes);
  void add_block(size_t size);

  std::vector<Block> blocks_;
  size_t block_ = 0;   // block of the next take
  size_t offset_ = 0;  // first free byte in it
  int64_t growths_ = 0;
};

// Scoped takes: everything taken from `arena` inside the scope is given back at its end.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& arena) : arena_(arena), mark_(arena.mark()) {}
  ~ArenaScope() { arena_.rewind(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& arena_;
  Arena::Mark mark_;
};

class Workspace {
 public:
  // Call at the start of each step: gives back all memory of the previous one.
  void begin_step() {
    step_.reset();
    frame_.reset();
  }
  Arena& step() { return step_; }
  Arena& frame() { return frame_; }

  int64_t growths() const { return step_.growths() + frame_.growths(); }
  size_t capacity_bytes() const { return step_.capacity_bytes() + frame_.capacity_bytes(); }

 private:
  Arena step_;
  Arena frame_;
};

// Objects of a non-trivial type T built in arena memory and destroyed at scope end (the memory itself goes back
// with the arena's scope or reset). For small per-step lists such as the forward's live segments.
template <class T>
class ArenaObjects {
 public:
  ArenaObjects(Arena& arena, size_t n) : items_(reinterpret_cast<T*>(arena.take<Storage>(n).data()), n) {
    for (T& item : items_) new (&item) T();
  }
  ~ArenaObjects() {
    for (T& item : items_) item.~T();
  }
  ArenaObjects(const ArenaObjects&) = delete;
  ArenaObjects& operator=(const ArenaObjects&) = delete;
  std::span<T> items() const { return items_; }

 private:
  struct alignas(T) Storage {
    std::byte bytes[sizeof(T)];
  };
  std::span<T> items_;
};

}  // namespace dsflash
