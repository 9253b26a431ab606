// The per-request event queue between the engine's loop thread (producer) and a RequestHandle (consumer):
// a mutex + condition variable around a deque. kFinished is the last event pushed; once it has been popped the
// stream is over.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "dsflash/engine.h"

namespace dsflash::detail {

class EventChannel {
 public:
  void push(Event event);
  // wait: block until an event is ready (or the stream is over).
  std::optional<Event> pop(bool wait);
  // Waits at most `timeout` for an event.
  std::optional<Event> pop_for(std::chrono::milliseconds timeout);
  bool done() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
  bool finished_pushed_ = false;
  bool finished_popped_ = false;
};

}  // namespace dsflash::detail
