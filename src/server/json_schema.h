// A basic JSON-schema check for tool-call arguments: type (one or a list), required,
// properties, additionalProperties: false, items, enum. Other keywords are ignored (accepted).
#pragma once

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace mr::server {

// Ok when `value` satisfies `schema`; else InvalidArgument naming the path ("$.a.b[2]").
Status ValidateJsonSchema(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema);

}  // namespace mr::server
