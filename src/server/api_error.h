// One error type for every API: handlers return ApiError values (never throw out); each wire
// format maps it to its status and body once (anthropic_api.cpp, openai_api.cpp).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace mr::server {

enum class ApiErrorType {
  kInvalidRequest,   // 400 invalid_request_error
  kAuthentication,   // 401 authentication_error
  kPermission,       // 403 permission_error
  kNotFound,         // 404 not_found_error
  kRequestTooLarge,  // 413 request_too_large
  kRateLimit,        // 429 rate_limit_error
  kApi,              // 500 api_error
  kOverloaded,       // 529 overloaded_error
};

struct ApiError {
  ApiErrorType type = ApiErrorType::kApi;
  std::string message;
  int retry_after_s = 0;  // > 0: sent as the retry-after header (429, 529)
};

inline ApiError InvalidRequest(std::string m) {
  return {ApiErrorType::kInvalidRequest, std::move(m)};
}

int HttpStatus(ApiErrorType t);
// Anthropic's error.type string ("invalid_request_error", ...).
const char* AnthropicErrorName(ApiErrorType t);
// {"type":"error","error":{"type":...,"message":...}}
std::string AnthropicErrorBody(const ApiError& e);
// OpenAI's {"error":{"message","type","param":null,"code":null}}.
std::string OpenAIErrorBody(const ApiError& e);

// A response or SSE payload as one line of JSON: invalid UTF-8 replaced (never an exception),
// and U+0085, U+2028 and U+2029 written as \u escapes. JSON allows them raw, but clients that
// split an SSE stream with a general line splitter (Python's str.splitlines, JavaScript line
// terminators) would cut an event in two at them.
std::string DumpWireJson(const nlohmann::ordered_json& j);

}  // namespace mr::server
