// Errors the HTTP APIs answer with, as values, and their body in each API's shape:
//   OpenAI    {"error": {"message": ..., "type": "invalid_request_error", "param": null, "code": ...}}
//             (platform.openai.com/docs/guides/error-codes)
//   Anthropic {"type": "error", "error": {"type": "invalid_request_error", "message": ...}}
//             (docs.anthropic.com/en/api/errors: 400 invalid_request_error, 401 authentication_error,
//              404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error,
//              529 overloaded_error)
#pragma once

#include <string>
#include <variant>

#include "dsflash/errors.h"

namespace dsflash::server {

enum class ApiFlavor { kOpenAi, kAnthropic };

struct ApiError {
  int status = 400;
  std::string message;
  std::string code;      // OpenAI "code" (e.g. "context_length_exceeded"); "" = null
  int retry_after_s = 0;  // > 0: a Retry-After header
};

ApiError bad_request(std::string message, std::string code = "invalid_request");
ApiError not_found(std::string message);
ApiError unauthorized(std::string message);
ApiError overloaded(std::string message, ApiFlavor flavor);  // 503 OpenAI, 529 Anthropic; Retry-After: 1
ApiError internal_error(std::string message);
// An engine error as the API answers it: kInvalidRequest / kContextTooLong 400, kOverloaded 503 / 529, else 500.
ApiError from_engine_error(const EngineError& error, ApiFlavor flavor);

// The JSON body (text) of `error` in the API's shape.
std::string error_body(const ApiError& error, ApiFlavor flavor);

// A parser result: a value or the error to answer with.
template <class T>
using ApiResult = std::variant<T, ApiError>;

template <class T>
bool failed(const ApiResult<T>& r) {
  return std::holds_alternative<ApiError>(r);
}

}  // namespace dsflash::server
