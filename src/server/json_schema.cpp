#include "server/json_schema.h"

#include <string>

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

bool HasType(const Json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return true;  // unknown type names are not ours to refuse
}

Status Check(const Json& v, const Json& schema, const std::string& path) {
  if (!schema.is_object()) return Status::Ok();
  if (auto it = schema.find("type"); it != schema.end()) {
    bool ok = false;
    if (it->is_string()) {
      ok = HasType(v, it->get<std::string>());
    } else if (it->is_array()) {
      for (const Json& t : *it) ok |= t.is_string() && HasType(v, t.get<std::string>());
    } else {
      ok = true;
    }
    if (!ok) return InvalidArgument(path + ": expected type " + it->dump() + ", got " + v.dump());
  }
  if (auto it = schema.find("enum"); it != schema.end() && it->is_array()) {
    bool found = false;
    for (const Json& e : *it) found |= e == v;
    if (!found) return InvalidArgument(path + ": " + v.dump() + " is not one of " + it->dump());
  }
  if (v.is_object()) {
    if (auto it = schema.find("required"); it != schema.end() && it->is_array()) {
      for (const Json& r : *it)
        if (r.is_string() && !v.contains(r.get<std::string>()))
          return InvalidArgument(path + ": missing required property \"" + r.get<std::string>() + "\"");
    }
    const auto props = schema.find("properties");
    const bool closed = schema.contains("additionalProperties") && schema["additionalProperties"].is_boolean() &&
                        !schema["additionalProperties"].get<bool>();
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props != schema.end() && props->is_object() && props->contains(it.key())) {
        MR_RETURN_IF_ERROR(Check(it.value(), (*props)[it.key()], path + "." + it.key()));
      } else if (closed) {
        return InvalidArgument(path + ": unexpected property \"" + it.key() + "\"");
      }
    }
  }
  if (v.is_array()) {
    if (auto it = schema.find("items"); it != schema.end() && it->is_object()) {
      for (size_t i = 0; i < v.size(); ++i) MR_RETURN_IF_ERROR(Check(v[i], *it, path + "[" + std::to_string(i) + "]"));
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateJsonSchema(const Json& value, const Json& schema) {
  return Check(value, schema, "$");
}

}  // namespace mr::server
