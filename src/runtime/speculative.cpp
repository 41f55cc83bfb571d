#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>

#include "model/gguf.h"

namespace mr {

float ProbOf(const std::vector<Candidate>& dist, TokenId id) {
  for (const Candidate& c : dist)
    if (c.id == id) return c.p;
  return 0.0f;
}

VerifyOutcome VerifyDraft(std::span<const TokenId> drafts, std::span<const std::vector<Candidate>> q,
                          const TargetDistFn& p, Rng& rng, VerifyScratch* scratch) {
  VerifyOutcome out;
  const int k = static_cast<int>(drafts.size());
  for (int i = 0; i < k; ++i) {
    const std::vector<Candidate>& pi = p(i);
    const TokenId d = drafts[i];
    const bool one_hot = q.empty() || q[i].empty();
    const float qd = one_hot ? 1.0f : ProbOf(q[i], d);
    const float pd = ProbOf(pi, d);
    // Accept with probability min(1, p/q): u < p/q  <=>  u·q < p (u in [0, 1)).
    const bool accept = qd <= 0.0f ? pd > 0.0f : (pd >= qd || rng.Uniform() * qd < pd);
    if (accept) {
      ++out.accepted;
      continue;
    }
    // Rejected: draw from normalize(max(p − q, 0)). Only p's support can carry mass.
    std::vector<Candidate>& r = scratch->residual;
    r.clear();
    if (one_hot || qd <= 0.0f) {
      for (const Candidate& c : pi)
        if (c.id != d) r.push_back(c);
    } else {
      std::vector<float>& dense = scratch->dense;
      for (const Candidate& c : q[i]) {
        if (static_cast<size_t>(c.id) >= dense.size()) dense.resize(static_cast<size_t>(c.id) + 1, 0.0f);
        dense[c.id] = c.p;
      }
      for (const Candidate& c : pi) {
        const float qx = static_cast<size_t>(c.id) < dense.size() ? dense[c.id] : 0.0f;
        const float m = c.p - qx;
        if (m > 0.0f) r.push_back({c.id, m});
      }
      for (const Candidate& c : q[i]) dense[c.id] = 0.0f;
    }
    // Rounding can leave no mass (p ≈ q everywhere); p itself is then the right law.
    out.next = r.empty() ? Sampler::Draw(pi, rng) : Sampler::Draw(r, rng);
    return out;
  }
  out.next = Sampler::Draw(p(k), rng);  // all accepted: the bonus token
  return out;
}

// ---- NgramDrafter ----

Status NgramDrafter::Propose(std::span<const TokenId> context, int k, const SamplingParams&, Rng&, Draft* out) {
  out->Clear();
  const int64_t len = static_cast<int64_t>(context.size());
  if (k <= 0) return Status::Ok();
  for (int64_t n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const TokenId* suffix = context.data() + len - n;
    // Most recent earlier occurrence first: recent text predicts best.
    for (int64_t j = len - n - 1; j >= 0; --j) {
      if (context[j + n - 1] != suffix[n - 1] || !std::equal(suffix, suffix + n, context.data() + j)) continue;
      const int64_t from = j + n;
      const int64_t take = std::min<int64_t>(k, len - from);
      if (take <= 0) continue;
      out->tokens.assign(context.begin() + from, context.begin() + from + take);
      return Status::Ok();
    }
  }
  return Status::Ok();
}

// ---- ModelDrafter ----

Status CheckSameVocabulary(const Model& target, const Model& draft) {
  const Tokenizer& a = target.tokenizer();
  const Tokenizer& b = draft.tokenizer();
  if (a.vocab_size() != b.vocab_size())
    return InvalidArgument("[spec] draft model vocabulary differs: " + std::to_string(b.vocab_size()) +
                           " tokens, target has " + std::to_string(a.vocab_size()));
  for (int32_t i = 0; i < a.vocab_size(); ++i)
    if (a.text(i) != b.text(i) || a.IsEndOfGeneration(i) != b.IsEndOfGeneration(i))
      return InvalidArgument("[spec] draft model vocabulary differs at token " + std::to_string(i) + ": '" + b.text(i) +
                             "', target has '" + a.text(i) + "'");
  if (draft.config().n_vocab < a.vocab_size())
    return InvalidArgument("[spec] draft model has fewer output rows than tokens");
  return Status::Ok();
}

ModelDrafter::ModelDrafter(Model& draft, int64_t n_ctx)
    : draft_(draft), kv_(draft.NewKvCache(n_ctx)), logits_(static_cast<size_t>(draft.config().n_vocab)) {}

Result<std::unique_ptr<ModelDrafter>> ModelDrafter::Create(const Model& target, Model& draft, int64_t n_ctx) {
  MR_RETURN_IF_ERROR(CheckSameVocabulary(target, draft));
  if (n_ctx <= 0) return InvalidArgument("[spec] draft context must be positive");
  return std::unique_ptr<ModelDrafter>(new ModelDrafter(draft, n_ctx));
}

std::string ModelDrafter::name() const {
  return "model:" + draft_.file().GetString("general.name").value_or("draft");
}

Status ModelDrafter::CatchUp(std::span<const TokenId> context) {
  const int64_t len = static_cast<int64_t>(context.size());
  if (len == 0) return InvalidArgument("[spec] empty context");
  if (len > kv_.n_ctx) return OutOfRange("[spec] context exceeds the draft cache");
  // Keep the common prefix (this is the rollback), but evaluate at least the last token.
  int64_t keep = 0;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(tokens_.size()), len - 1);
  while (keep < limit && tokens_[keep] == context[keep]) ++keep;
  kv_.n_past = keep;
  tokens_.resize(keep);
  constexpr int64_t kChunk = 256;
  for (int64_t pos = keep; pos < len; pos += kChunk) {
    const int64_t n = std::min(kChunk, len - pos);
    Status st = draft_.Forward(kv_, context.data() + pos, n, false, logits_.data());
    if (!st.ok()) {
      kv_.n_past = 0;
      tokens_.clear();
      return st;
    }
    tokens_.insert(tokens_.end(), context.begin() + pos, context.begin() + pos + n);
  }
  return Status::Ok();
}

