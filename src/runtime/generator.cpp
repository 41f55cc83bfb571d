#include "runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "model/gguf.h"

namespace mr {

const char* StopCauseName(StopCause c) {
  switch (c) {
    case StopCause::kEndOfGeneration: return "end_of_generation";
    case StopCause::kMaxTokens: return "max_tokens";
    case StopCause::kCallback: return "callback";
    case StopCause::kCancelled: return "cancelled";
    case StopCause::kContextFull: return "context_full";
  }
  return "?";
}

SamplingParams ModelDefaultSampling(const Model& model) {
  const gguf::GgufFile& f = model.file();
  SamplingParams s;
  switch (model.config().arch) {
    case Arch::kGemma3: s = {1.0f, 64, 0.95f, 0.0f}; break;
    case Arch::kQwen2: s = {0.7f, 20, 0.8f, 0.0f}; break;
    case Arch::kLlama: {
      const std::string name = f.GetString("general.name").value_or("");
      if (name.find("SmolLM2") != std::string::npos) s = {0.2f, 0, 0.9f, 0.0f};
      break;
    }
  }
  if (auto v = f.GetFloat("general.sampling.temp")) s.temperature = static_cast<float>(*v);
  if (auto v = f.GetInt("general.sampling.top_k")) s.top_k = static_cast<int>(*v);
  if (auto v = f.GetFloat("general.sampling.top_p")) s.top_p = static_cast<float>(*v);
  if (auto v = f.GetFloat("general.sampling.min_p")) s.min_p = static_cast<float>(*v);
  return s;
}

Generator::Generator(Model& model, int64_t n_ctx)
    : model_(model), kv_(model.NewKvCache(n_ctx)), logits_(static_cast<size_t>(model.config().n_vocab)) {}

Result<GenerateStats> Generator::Generate(std::span<const TokenId> prompt, const GenerateParams& params,
                                          const TokenFn& on_token, const CancelFn& cancelled) {
  using Clock = std::chrono::steady_clock;
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0) return InvalidArgument("empty prompt");
  if (n_prompt >= kv_.n_ctx)
    return InvalidArgument("prompt is too long: " + std::to_string(n_prompt) + " tokens > " +
                                   std::to_string(kv_.n_ctx - 1) + " maximum");
  const int64_t n_vocab = model_.config().n_vocab;
  for (TokenId t : prompt)
    if (t < 0 || t >= n_vocab) return InvalidArgument("token id " + std::to_string(t) + " outside the vocabulary");

  GenerateStats stats;
  stats.prompt_tokens = n_prompt;
  // Keep the longest common prefix with what the cache holds, but evaluate at least the last
  // prompt token: its logits start the decode.
  int64_t keep = 0;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(tokens_.size()), n_prompt - 1);
  while (keep < limit && tokens_[keep] == prompt[keep]) ++keep;
  kv_.n_past = keep;
  tokens_.resize(keep);
  stats.reused_tokens = keep;

  auto fail = [&](const Status& st) -> Result<GenerateStats> {
    ResetCache();
    return st;
  };
  const auto t0 = Clock::now();
  const int64_t chunk = std::max<int64_t>(1, params.prefill_chunk);
  for (int64_t pos = keep; pos < n_prompt; pos += chunk) {
    if (cancelled && cancelled()) {
      stats.stop = StopCause::kCancelled;
      stats.prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
      return stats;
    }
    const int64_t n = std::min(chunk, n_prompt - pos);
    Status st = model_.Forward(kv_, prompt.data() + pos, n, false, logits_.data());
    if (!st.ok()) return fail(st);
    tokens_.insert(tokens_.end(), prompt.begin() + pos, prompt.begin() + pos + n);
  }
  const auto t1 = Clock::now();
  stats.prefill_s = std::chrono::duration<double>(t1 - t0).count();

  sampler_.set_params(params.sampling);
  Rng rng(params.seeded ? params.seed : Rng::RandomSeed());
  const Tokenizer& tok = model_.tokenizer();
  for (;;) {
    if (stats.generated >= params.max_tokens) { stats.stop = StopCause::kMaxTokens; break; }
    if (cancelled && cancelled()) { stats.stop = StopCause::kCancelled; break; }
    const TokenId next = sampler_.Sample(logits_.data(), n_vocab, rng);
    if (tok.IsEndOfGeneration(next)) {
      stats.stop = StopCause::kEndOfGeneration;
      stats.eog_token = next;
      break;
    }
    ++stats.generated;
    const bool go_on = on_token(next);
    if (!go_on) { stats.stop = StopCause::kCallback; break; }
    if (stats.generated >= params.max_tokens) { stats.stop = StopCause::kMaxTokens; break; }
    if (kv_.n_past >= kv_.n_ctx) { stats.stop = StopCause::kContextFull; break; }
    Status st = model_.Forward(kv_, &next, 1, false, logits_.data());
    if (!st.ok()) return fail(st);
    tokens_.push_back(next);
  }
  stats.decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
  return stats;
}

}  // namespace mr
