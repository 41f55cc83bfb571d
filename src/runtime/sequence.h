// One sequence's generation as a step machine, so that several sequences can share one batched
// forward pass (the server's engine) and a single sequence can run alone (Generator):
//
//   seq.Start(prompt, params, prefix_cache);
//   while (!seq.done()) {
//     StepRows r = seq.NextRows(max_rows);          // a prefill chunk, or pending token + drafts
//     if (seq.done()) break;                       // e.g. the context is full
//     model.Forward(seq.kv(), r.tokens, r.n, r.all_logits, logits)   // or one ForwardBatch row group
//     seq.Consume(logits, on_token);              // samples / verifies, emits, may stop
//   }
//
// Prefill: the prompt is evaluated in chunks (the caller bounds each one), after reusing the KV
// of the longest common prefix with what this sequence's cache already holds and, beyond that,
// what the prefix cache holds (at least the last prompt token is always evaluated: its logits
// start the decode). When prefill ends the prompt's whole blocks are stored in the prefix cache.
//
// Decode: each step feeds the pending token (sampled, not yet in the KV cache) plus, with a
// drafter, k draft tokens as k+1 rows; VerifyDraft (speculative.h) keeps the exact-rule prefix
// plus one more token, so the output has the law of plain sampling (greedy: the same tokens).
// The KV cache is cut back to the tokens kept. A CostController, kept across requests, picks k
// per step (0 = a plain step).
//
// Thread-safety: none; a Sequence belongs to the thread that owns the Model.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "model/model.h"
#include "runtime/constraint.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace mr {

class PrefixCache;

// Speculative decoding of one request. The drafter is not owned and must outlive the request.
struct SpecParams {
  Drafter* drafter = nullptr;  // nullptr: plain decoding
  // Most draft tokens per step (k). < 0: adaptive with at most kDefaultDraftTokens. (The
  // MERERUN_DRAFT_TOKENS variable is read in app/, spec_config.h.)
  int draft_tokens = -1;
  bool adaptive = true;  // the cost controller picks k in 0..draft_tokens per step
};
constexpr int kDefaultDraftTokens = 7;
// The effective (k, adaptive) of `spec`.
std::pair<int, bool> ResolveDraftTokens(const SpecParams& spec);

struct GenerateParams {
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seeded = false;          // false: a fresh random seed per request
  int64_t max_tokens = 256;     // generated + injected tokens; 0: evaluate (and cache) the prompt only
  int64_t prefill_chunk = 256;  // rows per Forward during prefill (cancellation point)
  SpecParams spec;              // speculative decoding; off unless spec.drafter is set
  // Grammar-constrained decoding (constraint.h): every sampled and verified row is masked with
  // the constraint's state at that row. The constraint is this request's (its state advances).
  std::shared_ptr<TokenConstraint> constraint;
  // Logit bias and repetition penalties (sampler.h), applied to every sampled and verified row
  // (a verify row counts the drafts before it as generated).
  LogitAdjust adjust;
  // >= 0: each emitted token's log-probability and this many alternatives (TokenLogprob),
  // readable through Sequence::token_logprob() while on_token runs.
  int logprobs = -1;
  // >= 0: the log-probability of every prompt token under the model (and this many
  // alternatives; the first token has none: NaN, no alternatives), from all rows of the prefill (no KV reused, prefill
  // in chunks of at most kPromptLogprobRows rows so the logits stay small); read with Sequence::prompt_logprobs().
  int prompt_logprobs = -1;
  // Not kNone: the prompt's embedding, pooled this way from every prompt row's output-normed
  // hidden state (Model::BatchSeq::hidden); no KV is reused and none is stored in the prefix
  // cache. Read with Sequence::embedding() once prefill is done (usually with max_tokens 0).
  Pooling embed = Pooling::kNone;
};

// Rows per prefill Forward when prompt log-probabilities are wanted (the logits of every row are
// kept: 64 x 152k floats = 39 MB for Qwen's vocabulary).
inline constexpr int64_t kPromptLogprobRows = 64;

