// The grammar constraint of a chat request (runtime/constraint.h): what constrained decoding
// guarantees at the API level.
//
//   tool_choice any / tool   the call is forced (the prompt ends inside it) and its name and
//                            arguments are decoded under the tools' schemas: always a valid call
//   tool_choice auto         lazy: free text until the model opens a call (its family's open
//                            tag, or a ```json fence opening an object), then the name must be a
//                            declared tool and the arguments follow its schema; every call the
//                            model starts is then valid (repeatable). With tools present, a
//                            fenced JSON object is taken as a call.
//   structured output        the answer is JSON of the given schema (Anthropic
//                            output_config.format, OpenAI response_format json_schema /
//                            json_object); with prompted reasoning it starts after </think>, and
//                            with tools (auto) a tool call is allowed instead
//
// Schemas are compiled by runtime/json_grammar.h: strict tools and structured outputs refuse
// keywords the grammar does not enforce (400 naming it); other tools fall back to any JSON object
// for their arguments when their schema is outside the supported subset. Compiled grammars are
// cached (keyed by the schemas and the mode), so an agent's repeated tool list compiles once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/chat_format.h"
#include "runtime/constraint.h"

namespace mr::server {

enum class ToolChoice { kAuto, kAny, kTool, kNone };
enum class OutputFormat { kText, kJsonObject, kJsonSchema, kGrammar, kRegex };
// The output is exactly a sentence of a grammar or regular expression (no leading whitespace).
inline bool ExactTextFormat(OutputFormat f) {
  return f == OutputFormat::kGrammar || f == OutputFormat::kRegex;
}

struct ConstraintRequest {
  ChatFamily family = ChatFamily::kChatML;
  std::vector<ChatTool> tools;  // the tools the model sees (empty: none)
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string forced_tool;  // kTool
  OutputFormat format = OutputFormat::kText;
  nlohmann::ordered_json schema;  // kJsonSchema
  std::string grammar;            // kGrammar: GBNF text, kRegex: the pattern (runtime/gbnf.h)
  bool reasoning = false;         // prompted reasoning first: a structured answer follows </think>
};

// The request's constraint, or nullptr when it has none. Errors: InvalidArgument naming the
// schema keyword ("tools[0].input_schema: $.properties.x.pattern: ...").
Result<std::shared_ptr<TokenConstraint>> BuildOutputConstraint(const ConstraintRequest& req,
                                                               std::shared_ptr<const TokenMasker> masker);

}  // namespace mr::server
