#include "engine/event_channel.h"

namespace dsflash {
namespace detail {

void EventChannel::push(Event event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_pushed_) return;  // nothing follows kFinished
    finished_pushed_ = event.kind == EventKind::kFinished;
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

std::optional<Event> EventChannel::pop(bool wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (wait) ready_.wait(lock, [this] { return !events_.empty() || finished_popped_; });
  if (events_.empty()) return std::nullopt;
  Event event = std::move(events_.front());
  events_.pop_front();
  if (event.kind == EventKind::kFinished) finished_popped_ = true;
  return event;
}

std::optional<Event> EventChannel::pop_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait_for(lock, timeout, [this] { return !events_.empty() || finished_popped_; });
  if (events_.empty()) return std::nullopt;
  Event event = std::move(events_.front());
  events_.pop_front();
  if (event.kind == EventKind::kFinished) finished_popped_ = true;
  return event;
}

bool EventChannel::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_popped_;
}

}  // namespace detail

std::optional<Event> RequestHandle::next() { return channel_->pop(true); }
std::optional<Event> RequestHandle::try_next() { return channel_->pop(false); }
std::optional<Event> RequestHandle::next_for(std::chrono::milliseconds timeout) { return channel_->pop_for(timeout); }
bool RequestHandle::done() const { return channel_->done(); }

}  // namespace dsflash
