#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace dsflash::server {
namespace {

// The "type" of each API for an HTTP status.
const char* openai_type(int status) {
  switch (status) {
    case 400: case 404: case 413: return "invalid_request_error";
    case 401: return "authentication_error";
    case 429: case 503: return "server_overloaded";
  }
  return "server_error";
}

const char* anthropic_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
  }
  return "api_error";
}

}  // namespace

ApiError bad_request(std::string message, std::string code) { return ApiError{400, std::move(message), std::move(code)}; }
ApiError not_found(std::string message) { return ApiError{404, std::move(message), "model_not_found"}; }
ApiError unauthorized(std::string message) { return ApiError{401, std::move(message), "invalid_api_key"}; }
ApiError overloaded(std::string message, ApiFlavor flavor) {
  return ApiError{flavor == ApiFlavor::kAnthropic ? 529 : 503, std::move(message), "overloaded", 1};
}
ApiError internal_error(std::string message) { return ApiError{500, std::move(message), "internal_error"}; }

ApiError from_engine_error(const EngineError& error, ApiFlavor flavor) {
  switch (error.code) {
    case ErrorCode::kInvalidRequest: return bad_request(error.message);
    case ErrorCode::kContextTooLong: return bad_request(error.message, "context_length_exceeded");
    case ErrorCode::kOverloaded: return overloaded(error.message, flavor);
    case ErrorCode::kLoad:
    case ErrorCode::kInternal: break;
  }
  return internal_error(error.message);
}

std::string error_body(const ApiError& error, ApiFlavor flavor) {
  nlohmann::json body;
  if (flavor == ApiFlavor::kAnthropic) {
    body = {{"type", "error"}, {"error", {{"type", anthropic_type(error.status)}, {"message", error.message}}}};
  } else {
    body = {{"error",
             {{"message", error.message},
              {"type", openai_type(error.status)},
              {"param", nullptr},
              {"code", error.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.code)}}}};
  }
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dsflash::server