enum class StopCause {
  kEndOfGeneration,  // the model produced an end-of-generation token (not reported to on_token)
  kMaxTokens,
  kCallback,     // on_token returned false (stop sequence, tool call complete, ...)
  kCancelled,    // cancelled
  kContextFull,  // the KV cache has no room for another token
};
const char* StopCauseName(StopCause c);

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;   // prompt tokens whose KV was kept (own cache or prefix cache)
  int64_t cache_restored = 0;  // of them, copied from the prefix cache
  int64_t generated = 0;       // tokens passed to on_token
  int64_t injected = 0;        // tokens added by Inject (count against max_tokens)
  TokenId eog_token = -1;      // the end-of-generation token when stop == kEndOfGeneration
  double prefill_s = 0.0;      // Start -> first sampled token (excluding reused tokens)
  double decode_s = 0.0;       // from the first sampled token to the stop
  StopCause stop = StopCause::kMaxTokens;
  // Speculative decoding (zero when off).
  int64_t spec_steps = 0;   // verify passes with at least one draft
  int64_t plain_steps = 0;  // one-row steps
  int64_t drafted = 0;      // draft tokens verified
  int64_t accepted = 0;     // of them accepted
  double draft_s = 0.0;     // time in the drafter (included in decode_s)
  // Per draft position i (0-based): drafts verified there, and accepted.
  std::vector<int64_t> proposed_at, accepted_at;
};

class Sequence {
 public:
  // Returns false to stop generation after this token.
  using TokenFn = std::function<bool(TokenId)>;

  struct StepRows {
    const TokenId* tokens = nullptr;
    int64_t n = 0;
    bool all_logits = false;  // logits wanted for every row (verify) or the last one only
    float* hidden = nullptr;  // where the rows' hidden states go (n, d_model), when embedding
  };

  Sequence(Model& model, int64_t n_ctx);

  // Begins a request (any previous one is over). Errors: an empty prompt, one that does not
  // fit the context, token ids outside the vocabulary. `cache` (optional, not owned) is read
  // now and written when prefill ends and in Finish().
  Status Start(std::span<const TokenId> prompt, const GenerateParams& params, PrefixCache* cache = nullptr);

  // The rows of the next step, at most max_rows (>= 1): a prefill chunk, or the pending token
  // plus drafts (the drafter runs here). Sets done() instead when no step is possible (the
  // context is full). The rows stay valid until Consume.
  Result<StepRows> NextRows(int64_t max_rows);
  // Consumes the logits of the rows NextRows gave (n rows when all_logits, else one row of
  // n_vocab), after the caller ran them through the model on kv(). Emits tokens to on_token.
  Status Consume(const float* logits, const TokenFn& on_token);

  // Ends the request now (cancellation); the KV keeps what it holds.
  void Cancel();
  // After a kCallback or kMaxTokens-free stop: appends the last emitted token and `tokens` to
  // the sequence and resumes (they are prefilled by the next steps, then decoding goes on).
  // Counted against max_tokens. Only valid when done() and stop != kEndOfGeneration.
  void Inject(std::span<const TokenId> tokens);
  // Stores the whole KV (prompt and output) in the prefix cache given to Start, if any.
  void StoreInCache();

  bool done() const { return done_; }
  bool prefilling() const { return feed_pos_ < static_cast<int64_t>(feed_.size()); }
  // Prompt tokens still to evaluate.
  int64_t prefill_left() const { return static_cast<int64_t>(feed_.size()) - feed_pos_; }
  const GenerateStats& stats() const { return stats_; }
  KvCache& kv() { return kv_; }
  const KvCache& kv() const { return kv_; }
  Model& model() { return model_; }
  int64_t n_ctx() const { return kv_.n_ctx; }
  // Tokens whose KV is in the cache.
  const std::vector<TokenId>& cached_tokens() const { return tokens_; }
  void ResetCache() {
    tokens_.clear();
    kv_.n_past = 0;
  }
  // During on_token, with params.logprobs >= 0: the emitted token's log-probability (else null).
  const TokenLogprob* token_logprob() const { return params_.logprobs >= 0 ? &logprob_ : nullptr; }
  // With params.prompt_logprobs >= 0: one entry per prompt token (the first's value NaN), filled
  // as the prefill goes (complete once decoding starts).
  const std::vector<TokenLogprob>& prompt_logprobs() const { return prompt_logprobs_; }
  // With params.embed set: the pooled embedding (d_model floats, not normalized), complete once
  // prefill is done.
  const std::vector<float>& embedding() const { return embedding_; }
  // Frees the KV memory (the cache is then empty).
  void ReleaseCache();
  const CostController& controller() const { return controller_; }
  int last_draft_rows() const { return last_draft_; }
  // Draft rows the next decode step would like (the controller's next choice, without
  // committing to it): what a batching engine reserves for this sequence. 0 without a drafter.
  int wanted_draft_rows() const;
  // The rest of the batch this sequence's next step shares (other sequences' rows, and how
  // many of them decode): the cost controller then prices drafts at the batch's margin
  // (CostController::SetBatch). A batching engine sets it before NextRows and before Consume.
  void SetBatch(int64_t other_rows, int64_t other_decoders);

