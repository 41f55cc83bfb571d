// A grammar constraint on one request's output: the per-step token mask of constrained decoding.
//
// Plain sampling draws from the sampler's distribution over the masked logits (disallowed
// tokens at -inf), and speculative verification computes each verify row's distribution the
// same way with the state after that row's preceding drafts, so the output has exactly the law
// of plain constrained sampling.
//
// Lazy constraints (trigger strings) leave the output free until the generated text contains
// one of the triggers; the grammar, which begins with the trigger texts, then constrains the
// output from the trigger on (the bytes of the triggering token after it included). When the
// grammar is complete the constraint either waits for a trigger again (repeat, e.g. several tool
// calls) or allows only end-of-generation tokens. Should the state die anyway (an injected token,
// or a triggering token whose rest does not fit), the constraint turns itself off rather than
// leave nothing to sample.
//
// Copyable: a copy is the state to try drafts on. Not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/grammar.h"

namespace mr {

class TokenConstraint {
 public:
  struct Options {
    std::vector<std::string> triggers;  // empty: active from the start; else the grammar starts with one
    // Triggers that count only at the start of the output (after whitespace), or right after a
    // completed grammar (e.g. a bare JSON call object where a small model drops the tags).
    std::vector<std::string> start_triggers;
    bool repeat = false;  // lazy only: after the grammar completes, wait for a trigger again
  };
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenMasker> masker, Options opts);

  // The mask applies now (the grammar is open, or complete and only end-of-generation is left).
  bool active() const { return mode_ == Mode::kActive || mode_ == Mode::kDone; }
  // Sets the logits of disallowed tokens to -infinity (nothing when inactive). `scratch` holds
  // the mask between calls (its capacity is reused).
  void Apply(float* logits, std::vector<uint8_t>* scratch) const;
  // Whether t is allowed now (what Apply computes for one token).
  bool Allows(TokenId t) const;
  // Records an emitted (or injected) token.
  void Accept(TokenId t);
  // Turns the constraint off for the rest of the request (what follows is free).
  void Release() { mode_ = Mode::kOff; }
  const GrammarState& state() const { return state_; }
  const TokenMasker& masker() const { return *masker_; }

 private:
  enum class Mode { kFree, kActive, kDone, kOff };
  // Consumes `bytes` in kActive; handles completion and dead states.
  void Feed(std::string_view bytes);
  void Complete(std::string_view rest);  // the grammar completed; `rest` of the token is free text
  void Activate(std::string_view text);  // the grammar starts and consumes `text`
  bool lazy() const { return !opts_.triggers.empty() || !opts_.start_triggers.empty(); }
  // kFree: scans window_ + text for a trigger; activates at the first one.
  void Watch(std::string_view text);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenMasker> masker_;
  Options opts_;
  GrammarState state_;
  // kFree: lazy, waiting for the trigger; kActive: the grammar constrains; kDone: complete, only
  // end-of-generation; kOff: the state died, no constraint any more.
  Mode mode_ = Mode::kFree;
  std::string window_;      // kFree: the last bytes of the text (longest trigger - 1 at most)
  bool at_start_ = true;    // kFree: only whitespace since the start (or the last completion)
  std::string start_text_;  // kFree, at_start_: the text so far, whitespace included
  size_t max_trigger_ = 0;
};

}  // namespace mr
