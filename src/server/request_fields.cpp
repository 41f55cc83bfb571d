#include "server/request_fields.h"

#include <algorithm>

namespace mr::server {

using Json = nlohmann::ordered_json;

int JsonDepth(std::string_view body, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      depth = std::max(0, depth - 1);
    }
  }
  return max_depth;
}

std::optional<ApiError> ParseRequestBody(std::string_view body, const RequestLimits& limits, Json* out) {
  if (JsonDepth(body, limits.max_json_depth) > limits.max_json_depth)
    return InvalidRequest("the request body nests arrays/objects deeper than " + std::to_string(limits.max_json_depth) +
                          " levels");
  *out = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return InvalidRequest("the request body is not valid JSON");
  if (!out->is_object()) return InvalidRequest("the request body must be a JSON object");
  return std::nullopt;
}

std::string FieldName(const std::string& where, const char* key) {
  return where.empty() ? key : where + "." + key;
}

std::string JsonTypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an invalid value";
  }
}

namespace {

// The field `key` of obj when present and not null.
const Json* Present(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError WrongType(const std::string& where, const char* key, const char* expected, const Json& got) {
  return InvalidRequest(FieldName(where, key) + ": expected " + expected + ", got " + JsonTypeName(got));
}

}  // namespace

std::optional<ApiError> OptBool(const Json& obj, const char* key, const std::string& where, bool* out) {
  const Json* v = Present(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return WrongType(where, key, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> OptString(const Json& obj, const char* key, const std::string& where, std::string* out) {
  const Json* v = Present(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return WrongType(where, key, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> OptInt(const Json& obj, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  const Json* v = Present(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi)
    return InvalidRequest(std::string(key) + ": expected an integer between " + std::to_string(lo) + " and " +
                          std::to_string(hi));
  *out = v->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> OptObject(const Json& obj, const char* key, const std::string& where, const Json** out) {
  const Json* v = Present(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return WrongType(where, key, "an object", *v);
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> CheckToolName(const std::string& name, const std::string& where, size_t max_bytes) {
  const bool ok = !name.empty() && name.size() <= max_bytes && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
  if (ok) return std::nullopt;
  return InvalidRequest(where + ": a tool name must match ^[a-zA-Z0-9_-]{1," + std::to_string(max_bytes) + "}$");
}

std::optional<ApiError> CheckStopSequences(const std::vector<std::string>& stops, const char* field,
                                           const RequestLimits& limits) {
  if (stops.size() > limits.max_stop_sequences)
    return InvalidRequest(std::string(field) + ": at most " + std::to_string(limits.max_stop_sequences) +
                          " stop sequences, got " + std::to_string(stops.size()));
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty() || stops[i].size() > limits.max_stop_bytes)
      return InvalidRequest(std::string(field) + "[" + std::to_string(i) + "]: a stop sequence must be 1 to " +
                            std::to_string(limits.max_stop_bytes) + " bytes long, got " +
                            std::to_string(stops[i].size()));
  }
  return std::nullopt;
}

}  // namespace mr::server
