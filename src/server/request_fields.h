// Reading untrusted request bodies: limits checked before anything is parsed or tokenized, and
// typed accessors for optional fields, so that a wrong type is a 400 naming the field instead of
// an exception from the JSON library (which would surface as a 500, or worse).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/api_error.h"

namespace mr::server {

// Bounds on one request, checked before tokenization (docs/api.md, "Limits").
struct RequestLimits {
  int max_json_depth = 64;            // nesting of arrays/objects in the body
  size_t max_messages = 100000;       // entries of messages[] (Anthropic's own limit)
  size_t max_content_blocks = 10000;  // blocks of one message's content (and of a tool_result's)
  size_t max_tools = 1000;            // entries of tools[]
  size_t max_logit_bias = 1024;       // entries of OpenAI logit_bias
  size_t max_tool_name_bytes = 128;   // [A-Za-z0-9_-]{1,128}: names go into the prompt verbatim
  size_t max_stop_sequences = 16;     // stop_sequences / stop entries
  size_t max_stop_bytes = 512;        // bytes of one stop sequence
};

// Nesting depth of the JSON text `body` (strings are skipped, escapes honoured), counting only
// up to `limit + 1`: the parser and the recursive serializers never see deeper input.
// Malformed text is left to the parser; this only measures brackets.
int JsonDepth(std::string_view body, int limit);

// Parses a request body: invalid JSON, nesting deeper than limits.max_json_depth or a top level
// that is not an object give a 400.
std::optional<ApiError> ParseRequestBody(std::string_view body, const RequestLimits& limits,
                                         nlohmann::ordered_json* out);

// Optional fields of `obj` (an object): absent or null leave *out unchanged and return nullopt;
// another type than asked is a 400 "WHERE.KEY: expected ..., got TYPE".
std::optional<ApiError> OptBool(const nlohmann::ordered_json& obj, const char* key, const std::string& where,
                                bool* out);
std::optional<ApiError> OptString(const nlohmann::ordered_json& obj, const char* key, const std::string& where,
                                  std::string* out);
// An integer in [lo, hi]: anything else is a 400 "KEY: expected an integer between LO and HI".
std::optional<ApiError> OptInt(const nlohmann::ordered_json& obj, const char* key, int64_t lo, int64_t hi,
                               int64_t* out);
// *out points at the object (or stays null).
std::optional<ApiError> OptObject(const nlohmann::ordered_json& obj, const char* key, const std::string& where,
                                  const nlohmann::ordered_json** out);

// "where.key" or "key" when where is empty.
std::string FieldName(const std::string& where, const char* key);
// A JSON value's type in messages ("a string", "an array", ...).
std::string JsonTypeName(const nlohmann::ordered_json& v);

// Tool names go into prompts and come back out of the model's tool calls: Anthropic's and
// OpenAI's own rule, [A-Za-z0-9_-] and at most max_bytes long.
std::optional<ApiError> CheckToolName(const std::string& name, const std::string& where, size_t max_bytes);

// Stop sequences: at most max_count, each 1..max_bytes bytes.
std::optional<ApiError> CheckStopSequences(const std::vector<std::string>& stops, const char* field,
                                           const RequestLimits& limits);

}  // namespace mr::server
