// llama.cpp's own server endpoints, for the clients written against llama-server: editor plugins
// (llama.vscode, llama.vim: /infill), scripts (/completion) and tools (/tokenize, /detokenize,
// /props). Requests map onto a raw-prompt ChatRequest (no chat template); the response is
// llama.cpp's shape: content, stop, stop_type, timings, tokens_cached... (docs/api.md).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/chat_session.h"

namespace mr::server {

struct LlamaOptions {
  bool stream = false;
  bool infill = false;  // /infill (else /completion)
  std::string model;
  int n_probs = 0;                           // > 0: completion_probabilities with this many alternatives
  bool return_tokens = false;                // the ids in `tokens` (a streamed chunk always has its own)
  std::vector<std::string> response_fields;  // non-empty: only these (a/b takes b out of a)
  std::vector<std::string> samplers;         // as the request named them (generation_settings)
  int min_indent = 0;
  int64_t max_predict_ms = 0;
};

// POST /completion (`infill` false) and /infill: prompt (a string, token ids, or both mixed), or
// input_prefix / input_suffix / input_extra / prompt; n_predict, samplers and the sampling
// fields. Active options mererun does not implement (mirostat, DRY, XTC, typical-p, dynamic
// temperature, LoRA, images, GBNF grammars) get a 400 naming the field.
std::optional<ApiError> ParseLlamaCompletion(const nlohmann::ordered_json& body, const ServedModel& sm, bool infill,
                                             ChatRequest* req, LlamaOptions* opts);

// The response: a stream of `data: {content, tokens, stop: false, ...}` chunks ending with the
// full result (stop: true); or that result alone.
class LlamaWriter {
 public:
  LlamaWriter(LlamaOptions opts, const ServedModel& sm, const PreparedChat& prepared);
  std::string Start() { return ""; }
  bool streaming() const { return opts_.stream; }
  std::string Event(const StreamEvent& ev);  // a chunk when streaming ("" otherwise)
  nlohmann::ordered_json Result();           // after kDone

 private:
  nlohmann::ordered_json Probabilities(const std::vector<TokenLogprob>& lps) const;
  nlohmann::ordered_json Filtered(nlohmann::ordered_json full) const;  // response_fields

  LlamaOptions opts_;
  const Tokenizer& tok_;
  int64_t n_ctx_ = 0;
  nlohmann::ordered_json settings_;
  std::string prompt_text_;
  bool trimmed_ = false;
  std::string content_;
  bool has_new_line_ = false;
  std::vector<TokenId> tokens_;
  nlohmann::ordered_json probs_ = nlohmann::ordered_json::array();       // every token's
  nlohmann::ordered_json last_probs_ = nlohmann::ordered_json::array();  // streamed: the last chunk's
  int64_t predicted_ = 0;
  int64_t evaluated_ = 0;
  StreamEvent done_;
};

// POST /tokenize {content, add_special, parse_special, with_pieces} -> {tokens}.
std::optional<ApiError> LlamaTokenize(const nlohmann::ordered_json& body, const ServedModel& sm,
                                      nlohmann::ordered_json* out);
// POST /detokenize {tokens} -> {content}.
std::optional<ApiError> LlamaDetokenize(const nlohmann::ordered_json& body, const ServedModel& sm,
                                        nlohmann::ordered_json* out);
// GET /props: the context, the default sampling, the slots and the model.
nlohmann::ordered_json LlamaProps(const ServedModel& sm, int64_t slots);

}  // namespace mr::server