Status ModelDrafter::Begin(std::span<const TokenId> prompt) {
  return CatchUp(prompt);
}

Status ModelDrafter::Propose(std::span<const TokenId> context, int k, const SamplingParams& sampling, Rng& rng,
                             Draft* out) {
  out->Clear();
  // A context the draft cache cannot hold gets no draft (the target then decodes plainly).
  if (k <= 0 || static_cast<int64_t>(context.size()) >= kv_.n_ctx) return Status::Ok();
  MR_RETURN_IF_ERROR(CatchUp(context));
  if (out->q.size() < static_cast<size_t>(k)) out->q.resize(static_cast<size_t>(k));
  sampler_.set_params(sampling);
  out->sampled = true;
  const int64_t n_vocab = draft_.config().n_vocab;
  for (int i = 0; i < k; ++i) {
    std::vector<Candidate>& q = out->q[i];
    sampler_.Distribution(logits_.data(), n_vocab, &q);
    const TokenId d = sampling.greedy() ? q[0].id : Sampler::Draw(q, rng);
    out->tokens.push_back(d);
    if (i + 1 == k || kv_.n_past + 1 >= kv_.n_ctx) break;
    MR_RETURN_IF_ERROR(draft_.Forward(kv_, &d, 1, false, logits_.data()));
    tokens_.push_back(d);
  }
  return Status::Ok();
}

// ---- ChainDrafter ----

std::string ChainDrafter::name() const {
  std::string s;
  for (const Drafter* d : drafters_) s += (s.empty() ? "" : "+") + d->name();
  return s;
}

Status ChainDrafter::Begin(std::span<const TokenId> prompt) {
  for (Drafter* d : drafters_) MR_RETURN_IF_ERROR(d->Begin(prompt));
  return Status::Ok();
}

Status ChainDrafter::Propose(std::span<const TokenId> context, int k, const SamplingParams& sampling, Rng& rng,
                             Draft* out) {
  for (Drafter* d : drafters_) {
    MR_RETURN_IF_ERROR(d->Propose(context, k, sampling, rng, out));
    if (!out->tokens.empty()) return Status::Ok();
  }
  return Status::Ok();
}

// ---- CostController ----

namespace {
constexpr double kAlpha = 0.1;  // EMA weight of a new observation (~10-step memory)
void Ema(double* avg, int64_t* n, double x) {
  *avg = *n == 0 ? x : *avg + kAlpha * (x - *avg);
  ++*n;
}
}  // namespace

