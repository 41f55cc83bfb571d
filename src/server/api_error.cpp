#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace mr::server {

std::string DumpWireJson(const nlohmann::ordered_json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      out += "\\u0085";
      ++i;
    } else if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xA8 || static_cast<unsigned char>(s[i + 2]) == 0xA9)) {
      out += static_cast<unsigned char>(s[i + 2]) == 0xA8 ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

int HttpStatus(ApiErrorType t) {
  switch (t) {
    case ApiErrorType::kInvalidRequest:
      return 400;
    case ApiErrorType::kAuthentication:
      return 401;
    case ApiErrorType::kPermission:
      return 403;
    case ApiErrorType::kNotFound:
      return 404;
    case ApiErrorType::kRequestTooLarge:
      return 413;
    case ApiErrorType::kRateLimit:
      return 429;
    case ApiErrorType::kApi:
      return 500;
    case ApiErrorType::kOverloaded:
      return 529;
  }
  return 500;
}

const char* AnthropicErrorName(ApiErrorType t) {
  switch (t) {
    case ApiErrorType::kInvalidRequest:
      return "invalid_request_error";
    case ApiErrorType::kAuthentication:
      return "authentication_error";
    case ApiErrorType::kPermission:
      return "permission_error";
    case ApiErrorType::kNotFound:
      return "not_found_error";
    case ApiErrorType::kRequestTooLarge:
      return "request_too_large";
    case ApiErrorType::kRateLimit:
      return "rate_limit_error";
    case ApiErrorType::kApi:
      return "api_error";
    case ApiErrorType::kOverloaded:
      return "overloaded_error";
  }
  return "api_error";
}

std::string AnthropicErrorBody(const ApiError& e) {
  nlohmann::ordered_json j = {{"type", "error"},
                              {"error", {{"type", AnthropicErrorName(e.type)}, {"message", e.message}}}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string OpenAIErrorBody(const ApiError& e) {
  // OpenAI's own type strings for the statuses it uses; the rest keep Anthropic's names.
  const char* type = AnthropicErrorName(e.type);
  switch (e.type) {
    case ApiErrorType::kRateLimit:
      type = "rate_limit_exceeded";
      break;
    case ApiErrorType::kApi:
      type = "server_error";
      break;
    case ApiErrorType::kRequestTooLarge:
      type = "invalid_request_error";
      break;
    default:
      break;
  }
  nlohmann::ordered_json j = {
      {"error", {{"message", e.message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace mr::server
