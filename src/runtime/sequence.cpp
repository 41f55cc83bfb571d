#include "runtime/sequence.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "runtime/prefix_cache.h"

namespace mr {

const char* StopCauseName(StopCause c) {
  switch (c) {
    case StopCause::kEndOfGeneration:
      return "end_of_generation";
    case StopCause::kMaxTokens:
      return "max_tokens";
    case StopCause::kCallback:
      return "callback";
    case StopCause::kCancelled:
      return "cancelled";
    case StopCause::kContextFull:
      return "context_full";
  }
  return "?";
}

std::pair<int, bool> ResolveDraftTokens(const SpecParams& spec) {
  if (spec.draft_tokens >= 0) return {std::min(spec.draft_tokens, CostController::kMaxK), spec.adaptive};
  return {kDefaultDraftTokens, true};
}

int Sequence::wanted_draft_rows() const {
  if (drafter_ == nullptr || done_) return 0;
  return static_cast<int>(std::clamp<int64_t>(controller_.Preview(), 0, std::max<int64_t>(0, budget_left() - 1)));
}

void Sequence::SetBatch(int64_t other_rows, int64_t other_decoders) {
  batch_other_rows_ = std::max<int64_t>(other_rows, 0);
  controller_.SetBatch(static_cast<int>(std::min<int64_t>(batch_other_rows_, CostController::kMaxRows)),
                       static_cast<double>(std::max<int64_t>(other_decoders, 0)));
}

Sequence::Sequence(Model& model, int64_t n_ctx) : model_(model), kv_(model.NewKvCache(n_ctx)) {}

void Sequence::ReleaseCache() {
  tokens_.clear();
  kv_.Release();
}

Status Sequence::Start(std::span<const TokenId> prompt, const GenerateParams& params, PrefixCache* cache) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0) return InvalidArgument("empty prompt");
  if (n_prompt >= kv_.n_ctx)
    return InvalidArgument("prompt is too long: " + std::to_string(n_prompt) + " tokens > " +
                           std::to_string(kv_.n_ctx - 1) + " maximum");
  const int64_t n_vocab = model_.config().n_vocab;
  for (TokenId t : prompt)
    if (t < 0 || t >= n_vocab) return InvalidArgument("token id " + std::to_string(t) + " outside the vocabulary");

  t_start_ = Clock::now();
  params_ = params;
  cache_ = cache;
  stats_ = GenerateStats();
  stats_.prompt_tokens = n_prompt;
  // Keep the longest common prefix with what the cache holds, but evaluate at least the last
  // prompt token: its logits start the decode.
  int64_t keep = 0;
  // Prompt log-probabilities and embeddings need every row: nothing is reused, and an
  // embedding's rows are not stored either (they would crowd conversations out of the cache).
  const bool every_row = params.prompt_logprobs >= 0 || params.embed != Pooling::kNone;
  if (params.embed != Pooling::kNone) cache_ = nullptr;
  const int64_t limit = every_row ? 0 : std::min<int64_t>(static_cast<int64_t>(tokens_.size()), n_prompt - 1);
  while (keep < limit && tokens_[keep] == prompt[keep]) ++keep;
  kv_.n_past = keep;
  tokens_.resize(static_cast<size_t>(keep));
  if (cache_ != nullptr && !every_row) {
    const int64_t got = cache_->Restore(prompt, n_prompt - 1, keep, kv_);
    if (got > keep) {
      stats_.cache_restored = got - keep;
      tokens_.assign(prompt.begin(), prompt.begin() + got);
      keep = got;
    }
  }
  stats_.reused_tokens = keep;
  feed_.assign(prompt.begin(), prompt.end());
  feed_pos_ = keep;
  done_ = false;
  decode_started_ = false;
  have_pending_ = false;
  last_emitted_ = -1;
  counts_.clear();
  seen_.clear();
  prompt_logprobs_.clear();
  embedding_.clear();
  embed_sum_.assign(params.embed == Pooling::kMean ? static_cast<size_t>(model_.config().d_model) : 0, 0.0);
  if (params.prompt_logprobs >= 0)  // the first token has no row before it: no value
    prompt_logprobs_.push_back({prompt[0], std::numeric_limits<float>::quiet_NaN(), {}});
  if (params.adjust.repetition_penalty != 1.0f) seen_.insert(prompt.begin(), prompt.end());
  step_ = StepKind::kNone;
  sampler_.set_params(params.sampling);
  rng_ = Rng(params.seeded ? params.seed : Rng::RandomSeed());
  drafter_ = params.spec.drafter;
  if (drafter_ != nullptr) {
    const auto [k_max, adaptive] = ResolveDraftTokens(params.spec);
    if (drafter_ != controller_drafter_) {
      controller_ = CostController(k_max, adaptive);
      controller_drafter_ = drafter_;
    }
    controller_.Configure(k_max, adaptive);
    stats_.proposed_at.assign(static_cast<size_t>(k_max), 0);
    stats_.accepted_at.assign(static_cast<size_t>(k_max), 0);
  }
  return Status::Ok();
}

