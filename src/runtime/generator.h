// One sequence's whole generation, alone on the model: the loop that drives a Sequence
// (sequence.h: chunked prefill with prefix reuse, sampled decode, speculative verify) with one
// Forward per step. Used by the CLI, benchmarks and qualification; the server's engine drives
// several Sequences through batched forward passes instead.
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
#include "runtime/sequence.h"
#include "runtime/speculative.h"

namespace mr {

// The model's default sampling: GGUF general.sampling.{temp,top_k,top_p,min_p} when present,
// else the model family's published generation defaults (Gemma 3: T 1.0, top-k 64, top-p 0.95;
// Qwen2.5: T 0.7, top-k 20, top-p 0.8; SmolLM2: T 0.2, top-p 0.9), else T 1.0 with no cut.
SamplingParams ModelDefaultSampling(const Model& model);

class Generator {
 public:
  // Returns false to stop generation after this token.
  using TokenFn = std::function<bool(TokenId)>;
  using CancelFn = std::function<bool()>;

  Generator(Model& model, int64_t n_ctx);

  // Generates from `prompt` (must be non-empty and shorter than n_ctx). Errors: invalid
  // arguments, or a Forward failure (the cache is then reset).
  Result<GenerateStats> Generate(std::span<const TokenId> prompt, const GenerateParams& params, const TokenFn& on_token,
                                 const CancelFn& cancelled = nullptr);

  // Start-up warm-up: one short generation with the model's default sampling and `spec`, so the
  // first request does not pay first-use costs (page faults, workspace growth) and the cost
  // controller starts calibrated. Leaves the cache empty.
  // `cancelled` (optional) ends it early (a shutdown during start-up).
  Result<GenerateStats> WarmUp(const SpecParams& spec, int64_t max_tokens = 32, const CancelFn& cancelled = nullptr);

  int64_t n_ctx() const { return seq_.n_ctx(); }
  const CostController& controller() const { return seq_.controller(); }
  Model& model() { return seq_.model(); }
  // Tokens whose KV is in the cache (prompt + generated of the last request).
  const std::vector<TokenId>& cached_tokens() const { return seq_.cached_tokens(); }
  void ResetCache() { seq_.ResetCache(); }
  // During on_token, with params.logprobs >= 0: the token's log-probability (Sequence's).
  const TokenLogprob* token_logprob() const { return seq_.token_logprob(); }
  const std::vector<TokenLogprob>& prompt_logprobs() const { return seq_.prompt_logprobs(); }

 private:
  Sequence seq_;
  std::vector<float> logits_;  // (rows, n_vocab)
};

}  // namespace mr
