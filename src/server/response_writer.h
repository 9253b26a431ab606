// How one API renders a generation: the bytes of a streamed response (Server-Sent Events) or of one JSON body,
// written as the output arrives. ResponsePump calls start() once, output() per batch of deltas, keepalive()
// while nothing arrives (bytes that carry no meaning: an SSE comment or ping, JSON whitespace), finish() once.
#pragma once

#include <string>
#include <vector>

#include "server/generation_output.h"

namespace dsflash::server {

struct ResponseInfo {
  std::string id;          // response id (chatcmpl-..., msg_...)
  std::string model;       // as the client named it
  int64_t created = 0;     // unix seconds
  int64_t prompt_tokens = 0;
};

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual const char* content_type() const = 0;
  virtual std::string start() = 0;
  virtual std::string output(const std::vector<OutputDelta>& deltas, std::vector<TokenLogprobs> logprobs) = 0;
  virtual std::string keepalive() = 0;
  virtual std::string finish(const OutputSummary& summary) = 0;
};

// "data: {json}\n\n" / "event: {name}\ndata: {json}\n\n".
inline std::string sse_data(const std::string& json) { return "data: " + json + "\n\n"; }
inline std::string sse_event(const std::string& name, const std::string& json) {
  return "event: " + name + "\ndata: " + json + "\n\n";
}

}  // namespace dsflash::server