 private:
  using Clock = std::chrono::steady_clock;
  void Finish(StopCause cause);
  // Emits run_ (run_[j] drawn from the logits row at logits + j * row_stride); stopping at
  // run_[j] leaves the KV holding the context before run_[j].
  void Emit(int64_t kv_before_run, const float* logits, int64_t row_stride, const TokenFn& on_token);
  int64_t budget_left() const { return params_.max_tokens - stats_.generated - stats_.injected; }
  // The logits of one row as sampling sees them: params_.adjust (with `drafts`, the tokens
  // between the last emitted one and this row, counted as generated) and then the constraint
  // `c` applied. The input itself when neither applies; else an adjusted copy in masked_.
  const float* Adjusted(const float* logits, const TokenConstraint* c, std::span<const TokenId> drafts = {});

  Model& model_;
  KvCache kv_;
  GenerateParams params_;
  PrefixCache* cache_ = nullptr;
  GenerateStats stats_;
  std::vector<TokenId> tokens_;  // KV contents
  std::vector<TokenId> feed_;    // tokens to prefill: feed_[feed_pos_..] are not in the KV yet
  int64_t feed_pos_ = 0;
  bool done_ = true;
  bool decode_started_ = false;
  bool have_pending_ = false;
  TokenId pending_ = -1;
  TokenId last_emitted_ = -1;
  // The step in flight.
  enum class StepKind { kNone, kPrefill, kPlain, kVerify } step_ = StepKind::kNone;
  int64_t step_n_ = 0;
  Clock::time_point t_start_, t_decode_, t_forward_;
  Sampler sampler_;
  Rng rng_{0};
  // Speculative decoding state, reused across steps and requests.
  Drafter* drafter_ = nullptr;
  CostController controller_;
  const Drafter* controller_drafter_ = nullptr;  // the controller's figures describe this drafter
  Draft draft_;
  int last_draft_ = 0;
  int64_t batch_other_rows_ = 0;           // SetBatch
  std::vector<TokenId> rows_;              // pending token + drafts
  std::vector<std::vector<Candidate>> p_;  // target distributions per verify row
  VerifyScratch verify_scratch_;
  std::vector<TokenId> run_;  // tokens a step produced
  // Constrained decoding: masked logits, the mask, and the constraint's state per verify row.
  std::vector<float> masked_;
  std::vector<uint8_t> mask_;
  std::vector<TokenConstraint> row_constraints_;
  // Occurrences of each generated token (LogitAdjust's frequency and presence penalties), the
  // distinct tokens of prompt and output (its repetition penalty), and the emitted token's
  // log-probability (token_logprob).
  std::unordered_map<TokenId, int> counts_;
  std::unordered_set<TokenId> seen_;
  std::vector<TokenLogprob> prompt_logprobs_;
  TokenLogprob logprob_;
  // Embeddings: the step's hidden states, the running sum (mean pooling) and the result.
  std::vector<float> hidden_;
  std::vector<double> embed_sum_;
  std::vector<float> embedding_;
  void PoolHidden();  // folds hidden_ (the prefill step's rows) into the embedding
};

}  // namespace mr
