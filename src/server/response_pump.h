// Drives one response: events from an EventSource through GenerationOutput into a ResponseWriter, its bytes to
// the client. Bounded: after a cancel the producer still ends the stream with kFinished; the pump drains it.
//   - the client is gone (a write fails): the request is cancelled at once (the engine drops it at the next
//     step boundary); the pump probes the connection with the writer's keepalive bytes whenever nothing was
//     written for `probe_every`, so a silent client (prefill, held-back DSML, non-stream JSON) is noticed too;
//   - should_cancel() (the server shutting down past its grace): cancelled, the response ends normally.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "server/event_source.h"
#include "server/generation_output.h"
#include "server/response_writer.h"

namespace dsflash::server {

struct PumpHooks {
  std::function<bool(const std::string& bytes)> write;  // false: the client went away
  std::function<bool()> should_cancel;                  // may be empty
  std::function<void(const Event& event)> on_event;     // may be empty (metrics: token timing)
  std::chrono::milliseconds poll{50};
  std::chrono::milliseconds probe_every{100};
};

struct PumpResult {
  bool client_gone = false;
  bool finished = false;  // kFinished arrived
  OutputSummary summary;
};

PumpResult pump_response(EventSource& source, GenerationOutput& output, ResponseWriter& writer, const PumpHooks& hooks);

}  // namespace dsflash::server
