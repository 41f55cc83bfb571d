// Speculative decoding: the exact acceptance rule, the drafter interface, the drafters (n-gram
// lookup, a draft model, a chain of both), and the cost controller that picks the draft length.
//
// Acceptance (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
// and Chen et al. 2023): for draft token d drawn from q, with target distribution p (the
// sampler's final tempered, truncated distribution), accept with probability min(1, p(d)/q(d));
// on the first rejection draw the replacement from normalize(max(p − q, 0)); when every draft is
// accepted draw one bonus token from the next p. A deterministic drafter has q = one-hot(d), so
// acceptance is p(d) and the residual is p with d removed. Greedy (p one-hot on the argmax)
// reduces to "accept while d == argmax", and the correction is the argmax.
//
// Thread-safety: none of these are thread-safe; they belong to the Generator's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace mr {

// Probability of `id` in a candidate list (0 when absent). Linear in the list size.
float ProbOf(const std::vector<Candidate>& dist, TokenId id);

// Scratch for VerifyDraft; reuse one across calls (no allocation once warm).
struct VerifyScratch {
  std::vector<float> dense;  // (max id + 1) q values, zero between calls
  std::vector<Candidate> residual;
};

struct VerifyOutcome {
  int accepted = 0;   // drafts accepted, 0..drafts.size()
  TokenId next = -1;  // the token after them: a residual draw, or the bonus from p[accepted]
};

// Target distribution of position i (i = 0..drafts.size()): p(token | context, drafts[0..i)).
// Called lazily, in order, only for the positions verification reaches.
using TargetDistFn = std::function<const std::vector<Candidate>&(int i)>;

// The exact rule above. q[i] is the draft distribution drafts[i] was drawn from; an empty list
// means deterministic (one-hot). `q` is empty or has drafts.size() entries.
VerifyOutcome VerifyDraft(std::span<const TokenId> drafts, std::span<const std::vector<Candidate>> q,
                          const TargetDistFn& p, Rng& rng, VerifyScratch* scratch);

// A proposal: tokens and, per token, the distribution it was drawn from (empty = deterministic).
struct Draft {
  std::vector<TokenId> tokens;
  bool sampled = false;                   // q is valid; false: deterministic (q one-hot)
  std::vector<std::vector<Candidate>> q;  // when sampled: q[i] for tokens[i] (capacity reused)
  void Clear() {
    tokens.clear();
    sampled = false;
  }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // A request starts: `prompt` is the context the target just evaluated. Lets a model drafter
  // evaluate the prompt during prefill rather than in the first decode step.
  virtual Status Begin(std::span<const TokenId> prompt) {
    (void)prompt;
    return Status::Ok();
  }
  // Propose up to k tokens continuing `context` (everything the target has seen, including the
  // last emitted token). Fewer (even zero) is allowed. `sampling` is the request's sampling; a
  // sampling drafter draws with it from `rng` and fills out->q.
  virtual Status Propose(std::span<const TokenId> context, int k, const SamplingParams& sampling, Rng& rng,
                         Draft* out) = 0;
};

// Suffix lookup over the context (prompt lookup decoding): finds the most recent earlier
// occurrence of the longest context suffix of length max_ngram..min_ngram and proposes the
// tokens that followed it. Deterministic (q one-hot). No model, ~µs per proposal.
class NgramDrafter : public Drafter {
 public:
  explicit NgramDrafter(int min_ngram = 2, int max_ngram = 4) : min_n_(min_ngram), max_n_(max_ngram) {}
  std::string name() const override { return "ngram"; }
  Status Propose(std::span<const TokenId> context, int k, const SamplingParams& sampling, Rng& rng,
                 Draft* out) override;

 private:
  int min_n_, max_n_;
};

// A smaller model with the same vocabulary. Keeps its own KV cache; rollback is implicit: each
// call keeps the longest common prefix of what its cache holds and the new context, evaluates
// the rest in one multi-row Forward, then drafts k tokens one row at a time, sampling each from
// its sampler's distribution with the request's parameters (greedy: argmax, q one-hot).
class ModelDrafter : public Drafter {
 public:
  // Fails unless the draft vocabulary is identical to the target's (same size, same token
  // strings). `draft` must outlive the drafter.
  static Result<std::unique_ptr<ModelDrafter>> Create(const Model& target, Model& draft, int64_t n_ctx);
  std::string name() const override;
  Status Begin(std::span<const TokenId> prompt) override;
  Status Propose(std::span<const TokenId> context, int k, const SamplingParams& sampling, Rng& rng,
                 Draft* out) override;
  Model& model() { return draft_; }

