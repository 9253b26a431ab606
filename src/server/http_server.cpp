#include "server/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <limits>

#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/auth.h"
#include "server/event_source.h"
#include "server/json_fields.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/response_pump.h"

namespace dsflash::server {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr const char* kJson = "application/json; charset=utf-8";

ApiFlavor flavor_of_path(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ApiFlavor::kAnthropic : ApiFlavor::kOpenAi;
}

}  // namespace

// One response in flight: what the pump needs, owned by the content provider.
struct HttpServer::Stream {
  std::string endpoint;
  OutputMode mode = OutputMode::kChat;
  bool thinking = false;
  int top_logprobs = -1;
  std::unique_ptr<ResponseWriter> writer;
  std::unique_ptr<EngineEventSource> source;
  std::optional<GenerationOutput> output;
  Clock::time_point arrival = Clock::now();
  Clock::time_point last_token;
  int64_t tokens = 0;
  std::atomic<bool> pumped{false};
};

HttpServer::HttpServer(ServerOptions options)
    : options_(std::move(options)), http_(std::make_unique<httplib::Server>()), id_stamp_(unix_seconds()) {
  route();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  if (options_.port == 0) return http_->bind_to_any_port(options_.host);
  return http_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
}

bool HttpServer::listen() { return http_->listen_after_bind(); }

void HttpServer::set_load_progress(const LoadProgress& progress) {
  std::lock_guard<std::mutex> lock(load_mutex_);
  progress_ = progress;
}

void HttpServer::set_load_failed(const std::string& message) {
  std::lock_guard<std::mutex> lock(load_mutex_);
  load_error_ = message;
}

void HttpServer::set_engine(Engine* engine) { engine_.store(engine); }

void HttpServer::stop(std::chrono::duration<double> grace) {
  cancel_after_ns_.store(now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(grace).count());
  stopping_.store(true);
  http_->stop();
}

bool HttpServer::past_grace() const { return stopping_.load() && now_ns() >= cancel_after_ns_.load(); }

std::string HttpServer::next_id(const char* prefix) {
  return std::string(prefix) + std::to_string(id_stamp_) + std::to_string(next_id_.fetch_add(1) + 1000000);
}

int64_t HttpServer::context_tokens() const {
  const Engine* engine = engine_.load();
  int64_t limit = std::min(engine->info().max_request_positions, engine->info().max_position_embeddings);
  if (options_.context_tokens > 0) limit = std::min(limit, options_.context_tokens);
  return limit;
}

void HttpServer::reply_error(httplib::Response& res, const ApiError& error, ApiFlavor flavor) const {
  res.status = error.status;
  if (error.retry_after_s > 0) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  res.set_content(error_body(error, flavor), kJson);
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  const std::string key = presented_api_key(req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
  return constant_time_equals(key, options_.api_key);
}

bool HttpServer::model_known(const std::string& model, bool anthropic) const {
  if (model == options_.served_name) return true;
  if (std::find(options_.aliases.begin(), options_.aliases.end(), model) != options_.aliases.end()) return true;
  return anthropic && model.rfind("claude-", 0) == 0;
}

bool HttpServer::check_ready(const std::string& model, ApiFlavor flavor, httplib::Response& res) const {
  if (stopping_.load()) {
    reply_error(res, overloaded("the server is shutting down", flavor), flavor);
    return false;
  }
  if (engine_.load() == nullptr) {
    reply_error(res, overloaded("the model is still loading", flavor), flavor);
    return false;
  }
  if (!model_known(model, flavor == ApiFlavor::kAnthropic)) {
    reply_error(res, not_found("model '" + model + "' is not served here (served: " + options_.served_name + ")"), flavor);
    return false;
  }
  return true;
}

void HttpServer::route() {
  httplib::Server& s = *http_;
  s.new_task_queue = [threads = options_.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);
  s.set_keep_alive_max_count(1000);
  s.set_keep_alive_timeout(2);
  // Authentication before routing (every path but /health).
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health" || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    reply_error(res, unauthorized("invalid or missing API key"), flavor_of_path(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib sets itself (413 body too large, 404 unknown path, 400 unparsable) get an API-shaped body.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const ApiFlavor flavor = flavor_of_path(req.path);
    std::string message = "HTTP " + std::to_string(res.status);
    if (res.status == 413) message = "the request body is larger than " + std::to_string(options_.max_body_bytes) + " bytes";
    if (res.status == 404) message = "no endpoint " + req.method + " " + req.path;
    res.set_content(error_body(ApiError{res.status, message, res.status == 413 ? "request_too_large" : ""}, flavor), kJson);
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    const bool known = req.path == "/health" || req.path == "/metrics" || req.path.rfind("/v1/", 0) == 0;
    metrics_.count_http(known ? req.path : "other", res.status);
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) { handle_health(res); });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const Engine* engine = engine_.load();
    res.set_content(metrics_.render(engine ? engine->stats() : EngineStats{}), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) { handle_models(req, res); });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_chat(req, ApiFlavor::kOpenAi, res);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle_completion(req, res); });
  s.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    handle_chat(req, ApiFlavor::kAnthropic, res);
  });
  s.Post("/v1/messages/count_tokens",
         [this](const httplib::Request& req, httplib::Response& res) { handle_count_tokens(req, res); });
}

