// Speculative-decoding configuration shared by `serve`, `qualify speed` and `run`: parsing
// "draft=...,k=..." and the MERERUN_DRAFT / MERERUN_DRAFT_TOKENS environment variables (read here,
// in app/, and nowhere below), and building the drafters a configuration names.
//
//   draft: off | 0 | ngram | model | chain | model:NAME | ngram+model:NAME. "chain" (=
//          ngram+model) asks n-gram lookup first and the draft model when it finds nothing;
//          "model" and "chain" take the draft model from --draft-model.
//   k:     auto (the cost controller picks 0..7 per step) | auto:KMAX | N (fixed, 1..16)
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "model/model.h"
#include "runtime/sequence.h"
#include "runtime/speculative.h"

namespace mr::app {

struct DecodeConfig {
  std::string text;  // as given
  bool ngram = false;
  bool use_model = false;   // a draft model drafts (draft_model names it)
  std::string draft_model;  // catalog name or path
  int k = kDefaultDraftTokens;
  bool adaptive = true;
  bool speculative() const { return ngram || use_model; }
  // An error when a draft model is asked for and none is named.
  Status Validate() const;
  // "off", "ngram", "model:NAME" or "ngram+model:NAME".
  std::string DrafterName() const;
  // "auto", "auto:KMAX" or "N".
  std::string TokensName() const;
  nlohmann::json ToJson() const;
};

// Parses "key=value,..." (keys draft / MERERUN_DRAFT and k / MERERUN_DRAFT_TOKENS) on top of *c.
bool ParseConfig(const std::string& text, DecodeConfig* c, std::string* err);
// Sets one key ("draft" or "k") from a value; *err names the allowed values on failure.
bool SetConfigValue(const std::string& key, const std::string& value, DecodeConfig* c, std::string* err);
// Applies MERERUN_DRAFT and MERERUN_DRAFT_TOKENS when set. An invalid value is an error naming
// the variable and the allowed values.
Status ApplyDraftEnvironment(DecodeConfig* c);

// One set of drafters for one sequence. The draft model, when any, is shared (not owned).
class OwnedDrafter : public Drafter {
 public:
  std::string name() const override { return active_->name(); }
  Status Begin(std::span<const TokenId> prompt) override { return active_->Begin(prompt); }
  Status Propose(std::span<const TokenId> context, int k, const SamplingParams& sampling, Rng& rng,
                 Draft* out) override {
    return active_->Propose(context, k, sampling, rng, out);
  }

 private:
  friend Result<std::unique_ptr<OwnedDrafter>> MakeDrafter(const DecodeConfig&, const Model&, Model*, int64_t,
                                                           const std::string&);
  NgramDrafter ngram_;
  std::unique_ptr<ModelDrafter> model_;
  std::unique_ptr<ChainDrafter> chain_;
  Drafter* active_ = nullptr;
};

// The drafter `c` names, for a target of context n_ctx; `draft_model` must be loaded when
// c.draft_model is set (vocabulary identity is checked here). Null when c is not speculative.
// `target_name` names the target in errors.
Result<std::unique_ptr<OwnedDrafter>> MakeDrafter(const DecodeConfig& c, const Model& target, Model* draft_model,
                                                  int64_t n_ctx, const std::string& target_name = "");

}  // namespace mr::app
