// The HTTP front of `dsflash serve` (cpp-httplib): routing, authentication, body limits, health, metrics,
// model names, and the generation endpoints of both APIs:
//   GET  /health                    503 {"status": "loading", stage, progress} while loading, 200 when ready
//   GET  /metrics                   Prometheus text (server/metrics.h)
//   GET  /v1/models                 OpenAI list (Anthropic shape when an anthropic-version header is sent)
//   POST /v1/chat/completions       OpenAI chat (server/openai_request.h, openai_response.h)
//   POST /v1/completions            OpenAI raw-prompt completions
//   POST /v1/messages               Anthropic Messages (server/anthropic_request.h, anthropic_response.h)
//   POST /v1/messages/count_tokens  {"input_tokens": N}
// Each generation request is parsed, rendered (V4.1 encoding), tokenized and submitted before the response
// starts, so every request error is a 4xx in its API's shape; the response then streams through ResponsePump on
// the connection's thread. The server listens before the model is loaded (set_engine() makes it ready).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dsflash/engine.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/server_options.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace dsflash::server {

class HttpServer {
 public:
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: any); returns the bound port, or -1.
  int bind();
  // Accepts connections until stop(); returns when every connection's thread has finished.
  bool listen();

  void set_load_progress(const LoadProgress& progress);
  void set_load_failed(const std::string& message);
  // The loaded engine (outlives the server's listen()).
  void set_engine(Engine* engine);

  // Stops accepting; in-flight requests finish, or are cancelled once `grace` has passed.
  void stop(std::chrono::duration<double> grace);

 private:
  struct Stream;
  struct ChatPrompt;
  void route();
  bool authorized(const httplib::Request& req) const;
  void reply_error(httplib::Response& res, const ApiError& error, ApiFlavor flavor) const;
  void handle_health(httplib::Response& res) const;
  void handle_models(const httplib::Request& req, httplib::Response& res) const;
  // /v1/chat/completions (kOpenAi) and /v1/messages (kAnthropic).
  void handle_chat(const httplib::Request& req, ApiFlavor flavor, httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res);
  void handle_count_tokens(const httplib::Request& req, httplib::Response& res);
  // Parse, readiness, render and tokenize, shared by the chat endpoints: the prompt, or nullopt once res holds
  // the error.
  std::optional<ChatPrompt> chat_prompt(const httplib::Request& req, ApiFlavor flavor, bool count_tokens_only,
                                        httplib::Response& res);
  // Engine ready and not shutting down, the model name known: else the error to answer.
  bool check_ready(const std::string& model, ApiFlavor flavor, httplib::Response& res) const;
  bool model_known(const std::string& model, bool anthropic) const;
  int64_t context_tokens() const;
  std::string next_id(const char* prefix);
  // Submits and streams (res gets a chunked content provider).
  void respond(std::unique_ptr<Stream> stream, GenerationRequest request, ApiFlavor flavor, httplib::Response& res);
  bool past_grace() const;

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  ServerMetrics metrics_;
  std::atomic<Engine*> engine_{nullptr};
  mutable std::mutex load_mutex_;
  LoadProgress progress_;
  std::string load_error_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> cancel_after_ns_{0};  // steady-clock ns after which in-flight requests are cancelled
  std::atomic<int64_t> next_id_{0};
  int64_t id_stamp_ = 0;
};

}  // namespace dsflash::server
