// JSON Schema -> grammar (grammar.h), for constrained decoding of tool arguments and structured
// outputs.
//
// The generated JSON is compact with optional single spaces after ':' and ',' (the form the chat
// templates show the model: Python's json.dumps); no other whitespace. Object properties come in
// the schema's order, required ones always, optional ones possibly left out; no property the
// schema does not declare is generated. Numbers have at most 18 integer and 18 fraction digits
// and an exponent of at most 3 digits.
//
// Supported: type (one or a list), properties, required, additionalProperties (false, true or a
// schema for objects without properties), items, minItems / maxItems (up to 64), enum, const,
// minLength / maxLength (up to 256 characters; \uXXXX escapes not allowed in bounded strings),
// anyOf / oneOf (as alternatives), allOf with one member, $ref to "#", "#/$defs/..." or
// "#/definitions/..." (recursion included), nullable (OpenAPI), and annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly).
//
// Value constraints the grammar does not enforce (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum, multipleOf, pattern, format, uniqueItems, length bounds above 256,
// minProperties, maxProperties): refused in strict mode (structured outputs and strict tools, as
// Anthropic's API does), ignored otherwise (the structure is still guaranteed). Keywords that
// change the structure in ways not supported (prefixItems, patternProperties, not, if/then/else,
// contains, dependentSchemas, unevaluatedProperties, allOf with several members, ...) are
// refused always. Errors name the keyword and its path ("$.properties.a.pattern").
#pragma once

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "runtime/grammar.h"

namespace mr {

struct JsonGrammarOptions {
  bool strict = false;
};

// The expression of a JSON value that satisfies `schema`, in `b`.
Result<GrammarBuilder::Expr> JsonSchemaExpr(GrammarBuilder& b, const nlohmann::ordered_json& schema,
                                            const JsonGrammarOptions& opts = {});

// Any JSON value (or object) in the same compact form.
GrammarBuilder::Expr JsonAnyValue(GrammarBuilder& b);
GrammarBuilder::Expr JsonAnyObject(GrammarBuilder& b);

}  // namespace mr
