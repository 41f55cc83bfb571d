// API-neutral chat generation: a ChatRequest (what the Anthropic and OpenAI layers parse their
// bodies into) becomes a prompt and an EngineJob whose callbacks decode tokens, run the
// OutputParser and hand StreamEvents to the request's channel. The HTTP thread serializes them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/chat_format.h"
#include "server/api_error.h"
#include "server/engine.h"
#include "server/output_constraint.h"
#include "server/output_parser.h"
#include "server/tool_search.h"

namespace mr::server {

// Appended to the system prompt for structured outputs (the schema follows the first).
inline constexpr const char* kJsonSchemaInstruction =
    "\n\nAnswer only with a JSON object that conforms to this JSON schema, with concise values:\n";
inline constexpr const char* kJsonObjectInstruction = "\n\nAnswer only with a JSON object.";

// An Anthropic cache_control breakpoint as the request parser saw it: the request truncated right
// after the marked block. PrepareChat renders that truncated request and maps it to the token
// index where the full prompt's prefix up to and including the block ends (CacheBreakpoint).
struct CacheCut {
  size_t n_messages = 0;               // ChatRequest::messages[0, n_messages) kept whole,
  std::optional<ChatMessage> partial;  // then this one: the marked message up to its block
  size_t n_tools = SIZE_MAX;           // tools kept (a tool breakpoint keeps those up to it)
  bool one_hour = false;               // ttl "1h"
};

// One context_management edit (Anthropic's context editing), applied by PrepareChat before the
// prompt is rendered.
struct ContextEdit {
  enum class Kind { kClearToolUses, kClearThinking };
  Kind kind = Kind::kClearToolUses;
  // clear_tool_uses_20250919: when the prompt has more than trigger_value input tokens (or tool
  // uses), the results of all but the `keep` most recent tool uses are replaced by a placeholder
  // (their inputs too when asked), unless fewer than clear_at_least tokens would go.
  int64_t trigger_value = 100000;
  bool trigger_on_tool_uses = false;
  int64_t keep = 3;  // clear_thinking_20251015: assistant turns whose reasoning stays; -1: all
  int64_t clear_at_least = 0;
  std::vector<std::string> exclude_tools;
  bool clear_all_inputs = false;
  std::vector<std::string> clear_inputs_of;
};

// What replaces a cleared tool result.
inline constexpr const char* kClearedToolResult = "[tool result cleared to save context]";

// OpenAI /v1/completions: a prompt without a chat template. The text is tokenized as text (no
// control token comes from it); a token-array prompt is used as it is; with a suffix the model's
// fill-in-the-middle markers frame the two (prefix, suffix, then the middle to generate).
// A file of the project that /infill's repository-level prompt shows before the one edited.
struct InfillFile {
  std::string name;
  std::string text;
};

struct RawPrompt {
  bool on = false;
  std::string text;
  std::vector<TokenId> ids;  // a token-array prompt (then `text` is empty)
  std::optional<std::string> suffix;
  // /infill (llama.cpp's): `text` is the code before the cursor, `suffix` the code after it,
  // `middle` what follows <fim_middle> (the current line's start), `extra` the other files; each
  // is trimmed to fit the context (the prefix loses its start, the suffix its end, the files their
  // oldest), and PreparedChat::prompt_trimmed says so.
  bool infill = false;
  std::string middle;
  std::vector<InfillFile> extra;
};

struct ChatRequest {
  RawPrompt raw;  // on: no messages, template, tools or reasoning (`format` still constrains)
  std::vector<ChatMessage> messages;
  std::vector<CacheCut> cache_cuts;  // in request order (tools, system, messages); at most 4
  ChatRenderOptions render;          // tools, system suffix, assistant prefix, continue_final
  bool parse_tool_calls = false;
  bool single_tool_call = false;  // stop after the first complete call
  // kAny / kTool: the call is forced (the prompt ends inside it; PrepareChat adds the opening).
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string forced_tool;  // kTool
  OutputFormat format = OutputFormat::kText;
  nlohmann::ordered_json format_schema;  // kJsonSchema
  std::string format_grammar;            // kGrammar: GBNF (llama.cpp `grammar`, vLLM guided_*); kRegex: pattern
  std::vector<std::string> stop_sequences;
  int64_t max_tokens = -1;  // -1: up to the context
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<uint64_t> seed;
  // Raw prompts (llama.cpp's /completion, /infill): t_max_predict_ms (once a newline is out,
  // generation stops this long after its first token), n_indent (OutputParser::Options::
  // min_indent), return_tokens (StreamEvent::tokens).
  int64_t max_predict_ms = 0;
  int min_indent = 0;
  bool token_ids = false;
  bool infill_sampler = false;  // SamplingParams::infill (llama.cpp's samplers: ["infill"])
  LogitAdjust adjust;  // OpenAI logit_bias, frequency/presence_penalty, repetition_penalty (ids checked by PrepareChat)
  int logprobs = -1;   // OpenAI logprobs (>= 0: on, with this many top_logprobs)
  int prompt_logprobs = -1;     // /v1/completions echo + logprobs: the prompt's too
  int64_t thinking_budget = 0;  // > 0: reasoning of at most this many tokens
  // Adaptive thinking: the model decides whether to reason (a section it opens itself at the
  // start of its answer, capped by thinking_budget); no instruction, no opened section.
  // Otherwise a budget means prompted reasoning (the instruction, the turn opened inside it).
  bool thinking_adaptive = false;
  // Tool search: the server tool and the defer_loading catalog; loaded_tools are the deferred
  // tools the history's tool_reference blocks loaded (callable, defined in the prompt there).
  ToolSearchConfig tool_search;
  std::vector<ChatTool> loaded_tools;
  bool context_management = false;  // the request had context_management (the response reports it)
  std::vector<ContextEdit> context_edits;
};

// What the served model is, as the API layers need it.
struct ServedModel {
  Model* model = nullptr;
  Engine* engine = nullptr;
  ServerMetrics* metrics = nullptr;  // optional
  std::string id;                    // the name clients see (catalog name or file stem)
  ChatFamily family = ChatFamily::kChatML;
  SamplingParams default_sampling;
  int64_t n_ctx = 0;
  int64_t max_output_tokens = 0;  // > 0: every request's max_tokens is clamped to this too
  int64_t created_unix = 0;
  std::string signing_key;  // HMAC key for thinking signatures
  // The vocabulary's token masks for constrained decoding (built at start-up by serve; when
  // null, a request that needs one builds it).
  std::shared_ptr<const TokenMasker> masker;
  // Speculative decoding as configured (reported in /health): drafter and draft length names.
  std::string drafter = "off";
  std::string draft_tokens = "auto";
  // The numerics- and scheduling-affecting MERERUN_* variables that are set (/health).
  std::map<std::string, std::string> environment;
  // What this replica is (model file digest and every answer-changing setting) and its short
  // hash: /health shows both, and `/health?identity=HASH` fails (409) on another replica, so a
  // load balancer's check keeps a differently configured replica out (docs/deploy.md).
  nlohmann::ordered_json identity = nlohmann::ordered_json::object();
  std::string identity_hash;
  // How embeddings are pooled (embeddings_api.h): the file's pooling type, else serve --pooling.
  Pooling pooling = Pooling::kMean;
};

struct PreparedChat {
  std::vector<TokenId> prompt;
  int64_t max_tokens = 0;  // after clamping to the context
  GenerateParams params;
  OutputParser::Options parser;
  int64_t thinking_budget = 0;
  bool single_tool_call = false;
  bool forced_tool_call = false;
  ChatFamily family = ChatFamily::kChatML;
  ToolSearchConfig tool_search;
  // The constraint's inputs, for rebuilding it when a search loads tools mid-generation.
  ConstraintRequest constraint_request;
  std::shared_ptr<const TokenMasker> masker;
  std::vector<CacheBreakpoint> cache_breakpoints;  // sorted by end, distinct ends
  int choice = 0;                                  // of the request's n (OpenAI), on every event
  bool prompt_trimmed = false;                     // RawPrompt::infill: a part was cut to fit
  int64_t max_predict_ms = 0;                      // ChatRequest's
  bool token_ids = false;
  // With context_management: {"applied_edits": [...]} (and original_input_tokens, which
  // count_tokens reports); null otherwise.
  nlohmann::ordered_json context_management;
};

// The request truncated right after `cut`'s block, rendered without its generation prompt.
RenderedChat RenderCacheCut(const ServedModel& sm, const ChatRequest& req, const CacheCut& cut);

// Tokens of `r.text` from byte `from_char` on: control tokens only from the template's
// scaffolding, the request's content (r.literal) as text (Tokenizer::EncodeTemplated).
std::vector<TokenId> EncodePrompt(const ServedModel& sm, const RenderedChat& r, size_t from_char, bool add_special);

// The token index where `prompt` (the tokens of `rendered`) has its prefix up to and including
// each cut's block end: the longest common prefix of `prompt` and the tokenized render of the
// request truncated after that block (generation prompt left off). Sorted by end; cuts landing on
// the same end are merged (1h wins).
std::vector<CacheBreakpoint> MapCacheCuts(const ServedModel& sm, const ChatRequest& req, const RenderedChat& rendered,
                                          const std::vector<TokenId>& prompt);

// Renders and tokenizes (and maps cache_control breakpoints to token indices). Errors: a
// rendered text over 16 bytes per context token (400, before tokenization; count_tokens too);
// when `for_generation`, a prompt longer than the context (400 "prompt is too long: N tokens >
// M maximum"). max_tokens
// beyond the context is clamped, never refused.
std::optional<ApiError> PrepareChat(const ServedModel& sm, ChatRequest req, PreparedChat* out,
                                    bool for_generation = true);

// Choice `choice` (> 0) of a request for several (OpenAI's n): a copy of `first` with a grammar
// constraint of its own (a constraint holds one generation's state) and, when seeded, seed + choice.
std::optional<ApiError> PrepareChoice(const PreparedChat& first, int choice, PreparedChat* out);

enum class FinishReason { kEndTurn, kMaxTokens, kStopSequence, kToolUse, kCancelled };

struct StreamEvent {
  // kStarted: the request got its sequence slot; the prompt and cache counts below are final
  // (Anthropic's message_start waits for it, so its usage is the real one).
  // kServerTool: a call of the tool search server tool, run by the server (call, server_result).
  enum class Kind { kStarted, kText, kReasoning, kToolCall, kServerTool, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;
  ChatToolCall call;
  // With logprobs requested: the log-probabilities of the tokens generated since the previous
  // event (kText, kReasoning, kToolCall, kServerTool, or kDone for those no event showed).
  std::vector<TokenLogprob> logprobs;
  // kDone, when the request asked for them: one per prompt token (the first's value NaN).
  std::vector<TokenLogprob> prompt_logprobs;
  // With ChatRequest::token_ids: the ids generated since the previous event (as logprobs).
  std::vector<TokenId> tokens;
  int choice = 0;                        // PreparedChat::choice
  nlohmann::ordered_json server_result;  // kServerTool: the tool_search_tool_result's content
  // kStarted and kDone (the counts), kDone (the rest):
  FinishReason finish = FinishReason::kEndTurn;
  std::string stop_sequence;
  int64_t input_tokens = 0;  // the whole prompt
  int64_t output_tokens = 0;
  int64_t cache_read_tokens = 0;         // of input_tokens: KV reused
  int64_t cache_creation_5m_tokens = 0;  // of input_tokens: evaluated and cached (5m, 1h)
  int64_t cache_creation_1h_tokens = 0;
  // kDone: the engine's timing of this request (the x-mererun-* response headers).
  double prefill_s = 0.0, decode_s = 0.0;
  int64_t generated = 0, drafted = 0, accepted = 0;
  std::vector<int64_t> proposed_at, accepted_at;
  uint64_t peak_rss_bytes = 0, kv_peak_bytes = 0, process_peak_rss_bytes = 0;  // JobResult's
  // kError:
  ApiError error;
};

// One request's events, engine thread -> HTTP thread.
class EventChannel {
 public:
  void Push(StreamEvent ev);
  // Waits up to `timeout`; false when nothing came.
  bool Pop(StreamEvent* ev, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> q_;
};

// Submits the generation; events (ending with one kDone or kError) arrive on `channel`.
// Errors: 529 overloaded when the engine's queue is full.
// The error a client gets when the engine refuses a job (429 queue full, 529 overloaded);
// nullopt when it was queued.
std::optional<ApiError> AdmissionError(const SubmitResult& sr);
// The error a client gets when the engine ends a job with `error`: overloaded (529, retried by
// clients) when shutting down, else an API error.
ApiError EngineFailure(const mr::Status& error);

std::optional<ApiError> StartChat(const ServedModel& sm, PreparedChat prepared, std::shared_ptr<EventChannel> channel,
                                  std::shared_ptr<EngineJob>* job_out);

// Complete UTF-8 prefix length of s (a trailing partial character is left for later).
size_t CompleteUtf8Prefix(std::string_view s);

// "prefix" + n random alphanumerics (ids of messages and tool calls).
std::string RandomId(const char* prefix, int n = 24);

// Whether the served model reasons natively: a template with enable_thinking (Qwen3) or gpt-oss's
// harmony. Such a model's reasoning is turned on by ChatRequest::thinking_budget (off without it).
bool ReasonsNatively(const ServedModel& sm);

}  // namespace mr::server
