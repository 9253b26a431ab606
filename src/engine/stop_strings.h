// Text-level stop strings over streamed text: push() takes each new piece and returns what may be output now.
// Text that could still be the start of a stop string is held back until the following text decides it; when a
// stop string completes, the text before it is returned, matched() becomes true and everything after is dropped.
// A stop string split across any number of pieces is found.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsflash::engine {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // The text that is safe to output after `piece` (possibly empty). After a match: "" for every later piece.
  std::string push(std::string_view piece);
  // End of stream without a match: the held text.
  std::string finish();

  bool matched() const { return matched_index_ >= 0; }
  const std::string& matched_string() const;  // "" when none
  size_t held_bytes() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // undecided text: the longest suffix that is a proper prefix of some stop string
  int matched_index_ = -1;
};

}  // namespace dsflash::engine
