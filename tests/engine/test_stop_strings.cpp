// Stop strings over streamed text: text that could start a stop string is held back, a stop string split across
// pieces is found, the text before it is output and nothing after.
#include <gtest/gtest.h>

#include "engine/stop_strings.h"

namespace dsflash::engine {
namespace {

TEST(StopStrings, HoldsBackAPossibleStartAndReleasesItWhenDecided) {
  StopStringFilter f({"END"});
  EXPECT_EQ(f.push("abc E"), "abc ");
  EXPECT_EQ(f.held_bytes(), 1u);
  EXPECT_EQ(f.push("x"), "Ex");  // "Ex" cannot start "END"
  EXPECT_EQ(f.push("EN"), "");
  EXPECT_EQ(f.finish(), "EN");  // no match: the held text is output at the end
  EXPECT_FALSE(f.matched());
}

TEST(StopStrings, FindsAStopSplitAcrossPiecesAndDropsWhatFollows) {
  StopStringFilter f({"</s>", "STOP"});
  std::string out;
  for (const char* piece : {"hello <", "/", "s", ">after", " more"}) out += f.push(piece);
  out += f.finish();
  EXPECT_EQ(out, "hello ");
  EXPECT_TRUE(f.matched());
  EXPECT_EQ(f.matched_string(), "</s>");
}

TEST(StopStrings, EarliestMatchWinsAndTextBeforeItInTheSamePieceIsOutput) {
  StopStringFilter f({"cd", "b"});
  EXPECT_EQ(f.push("abcd"), "a");
  EXPECT_EQ(f.matched_string(), "b");
  StopStringFilter none({});
  EXPECT_EQ(none.push("anything"), "anything");
}

}  // namespace
}  // namespace dsflash::engine
