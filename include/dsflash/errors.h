// Typed errors of the public API (a server maps ErrorCode to an HTTP status: kInvalidRequest 400,
// kContextTooLong 400 / 413, kOverloaded 429 / 503, kLoad and kInternal 500). Errors are values: every fallible
// call returns Expected<T>, a T or an EngineError.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace dsflash {

enum class ErrorCode {
  kInvalidRequest,  // malformed request: empty prompt, ids outside the vocabulary, bad sampling params, ...
  kContextTooLong,  // prompt + max_tokens beyond the model's positions or the whole KV budget
  kOverloaded,      // too many requests in flight; retry later
  kLoad,            // loading a model directory failed (missing directory, bad checkpoint)
  kInternal,        // a failure inside the engine (the forward, the KV cache)
};

const char* error_code_name(ErrorCode code);  // "invalid_request", "context_too_long", "overloaded", "load", "internal"

struct EngineError {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;  // one line naming what is wrong
};

template <class T>
class Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Expected(EngineError error) : value_(std::move(error)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(value_); }
  const EngineError& error() const {
    assert(!ok());
    return std::get<EngineError>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, EngineError> value_;
};

}  // namespace dsflash
