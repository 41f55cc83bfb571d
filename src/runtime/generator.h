// One sequence's generation loop on the engine thread: prefill in chunks, then decode token by
// token with the sampler, reusing the KV cache of the previous request's longest common token
// prefix. The server's engine thread owns one Generator per sequence slot.
//
// Speculative decoding (GenerateParams::spec.drafter set): each step the drafter proposes k
// tokens; the target evaluates the pending token plus the k drafts as k+1 rows of one Forward
// and VerifyDraft (speculative.h) keeps the exact-rule prefix plus one more token, so the output
// has the law of plain sampling (greedy: the same tokens). The KV cache is cut back to the
// tokens kept. A CostController, kept across requests, chooses k per step (0 = a plain step).
//
// Thread-safety: not thread-safe; a Generator belongs to the thread that owns the Model.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace mr {

// The model's default sampling: GGUF general.sampling.{temp,top_k,top_p,min_p} when present,
// else the model family's published generation defaults (Gemma 3: T 1.0, top-k 64, top-p 0.95;
// Qwen2.5: T 0.7, top-k 20, top-p 0.8; SmolLM2: T 0.2, top-p 0.9), else T 1.0 with no cut.
SamplingParams ModelDefaultSampling(const Model& model);

// Speculative decoding of one request. The drafter is not owned and must outlive the call.
struct SpecParams {
  Drafter* drafter = nullptr;  // nullptr: plain decoding
  // Most draft tokens per step (k). < 0: from MERERUN_DRAFT_TOKENS ("N" = fixed N, "auto" or
  // unset = adaptive with at most kDefaultDraftTokens).
  int draft_tokens = -1;
  bool adaptive = true;        // the cost controller picks k in 0..draft_tokens per step
};
constexpr int kDefaultDraftTokens = 7;
// The effective (k, adaptive) of `spec` after applying MERERUN_DRAFT_TOKENS.
std::pair<int, bool> ResolveDraftTokens(const SpecParams& spec);

struct GenerateParams {
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seeded = false;      // false: a fresh random seed per request
  int64_t max_tokens = 256;
  int64_t prefill_chunk = 256;  // rows per Forward during prefill (cancellation point)
  SpecParams spec;              // speculative decoding; off unless spec.drafter is set
};

enum class StopCause {
  kEndOfGeneration,  // the model produced an end-of-generation token (not reported to on_token)
  kMaxTokens,
  kCallback,         // on_token returned false (stop sequence, tool call complete, ...)
  kCancelled,        // cancelled() returned true
  kContextFull,      // the KV cache has no room for another token
};
const char* StopCauseName(StopCause c);

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;  // prompt tokens whose KV was kept from the previous request
  int64_t generated = 0;      // tokens passed to on_token
  TokenId eog_token = -1;     // the end-of-generation token when stop == kEndOfGeneration
  double prefill_s = 0.0;     // evaluating the prompt (excluding reused tokens)
  double decode_s = 0.0;      // from the first sampled token to the stop
  StopCause stop = StopCause::kMaxTokens;
  // Speculative decoding (zero when off).
  int64_t spec_steps = 0;    // verify passes with at least one draft
  int64_t plain_steps = 0;   // one-row steps
  int64_t drafted = 0;       // draft tokens verified
  int64_t accepted = 0;      // of them accepted
  double draft_s = 0.0;      // time in the drafter (included in decode_s)
  // Per draft position i (0-based): drafts verified there, and accepted.
  std::vector<int64_t> proposed_at, accepted_at;
};

class Generator {
 public:
  // Returns false to stop generation after this token.
  using TokenFn = std::function<bool(TokenId)>;
  using CancelFn = std::function<bool()>;

  Generator(Model& model, int64_t n_ctx);

  // Generates from `prompt` (must be non-empty and shorter than n_ctx). Errors: invalid
  // arguments, or a Forward failure (the cache is then reset).
  Result<GenerateStats> Generate(std::span<const TokenId> prompt, const GenerateParams& params,
                                 const TokenFn& on_token, const CancelFn& cancelled = nullptr);

  // Start-up warm-up: one short generation with the model's default sampling and `spec`, so the
  // first request does not pay first-use costs (page faults, workspace growth) and the cost
  // controller starts calibrated. Leaves the cache empty.
  Result<GenerateStats> WarmUp(const SpecParams& spec, int64_t max_tokens = 32);

  int64_t n_ctx() const { return kv_.n_ctx; }
  const CostController& controller() const { return controller_; }
  Model& model() { return model_; }
  // Tokens whose KV is in the cache (prompt + generated of the last request).
  const std::vector<TokenId>& cached_tokens() const { return tokens_; }
  void ResetCache() { tokens_.clear(); kv_.n_past = 0; }

 private:
  Model& model_;
  KvCache kv_;
  std::vector<TokenId> tokens_;
  std::vector<float> logits_;      // (n_vocab) last row of a prefill or plain step
  std::vector<float> logits_all_;  // (k+1, n_vocab) rows of a verify pass
  Sampler sampler_;
  // Speculative decoding state, reused across steps.
  CostController controller_;
  const Drafter* controller_drafter_ = nullptr;  // the controller's figures describe this drafter
  Draft draft_;
  std::vector<TokenId> rows_;                    // pending token + drafts
  std::vector<std::vector<Candidate>> p_;        // target distributions per verify row
  VerifyScratch verify_scratch_;
  std::vector<TokenId> run_;                     // tokens a step produced
};

}  // namespace mr
