#include "app/spec_config.h"

#include <charconv>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "model/gguf.h"

namespace mr::app {

std::string DecodeConfig::DrafterName() const {
  if (!speculative()) return "off";
  if (ngram && use_model) return "ngram+model:" + draft_model;
  return ngram ? "ngram" : "model:" + draft_model;
}

Status DecodeConfig::Validate() const {
  if (use_model && draft_model.empty())
    return InvalidArgument("the drafter '" + std::string(ngram ? "chain" : "model") +
                           "' needs a draft model (--draft-model NAME, or model:NAME)");
  return Status::Ok();
}

std::string DecodeConfig::TokensName() const {
  if (!adaptive) return std::to_string(k);
  return k == kDefaultDraftTokens ? "auto" : "auto:" + std::to_string(k);
}

nlohmann::json DecodeConfig::ToJson() const {
  return {{"spec", text},
          {"drafter", DrafterName()},
          {"ngram", ngram},
          {"draft_model", use_model ? draft_model : ""},
          {"k", speculative() ? k : 0},
          {"adaptive", speculative() && adaptive}};
}

bool SetConfigValue(const std::string& key, const std::string& v, DecodeConfig* c, std::string* err) {
  if (key == "draft" || key == "MERERUN_DRAFT" || key == "--draft") {
    const std::string allowed = " (off, ngram, model, chain, model:NAME, ngram+model:NAME)";
    c->ngram = false;
    c->use_model = false;
    if (v == "0" || v == "off" || v == "none") return true;
    if (v == "chain") {
      c->ngram = c->use_model = true;
      return true;
    }
    std::stringstream parts(v);
    std::string p;
    int n = 0;
    while (std::getline(parts, p, '+')) {
      ++n;
      if (p == "ngram") {
        c->ngram = true;
      } else if (p == "model") {
        c->use_model = true;
      } else if (p.rfind("model:", 0) == 0 && p.size() > 6) {
        c->use_model = true;
        c->draft_model = p.substr(6);
      } else {
        *err = key + ": unknown drafter '" + p + "'" + allowed;
        return false;
      }
    }
    if (n == 0) {
      *err = key + ": empty" + allowed;
      return false;
    }
    return true;
  }
  if (key == "k" || key == "MERERUN_DRAFT_TOKENS" || key == "--draft-tokens") {
    // Strict integers: "k=3x" or "k=auto:" is an error, not 3 or 0.
    auto to_int = [](std::string_view t) {
      int n = 0;
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
      return ec == std::errc() && end == t.data() + t.size() ? n : 0;
    };
    DecodeConfig next = *c;
    if (v == "auto") {
      next.adaptive = true;
      next.k = kDefaultDraftTokens;
    } else if (v.rfind("auto:", 0) == 0) {
      next.adaptive = true;
      next.k = to_int(std::string_view(v).substr(5));
    } else {
      next.adaptive = false;
      next.k = to_int(v);
    }
    if (next.k < 1 || next.k > CostController::kMaxK) {
      *err = key + " must be auto, auto:KMAX or N with KMAX, N in 1.." + std::to_string(CostController::kMaxK) +
             "; got '" + v + "'";
      return false;
    }
    *c = next;
    return true;
  }
  *err = "unknown key '" + key + "' (draft, k)";
  return false;
}

bool ParseConfig(const std::string& text, DecodeConfig* c, std::string* err) {
  c->text = text;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      *err = "expected key=value, got '" + item + "'";
      return false;
    }
    if (!SetConfigValue(item.substr(0, eq), item.substr(eq + 1), c, err)) return false;
  }
  return true;
}

Status ApplyDraftEnvironment(DecodeConfig* c) {
  for (const char* name : {"MERERUN_DRAFT", "MERERUN_DRAFT_TOKENS"}) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    std::string err;
    if (!SetConfigValue(name, v, c, &err)) return InvalidArgument(err);
  }
  return Status::Ok();
}

Result<std::unique_ptr<OwnedDrafter>> MakeDrafter(const DecodeConfig& c, const Model& target, Model* draft_model,
                                                  int64_t n_ctx, const std::string& target_name) {
  MR_RETURN_IF_ERROR(c.Validate());
  if (!c.speculative()) return std::unique_ptr<OwnedDrafter>();
  auto d = std::unique_ptr<OwnedDrafter>(new OwnedDrafter());
  if (c.use_model) {
    if (draft_model == nullptr) return InvalidArgument("draft model '" + c.draft_model + "' is not loaded");
    auto md = ModelDrafter::Create(target, *draft_model, n_ctx);
    if (!md.ok())
      return InvalidArgument("draft model '" + c.draft_model + "' cannot draft for '" +
                             (target_name.empty() ? target.file().path() : target_name) +
                             "': " + md.status().message());
    d->model_ = std::move(md).value();
  }
  if (c.ngram && d->model_) {
    d->chain_ = std::make_unique<ChainDrafter>(std::vector<Drafter*>{&d->ngram_, d->model_.get()});
    d->active_ = d->chain_.get();
  } else if (c.ngram) {
    d->active_ = &d->ngram_;
  } else {
    d->active_ = d->model_.get();
  }
  return d;
}

}  // namespace mr::app