void HttpServer::handle_health(httplib::Response& res) const {
  OrderedJson body;
  const Engine* engine = engine_.load();
  if (stopping_.load()) {
    res.status = 503;
    body = {{"status", "shutting_down"}};
  } else if (engine == nullptr) {
    std::lock_guard<std::mutex> lock(load_mutex_);
    res.status = 503;
    body = {{"status", load_error_.empty() ? "loading" : "failed"}, {"stage", progress_.stage}, {"progress", progress_.fraction}};
    if (!load_error_.empty()) body["error"] = load_error_;
  } else {
    const EngineStats stats = engine->stats();
    res.status = 200;
    body = {{"status", "ok"},
            {"model", options_.served_name},
            {"prefix_cache", stats.prefix_cache},
            {"cache_dir", options_.cache_dir},
            {"context_tokens", context_tokens()},
            {"requests_running", stats.requests_running},
            {"requests_waiting", stats.requests_waiting}};
  }
  res.set_content(dump_json(body), kJson);
}

void HttpServer::handle_models(const httplib::Request& req, httplib::Response& res) const {
  std::vector<std::string> names = {options_.served_name};
  names.insert(names.end(), options_.aliases.begin(), options_.aliases.end());
  OrderedJson data = OrderedJson::array();
  const bool anthropic = req.has_header("anthropic-version");
  for (const std::string& name : names) {
    if (anthropic) {
      data.push_back(OrderedJson{{"type", "model"}, {"id", name}, {"display_name", name}, {"created_at", "2025-01-01T00:00:00Z"}});
    } else {
      data.push_back(OrderedJson{{"id", name}, {"object", "model"}, {"created", id_stamp_}, {"owned_by", "dsflash"}});
    }
  }
  OrderedJson body = anthropic ? OrderedJson{{"data", data}, {"has_more", false}, {"first_id", names.front()}, {"last_id", names.back()}}
                               : OrderedJson{{"object", "list"}, {"data", data}};
  res.set_content(dump_json(body), kJson);
}

// A chat request's body parsed in its API's shape (count_tokens_only: the Anthropic count_tokens shape), the
// server ready for its model, the prompt rendered (V4.1 encoding) and tokenized.
struct HttpServer::ChatPrompt {
  ChatRequest chat;
  std::vector<int32_t> ids;
};

std::optional<HttpServer::ChatPrompt> HttpServer::chat_prompt(const httplib::Request& req, ApiFlavor flavor,
                                                              bool count_tokens_only, httplib::Response& res) {
  auto fail = [&](const ApiError& error) {
    reply_error(res, error, flavor);
    return std::nullopt;
  };
  auto body = parse_json_object(req.body);
  if (failed(body)) return fail(std::get<ApiError>(body));
  auto parsed = flavor == ApiFlavor::kAnthropic
                    ? parse_anthropic_messages(std::get<OrderedJson>(body), count_tokens_only)
                    : parse_openai_chat(std::get<OrderedJson>(body));
  if (failed(parsed)) return fail(std::get<ApiError>(parsed));
  ChatPrompt prompt{std::move(std::get<ChatRequest>(parsed)), {}};
  if (!check_ready(prompt.chat.model, flavor, res)) return std::nullopt;
  auto text = render_chat_request(prompt.chat);
  if (failed(text)) return fail(std::get<ApiError>(text));
  auto ids = engine_.load()->tokenize(std::get<std::string>(text));
  if (!ids.ok()) return fail(from_engine_error(ids.error(), flavor));
  prompt.ids = std::move(*ids);
  return prompt;
}

// The chat endpoints of both APIs (OpenAI /v1/chat/completions, Anthropic /v1/messages): one pipeline, each
// API's response writer.
void HttpServer::handle_chat(const httplib::Request& req, ApiFlavor flavor, httplib::Response& res) {
  std::optional<ChatPrompt> prompt = chat_prompt(req, flavor, /*count_tokens_only=*/false, res);
  if (!prompt) return;
  const ChatRequest& chat = prompt->chat;
  const GenerationSettings& generation = chat.generation;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt->ids.size());
  auto request = make_generation_request(std::move(prompt->ids), generation, ContextLimits{context_tokens()});
  if (failed(request)) return reply_error(res, std::get<ApiError>(request), flavor);
  auto stream = std::make_unique<Stream>();
  stream->thinking = chat.render.thinking;
  if (flavor == ApiFlavor::kAnthropic) {
    stream->endpoint = "messages";
    stream->writer = std::make_unique<AnthropicMessageWriter>(
        ResponseInfo{next_id("msg_"), chat.model, unix_seconds(), prompt_tokens}, generation.stream);
  } else {
    stream->endpoint = "chat";
    stream->top_logprobs = generation.logprobs ? generation.top_logprobs : -1;
    stream->writer = std::make_unique<OpenAiChatWriter>(
        ResponseInfo{next_id("chatcmpl-"), chat.model, unix_seconds(), prompt_tokens}, generation.stream,
        generation.include_usage, generation.logprobs);
  }
  respond(std::move(stream), std::move(std::get<GenerationRequest>(request)), flavor, res);
}