void Sequence::Finish(StopCause cause) {
  stats_.stop = cause;
  done_ = true;
  step_ = StepKind::kNone;
  const auto now = Clock::now();
  if (decode_started_) {
    stats_.decode_s = std::chrono::duration<double>(now - t_decode_).count();
  } else {
    stats_.prefill_s = std::chrono::duration<double>(now - t_start_).count();
  }
}

void Sequence::Cancel() {
  if (!done_) Finish(StopCause::kCancelled);
}

void Sequence::PoolHidden() {
  const int64_t d = model_.config().d_model, n_prompt = static_cast<int64_t>(feed_.size());
  const bool last_chunk = feed_pos_ + step_n_ == n_prompt;
  switch (params_.embed) {
    case Pooling::kMean:
      for (int64_t t = 0; t < step_n_; ++t)
        for (int64_t i = 0; i < d; ++i) embed_sum_[static_cast<size_t>(i)] += hidden_[static_cast<size_t>(t * d + i)];
      if (last_chunk) {
        embedding_.resize(static_cast<size_t>(d));
        for (int64_t i = 0; i < d; ++i)
          embedding_[static_cast<size_t>(i)] =
              static_cast<float>(embed_sum_[static_cast<size_t>(i)] / static_cast<double>(n_prompt));
      }
      break;
    case Pooling::kCls:
      if (feed_pos_ == 0) embedding_.assign(hidden_.begin(), hidden_.begin() + d);
      break;
    case Pooling::kLast:
      if (last_chunk) embedding_.assign(hidden_.begin() + (step_n_ - 1) * d, hidden_.begin() + step_n_ * d);
      break;
    case Pooling::kNone:
      break;
  }
}

