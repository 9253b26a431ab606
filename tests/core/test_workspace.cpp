// Arena (src/core/workspace.h): a later step of the same shape gets the very memory of the first one, so it faults
// in no fresh page (the no-allocation side is tests/alloc/test_forward_allocations.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/workspace.h"

namespace dsflash {
namespace {

// One "step": scoped takes that outgrow the first blocks (the arena starts empty), then a step-long take.
std::vector<const void*> run_step(Arena& arena) {
  std::vector<const void*> addresses;
  arena.reset();
  {
    ArenaScope layer(arena);
    for (size_t n : {size_t{1000}, size_t{70000}, size_t{300000}, size_t{5}}) {
      auto s = arena.take<float>(n);
      s[0] = 1.0f;
      addresses.push_back(s.data());
    }
  }
  auto whole_step = arena.take<uint8_t>(900000);
  whole_step[0] = 1;
  addresses.push_back(whole_step.data());
  return addresses;
}

TEST(Arena, LaterStepsOfTheSameShapeReuseTheFirstStepsAddresses) {
  Arena arena;
  const std::vector<const void*> first = run_step(arena);
  const int64_t grown = arena.growths();
  ASSERT_GE(grown, 2) << "the first step should span several blocks";
  const size_t capacity = arena.capacity_bytes();
  for (int step = 1; step < 4; ++step) {
    EXPECT_EQ(run_step(arena), first) << "step " << step;
    EXPECT_EQ(arena.growths(), grown);
    EXPECT_EQ(arena.capacity_bytes(), capacity);
  }
}

TEST(Arena, ASmallerStepFitsAndALargerOneGrowsOnce) {
  Arena arena;
  (void)run_step(arena);
  const int64_t grown = arena.growths();
  arena.reset();
  (void)arena.take<float>(10);
  EXPECT_EQ(arena.growths(), grown);
  arena.reset();
  const size_t capacity = arena.capacity_bytes();
  auto big = arena.take<uint8_t>(capacity + 1);  // more than all blocks together
  big[capacity] = 1;
  EXPECT_EQ(arena.growths(), grown + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % Arena::kAlignment, 0u);
  const void* again = nullptr;
  for (int step = 0; step < 2; ++step) {
    arena.reset();
    auto s = arena.take<uint8_t>(capacity + 1);
    if (step == 0) again = s.data();
    EXPECT_EQ(s.data(), again);
  }
  EXPECT_EQ(arena.growths(), grown + 1);
}

}  // namespace
}  // namespace dsflash
