#include "runtime/constraint.h"

#include <algorithm>
#include <limits>

#include "base/log.h"

namespace mr {

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenMasker> masker,
                                 Options opts)
    : grammar_(std::move(grammar)), masker_(std::move(masker)), opts_(std::move(opts)) {
  for (const std::string& t : opts_.triggers) max_trigger_ = std::max(max_trigger_, t.size());
  max_trigger_ = std::max<size_t>(max_trigger_, 1);
  if (!lazy()) {
    state_ = grammar_->Start();
    mode_ = Mode::kActive;
  }
}

void TokenConstraint::Apply(float* logits, std::vector<uint8_t>* scratch) const {
  if (!active()) return;
  const int64_t n = masker_->n_vocab();
  if (mode_ == Mode::kDone) {
    for (int64_t t = 0; t < n; ++t)
      if (!masker_->is_eog(static_cast<TokenId>(t))) logits[t] = -std::numeric_limits<float>::infinity();
    return;
  }
  masker_->Mask(state_, scratch);
  bool any = false;
  for (int64_t t = 0; t < n && !any; ++t) any = (*scratch)[t] != 0;
  if (!any) return;  // nothing fits (not possible with a byte-complete vocabulary): leave it free
  for (int64_t t = 0; t < n; ++t)
    if (!(*scratch)[t]) logits[t] = -std::numeric_limits<float>::infinity();
}

bool TokenConstraint::Allows(TokenId t) const {
  switch (mode_) {
    case Mode::kDone:
      return masker_->is_eog(t);
    case Mode::kActive:
      return masker_->Allows(state_, t);
    default:
      return true;
  }
}

void TokenConstraint::Activate(std::string_view text) {
  state_ = grammar_->Start();
  mode_ = Mode::kActive;
  window_.clear();
  Feed(text);
}

void TokenConstraint::Watch(std::string_view piece) {
  if (at_start_ && !opts_.start_triggers.empty()) {
    start_text_.append(piece);
    const size_t first = start_text_.find_first_not_of(" \t\r\n");
    if (first != std::string::npos) {
      const std::string_view rest = std::string_view(start_text_).substr(first);
      bool undecided = false;
      for (const std::string& t : opts_.start_triggers) {
        if (rest.substr(0, t.size()) == t) {
          const std::string text(rest);
          at_start_ = false;
          start_text_.clear();
          Activate(text);
          return;
        }
        undecided |= t.substr(0, rest.size()) == rest;
      }
      if (!undecided) {
        at_start_ = false;
        start_text_.clear();
      }
    }
  }
  const std::string text = window_ + std::string(piece);
  size_t at = std::string::npos;
  for (const std::string& t : opts_.triggers) at = std::min(at, text.find(t));
  if (at != std::string::npos) {
    Activate(std::string_view(text).substr(at));  // the grammar begins with the trigger itself
    return;
  }
  const size_t keep = max_trigger_ - 1;
  window_ = text.size() > keep ? text.substr(text.size() - keep) : text;
}

void TokenConstraint::Complete(std::string_view rest) {
  if (!lazy() || !opts_.repeat) {
    mode_ = Mode::kDone;
    return;
  }
  mode_ = Mode::kFree;
  window_.clear();
  at_start_ = true;  // a bare call may follow a call
  start_text_.clear();
  if (!rest.empty()) Watch(rest);
}

void TokenConstraint::Feed(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (state_.finished()) {
      Complete(bytes.substr(i));
      return;
    }
    if (!state_.Advance(static_cast<uint8_t>(bytes[i]))) {
      MR_LOGD("runtime", "constraint: the output left the grammar; constraint off");
      mode_ = lazy() && opts_.repeat ? Mode::kFree : Mode::kOff;
      window_.clear();
      return;
    }
  }
  // The grammar is done where nothing more can follow; while it still accepts and could go on,
  // end-of-generation is allowed along with the continuations.
  if (state_.finished()) Complete({});
}

void TokenConstraint::Accept(TokenId t) {
  if (mode_ == Mode::kOff || mode_ == Mode::kDone || masker_->is_eog(t)) return;
  const std::string& piece = masker_->piece(t);
  if (mode_ == Mode::kActive) {
    Feed(piece);
  } else {
    Watch(piece);
  }
}

}  // namespace mr