void HttpServer::handle_completion(const httplib::Request& req, httplib::Response& res) {
  constexpr ApiFlavor kFlavor = ApiFlavor::kOpenAi;
  auto body = parse_json_object(req.body);
  if (failed(body)) return reply_error(res, std::get<ApiError>(body), kFlavor);
  auto parsed = parse_openai_completion(std::get<OrderedJson>(body));
  if (failed(parsed)) return reply_error(res, std::get<ApiError>(parsed), kFlavor);
  CompletionRequest& completion = std::get<CompletionRequest>(parsed);
  if (!check_ready(completion.model, kFlavor, res)) return;
  Engine& engine = *engine_.load();
  std::vector<int32_t> ids = completion.prompt_ids;
  if (ids.empty()) {
    auto encoded = engine.tokenize(completion.prompt);
    if (!encoded.ok()) return reply_error(res, from_engine_error(encoded.error(), kFlavor), kFlavor);
    ids = std::move(*encoded);
  }
  for (int32_t id : ids) {
    if (id >= engine.info().vocab_size) {
      return reply_error(res, bad_request("prompt token id " + std::to_string(id) + " is outside the vocabulary"), kFlavor);
    }
  }
  const int64_t prompt_tokens = static_cast<int64_t>(ids.size());
  auto request = make_generation_request(std::move(ids), completion.generation, ContextLimits{context_tokens()});
  if (failed(request)) return reply_error(res, std::get<ApiError>(request), kFlavor);
  auto stream = std::make_unique<Stream>();
  stream->endpoint = "completions";
  stream->mode = OutputMode::kRaw;
  stream->top_logprobs = completion.generation.logprobs ? completion.generation.top_logprobs : -1;
  stream->writer = std::make_unique<OpenAiCompletionWriter>(
      ResponseInfo{next_id("cmpl-"), completion.model, unix_seconds(), prompt_tokens}, completion.generation.stream,
      completion.generation.include_usage, completion.generation.logprobs);
  respond(std::move(stream), std::move(std::get<GenerationRequest>(request)), kFlavor, res);
}

void HttpServer::handle_count_tokens(const httplib::Request& req, httplib::Response& res) {
  constexpr ApiFlavor kFlavor = ApiFlavor::kAnthropic;
  std::optional<ChatPrompt> prompt = chat_prompt(req, kFlavor, /*count_tokens_only=*/true, res);
  if (!prompt) return;
  res.set_content(dump_json(OrderedJson{{"input_tokens", static_cast<int64_t>(prompt->ids.size())}}), kJson);
}

void HttpServer::respond(std::unique_ptr<Stream> stream, GenerationRequest request, ApiFlavor flavor,
                         httplib::Response& res) {
  Engine& engine = *engine_.load();
  request.speculative = options_.speculative;  // greedy output is unchanged by it, sampled output's distribution too
  auto handle = engine.submit(std::move(request));
  if (!handle.ok()) return reply_error(res, from_engine_error(handle.error(), flavor), flavor);
  stream->source = std::make_unique<EngineEventSource>(engine, std::move(*handle));
  stream->output.emplace(stream->mode, stream->thinking, stream->top_logprobs,
                         [&engine](int32_t id) { return engine.detokenize({id}); });
  std::shared_ptr<Stream> shared(std::move(stream));
  const std::string content_type = shared->writer->content_type() == std::string("application/json") ? kJson
                                                                                                       : "text/event-stream";
  if (content_type == "text/event-stream") res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      content_type,
      [this, shared](size_t, httplib::DataSink& sink) {
        PumpHooks hooks;
        hooks.write = [&sink](const std::string& bytes) { return sink.write(bytes.data(), bytes.size()); };
        hooks.should_cancel = [this] { return past_grace(); };
        hooks.on_event = [this, &shared](const Event& event) {
          if (event.kind != EventKind::kToken) return;
          const auto now = Clock::now();
          if (shared->tokens++ == 0) {
            metrics_.observe_time_to_first_token(std::chrono::duration<double>(now - shared->arrival).count());
          } else {
            metrics_.observe_inter_token_latency(std::chrono::duration<double>(now - shared->last_token).count());
          }
          shared->last_token = now;
        };
        PumpResult result = pump_response(*shared->source, *shared->output, *shared->writer, hooks);
        shared->pumped = true;
        if (result.finished) metrics_.add_usage(result.summary.usage);
        if (result.client_gone) return false;
        sink.done();
        return true;
      },
      [shared](bool) {
        // The connection ended before the pump ran (or mid-way): the engine must not keep generating.
        if (!shared->pumped.load()) shared->source->cancel();
      });
}

}  // namespace dsflash::server