Result<Sequence::StepRows> Sequence::NextRows(int64_t max_rows) {
  max_rows = std::max<int64_t>(1, max_rows);
  StepRows r;
  if (done_) return r;
  if (prefilling()) {
    if (kv_.n_past + 1 > kv_.n_ctx) {
      Finish(StopCause::kContextFull);
      return r;
    }
    const bool all = params_.prompt_logprobs >= 0 && !decode_started_;  // the prompt's rows, not injections
    step_n_ = std::min({max_rows, prefill_left(), kv_.n_ctx - kv_.n_past, all ? kPromptLogprobRows : INT64_MAX});
    step_ = StepKind::kPrefill;
    r.tokens = feed_.data() + feed_pos_;
    r.n = step_n_;
    r.all_logits = all;
    if (params_.embed != Pooling::kNone && !decode_started_) {
      hidden_.resize(static_cast<size_t>(step_n_ * model_.config().d_model));
      r.hidden = hidden_.data();
    }
    t_forward_ = Clock::now();
    return r;
  }
  // Decode: the pending token, plus drafts.
  if (budget_left() <= 0) {
    Finish(StopCause::kMaxTokens);
    return r;
  }
  if (kv_.n_past >= kv_.n_ctx) {
    Finish(StopCause::kContextFull);
    return r;
  }
  const int64_t base = kv_.n_past;
  // Draft length: the controller's choice, within the token budget (a step yields up to k+1
  // tokens), the rows allowed and the context (k+1 rows must fit).
  int k = drafter_ != nullptr ? controller_.Choose() : 0;
  k = static_cast<int>(std::min<int64_t>({k, budget_left() - 1, kv_.n_ctx - base - 1, max_rows - 1}));
  int n_draft = 0;
  if (k > 0) {
    tokens_.push_back(pending_);  // the drafter continues the full context
    const auto td = Clock::now();
    Status st = drafter_->Propose(std::span<const TokenId>(tokens_), k, params_.sampling, rng_, &draft_);
    const double draft_s = std::chrono::duration<double>(Clock::now() - td).count();
    tokens_.pop_back();
    MR_RETURN_IF_ERROR(st);
    n_draft = static_cast<int>(std::min<size_t>(draft_.tokens.size(), static_cast<size_t>(k)));
    stats_.draft_s += draft_s;
    controller_.RecordDraftCost(n_draft, draft_s);
  }
  last_draft_ = n_draft;
  rows_.assign(1, pending_);
  rows_.insert(rows_.end(), draft_.tokens.begin(), draft_.tokens.begin() + n_draft);
  step_ = n_draft == 0 ? StepKind::kPlain : StepKind::kVerify;
  step_n_ = n_draft + 1;
  r.tokens = rows_.data();
  r.n = step_n_;
  r.all_logits = n_draft > 0;
  t_forward_ = Clock::now();
  return r;
}

const float* Sequence::Adjusted(const float* logits, const TokenConstraint* c, std::span<const TokenId> drafts) {
  const LogitAdjust& a = params_.adjust;
  const bool constrained = c != nullptr && c->active();
  if (!constrained && !a.active()) return logits;
  const int64_t n_vocab = model_.config().n_vocab;
  masked_.assign(logits, logits + n_vocab);
  if (a.active()) {
    float* l = masked_.data();
    // drafts[j] also occurs among the drafts before it.
    auto repeats_draft = [&](size_t j) {
      const auto before = drafts.begin() + static_cast<ptrdiff_t>(j);
      return std::find(drafts.begin(), before, drafts[j]) != before;
    };
    for (const auto& [t, b] : a.bias) l[t] += b;
    if (a.repetition_penalty != 1.0f) {
      const float rp = a.repetition_penalty;
      auto penalize = [&](TokenId t) { l[t] = l[t] > 0.0f ? l[t] / rp : l[t] * rp; };
      for (const TokenId t : seen_) penalize(t);
      // A draft before this row is in the context too: once, unless already there.
      for (size_t j = 0; j < drafts.size(); ++j)
        if (seen_.count(drafts[j]) == 0 && !repeats_draft(j)) penalize(drafts[j]);
    }
    if (a.frequency_penalty != 0.0f || a.presence_penalty != 0.0f) {
      for (const auto& [t, n] : counts_) l[t] -= a.frequency_penalty * static_cast<float>(n) + a.presence_penalty;
      // Each draft adds one occurrence: the presence penalty only where it is the first.
      for (size_t j = 0; j < drafts.size(); ++j) {
        const bool seen = counts_.count(drafts[j]) > 0 || repeats_draft(j);
        l[drafts[j]] -= a.frequency_penalty + (seen ? 0.0f : a.presence_penalty);
      }
    }
  }
  if (constrained) c->Apply(masked_.data(), &mask_);
  return masked_.data();
}

