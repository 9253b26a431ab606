#include "engine/stop_strings.h"

#include <algorithm>

namespace dsflash::engine {

const std::string& StopStringFilter::matched_string() const {
  static const std::string kNone;
  return matched() ? stops_[static_cast<size_t>(matched_index_)] : kNone;
}

std::string StopStringFilter::push(std::string_view piece) {
  if (matched()) return "";
  pending_.append(piece);
  // The earliest stop string that occurs (ties: the first listed).
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) continue;
    const size_t at = pending_.find(stops_[i]);
    if (at != std::string::npos && at < best) {
      best = at;
      matched_index_ = static_cast<int>(i);
    }
  }
  if (best != std::string::npos) {
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - (stop.empty() ? 0 : 1), pending_.size());
    for (size_t n = longest; n > hold; --n) {
      if (std::string_view(pending_).substr(pending_.size() - n) == std::string_view(stop).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::finish() {
  std::string out = matched() ? "" : pending_;
  pending_.clear();
  return out;
}

}  // namespace dsflash::engine
