// The OpenAI Responses API (/v1/responses), which the current OpenAI SDKs, the Agents SDK and
// Codex CLI speak: typed input items (messages, function calls and their outputs, reasoning)
// instead of chat messages, flat function tools, `text.format` for structured output, and a
// stream of typed events (response.created ... response.completed) in place of chunks.
//
// A request is translated into a Chat Completions body and parsed by ParseOpenAIRequest, so the
// sampling, tool and constraint rules are that endpoint's. Responses are stored in memory
// (`store`, default true, as OpenAI's) for `previous_response_id`, GET and DELETE: a bounded store,
// the oldest dropped first, gone when the server restarts (docs/api.md).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/api_error.h"
#include "server/chat_session.h"

namespace mr::server {

// What is kept of a stored response: the response object, and the input items it answered (the
// previous responses' inputs and outputs first, when it continued one).
struct StoredResponse {
  nlohmann::ordered_json response;
  nlohmann::ordered_json input_items;
};

// Thread-safe, bounded by count and by bytes (the JSON text of both parts); the oldest go first.
// A store of 0 bytes keeps nothing.
class ResponseStore {
 public:
  ResponseStore(size_t max_responses, size_t max_bytes) : max_responses_(max_responses), max_bytes_(max_bytes) {}
  // Stores (or replaces) `r` under r.response["id"]; one larger than the whole store is not kept.
  void Put(StoredResponse r);
  std::optional<StoredResponse> Get(const std::string& id) const;
  bool Delete(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    StoredResponse r;
    size_t bytes = 0;
  };
  bool EraseLocked(const std::string& id);
  mutable std::mutex mu_;
  size_t max_responses_, max_bytes_;
  size_t bytes_ = 0;
  std::unordered_map<std::string, Entry> by_id_;
  std::deque<std::string> order_;  // the stored ids, oldest first
};

struct ResponsesOptions {
  bool stream = false;
  bool store = true;
  bool logprobs = false;  // include: ["message.output_text.logprobs"]
  const Tokenizer* tokenizer = nullptr;
  std::string model;
  // The request's settings the response object repeats (instructions, tools, tool_choice, text,
  // reasoning, temperature, top_p, max_output_tokens, previous_response_id, metadata, ...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  // Every input item of this response (the previous response's conversation and output first),
  // each with an id: what `store` keeps and GET .../input_items lists.
  nlohmann::ordered_json input_items = nlohmann::ordered_json::array();
  // Tools listed inside a namespace tool: name -> namespace (their calls carry `namespace`).
  std::map<std::string, std::string> tool_namespace;
};

// POST /v1/responses (and /v1/responses/input_tokens, which only counts). `store` resolves
// previous_response_id; null: no store (then previous_response_id is refused).
std::optional<ApiError> ParseResponsesRequest(const nlohmann::ordered_json& body, const ServedModel& sm,
                                              const ResponseStore* store, ChatRequest* req, ResponsesOptions* opts);

// The response object and, streamed, its events (SSE with `event:` lines, each with a
// sequence_number): response.created, response.in_progress, then per output item
// output_item.added, its content events and output_item.done, and response.completed (or
// response.incomplete at max_output_tokens, response.failed on an engine error). The outcome is
// stored at the end when the request asked for it and `store` is given.
class ResponsesWriter {
 public:
  ResponsesWriter(ResponsesOptions opts, int64_t input_tokens, ResponseStore* store);
  std::string Start();  // response.created and response.in_progress (streamed), or nothing
  std::string Event(const StreamEvent& ev);
  // While nothing else was written for a while (queued, a long prefill, a long tool call): a
  // response.in_progress event with the response as it stands, so clients that time out an idle
  // stream (Codex CLI: stream_idle_timeout_ms, 5 minutes) keep waiting; "" once it has ended.
  std::string KeepAlive();
  nlohmann::ordered_json Response() const;  // the response object as it stands
  const std::string& id() const { return id_; }

 private:
  enum class Item { kNone, kMessage, kReasoning };
  std::string Emit(const char* type, nlohmann::ordered_json ev);
  std::string Open(Item kind);  // closes the open item first
  std::string Close();          // the open item's done events
  nlohmann::ordered_json Logprobs(const std::vector<TokenLogprob>& lps) const;

  ResponsesOptions opts_;
  ResponseStore* store_;
  std::string id_;
  int64_t created_ = 0, completed_at_ = 0;
  int64_t input_tokens_ = 0, output_tokens_ = 0, cached_tokens_ = 0, reasoning_tokens_ = 0;
  std::string status_ = "in_progress";
  nlohmann::ordered_json incomplete_details_;  // null unless max_output_tokens cut the answer
  nlohmann::ordered_json error_;               // null unless the engine failed
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  Item open_ = Item::kNone;
  std::string text_;  // the open item's text so far
  int64_t seq_ = 0;
};

// GET /v1/responses/{id}/input_items: a list object of the stored items; `order` "asc" or
// "desc" (the default), at most `limit` (1..100) items after the item `after` (empty: from the start).
std::optional<ApiError> ResponseInputItemList(const StoredResponse& r, const std::string& order, int64_t limit,
                                              const std::string& after, nlohmann::ordered_json* out);

}  // namespace mr::server
