// The Anthropic Messages API: request parsing into a ChatRequest and the response writer
// (one JSON message, or the SSE event sequence). docs/api.md lists every field and its status.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/chat_session.h"

namespace mr::server {

struct AnthropicOptions {
  bool stream = false;
  std::string model;              // echoed in responses (any id maps to the served model)
  bool thinking_omitted = false;  // thinking.display == "omitted": blocks carry no text
  // The response's context_management ({"applied_edits": [...]}), when the request had one.
  nlohmann::ordered_json context_management;
};

// Parses a POST /v1/messages body (count_only: /v1/messages/count_tokens, where max_tokens is
// not required). Unknown fields are ignored; known ones the server cannot honour are refused
// with a 400 naming the field.
std::optional<ApiError> ParseAnthropicRequest(const nlohmann::ordered_json& body, const ServedModel& sm,
                                              bool count_only, ChatRequest* req, AnthropicOptions* opts);

// Builds the response from StreamEvents: Message() for a non-streaming request, or the SSE text
// of each event (Start, then Event for each StreamEvent).
class AnthropicWriter {
 public:
  AnthropicWriter(const ServedModel& sm, AnthropicOptions opts, int64_t input_tokens);  // the whole prompt

  std::string Start();  // message_start
  static std::string Ping();
  // SSE text for one event; kDone closes the message (message_delta, message_stop).
  std::string Event(const StreamEvent& ev);
  nlohmann::ordered_json Message() const;  // the whole message (after kDone)

  static std::string Sse(const char* event, const nlohmann::ordered_json& data);

 private:
  enum class Block { kNone, kText, kThinking, kToolUse };
  std::string OpenBlock(Block b, nlohmann::ordered_json start);
  std::string CloseBlock();
  // Anthropic usage: input_tokens is the prompt less the cached parts, so input +
  // cache_creation + cache_read = the prompt. Before kDone (message_start) nothing is known of
  // the cache: all prompt tokens count as input.
  nlohmann::ordered_json Usage() const;

  const ServedModel& sm_;
  AnthropicOptions opts_;
  std::string id_;
  nlohmann::ordered_json content_ = nlohmann::ordered_json::array();
  Block open_ = Block::kNone;
  int64_t input_tokens_ = 0;
  int64_t output_tokens_ = 0;
  int64_t cache_read_tokens_ = 0;
  int64_t cache_creation_5m_tokens_ = 0;
  int64_t cache_creation_1h_tokens_ = 0;
  std::string stop_reason_;
  nlohmann::ordered_json stop_sequence_;  // null or the string
};

}  // namespace mr::server
