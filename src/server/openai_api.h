// The OpenAI Chat Completions API: request parsing into a ChatRequest and the response writer
// (one chat.completion object, or chat.completion.chunk SSE lines ending with [DONE]); and the
// legacy text completions (/v1/completions, a raw prompt: text_completion objects).
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
  bool echo = false;  // /v1/completions: the prompt's text opens the output
  // n: choices generated independently (each its own sequence); each writer writes one, with
  // index `index`, and all share `id`. choice_of_many: the last chunk leaves the usage chunk and
  // [DONE] to EndOfChoices, called once every choice has finished.
  int n = 1;
  int index = 0;
  bool choice_of_many = false;
  std::string id;  // empty: a new one
};

inline constexpr int kMaxChoices = 16;

// The fields both OpenAI endpoints share (llama.cpp's too, their own spellings mapped to these):
// stream, stream_options, max_tokens, stop, temperature, top_p, seed, n, logit_bias (an object),
// metadata, user, and vLLM's and llama.cpp's top_k, min_p, repetition/repeat_penalty and
// frequency/presence_penalty.
std::optional<ApiError> ParseOpenAICommon(const nlohmann::ordered_json& body, ChatRequest* req, OpenAIOptions* opts);

// Output formats beyond response_format: llama.cpp's `grammar` (GBNF, runtime/gbnf.h), vLLM's
// guided_grammar, guided_choice (GbnfChoice), guided_regex (RegexExpr) and guided_json, and the
// same under vLLM's newer `structured_outputs` {grammar, choice, regex, json, json_object}. One
// format per request: a second one (response_format or llama.cpp's json_schema included, when
// parsed first) is a 400. The grammar or pattern itself is compiled, and its errors reported, by
// BuildOutputConstraint.
std::optional<ApiError> ParseGuidedOutput(const nlohmann::ordered_json& body, ChatRequest* req);

std::optional<ApiError> ParseOpenAIRequest(const nlohmann::ordered_json& body, const ServedModel& sm, ChatRequest* req,
                                           OpenAIOptions* opts);

// The chat and Responses APIs' log-probabilities of tokens: per token {token, logprob, bytes,
// top_logprobs: [{token, logprob, bytes}]}.
nlohmann::ordered_json OpenAILogprobContent(const Tokenizer& tok, const std::vector<TokenLogprob>& lps);

// What both OpenAI writers keep: the response's identity, its usage counts, its finish reason
// and the log-probabilities no chunk has carried yet.
class OpenAIWriterBase {
 protected:
  OpenAIWriterBase(OpenAIOptions opts, const char* id_prefix, int64_t input_tokens);
  // Every event: its log-probabilities, and the counts of kStarted and kDone (kDone's finish).
  void Note(const StreamEvent& ev);
  // prompt_tokens_details.cached_tokens: prompt tokens whose KV was reused (prefix cache).
  nlohmann::ordered_json Usage() const;
  // After the last choice chunk: the usage chunk (stream_options.include_usage) and [DONE].
  std::string StreamEnd(const char* object) const;

 public:
  // choice_of_many: the end of the stream, with every choice's output tokens counted.
  std::string EndOfChoices(const char* object, int64_t output_tokens);
  const std::string& id() const { return id_; }

 protected:
  OpenAIOptions opts_;
  std::string id_;
  int64_t created_ = 0;
  int64_t input_tokens_ = 0;
  int64_t output_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  std::string finish_;
  std::vector<TokenLogprob> lp_pending_;  // not yet in a chunk
};

class OpenAIWriter : public OpenAIWriterBase {
 public:
  static constexpr const char* kChunkObject = "chat.completion.chunk";
  OpenAIWriter(OpenAIOptions opts, int64_t input_tokens);
  std::string Start();                       // the first chunk (role)
  std::string Event(const StreamEvent& ev);  // kDone also writes the usage chunk and [DONE]
  nlohmann::ordered_json Completion();

 private:
  std::string Chunk(nlohmann::ordered_json delta, const nlohmann::ordered_json& finish);
  // choices[].logprobs of a chunk: {"content": [...]} of the tokens since the last chunk (null
  // when logprobs are off).
  nlohmann::ordered_json TakeLogprobs();

  std::string content_;
  std::string reasoning_;
  nlohmann::ordered_json tool_calls_ = nlohmann::ordered_json::array();
  nlohmann::ordered_json lp_content_ = nlohmann::ordered_json::array();  // every token's (Completion)
};

// /v1/completions: prompt (a string, or token ids; one prompt per request), suffix (fill in the
// middle), echo, logprobs (an integer: alternatives per token) and the chat endpoint's sampling.
std::optional<ApiError> ParseCompletionRequest(const nlohmann::ordered_json& body, const ServedModel& sm,
                                               ChatRequest* req, OpenAIOptions* opts);

class CompletionWriter : public OpenAIWriterBase {
 public:
  static constexpr const char* kChunkObject = "text_completion";
  // `echo`: the prompt's text when the request asked for it (it opens the output), else "".
  CompletionWriter(OpenAIOptions opts, int64_t input_tokens, std::string echo);
  std::string Start();  // the echoed prompt's chunk, or nothing
  std::string Event(const StreamEvent& ev);
  nlohmann::ordered_json Completion();

 private:
  std::string Chunk(const std::string& text, const nlohmann::ordered_json& finish);
  // choices[].logprobs in the legacy shape ({tokens, token_logprobs, top_logprobs, text_offset})
  // of the tokens since the last chunk; null when logprobs are off.
  nlohmann::ordered_json TakeLogprobs();
  // echo with logprobs: the prompt's entries (kDone's prompt_logprobs) go before the output's.
  void AddPromptLogprobs(const std::vector<TokenLogprob>& prompt);

  std::string text_;
  int64_t offset_ = 0;             // characters before the next token (text_offset)
  nlohmann::ordered_json lp_all_;  // every token's, for Completion()
};

}  // namespace mr::server
