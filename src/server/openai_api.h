// The OpenAI Chat Completions API: request parsing into a ChatRequest and the response writer
// (one chat.completion object, or chat.completion.chunk SSE lines ending with [DONE]).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/chat_session.h"

namespace mr::server {

struct OpenAIOptions {
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;
  // logprobs: true (with top_logprobs alternatives per token); the tokenizer names the tokens.
  bool logprobs = false;
  const Tokenizer* tokenizer = nullptr;
};

std::optional<ApiError> ParseOpenAIRequest(const nlohmann::ordered_json& body, const ServedModel& sm, ChatRequest* req,
                                           OpenAIOptions* opts);

class OpenAIWriter {
 public:
  OpenAIWriter(OpenAIOptions opts, int64_t input_tokens);
  std::string Start();                       // the first chunk (role)
  std::string Event(const StreamEvent& ev);  // kDone also writes the usage chunk and [DONE]
  nlohmann::ordered_json Completion();

 private:
  std::string Chunk(nlohmann::ordered_json delta, const nlohmann::ordered_json& finish);
  // choices[].logprobs of a chunk: {"content": [...]} of the tokens since the last chunk (null
  // when logprobs are off).
  nlohmann::ordered_json TakeLogprobs();
  nlohmann::ordered_json LogprobEntry(TokenId id, float logprob) const;
  // prompt_tokens_details.cached_tokens: prompt tokens whose KV was reused (prefix cache).
  nlohmann::ordered_json Usage() const;

  OpenAIOptions opts_;
  std::string id_;
  int64_t created_ = 0;
  int64_t input_tokens_ = 0;
  int64_t output_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  std::string content_;
  std::string reasoning_;
  nlohmann::ordered_json tool_calls_ = nlohmann::ordered_json::array();
  std::string finish_;
  std::vector<TokenLogprob> lp_pending_;                                 // not yet in a chunk
  nlohmann::ordered_json lp_content_ = nlohmann::ordered_json::array();  // every token's (Completion)
};

}  // namespace mr::server