void Sequence::Emit(int64_t kv_before_run, const float* logits, int64_t row_stride, const TokenFn& on_token) {
  const Tokenizer& tok = model_.tokenizer();
  const int64_t n_vocab = model_.config().n_vocab;
  for (size_t j = 0; j < run_.size(); ++j) {
    const TokenId t = run_[j];
    bool stop = false;
    StopCause cause = StopCause::kMaxTokens;
    if (tok.IsEndOfGeneration(t)) {
      stats_.eog_token = t;
      cause = StopCause::kEndOfGeneration;
      stop = true;
    } else {
      ++stats_.generated;
      last_emitted_ = t;
      if (params_.constraint) params_.constraint->Accept(t);
      if (params_.adjust.frequency_penalty != 0.0f || params_.adjust.presence_penalty != 0.0f) ++counts_[t];
      if (params_.adjust.repetition_penalty != 1.0f) seen_.insert(t);
      if (params_.logprobs >= 0)
        ComputeLogprob(logits + static_cast<int64_t>(j) * row_stride, n_vocab, t, params_.logprobs, &logprob_);
      if (!on_token(t)) {
        cause = StopCause::kCallback;
        stop = true;
      } else if (budget_left() <= 0) {
        stop = true;
      }
    }
    if (stop) {
      kv_.n_past = kv_before_run + static_cast<int64_t>(j);
      tokens_.resize(static_cast<size_t>(kv_.n_past));
      have_pending_ = false;
      Finish(cause);
      return;
    }
  }
  pending_ = run_.back();
  have_pending_ = true;
}

