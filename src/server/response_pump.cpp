#include "server/response_pump.h"

namespace dsflash::server {

PumpResult pump_response(EventSource& source, GenerationOutput& output, ResponseWriter& writer, const PumpHooks& hooks) {
  using Clock = std::chrono::steady_clock;
  PumpResult result;
  bool cancelled = false;
  auto cancel = [&] {
    if (!cancelled) source.cancel();
    cancelled = true;
  };
  auto last_write = Clock::now();
  auto send = [&](const std::string& bytes) {
    if (result.client_gone || bytes.empty()) return;
    if (!hooks.write(bytes)) {
      result.client_gone = true;
      cancel();
    }
    last_write = Clock::now();
  };
  send(writer.start());
  std::vector<OutputDelta> deltas;
  while (!output.finished()) {
    std::optional<Event> event = source.next_for(hooks.poll);
    if (hooks.should_cancel && !cancelled && hooks.should_cancel()) cancel();
    if (!event) {
      if (source.done()) break;  // the stream ended without kFinished (a scripted source only)
      if (Clock::now() - last_write >= hooks.probe_every) send(writer.keepalive());
      continue;
    }
    if (hooks.on_event) hooks.on_event(*event);
    deltas.clear();
    output.on_event(*event, &deltas);
    std::vector<TokenLogprobs> logprobs = output.take_logprobs();
    if (!deltas.empty() || !logprobs.empty()) send(writer.output(deltas, std::move(logprobs)));
    if (!output.finished() && Clock::now() - last_write >= hooks.probe_every) send(writer.keepalive());
  }
  result.finished = output.finished();
  result.summary = output.summary();
  if (result.finished) send(writer.finish(result.summary));
  return result;
}

}  // namespace dsflash::server