void CostController::Configure(int k_max, bool adaptive) {
  k_max = std::clamp(k_max, 0, kMaxK);
  if (k_max != k_max_ || adaptive != adaptive_) {
    // Acceptance is kept (it describes the drafter and the text); costs stay valid too.
    k_max_ = k_max;
    adaptive_ = adaptive;
    plain_streak_ = 0;
    probe_interval_ = 16;
  }
}

double CostController::forward_cost(int rows) const {
  rows = std::clamp(rows, 1, kMaxRows + 1);
  if (rows <= kMaxRows && fwd_n_[rows] > 0) return fwd_[rows];
  int lo = rows - 1, hi = rows + 1;
  while (lo >= 1 && fwd_n_[lo] == 0) --lo;
  while (hi <= kMaxRows && fwd_n_[hi] == 0) ++hi;
  if (lo >= 1 && hi <= kMaxRows) return fwd_[lo] + (fwd_[hi] - fwd_[lo]) * (rows - lo) / (hi - lo);
  if (lo >= 1) return fwd_[lo];  // optimistic: more rows cost at least this
  if (hi <= kMaxRows) return fwd_[hi];
  return 0.0;
}

bool CostController::MeasuredAtMost(int rows) const {
  for (int r = std::min(rows, kMaxRows); r >= 1; --r)
    if (fwd_n_[r] > 0) return true;
  return false;
}

bool CostController::MeasuredAbove(int rows) const {
  for (int r = std::max(rows + 1, 1); r <= kMaxRows; ++r)
    if (fwd_n_[r] > 0) return true;
  return false;
}

void CostController::SetBatch(int other_rows, double other_tokens) {
  other_rows_ = std::max(other_rows, 0);
  other_tokens_ = std::max(other_tokens, 0.0);
}

double CostController::expected_rate(int k) const {
  double expect = 1.0, run = 1.0;
  for (int i = 0; i < k; ++i) {
    run *= accept_[i];
    expect += run;
  }
  const double cost = draft_per_token_ * k + forward_cost(other_rows_ + 1 + k);
  return cost > 0.0 ? (other_tokens_ + expect) / cost : 0.0;
}

bool CostController::Calibrated() const {
  // A verify and a plain step (in a batch: steps of more rows than its plain size, and of at
  // most that) measured, and an acceptance, before any comparison.
  const int plain = other_rows_ + 1;
  return adaptive_ && k_max_ > 0 && accept_n_[0] > 0 && MeasuredAbove(plain) && MeasuredAtMost(plain);
}

// The best k by the current figures (k_max while not adaptive or calibrating the verify cost,
// 0 while calibrating the plain one).
int CostController::Best() const {
  if (!adaptive_ || k_max_ == 0) return k_max_;
  const int plain = other_rows_ + 1;
  if (!MeasuredAbove(plain) || accept_n_[0] == 0) return k_max_;
  if (!MeasuredAtMost(plain)) return 0;
  int best = 0;
  double best_rate = expected_rate(0);
  for (int k = 1; k <= k_max_; ++k) {
    const double r = expected_rate(k);
    if (r > best_rate) best_rate = r, best = k;
  }
  return best;
}

int CostController::Preview() const {
  const int best = Best();
  if (!Calibrated() || best > 0) return best;
  return plain_streak_ + 1 >= probe_interval_ ? k_max_ : 0;
}

int CostController::Choose() {
  const int best = Best();
  if (!Calibrated()) return best;
  if (best > 0) {
    plain_streak_ = 0;
    probe_interval_ = 16;
    return best;
  }
  // Plain decoding wins; probe now and then (less often while probes keep failing).
  if (++plain_streak_ >= probe_interval_) {
    plain_streak_ = 0;
    probe_interval_ = std::min<int64_t>(probe_interval_ * 2, 256);
    return k_max_;
  }
  return 0;
}

void CostController::RecordAcceptance(int proposed, int accepted) {
  // Position i is observed only when every draft before it was accepted.
  const int observed = std::min(proposed, accepted + 1);
  for (int i = 0; i < observed && i < kMaxK; ++i) Ema(&accept_[i], &accept_n_[i], i < accepted ? 1.0 : 0.0);
}

void CostController::RecordDraftCost(int n_tokens, double seconds) {
  if (n_tokens > 0) Ema(&draft_per_token_, &draft_n_, seconds / n_tokens);
}

void CostController::RecordForwardCost(int rows, double seconds) {
  if (rows >= 1 && rows <= kMaxRows) Ema(&fwd_[rows], &fwd_n_[rows], seconds);
}

}  // namespace mr
