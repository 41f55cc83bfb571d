#include "server/chat_session.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "base/log.h"

namespace mr::server {

size_t CompleteUtf8Prefix(std::string_view s) {
  // Walk back over at most 3 continuation bytes to the last lead byte.
  size_t i = s.size();
  size_t back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i == 0) return back == 0 ? 0 : s.size();  // only continuation bytes: pass them on
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t need = 1;
  if (lead >= 0xF0)
    need = 4;
  else if (lead >= 0xE0)
    need = 3;
  else if (lead >= 0xC0)
    need = 2;
  if (need == 1) return s.size();
  return back + 1 >= need ? s.size() : i - 1;
}

bool ReasonsNatively(const ServedModel& sm) {
  return sm.family == ChatFamily::kHarmony || (sm.model != nullptr && HasNativeReasoning(sm.model->file()));
}

std::string RandomId(const char* prefix, int n) {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string s = prefix;
  for (int i = 0; i < n; ++i) s.push_back(kChars[rng() % (sizeof(kChars) - 1)]);
  return s;
}

void EventChannel::Push(StreamEvent ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

bool EventChannel::Pop(StreamEvent* ev, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return false;
  *ev = std::move(q_.front());
  q_.pop_front();
  return true;
}

// The prompt's tokens: the template's control tokens parsed, the request's content as text.
std::vector<TokenId> EncodePrompt(const ServedModel& sm, const RenderedChat& r, size_t from_char, bool add_special) {
  const Tokenizer& tok = sm.model->tokenizer();
  const std::string_view text = std::string_view(r.text).substr(from_char);
  if (sm.family == ChatFamily::kNone) return tok.Encode(text, add_special, /*parse_special=*/false);
  std::vector<TextSpan> spans;
  for (const TextSpan& sp : r.literal)
    if (sp.end > from_char) spans.push_back({std::max(sp.begin, from_char) - from_char, sp.end - from_char});
  return tok.EncodeTemplated(text, add_special, spans);
}

RenderedChat RenderCacheCut(const ServedModel& sm, const ChatRequest& req, const CacheCut& cut) {
  std::vector<ChatMessage> msgs(req.messages.begin(), req.messages.begin() + static_cast<ptrdiff_t>(std::min(
                                                                                 cut.n_messages, req.messages.size())));
  if (cut.partial) msgs.push_back(*cut.partial);
  ChatRenderOptions opts = req.render;
  opts.assistant_prefix.clear();
  opts.continue_final = false;
  opts.add_generation_prompt = false;  // kTemplate; the hand-written families' opening is cut below
  if (opts.tools.size() > cut.n_tools) opts.tools.resize(cut.n_tools);
  // Gemma writes the system text (tools included) into the first user turn: without a user
  // message it would not be rendered at all.
  if (sm.family == ChatFamily::kGemma &&
      std::none_of(msgs.begin(), msgs.end(), [](const ChatMessage& m) { return m.role != "system"; }))
    msgs.push_back({"user", "", {}, {}, {}});
  RenderedChat r = RenderChatSpans(sm.family, sm.model->file(), msgs, opts);
  std::string& text = r.text;
  // What RenderChat appends to open the assistant turn (scaffolding: no literal span in it).
  const std::string_view gen = sm.family == ChatFamily::kChatML  ? "<|im_start|>assistant\n"
                               : sm.family == ChatFamily::kGemma ? "<start_of_turn>model\n"
                                                                 : "";
  if (!gen.empty() && text.size() >= gen.size() && text.compare(text.size() - gen.size(), gen.size(), gen) == 0)
    text.resize(text.size() - gen.size());
  return r;
}

std::vector<CacheBreakpoint> MapCacheCuts(const ServedModel& sm, const ChatRequest& req, const RenderedChat& rendered,
                                          const std::vector<TokenId>& prompt) {
  const std::string& prompt_text = rendered.text;
  std::vector<CacheBreakpoint> out;
  if (req.cache_cuts.empty()) return out;
  const Tokenizer& tok = sm.model->tokenizer();
  const bool parse_special = sm.family != ChatFamily::kNone;
  // The tokenizer encodes the text between special tokens piece by piece, so the tokens after a
  // turn marker depend only on the text after it: each cut is tokenized from the last turn
  // marker the cut and the full prompt share, not from the start (a long conversation would
  // otherwise be tokenized once per breakpoint).
  const std::string marker = sm.family == ChatFamily::kChatML  ? "<|im_start|>"
                             : sm.family == ChatFamily::kGemma ? "<start_of_turn>"
                                                               : "";
  const TokenId marker_id = marker.empty() ? -1 : tok.Find(marker);
  for (const CacheCut& cut : req.cache_cuts) {
    const RenderedChat cut_render = RenderCacheCut(sm, req, cut);
    const std::string& text = cut_render.text;
    size_t common = 0;  // characters
    const size_t n = std::min(text.size(), prompt_text.size());
    while (common < n && text[common] == prompt_text[common]) ++common;
    size_t from_char = 0, from_token = 0;
    bool restart = false;
    if (marker_id >= 0 && parse_special && common >= marker.size()) {
      const size_t pos = prompt_text.rfind(marker, common - marker.size());
      if (pos != std::string::npos) {
        size_t k = 0;  // markers in the text before pos; the prompt has as many marker tokens before it
        for (size_t p = prompt_text.find(marker); p < pos; p = prompt_text.find(marker, p + marker.size())) ++k;
        for (size_t i = 0; i < prompt.size(); ++i) {
          if (prompt[i] != marker_id) continue;
          if (k-- == 0) {
            from_token = i + 1;
            from_char = pos + marker.size();
            restart = true;
            break;
          }
        }
      }
    }
    const std::vector<TokenId> cut_tokens =
        EncodePrompt(sm, cut_render, restart ? from_char : 0, /*add_special=*/!restart);
    size_t end = from_token;
    for (size_t i = 0; i < cut_tokens.size() && end < prompt.size() && cut_tokens[i] == prompt[end]; ++i) ++end;
    if (end == 0) continue;
    out.push_back({static_cast<int64_t>(end), cut.one_hour});
  }
  std::sort(out.begin(), out.end(), [](const CacheBreakpoint& a, const CacheBreakpoint& b) { return a.end < b.end; });
  std::vector<CacheBreakpoint> merged;
  for (const CacheBreakpoint& b : out) {
    if (!merged.empty() && merged.back().end == b.end) {
      merged.back().one_hour |= b.one_hour;
    } else {
      merged.push_back(b);
    }
  }
  return merged;
}

namespace {

// Anthropic's rule for reasoning: only the current tool loop's (the assistant turns after the
// last user turn) is replayed into the prompt; earlier turns' is dropped.
void DropEarlierReasoning(std::vector<ChatMessage>* msgs) {
  size_t last_user = SIZE_MAX;
  for (size_t i = 0; i < msgs->size(); ++i)
    if ((*msgs)[i].role == "user") last_user = i;
  if (last_user == SIZE_MAX) return;
  for (size_t i = 0; i < last_user; ++i) (*msgs)[i].reasoning.clear();
}

// Prompt bytes beyond which nothing is tokenized (see PrepareChat).
size_t MaxPromptBytes(const ServedModel& sm) {
  return static_cast<size_t>(std::max<int64_t>(sm.n_ctx, 1)) * 16;
}

int64_t PromptTokens(const ServedModel& sm, const ChatRequest& req) {
  ChatRequest r = req;
  DropEarlierReasoning(&r.messages);
  const RenderedChat rendered = RenderChatSpans(sm.family, sm.model->file(), r.messages, r.render);
  if (!rendered.error.empty() || rendered.text.size() > MaxPromptBytes(sm)) return INT64_MAX / 4;  // refused later
  return static_cast<int64_t>(EncodePrompt(sm, rendered, 0, /*add_special=*/true).size());
}

// Applies req->context_edits in order; returns the response's context_management object.
nlohmann::ordered_json ApplyContextEdits(const ServedModel& sm, ChatRequest* req) {
  using Json = nlohmann::ordered_json;
  const int64_t original = PromptTokens(sm, *req);
  int64_t current = original;
  Json applied = Json::array();
  for (const ContextEdit& e : req->context_edits) {
    std::vector<ChatMessage> before = req->messages;
    if (e.kind == ContextEdit::Kind::kClearThinking) {
      std::vector<size_t> turns;
      for (size_t i = 0; i < req->messages.size(); ++i)
        if (req->messages[i].role == "assistant" && !req->messages[i].reasoning.empty()) turns.push_back(i);
      const size_t keep = e.keep < 0 ? turns.size() : std::min(turns.size(), static_cast<size_t>(e.keep));
      const size_t n_clear = turns.size() - keep;
      if (n_clear == 0) continue;
      for (size_t k = 0; k < n_clear; ++k) req->messages[turns[k]].reasoning.clear();
      const int64_t now = PromptTokens(sm, *req);
      applied.push_back({{"type", "clear_thinking_20251015"},
                         {"cleared_thinking_turns", n_clear},
                         {"cleared_input_tokens", std::max<int64_t>(0, current - now)}});
      current = now;
      continue;
    }
    // clear_tool_uses: every call, oldest first, with the message holding its result.
    struct Use {
      size_t msg, call;
      std::string name;
      size_t result = SIZE_MAX;
    };
    std::vector<Use> uses;
    std::map<std::string, size_t> by_id;
    for (size_t i = 0; i < req->messages.size(); ++i) {
      const ChatMessage& m = req->messages[i];
      if (m.role == "assistant") {
        for (size_t c = 0; c < m.tool_calls.size(); ++c) {
          if (!m.tool_calls[c].id.empty()) by_id[m.tool_calls[c].id] = uses.size();
          uses.push_back({i, c, m.tool_calls[c].name});
        }
      } else if (m.role == "tool") {
        auto it = by_id.find(m.tool_call_id);
        if (it != by_id.end()) uses[it->second].result = i;
      }
    }
    const bool triggered =
        e.trigger_on_tool_uses ? static_cast<int64_t>(uses.size()) > e.trigger_value : current > e.trigger_value;
    if (!triggered) continue;
    const size_t keep = std::min(uses.size(), static_cast<size_t>(std::max<int64_t>(e.keep, 0)));
    int64_t n_cleared = 0;
    for (size_t u = 0; u + keep < uses.size(); ++u) {
      const Use& use = uses[u];
      if (std::find(e.exclude_tools.begin(), e.exclude_tools.end(), use.name) != e.exclude_tools.end()) continue;
      bool cleared = false;
      if (use.result != SIZE_MAX && req->messages[use.result].content != kClearedToolResult) {
        req->messages[use.result].content = kClearedToolResult;
        cleared = true;
      }
      const bool inputs = e.clear_all_inputs || std::find(e.clear_inputs_of.begin(), e.clear_inputs_of.end(),
                                                          use.name) != e.clear_inputs_of.end();
      ChatToolCall& call = req->messages[use.msg].tool_calls[use.call];
      if (inputs && !call.arguments.empty()) {
        call.arguments = Json::object();
        cleared = true;
      }
      n_cleared += cleared ? 1 : 0;
    }
    const int64_t now = n_cleared > 0 ? PromptTokens(sm, *req) : current;
    if (n_cleared == 0 || current - now < e.clear_at_least) {
      req->messages = std::move(before);  // not worth it: the prompt (and its cache) stays
      continue;
    }
    applied.push_back({{"type", "clear_tool_uses_20250919"},
                       {"cleared_tool_uses", n_cleared},
                       {"cleared_input_tokens", std::max<int64_t>(0, current - now)}});
    current = now;
  }
  return Json{{"applied_edits", std::move(applied)}, {"original_input_tokens", original}};
}

// The prompt's length, max_tokens and the sampling: what every generation request shares.
std::optional<ApiError> SetGeneration(const ServedModel& sm, const ChatRequest& req, PreparedChat* out) {
  const int64_t n = static_cast<int64_t>(out->prompt.size());
  const int64_t max_prompt = sm.n_ctx - 1;
  if (n > max_prompt)
    return InvalidRequest("prompt is too long: " + std::to_string(n) + " tokens > " + std::to_string(max_prompt) +
                          " maximum");
  if (n == 0) return InvalidRequest("the prompt is empty");
  const int64_t room = sm.n_ctx - n;
  out->max_tokens = req.max_tokens < 0 ? room : std::min(req.max_tokens, room);
  if (sm.max_output_tokens > 0) out->max_tokens = std::min(out->max_tokens, sm.max_output_tokens);

  SamplingParams s = sm.default_sampling;
  if (req.temperature) s.temperature = *req.temperature;
  if (req.top_p) s.top_p = *req.top_p;
  if (req.top_k) s.top_k = *req.top_k;
  if (req.min_p) s.min_p = *req.min_p;
  if (req.infill_sampler) s.infill = &sm.model->tokenizer();
  out->params.sampling = s;
  out->params.max_tokens = out->max_tokens;
  const int64_t n_vocab = sm.model->config().n_vocab;
  for (const auto& [t, b] : req.adjust.bias)
    if (t < 0 || t >= n_vocab)
      return InvalidRequest("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                            std::to_string(n_vocab - 1) + ")");
  out->params.adjust = req.adjust;
  out->params.logprobs = req.logprobs;
  out->params.prompt_logprobs = req.prompt_logprobs;
  if (req.seed) {
    out->params.seed = *req.seed;
    out->params.seeded = true;
  }
  out->family = sm.family;
  return std::nullopt;
}

// A /v1/completions prompt: BOS where the model's metadata asks for it, then the text as text
// (or the ids as given); with a suffix, <fim_prefix> text <fim_suffix> suffix <fim_middle>.
std::optional<ApiError> EncodeRawPrompt(const ServedModel& sm, const RawPrompt& raw, std::vector<TokenId>* out) {
  const Tokenizer& tok = sm.model->tokenizer();
  const int64_t n_vocab = sm.model->config().n_vocab;
  if (!raw.ids.empty()) {
    if (raw.suffix) return InvalidRequest("suffix: not with a token-array prompt; send the prompt as text");
    for (const TokenId t : raw.ids)
      if (t < 0 || t >= n_vocab)
        return InvalidRequest("prompt: token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                              std::to_string(n_vocab - 1) + ")");
    *out = raw.ids;
    return std::nullopt;
  }
  const size_t bytes = raw.text.size() + (raw.suffix ? raw.suffix->size() : 0);
  if (bytes > MaxPromptBytes(sm))
    return InvalidRequest("prompt is too long: " + std::to_string(bytes) + " bytes of text cannot fit a " +
                          std::to_string(sm.n_ctx) + "-token context");
  if (!raw.suffix) {
    *out = tok.Encode(raw.text, /*add_special=*/true, /*parse_special=*/false);
    return std::nullopt;
  }
  const Tokenizer::FimTokens fim = tok.fim();
  if (!fim.ok())
    return InvalidRequest("suffix: model '" + sm.id +
                          "' has no fill-in-the-middle tokens; send the prompt without a suffix");
  out->clear();
  const std::vector<TokenId> head = tok.Encode("", /*add_special=*/true, /*parse_special=*/false);
  if (!head.empty() && head[0] == tok.bos_id()) out->push_back(head[0]);
  auto append = [&](TokenId marker, const std::string& text) {
    out->push_back(marker);
    const std::vector<TokenId> ids = tok.Encode(text, /*add_special=*/false, /*parse_special=*/false);
    out->insert(out->end(), ids.begin(), ids.end());
  };
  append(fim.prefix, raw.text);
  append(fim.suffix, *raw.suffix);
  out->push_back(fim.middle);
  return std::nullopt;
}

// /infill's budget: as llama.cpp's default batch of 2,048 tokens, a prefix of at most 3/4 of it
// and a suffix of the rest; the other files get what the context has left after twice the output
// reserve (max_tokens, or kInfillReserve when unbounded).
constexpr int64_t kInfillBatch = 2048;
constexpr int64_t kInfillReserve = 256;
constexpr size_t kBytesPerToken = 16;  // no real text averages more (MaxPromptBytes)

// The last (from_end) or first `max_bytes` of `s`, cut at a character boundary.
std::string_view Utf8Part(std::string_view s, size_t max_bytes, bool from_end) {
  if (s.size() <= max_bytes) return s;
  auto inside = [&](size_t at) {
    return at > 0 && at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80;
  };
  size_t at = from_end ? s.size() - max_bytes : max_bytes;
  while (inside(at)) from_end ? ++at : --at;
  return from_end ? s.substr(at) : s.substr(0, at);
}

// llama.cpp's /infill prompt: [BOS] [<repo>myproject\n (<file_sep>name\ntext)* <file_sep>filename\n]
// <fim_prefix>prefix<fim_suffix>suffix<fim_middle>middle, the files as "--- snippet ---" blocks
// where the vocabulary has no repository markers.
std::optional<ApiError> EncodeInfillPrompt(const ServedModel& sm, const RawPrompt& raw, int64_t max_tokens,
                                           std::vector<TokenId>* out, bool* trimmed) {
  const Tokenizer& tok = sm.model->tokenizer();
  const Tokenizer::FimTokens fim = tok.fim();
  if (!fim.ok())
    return InvalidRequest("model '" + sm.id + "' has no fill-in-the-middle tokens; /infill needs a code model's");
  auto text = [&](std::string_view t) { return tok.Encode(t, /*add_special=*/false, /*parse_special=*/false); };
  // At most a quarter of the context: a larger n_predict is clamped later, as everywhere.
  const int64_t reserve = std::min(max_tokens >= 0 ? max_tokens : kInfillReserve, sm.n_ctx / 4);
  const int64_t avail = sm.n_ctx - 8 - reserve;  // what the prompt may take (BOS and the markers aside)
  if (raw.middle.size() > MaxPromptBytes(sm))
    return InvalidRequest("prompt is too long: " + std::to_string(raw.middle.size()) + " bytes of text cannot fit a " +
                          std::to_string(sm.n_ctx) + "-token context");
  const std::vector<TokenId> middle = text(raw.middle);
  const int64_t batch = std::min(kInfillBatch, avail);
  if (batch < 8 || static_cast<int64_t>(middle.size()) + 4 > avail)
    return InvalidRequest("n_predict " + std::to_string(reserve) + " leaves no room for the prompt in a " +
                          std::to_string(sm.n_ctx) + "-token context");
  const int64_t prefix_cap = 3 * batch / 4;
  const int64_t suffix_cap = std::max<int64_t>(0, batch / 4 - 2 - static_cast<int64_t>(middle.size()));
  const std::string_view suffix_text = raw.suffix ? std::string_view(*raw.suffix) : std::string_view();
  const std::string_view prefix_part = Utf8Part(raw.text, prefix_cap * kBytesPerToken, /*from_end=*/true);
  const std::string_view suffix_part = Utf8Part(suffix_text, suffix_cap * kBytesPerToken, /*from_end=*/false);
  std::vector<TokenId> prefix = text(prefix_part);
  std::vector<TokenId> suffix = text(suffix_part);
  *trimmed = prefix_part.size() < raw.text.size() || suffix_part.size() < suffix_text.size();
  if (static_cast<int64_t>(prefix.size()) > prefix_cap) {
    prefix.erase(prefix.begin(), prefix.end() - prefix_cap);
    *trimmed = true;
  }
  if (static_cast<int64_t>(suffix.size()) > suffix_cap) {
    suffix.resize(static_cast<size_t>(suffix_cap));
    *trimmed = true;
  }
  const int64_t used = static_cast<int64_t>(prefix.size() + suffix.size() + middle.size()) + 4;
  // The other files, newest (last) first, while they fit.
  const bool repo = fim.repo >= 0 && fim.file_sep >= 0;
  std::vector<TokenId> extra;
  if (!raw.extra.empty()) {
    const int64_t room = std::max<int64_t>(0, sm.n_ctx - 1 - 2 * reserve - used);
    std::vector<TokenId> head, tail;  // the repository header and the edited file's separator
    if (repo) {
      head.push_back(fim.repo);
      for (TokenId t : text("myproject\n")) head.push_back(t);
      tail.push_back(fim.file_sep);
      for (TokenId t : text("filename\n")) tail.push_back(t);
    }
    std::vector<std::vector<TokenId>> files;
    int64_t total = static_cast<int64_t>(head.size() + tail.size());
    size_t bytes = 0;
    for (size_t i = raw.extra.size(); i-- > 0;) {
      const InfillFile& f = raw.extra[i];
      bytes += f.name.size() + f.text.size();
      if (bytes > static_cast<size_t>(room) * kBytesPerToken) break;
      std::vector<TokenId> ids;
      if (repo) {
        ids.push_back(fim.file_sep);
        for (TokenId t : text(f.name + "\n")) ids.push_back(t);
      } else {
        ids = text("\n\n--- snippet ---\n\n");
      }
      for (TokenId t : text(f.text)) ids.push_back(t);
      if (total + static_cast<int64_t>(ids.size()) > room) break;
      total += static_cast<int64_t>(ids.size());
      files.push_back(std::move(ids));
    }
    *trimmed = *trimmed || files.size() < raw.extra.size();
    if (!files.empty()) {
      extra = head;
      for (size_t i = files.size(); i-- > 0;) extra.insert(extra.end(), files[i].begin(), files[i].end());
      extra.insert(extra.end(), tail.begin(), tail.end());
    }
  }
  out->clear();
  const std::vector<TokenId> bos = tok.Encode("", /*add_special=*/true, /*parse_special=*/false);
  if (!bos.empty() && bos[0] == tok.bos_id()) out->push_back(bos[0]);
  out->insert(out->end(), extra.begin(), extra.end());
  out->push_back(fim.prefix);
  out->insert(out->end(), prefix.begin(), prefix.end());
  out->push_back(fim.suffix);
  out->insert(out->end(), suffix.begin(), suffix.end());
  out->push_back(fim.middle);
  out->insert(out->end(), middle.begin(), middle.end());
  return std::nullopt;
}

// The grammar constraint of `cr` (none when it asks for none) into `out`.
std::optional<ApiError> SetConstraint(const ServedModel& sm, ConstraintRequest cr, PreparedChat* out) {
  std::shared_ptr<const TokenMasker> masker = sm.masker;
  if (masker == nullptr && (!cr.tools.empty() || cr.format != OutputFormat::kText))
    masker = std::make_shared<const TokenMasker>(sm.model->tokenizer(), sm.model->config().n_vocab);
  Result<std::shared_ptr<TokenConstraint>> c = BuildOutputConstraint(cr, masker);
  if (!c.ok()) return InvalidRequest(c.status().message());
  out->params.constraint = std::move(*c);
  out->constraint_request = std::move(cr);
  out->masker = std::move(masker);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> PrepareChoice(const PreparedChat& first, int choice, PreparedChat* out) {
  *out = first;
  out->choice = choice;
  if (out->params.seeded) out->params.seed += static_cast<uint64_t>(choice);
  if (first.params.constraint == nullptr) return std::nullopt;
  Result<std::shared_ptr<TokenConstraint>> c = BuildOutputConstraint(first.constraint_request, first.masker);
  if (!c.ok()) return InvalidRequest(c.status().message());
  out->params.constraint = std::move(*c);
  return std::nullopt;
}

std::optional<ApiError> PrepareChat(const ServedModel& sm, ChatRequest req, PreparedChat* out, bool for_generation) {
  if (req.raw.on) {  // /v1/completions, /completion, /infill: the prompt as it is, the output as plain text
    if (auto e = req.raw.infill ? EncodeInfillPrompt(sm, req.raw, req.max_tokens, &out->prompt, &out->prompt_trimmed)
                                : EncodeRawPrompt(sm, req.raw, &out->prompt))
      return e;
    if (!for_generation) return std::nullopt;
    if (auto e = SetGeneration(sm, req, out)) return e;
    out->parser.stop_sequences = req.stop_sequences;
    out->parser.verbatim = true;
    out->parser.min_indent = req.min_indent;
    out->max_predict_ms = req.max_predict_ms;
    out->token_ids = req.token_ids;
    if (req.format == OutputFormat::kText) return std::nullopt;
    ConstraintRequest cr;
    cr.family = sm.family;
    cr.format = req.format;
    cr.schema = req.format_schema;
    cr.grammar = req.format_grammar;
    return SetConstraint(sm, std::move(cr), out);
  }
  // Structured outputs: the model is told the schema too (the grammar makes the answer valid;
  // knowing the keys and types lets the model fill them instead of rambling into a string).
  if (req.format == OutputFormat::kJsonSchema) {
    req.render.system_suffix += std::string(kJsonSchemaInstruction) + PyJsonDumps(req.format_schema);
  } else if (req.format == OutputFormat::kJsonObject) {
    req.render.system_suffix += kJsonObjectInstruction;
  }
  const ReasoningMarkup& reasoning = ReasoningMarkupFor(sm.family);
  const bool prompted_reasoning = req.thinking_budget > 0 && !req.thinking_adaptive;
  const bool native_reasoning = HasNativeReasoning(sm.model->file());
  if (prompted_reasoning) {
    if (!native_reasoning) req.render.system_suffix += reasoning.instruction;
    req.render.assistant_prefix += reasoning.open;
  }
  // Harmony reasons whatever it is told: thinking off asks for the least (model/chat_format.h).
  if (sm.family == ChatFamily::kHarmony) req.render.enable_thinking = req.thinking_budget > 0;
  if (native_reasoning) {
    // Thinking off: the template's own empty section (kTemplate renders it from enable_thinking;
    // the hand-written formats get it here), so the model answers at once instead of reasoning
    // into the answer. Not after an assistant turn the client started (continue_final).
    const bool thinking = req.thinking_budget > 0;
    if (sm.family == ChatFamily::kTemplate) {
      req.render.enable_thinking = thinking;
    } else if (!thinking && !req.render.continue_final) {
      req.render.assistant_prefix += reasoning.skip;
    }
  }
  const bool forced =
      req.parse_tool_calls && (req.tool_choice == ToolChoice::kAny || req.tool_choice == ToolChoice::kTool);
  const std::string tool_call_prefill =
      forced ? ForcedToolCallPrefix(sm.family, req.tool_choice == ToolChoice::kTool ? req.forced_tool : "") : "";
  if (forced) req.single_tool_call = true;
  req.render.assistant_prefix += tool_call_prefill;
  if (req.context_management) out->context_management = ApplyContextEdits(sm, &req);
  DropEarlierReasoning(&req.messages);
  const RenderedChat rendered = RenderChatSpans(sm.family, sm.model->file(), req.messages, req.render);
  if (!rendered.error.empty())
    return InvalidRequest("the model's chat template refused the conversation: " + rendered.error);
  MR_LOGD("server", "prompt:\n%s", rendered.text.c_str());
  // Work bounded before tokenization: no real prompt averages more than 16 bytes per token, so
  // a longer text cannot fit the context and is not worth tokenizing (an 8 MB "word" would
  // take gigabytes in BPE).
  const size_t max_bytes = MaxPromptBytes(sm);
  if (rendered.text.size() > max_bytes)
    return InvalidRequest("prompt is too long: " + std::to_string(rendered.text.size()) +
                          " bytes of text cannot fit a " + std::to_string(sm.n_ctx) + "-token context");
  out->prompt = EncodePrompt(sm, rendered, 0, /*add_special=*/true);
  if (!for_generation) return std::nullopt;
  if (auto e = SetGeneration(sm, req, out)) return e;
  out->cache_breakpoints = MapCacheCuts(sm, req, rendered, out->prompt);
  out->parser.start_in_reasoning = prompted_reasoning;
  out->parser.may_open_reasoning = req.thinking_budget > 0 && req.thinking_adaptive;
  out->parser.reasoning_open = reasoning.open_tag;
  // Callable: the listed tools and the deferred ones loaded earlier (a search within this
  // generation adds what it finds: Session).
  std::vector<ChatTool> callable = req.render.tools;
  callable.insert(callable.end(), req.loaded_tools.begin(), req.loaded_tools.end());
  out->parser.parse_tool_calls = req.parse_tool_calls;
  out->parser.tools = callable;
  out->parser.stop_sequences = req.stop_sequences;
  out->parser.tool_call_prefill = tool_call_prefill;
  out->parser.markup = ToolCallMarkupFor(sm.family);
  out->parser.reasoning_end = reasoning.end;
  out->parser.harmony = sm.family == ChatFamily::kHarmony;
  out->parser.turn_prefill = OpenAssistantTurn(sm.family, rendered);
  out->thinking_budget = req.thinking_budget;
  out->single_tool_call = req.single_tool_call;
  out->forced_tool_call = forced;
  out->tool_search = req.tool_search;

  ConstraintRequest cr;
  cr.family = sm.family;
  if (req.parse_tool_calls) cr.tools = callable;
  cr.tool_choice = req.tool_choice;
  cr.forced_tool = req.forced_tool;
  cr.format = req.format;
  cr.schema = req.format_schema;
  cr.grammar = req.format_grammar;
  cr.reasoning = prompted_reasoning;
  return SetConstraint(sm, std::move(cr), out);
}

namespace {

// Engine-thread state of one request.
struct Session {
  Session(const Tokenizer& t, OutputParser::Options o) : tok(t), parser(std::move(o)) {}
  const Tokenizer& tok;
  OutputParser parser;
  std::shared_ptr<EventChannel> channel;
  std::string pending;  // bytes of an incomplete UTF-8 character
  std::vector<ParsedEvent> events;
  int64_t reasoning_tokens = 0;
  int64_t thinking_budget = 0;
  bool single_tool_call = false;
  bool end_reasoning = false;  // the budget is spent: inject the reasoning's close
  // Tool search run by the server: its calls (not the client's), and the result to inject.
  ToolSearchConfig tool_search;
  ChatFamily family = ChatFamily::kChatML;
  bool forced_tool_call = false;
  std::shared_ptr<TokenConstraint> constraint;
  int server_calls = 0;
  std::string server_result;          // non-empty: the search ran; its result goes into the prompt next
  std::string server_tool;            // the search tool's name (harmony addresses its result)
  bool last_was_server_tool = false;  // the last event: a search whose result may not have fit
  int client_calls() const { return parser.tool_calls() - server_calls; }
  ConstraintRequest constraint_request;
  std::shared_ptr<const TokenMasker> masker;
  std::vector<TokenLogprob> logprobs;  // of tokens no event has carried yet
  bool token_ids = false;
  std::vector<TokenId> ids;  // with token_ids: tokens no event has carried yet
  int choice = 0;
  // t_max_predict_ms: the clock starts at the first token and runs out once a newline is out.
  int64_t max_predict_ms = 0;
  std::chrono::steady_clock::time_point first_token;
  bool any_token = false, newline = false, out_of_time = false;

  // Tools a search found become callable: the parser accepts them and the grammar (rebuilt with
  // them; the constraint object is shared with the Sequence) allows them.
  void Load(const std::vector<std::string>& names) {
    bool added = false;
    for (const std::string& n : names) {
      const ChatTool* t = tool_search.Find(n);
      if (t == nullptr) continue;
      bool have = false;
      for (const ChatTool& c : constraint_request.tools) have |= c.name == n;
      if (have) continue;
      parser.AddTool(*t);
      constraint_request.tools.push_back(*t);
      added = true;
    }
    if (!added || !constraint || !masker) return;
    Result<std::shared_ptr<TokenConstraint>> c = BuildOutputConstraint(constraint_request, masker);
    if (c.ok() && *c) *constraint = **c;
  }

  void Flush() {
    for (ParsedEvent& e : events) {
      last_was_server_tool = false;
      StreamEvent ev;
      switch (e.kind) {
        case ParsedEvent::Kind::kText:
          ev.kind = StreamEvent::Kind::kText;
          break;
        case ParsedEvent::Kind::kReasoning:
          ev.kind = StreamEvent::Kind::kReasoning;
          break;
        case ParsedEvent::Kind::kToolCall:
          ev.kind = StreamEvent::Kind::kToolCall;
          if (tool_search.kind != ToolSearchKind::kNone && e.call.name == tool_search.name) {
            const ToolSearchOutcome found = RunToolSearch(tool_search, e.call.arguments);
            ev.kind = StreamEvent::Kind::kServerTool;
            ev.server_result = ToolSearchResultContent(found);
            server_tool = e.call.name;
            server_result =
                found.error_code.empty() ? ToolReferencesText(tool_search, found.names) : ToolSearchErrorText(found);
            Load(found.names);
            ++server_calls;
            last_was_server_tool = true;
          }
          break;
      }
      ev.text = std::move(e.text);
      ev.call = std::move(e.call);
      ev.logprobs = std::move(logprobs);
      logprobs.clear();
      ev.tokens = std::move(ids);
      ids.clear();
      ev.choice = choice;
      channel->Push(std::move(ev));
    }
    events.clear();
  }

  // t_max_predict_ms: true once the time is up (`piece` is the token's text).
  bool OutOfTime(const std::string& piece) {
    const auto now = std::chrono::steady_clock::now();
    if (!any_token) first_token = now;
    any_token = true;
    newline = newline || piece.find('\n') != std::string::npos;
    return newline && now - first_token > std::chrono::milliseconds(max_predict_ms);
  }

  bool OnToken(TokenId id) {
    if (parser.in_reasoning()) ++reasoning_tokens;
    if (token_ids) ids.push_back(id);
    const std::string piece = tok.TokenToPiece(id, false);
    pending += piece;
    const size_t n = CompleteUtf8Prefix(pending);
    if (n > 0) {
      parser.Feed(std::string_view(pending).substr(0, n), &events);
      pending.erase(0, n);
    }
    Flush();
    if (parser.stopped()) return false;
    if (max_predict_ms > 0 && OutOfTime(piece)) {
      out_of_time = true;
      return false;
    }
    if (!server_result.empty()) return false;  // Continuation puts the search's result in the prompt
    if (single_tool_call && client_calls() > 0) return false;
    if (thinking_budget > 0 && parser.in_reasoning() && reasoning_tokens >= thinking_budget) {
      end_reasoning = true;
      return false;
    }
    return true;
  }

  std::vector<TokenId> Continuation() {
    if (!server_result.empty()) {
      const RenderedChat turn = ToolResultTurn(family, server_tool, server_result);
      server_result.clear();
      // A forced call was the search: the answer after it is free (the grammar had its call).
      if (forced_tool_call && constraint) constraint->Release();
      return tok.EncodeTemplated(turn.text, /*add_special=*/false, turn.literal);
    }
    if (!end_reasoning) return {};
    end_reasoning = false;
    const std::string close = ReasoningMarkupFor(family).close;
    parser.Feed(close, &events);
    Flush();
    return tok.Encode(close, /*add_special=*/false, /*parse_special=*/true);
  }

  void Done(const Result<JobResult>& r) {
    if (!pending.empty()) parser.Feed(pending, &events);
    pending.clear();
    parser.Finish(&events);
    Flush();
    StreamEvent ev;
    ev.choice = choice;
    if (!r.ok()) {
      ev.kind = StreamEvent::Kind::kError;
      // Shutting down: overloaded_error (529), which clients retry; the stream ends with an
      // error event, never with a normal stop reason.
      ev.error = EngineFailure(r.status());
      channel->Push(std::move(ev));
      return;
    }
    ev.kind = StreamEvent::Kind::kDone;
    ev.logprobs = std::move(logprobs);
    ev.tokens = std::move(ids);
    ev.prompt_logprobs = r->prompt_logprobs;
    ev.input_tokens = r->prompt_tokens;
    ev.output_tokens = r->output_tokens;
    ev.cache_read_tokens = r->cache_read_tokens;
    ev.cache_creation_5m_tokens = r->cache_creation_5m_tokens;
    ev.cache_creation_1h_tokens = r->cache_creation_1h_tokens;
    ev.prefill_s = r->prefill_s;
    ev.decode_s = r->decode_s;
    ev.generated = r->generated;
    ev.drafted = r->drafted;
    ev.accepted = r->accepted;
    ev.proposed_at = r->proposed_at;
    ev.accepted_at = r->accepted_at;
    ev.peak_rss_bytes = r->peak_rss_bytes;
    ev.kv_peak_bytes = r->kv_peak_bytes;
    ev.process_peak_rss_bytes = r->process_peak_rss_bytes;
    if (r->stop == StopCause::kCancelled) {
      ev.finish = FinishReason::kCancelled;
    } else if (out_of_time || parser.cut_by_indent()) {  // llama.cpp's "limit" too
      ev.finish = FinishReason::kMaxTokens;
    } else if (parser.stopped()) {
      ev.finish = FinishReason::kStopSequence;
      ev.stop_sequence = parser.matched_stop_sequence();
    } else if (client_calls() > 0) {
      ev.finish = FinishReason::kToolUse;
    } else if (r->stop == StopCause::kMaxTokens || r->stop == StopCause::kContextFull ||
               (r->stop == StopCause::kCallback && last_was_server_tool)) {  // no room for the search's result
      ev.finish = FinishReason::kMaxTokens;
    } else {
      ev.finish = FinishReason::kEndTurn;
    }
    MR_LOGI("server",
            "request done: %lld prompt tokens (%lld reused), %lld output tokens, prefill %.2f s, decode %.2f s",
            (long long)r->prompt_tokens, (long long)r->reused_tokens, (long long)r->output_tokens, r->prefill_s,
            r->decode_s);
    channel->Push(std::move(ev));
  }
};

}  // namespace

std::optional<ApiError> StartChat(const ServedModel& sm, PreparedChat prepared, std::shared_ptr<EventChannel> channel,
                                  std::shared_ptr<EngineJob>* job_out) {
  auto session = std::make_shared<Session>(sm.model->tokenizer(), std::move(prepared.parser));
  session->channel = std::move(channel);
  session->thinking_budget = prepared.thinking_budget;
  session->single_tool_call = prepared.single_tool_call;
  session->tool_search = std::move(prepared.tool_search);
  session->family = prepared.family;
  session->forced_tool_call = prepared.forced_tool_call;
  session->constraint = prepared.params.constraint;
  session->constraint_request = std::move(prepared.constraint_request);
  session->masker = std::move(prepared.masker);
  session->token_ids = prepared.token_ids;
  session->choice = prepared.choice;
  session->max_predict_ms = prepared.max_predict_ms;
  auto job = std::make_shared<EngineJob>();
  job->prompt = std::move(prepared.prompt);
  job->params = prepared.params;
  job->cache_breakpoints = std::move(prepared.cache_breakpoints);
  job->on_token = [session](TokenId id) { return session->OnToken(id); };
  if (job->params.logprobs >= 0)
    job->on_logprob = [session](const TokenLogprob& lp) { session->logprobs.push_back(lp); };
  job->continuation = [session] { return session->Continuation(); };
  job->on_done = [session](const Result<JobResult>& r) { session->Done(r); };
  job->on_start = [session](const JobResult& r) {
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::kStarted;
    ev.choice = session->choice;
    ev.input_tokens = r.prompt_tokens;
    ev.cache_read_tokens = r.cache_read_tokens;
    ev.cache_creation_5m_tokens = r.cache_creation_5m_tokens;
    ev.cache_creation_1h_tokens = r.cache_creation_1h_tokens;
    session->channel->Push(std::move(ev));
  };
  if (auto e = AdmissionError(sm.engine->Submit(job))) return e;
  *job_out = std::move(job);
  return std::nullopt;
}

std::optional<ApiError> AdmissionError(const SubmitResult& sr) {
  if (sr.admit == sched::Admit::kQueueFull)
    return ApiError{ApiErrorType::kRateLimit, "too many queued requests; retry later", sr.retry_after_s};
  if (sr.admit == sched::Admit::kOverloaded)
    return ApiError{ApiErrorType::kOverloaded, "the server is overloaded; retry later", sr.retry_after_s};
  return std::nullopt;
}

ApiError EngineFailure(const mr::Status& error) {
  return {error.code() == ErrorCode::kUnavailable ? ApiErrorType::kOverloaded : ApiErrorType::kApi, error.message()};
}

}  // namespace mr::server
