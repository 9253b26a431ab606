// Where a response's engine events come from. The server's output path (GenerationOutput + a ResponseWriter,
// driven by ResponsePump) reads events through this seam: in production from an engine request
// (EngineEventSource); in tests from scripted event sequences (tests/server), never a mode of the engine.
#pragma once

#include <chrono>
#include <optional>

#include "dsflash/engine.h"

namespace dsflash::server {

class EventSource {
 public:
  virtual ~EventSource() = default;
  // The next event, waiting at most `timeout`; nullopt when none arrived (or the stream is over: done()).
  virtual std::optional<Event> next_for(std::chrono::milliseconds timeout) = 0;
  virtual bool done() const = 0;
  // Asks the producer to stop; a kFinished (kCancelled) still follows.
  virtual void cancel() = 0;
};

// The events of one submitted engine request.
class EngineEventSource final : public EventSource {
 public:
  EngineEventSource(Engine& engine, RequestHandle handle) : engine_(engine), handle_(std::move(handle)) {}
  std::optional<Event> next_for(std::chrono::milliseconds timeout) override { return handle_.next_for(timeout); }
  bool done() const override { return handle_.done(); }
  void cancel() override { engine_.cancel(handle_.id()); }
  RequestId id() const { return handle_.id(); }

 private:
  Engine& engine_;
  RequestHandle handle_;
};

}  // namespace dsflash::server