 private:
  ModelDrafter(Model& draft, int64_t n_ctx);
  Status CatchUp(std::span<const TokenId> context);

  Model& draft_;
  KvCache kv_;
  std::vector<TokenId> tokens_;  // tokens whose KV is in kv_
  std::vector<float> logits_;    // (n_vocab) of the last evaluated row
  Sampler sampler_;
};

// Same vocabulary: equal n_vocab and tokenizer sizes and identical token strings.
Status CheckSameVocabulary(const Model& target, const Model& draft);

// Asks each drafter in turn and keeps the first non-empty proposal (e.g. n-gram lookup when the
// context repeats, the draft model otherwise). Every drafter's Begin runs.
class ChainDrafter : public Drafter {
 public:
  explicit ChainDrafter(std::vector<Drafter*> drafters) : drafters_(std::move(drafters)) {}
  std::string name() const override;
  Status Begin(std::span<const TokenId> prompt) override;
  Status Propose(std::span<const TokenId> context, int k, const SamplingParams& sampling, Rng& rng,
                 Draft* out) override;

 private:
  std::vector<Drafter*> drafters_;
};

// Picks the draft length k in 0..k_max that maximises expected tokens per second from measured
// figures: acceptance rate per draft position i (probability draft i is accepted given drafts
// before it were), the cost of drafting per token, and the cost of a target Forward of r rows
// (r = 1 is a plain step, r = k+1 a verify). Expected tokens of a k-step are
// 1 + Σ_{i≤k} Π_{j≤i} a_j; its cost is draft(k) + verify(k+1). k = 0 (plain decoding) wins when
// speculation does not pay; then every `probe_interval` steps it probes with k_max so the
// figures recover when the text becomes predictable again. Figures are exponential moving
// averages, so they follow changes.
// In a batch (SetBatch: the other sequences' rows and expected tokens in the same forward pass),
// forward costs are by the step's total rows and the rate maximised is the batch's:
// (other tokens + expected tokens) / (draft(k) + forward(other rows + 1 + k)). A draft row
// lengthens every sequence's step, so it must pay at the batch's margin, not only for its own
// sequence. Alone (the default) this is the formula above.
class CostController {
 public:
  static constexpr int kMaxK = 16;
  static constexpr int kMaxRows = 64;  // forward costs are kept for steps of 1..kMaxRows rows
  explicit CostController(int k_max = 7, bool adaptive = true) { Configure(k_max, adaptive); }
  void Configure(int k_max, bool adaptive);
  int k_max() const { return k_max_; }
  bool adaptive() const { return adaptive_; }

  // The k for the next step (k_max when not adaptive or still calibrating).
  int Choose();
  // What Choose would return now, without counting it (probing included).
  int Preview() const;
  // Feedback. proposed: drafts verified; accepted: how many of them were accepted.
  void RecordAcceptance(int proposed, int accepted);
  void RecordDraftCost(int n_tokens, double seconds);
  // rows: the step's total rows (its own when alone).
  void RecordForwardCost(int rows, double seconds);
  // The rest of the next step's batch: the other sequences' rows and the tokens they are
  // expected to yield (one per decoding sequence). 0, 0: alone.
  void SetBatch(int other_rows, double other_tokens);

  // Current estimates (for reports): acceptance at position i (1-based), cost of r rows.
  double acceptance(int i) const { return accept_[i - 1]; }
  double forward_cost(int rows) const;  // seconds; interpolated when not measured
  double expected_rate(int k) const;    // tokens per second
  double draft_cost_per_token() const { return draft_per_token_; }

 private:
  bool Calibrated() const;
  int Best() const;
  bool MeasuredAtMost(int rows) const;  // a forward cost of 1..rows rows is known
  bool MeasuredAbove(int rows) const;   // one of more than `rows` rows is known

  int k_max_ = 7;
  bool adaptive_ = true;
  double accept_[kMaxK] = {};
  int64_t accept_n_[kMaxK] = {};
  double fwd_[kMaxRows + 1] = {};  // index = the step's total rows
  int64_t fwd_n_[kMaxRows + 1] = {};
  int other_rows_ = 0;
  double other_tokens_ = 0.0;
  double draft_per_token_ = 0.0;
  int64_t draft_n_ = 0;
  int64_t plain_streak_ = 0;  // consecutive k = 0 choices
  int64_t probe_interval_ = 16;
};

}  // namespace mr