Status Sequence::Consume(const float* logits, const TokenFn& on_token) {
  const int64_t n_vocab = model_.config().n_vocab;
  const StepKind kind = step_;
  step_ = StepKind::kNone;
  const double forward_s = std::chrono::duration<double>(Clock::now() - t_forward_).count();
  run_.clear();
  switch (kind) {
    case StepKind::kNone:
      return Internal("Sequence::Consume without a step in flight");
    case StepKind::kPrefill: {
      if (params_.prompt_logprobs >= 0 && !decode_started_) {
        // Row i predicts the prompt token after it; the last prompt row predicts the output.
        for (int64_t i = 0; i < step_n_ && feed_pos_ + i + 1 < static_cast<int64_t>(feed_.size()); ++i) {
          prompt_logprobs_.emplace_back();
          ComputeLogprob(logits + i * n_vocab, n_vocab, feed_[static_cast<size_t>(feed_pos_ + i + 1)],
                         params_.prompt_logprobs, &prompt_logprobs_.back());
        }
        logits += (step_n_ - 1) * n_vocab;  // the last row, for sampling below
      }
      if (params_.embed != Pooling::kNone && !decode_started_) PoolHidden();
      tokens_.insert(tokens_.end(), feed_.begin() + feed_pos_, feed_.begin() + feed_pos_ + step_n_);
      feed_pos_ += step_n_;
      if (prefilling()) return Status::Ok();
      if (cache_ != nullptr) cache_->Store(std::span<const TokenId>(tokens_), kv_.n_past, kv_);
      // The drafter reads the whole context now (a draft model prefills its own cache).
      if (drafter_ != nullptr) MR_RETURN_IF_ERROR(drafter_->Begin(std::span<const TokenId>(tokens_)));
      if (!decode_started_) {
        decode_started_ = true;
        t_decode_ = Clock::now();
        stats_.prefill_s = std::chrono::duration<double>(t_decode_ - t_start_).count();
      }
      if (budget_left() <= 0) {  // max_tokens 0: the prompt is evaluated (and cached), nothing sampled
        have_pending_ = false;
        Finish(StopCause::kMaxTokens);
        return Status::Ok();
      }
      run_.push_back(sampler_.Sample(Adjusted(logits, params_.constraint.get()), n_vocab, rng_));
      Emit(kv_.n_past, logits, 0, on_token);
      return Status::Ok();
    }
    case StepKind::kPlain: {
      if (drafter_ != nullptr) controller_.RecordForwardCost(static_cast<int>(batch_other_rows_ + 1), forward_s);
      ++stats_.plain_steps;
      tokens_.push_back(pending_);
      const int64_t kv_before_run = kv_.n_past;
      run_.push_back(sampler_.Sample(Adjusted(logits, params_.constraint.get()), n_vocab, rng_));
      Emit(kv_before_run, logits, 0, on_token);
      return Status::Ok();
    }
    case StepKind::kVerify: {
      const int n_draft = static_cast<int>(step_n_ - 1);
      const int64_t base = kv_.n_past - step_n_;  // the forward pass appended all rows
      controller_.RecordForwardCost(static_cast<int>(batch_other_rows_ + step_n_), forward_s);
      if (p_.size() < static_cast<size_t>(step_n_)) p_.resize(static_cast<size_t>(step_n_));
      // Row i's constraint state: after the pending token's row and drafts 0..i-1 (the rule
      // asks for rows in order, stopping at the first rejection).
      TokenConstraint* constraint = params_.constraint.get();
      if (constraint != nullptr) row_constraints_.assign(1, *constraint);
      const TargetDistFn p = [&](int i) -> const std::vector<Candidate>& {
        const TokenConstraint* c = nullptr;
        if (constraint != nullptr) {
          while (static_cast<int>(row_constraints_.size()) <= i) {
            row_constraints_.push_back(row_constraints_.back());
            row_constraints_.back().Accept(rows_[row_constraints_.size() - 1]);
          }
          c = &row_constraints_[static_cast<size_t>(i)];
        }
        sampler_.Distribution(Adjusted(logits + static_cast<int64_t>(i) * n_vocab, c,
                                       std::span<const TokenId>(rows_.data() + 1, static_cast<size_t>(i))),
                              n_vocab, &p_[i]);
        return p_[i];
      };
      const bool sampled_q = draft_.sampled && !params_.sampling.greedy();
      const std::span<const std::vector<Candidate>> q =
          sampled_q ? std::span<const std::vector<Candidate>>(draft_.q.data(), static_cast<size_t>(n_draft))
                    : std::span<const std::vector<Candidate>>();
      const VerifyOutcome v =
          VerifyDraft(std::span<const TokenId>(rows_.data() + 1, n_draft), q, p, rng_, &verify_scratch_);
      controller_.RecordAcceptance(n_draft, v.accepted);
      ++stats_.spec_steps;
      stats_.drafted += n_draft;
      stats_.accepted += v.accepted;
      for (int i = 0; i < std::min(n_draft, v.accepted + 1) && i < static_cast<int>(stats_.proposed_at.size()); ++i) {
        ++stats_.proposed_at[i];
        if (i < v.accepted) ++stats_.accepted_at[i];
      }
      // Keep the pending token and the accepted drafts; later rows are overwritten later.
      kv_.n_past = base + 1 + v.accepted;
      tokens_.insert(tokens_.end(), rows_.begin(), rows_.begin() + 1 + v.accepted);
      run_.assign(rows_.begin() + 1, rows_.begin() + 1 + v.accepted);
      run_.push_back(v.next);
      Emit(base + 1, logits, n_vocab, on_token);
      return Status::Ok();
    }
  }
  return Status::Ok();
}

void Sequence::Inject(std::span<const TokenId> tokens) {
  if (!done_ || stats_.stop == StopCause::kEndOfGeneration || stats_.stop == StopCause::kCancelled) return;
  // The KV holds the context before the last emitted token: feed it, then the new tokens.
  feed_.assign(tokens_.begin(), tokens_.end());
  feed_pos_ = static_cast<int64_t>(tokens_.size());
  if (last_emitted_ >= 0) feed_.push_back(last_emitted_);
  feed_.insert(feed_.end(), tokens.begin(), tokens.end());
  if (params_.constraint)
    for (TokenId t : tokens) params_.constraint->Accept(t);
  stats_.injected += static_cast<int64_t>(tokens.size());
  have_pending_ = false;
  done_ = false;
}

void Sequence::StoreInCache() {
  if (cache_ != nullptr && kv_.n_past > 0) cache_->Store(std::span<const TokenId>(tokens_), kv_.n_past, kv_);
}

}  // namespace mr
