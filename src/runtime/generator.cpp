#include "runtime/generator.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <string>

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
      // general.name varies in case ("Smollm2 135M 8k ..." in the catalog's file).
      std::string name = f.GetString("general.name").value_or("");
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (name.find("smollm2") != std::string::npos) s = {0.2f, 0, 0.9f, 0.0f};
      break;
    }
  }
  if (auto v = f.GetFloat("general.sampling.temp")) s.temperature = static_cast<float>(*v);
  if (auto v = f.GetInt("general.sampling.top_k")) s.top_k = static_cast<int>(*v);
  if (auto v = f.GetFloat("general.sampling.top_p")) s.top_p = static_cast<float>(*v);
  if (auto v = f.GetFloat("general.sampling.min_p")) s.min_p = static_cast<float>(*v);
  return s;
}

std::pair<int, bool> ResolveDraftTokens(const SpecParams& spec) {
  if (spec.draft_tokens >= 0) return {std::min(spec.draft_tokens, CostController::kMaxK), spec.adaptive};
  const char* env = std::getenv("MERERUN_DRAFT_TOKENS");
  if (env == nullptr || *env == '\0' || std::string(env) == "auto") return {kDefaultDraftTokens, true};
  const int k = std::atoi(env);
  return {std::clamp(k, 0, CostController::kMaxK), false};
}

