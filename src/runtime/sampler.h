// Token sampling: temperature, top-k, top-p, min-p, greedy, and a seeded PRNG.
//
// The sampler exposes the final distribution (Distribution) so that speculative verification
// accepts and resamples against exactly the distribution plain sampling draws from.
//
// Order of the transforms (as Hugging Face transformers applies them):
//   1. temperature: p ∝ exp(logit / T)   (T <= 0 means greedy: the argmax, lowest id on ties)
//   2. top-k: keep the k most probable (k <= 0: off)
//   3. top-p: keep the smallest prefix of the sorted candidates whose mass reaches p (p >= 1: off)
//   4. min-p: drop candidates whose probability is below min_p × the largest one (0: off)
//   5. renormalize.
//   6. infill (only when SamplingParams::infill names a vocabulary): llama.cpp's fill-in-the-middle
//      filter, InfillFilter below.
// When top-k or top-p cut the list, candidates are ordered by probability descending, ties by
// token id ascending; otherwise they are in token id order (sorting a whole vocabulary costs
// ~10 ms). Either way the result is a deterministic function of the logits.
//
// Thread-safety: a Sampler holds scratch buffers; use one per thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "model/tokenizer.h"

namespace mr {

// OpenAI-style adjustments of the model's logits, applied before everything else (then a grammar
// constraint's mask, then SamplingParams' transforms), in this order:
//   logit[t] += bias(t)
//   logit[t] = logit[t] > 0 ? logit[t] / repetition_penalty : logit[t] * repetition_penalty
//              for every distinct t of the prompt and the output so far (CTRL's rule, as
//              llama.cpp's repeat_penalty and vLLM's repetition_penalty apply it)
//   logit[t] -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0)
// where count(t) is how often t occurs among the tokens generated so far (the prompt does not
// count: vLLM's and OpenAI's reading of "the text so far").
struct LogitAdjust {
  std::vector<std::pair<TokenId, float>> bias;  // ids within the vocabulary (the API layer checks)
  float repetition_penalty = 1.0f;              // > 0; 1: off
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  bool active() const {
    return !bias.empty() || repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};

// One generated token's log-probability under the model: the log-softmax of the raw logits of
// its row (temperature 1, before any adjustment, mask or truncation), and the `top` most likely
// tokens of that row by log-probability (descending, ties by id ascending).
struct TokenLogprob {
  TokenId id = -1;
  float logprob = 0.0f;
  std::vector<std::pair<TokenId, float>> top;
};
void ComputeLogprob(const float* logits, int64_t n_vocab, TokenId id, int top_n, TokenLogprob* out);

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  // Non-null: the infill filter runs last, over this vocabulary's pieces and end-of-generation
  // set (llama.cpp's "infill" sampler, which editor plugins ask for; not under greedy decoding).
  const Tokenizer* infill = nullptr;
  bool greedy() const { return temperature <= 0.0f; }
};

// xoshiro256** (Blackman & Vigna), state seeded from a 64-bit seed with SplitMix64.
// Same seed => same sequence on every machine.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  double Uniform();  // [0, 1) with 53 random bits
  // A seed from the OS (std::random_device) and the clock, for unseeded requests.
  static uint64_t RandomSeed();

 private:
  uint64_t s_[4];
};

struct Candidate {
  TokenId id;
  float p;
};

// The infill filter over a normalized candidate list (llama.cpp's llama_sampler_infill, the rule
// as it documents it), leaving it sorted by probability (ties by id) and normalized:
//   1. Only the kInfillMaxCandidates most probable candidates are considered (the rest is dropped;
//      llama.cpp's pairwise merge is quadratic and its clients always cut with top-k first).
//   2. If 3 x p(end-of-generation) x n > p(text), only the end-of-generation candidates remain.
//   3. Where one token's piece is a prefix of another's, the less probable one's probability moves
//      to the more probable one (pairs in probability order), and it drops out.
//   4. Text candidates under 0.2 drop; if none is left, the end-of-turn token alone remains (p 1).
//   5. Renormalized, text candidates under 1 / (n_text + 1) drop, and the rest is renormalized.
inline constexpr size_t kInfillMaxCandidates = 512;
void InfillFilter(const Tokenizer& tok, std::vector<Candidate>* dist);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params = {}) : params_(params) {}
  const SamplingParams& params() const { return params_; }
  void set_params(const SamplingParams& params) { params_ = params; }

  // The final normalized distribution over the surviving candidates (sorted as above).
  // Greedy: one candidate with p = 1. `out` is cleared first; its capacity is reused.
  void Distribution(const float* logits, int64_t n_vocab, std::vector<Candidate>* out);

  // Draws one token from Distribution(logits).
  TokenId Sample(const float* logits, int64_t n_vocab, Rng& rng);

  // Inverse-CDF draw from a normalized candidate list (u = rng.Uniform()).
  static TokenId Draw(const std::vector<Candidate>& dist, Rng& rng);

 private:
  SamplingParams params_;
  std::vector<Candidate> scratch_;
  std::vector<Candidate> dist_;
};

}  // namespace mr
