// One sequence's generation loop on the engine thread: prefill in chunks, then decode token by
// token with the sampler, reusing the KV cache of the previous request's longest common token
// prefix. Speculative decoding plugs in here (issue 4); the server's engine thread owns one
// Generator per sequence slot.
//
// Thread-safety: not thread-safe; a Generator belongs to the thread that owns the Model.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace mr {

// The model's default sampling: GGUF general.sampling.{temp,top_k,top_p,min_p} when present,
// else the model family's published generation defaults (Gemma 3: T 1.0, top-k 64, top-p 0.95;
// Qwen2.5: T 0.7, top-k 20, top-p 0.8; SmolLM2: T 0.2, top-p 0.9), else T 1.0 with no cut.
SamplingParams ModelDefaultSampling(const Model& model);

struct GenerateParams {
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seeded = false;      // false: a fresh random seed per request
  int64_t max_tokens = 256;
  int64_t prefill_chunk = 256;  // rows per Forward during prefill (cancellation point)
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

  int64_t n_ctx() const { return kv_.n_ctx; }
  Model& model() { return model_; }
  // Tokens whose KV is in the cache (prompt + generated of the last request).
  const std::vector<TokenId>& cached_tokens() const { return tokens_; }
  void ResetCache() { tokens_.clear(); kv_.n_past = 0; }

 private:
  Model& model_;
  KvCache kv_;
  std::vector<TokenId> tokens_;
  std::vector<float> logits_;
  Sampler sampler_;
};

}  // namespace mr