Result<GenerateStats> Generator::WarmUp(const SpecParams& spec, int64_t max_tokens) {
  const std::vector<TokenId> prompt = model_.tokenizer().Encode(
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", /*add_special=*/true, false);
  GenerateParams p;
  p.sampling = ModelDefaultSampling(model_);
  p.max_tokens = max_tokens;
  p.spec = spec;
  auto r = Generate(prompt, p, [](TokenId) { return true; });
  ResetCache();
  return r;
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
  sampler_.set_params(params.sampling);
  Rng rng(params.seeded ? params.seed : Rng::RandomSeed());
  const Tokenizer& tok = model_.tokenizer();
  Drafter* drafter = params.spec.drafter;
  if (drafter != nullptr) {
    const auto [k_max, adaptive] = ResolveDraftTokens(params.spec);
    if (drafter != controller_drafter_) {
      controller_ = CostController(k_max, adaptive);
      controller_drafter_ = drafter;
    }
    controller_.Configure(k_max, adaptive);
    // The drafter reads the prompt now (a draft model prefills its own cache).
    Status st = drafter->Begin(std::span<const TokenId>(tokens_));
    if (!st.ok()) return fail(st);
    stats.proposed_at.assign(static_cast<size_t>(k_max), 0);
    stats.accepted_at.assign(static_cast<size_t>(k_max), 0);
    stats.prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const auto t1 = Clock::now();
  if (drafter == nullptr) stats.prefill_s = std::chrono::duration<double>(t1 - t0).count();

  // Decode. Each iteration produces a run of tokens (one sampled token, or the accepted drafts
  // plus one) and emits them. `pending` is the last emitted token: sampled, not yet in the KV
  // cache. kv_before_run: KV positions holding the context before run_[0].
  bool have_pending = false;
  TokenId pending = -1;
  for (;;) {
    if (stats.generated >= params.max_tokens) { stats.stop = StopCause::kMaxTokens; break; }
    if (cancelled && cancelled()) { stats.stop = StopCause::kCancelled; break; }
    run_.clear();
    int64_t kv_before_run = kv_.n_past;
    if (!have_pending) {
      run_.push_back(sampler_.Sample(logits_.data(), n_vocab, rng));
    } else {
      if (kv_.n_past >= kv_.n_ctx) { stats.stop = StopCause::kContextFull; break; }
      const int64_t base = kv_.n_past;
      // Draft length: the controller's choice, within the token budget (a step yields up to
      // k+1 tokens) and the context (k+1 rows must fit).
      int k = drafter != nullptr ? controller_.Choose() : 0;
      k = static_cast<int>(std::min<int64_t>({k, params.max_tokens - stats.generated - 1, kv_.n_ctx - base - 1}));
      int n_draft = 0;
      if (k > 0) {
        tokens_.push_back(pending);  // the drafter continues the full context
        const auto td = Clock::now();
        Status st = drafter->Propose(std::span<const TokenId>(tokens_), k, params.sampling, rng, &draft_);
        const double draft_s = std::chrono::duration<double>(Clock::now() - td).count();
        tokens_.pop_back();
        if (!st.ok()) return fail(st);
        n_draft = static_cast<int>(std::min<size_t>(draft_.tokens.size(), static_cast<size_t>(k)));
        stats.draft_s += draft_s;
        controller_.RecordDraftCost(n_draft, draft_s);
      }
      const auto tf = Clock::now();
      if (n_draft == 0) {
        Status st = model_.Forward(kv_, &pending, 1, false, logits_.data());
        if (!st.ok()) return fail(st);
        if (drafter != nullptr) controller_.RecordForwardCost(1, std::chrono::duration<double>(Clock::now() - tf).count());
        ++stats.plain_steps;
        tokens_.push_back(pending);
        run_.push_back(sampler_.Sample(logits_.data(), n_vocab, rng));
      } else {
        rows_.assign(1, pending);
        rows_.insert(rows_.end(), draft_.tokens.begin(), draft_.tokens.begin() + n_draft);
        const int64_t n_rows = n_draft + 1;
        if (static_cast<int64_t>(logits_all_.size()) < n_rows * n_vocab) logits_all_.resize(static_cast<size_t>(n_rows * n_vocab));
        Status st = model_.Forward(kv_, rows_.data(), n_rows, true, logits_all_.data());
        if (!st.ok()) return fail(st);
        controller_.RecordForwardCost(static_cast<int>(n_rows), std::chrono::duration<double>(Clock::now() - tf).count());
        if (p_.size() < static_cast<size_t>(n_rows)) p_.resize(static_cast<size_t>(n_rows));
        const TargetDistFn p = [&](int i) -> const std::vector<Candidate>& {
          sampler_.Distribution(logits_all_.data() + static_cast<int64_t>(i) * n_vocab, n_vocab, &p_[i]);
          return p_[i];
        };
        const bool sampled_q = draft_.sampled && !params.sampling.greedy();
        const std::span<const std::vector<Candidate>> q =
            sampled_q ? std::span<const std::vector<Candidate>>(draft_.q.data(), static_cast<size_t>(n_draft))
                      : std::span<const std::vector<Candidate>>();
        const VerifyOutcome v = VerifyDraft(std::span<const TokenId>(rows_.data() + 1, n_draft), q, p, rng, &verify_scratch_);
        controller_.RecordAcceptance(n_draft, v.accepted);
        ++stats.spec_steps;
        stats.drafted += n_draft;
        stats.accepted += v.accepted;
        for (int i = 0; i < std::min(n_draft, v.accepted + 1) && i < static_cast<int>(stats.proposed_at.size()); ++i) {
          ++stats.proposed_at[i];
          if (i < v.accepted) ++stats.accepted_at[i];
        }
        // Keep the pending token and the accepted drafts; later rows are overwritten later.
        kv_.n_past = base + 1 + v.accepted;
        tokens_.insert(tokens_.end(), rows_.begin(), rows_.begin() + 1 + v.accepted);
        run_.assign(rows_.begin() + 1, rows_.begin() + 1 + v.accepted);
        run_.push_back(v.next);
      }
      kv_before_run = base + 1;
    }
    // Emit the run. Stopping at run_[j] leaves the KV holding the context before run_[j], as a
    // plain step would.
    bool stop = false;
    for (size_t j = 0; j < run_.size() && !stop; ++j) {
      const TokenId t = run_[j];
      if (tok.IsEndOfGeneration(t)) {
        stats.stop = StopCause::kEndOfGeneration;
        stats.eog_token = t;
        stop = true;
      } else {
        ++stats.generated;
        if (!on_token(t)) { stats.stop = StopCause::kCallback; stop = true; }
        else if (stats.generated >= params.max_tokens) { stats.stop = StopCause::kMaxTokens; stop = true; }
      }
      if (stop) {
        kv_.n_past = kv_before_run + static_cast<int64_t>(j);
        tokens_.resize(static_cast<size_t>(kv_.n_past));
      }
    }
    if (stop) break;
    pending = run_.back();
    have_pending = true;
  }
  stats.decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
  return stats;
}

}  // namespace mr
