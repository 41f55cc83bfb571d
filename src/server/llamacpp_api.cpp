#include "server/llamacpp_api.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "server/openai_api.h"
#include "server/request_fields.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

const RequestLimits kLimits;
constexpr size_t kMaxInfillFiles = 1024;
constexpr size_t kMaxResponseFields = 64;
constexpr int kMaxProbs = 20;

bool Has(const Json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// llama.cpp options whose default leaves them off: accepted at that value, refused when set to do
// something mererun does not implement.
struct InactiveOption {
  const char* key;
  double off;  // the value that means off
  const char* what;
};
constexpr InactiveOption kInactive[] = {
    {"dynatemp_range", 0.0, "dynamic temperature"}, {"typical_p", 1.0, "typical sampling"},
    {"xtc_probability", 0.0, "XTC sampling"},       {"dry_multiplier", 0.0, "DRY sampling"},
    {"mirostat", 0.0, "Mirostat sampling"},         {"top_n_sigma", -1.0, "top-n-sigma sampling"},
};

std::optional<ApiError> CheckUnsupported(const Json& body) {
  for (const InactiveOption& o : kInactive) {
    if (!Has(body, o.key)) continue;
    const Json& v = body[o.key];
    if (!v.is_number()) return InvalidRequest(std::string(o.key) + ": expected a number");
    const bool off = o.off < 0 ? v.get<double>() <= 0 : v.get<double>() == o.off;
    if (!off) return InvalidRequest(std::string(o.key) + ": " + o.what + " is not supported by this server");
  }
  for (const char* key : {"lora", "image_data", "multimodal_data"})
    if (Has(body, key) && !(body[key].is_array() && body[key].empty()))
      return InvalidRequest(std::string(key) + ": not supported (LoRA adapters and images are not served here)");
  bool lazy = false;
  if (auto e = OptBool(body, "grammar_lazy", "", &lazy)) return e;
  if (lazy)
    return InvalidRequest(
        "grammar_lazy: lazy grammars (grammar_triggers) are not supported; the grammar applies from the first token");
  bool post = false;
  if (auto e = OptBool(body, "post_sampling_probs", "", &post)) return e;
  if (post) return InvalidRequest("post_sampling_probs: not supported; n_probs gives the model's log-probabilities");
  return std::nullopt;
}

// samplers: an array of names, or llama.cpp's one-letter string ("kpmt").
std::optional<ApiError> ParseSamplers(const Json& v, std::vector<std::string>* out) {
  static const std::pair<char, const char*> kLetters[] = {
      {'e', "penalties"}, {'d', "dry"}, {'k', "top_k"},       {'y', "typ_p"},  {'p', "top_p"},
      {'m', "min_p"},     {'x', "xtc"}, {'t', "temperature"}, {'i', "infill"}, {'s', "top_n_sigma"}};
  static const std::set<std::string> kNames = {"penalties", "dry", "top_k",       "typ_p",  "typical_p",  "top_p",
                                               "min_p",     "xtc", "temperature", "infill", "top_n_sigma"};
  if (v.is_string()) {
    for (const char c : v.get<std::string>()) {
      const auto* it =
          std::find_if(std::begin(kLetters), std::end(kLetters), [c](const auto& l) { return l.first == c; });
      if (it == std::end(kLetters)) return InvalidRequest(std::string("samplers: unknown sampler letter '") + c + "'");
      out->push_back(it->second);
    }
    return std::nullopt;
  }
  if (!v.is_array() || v.size() > 32) return InvalidRequest("samplers: expected an array of sampler names");
  for (const Json& s : v) {
    if (!s.is_string() || !kNames.count(s.get<std::string>()))
      return InvalidRequest("samplers: unknown sampler " +
                            (s.is_string() ? "\"" + s.get<std::string>() + "\"" : s.dump()) +
                            " (known: penalties, top_k, top_p, min_p, temperature, infill; dry, typ_p, xtc and "
                            "top_n_sigma are accepted at their off values)");
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

// logit_bias as llama.cpp takes it: OpenAI's object, or [[id or text, bias or false], ...]; a
// text biases each of its tokens, false bans (-100, the API's floor).
std::optional<ApiError> ParseLogitBias(const Json& lb, const ServedModel& sm, ChatRequest* req, Json* common) {
  if (lb.is_object()) {
    (*common)["logit_bias"] = lb;
    return std::nullopt;
  }
  constexpr const char* kShape = "logit_bias: expected an object of token id -> bias or an array of [token, bias]";
  if (!lb.is_array()) return InvalidRequest(kShape);
  if (lb.size() > kLimits.max_logit_bias)
    return InvalidRequest("logit_bias: at most " + std::to_string(kLimits.max_logit_bias) + " entries");
  for (const Json& e : lb) {
    if (!e.is_array() || e.size() != 2) return InvalidRequest(kShape);
    float bias = -100.0f;
    if (e[1].is_number()) {
      if (e[1].get<double>() < -100 || e[1].get<double>() > 100)
        return InvalidRequest("logit_bias: a bias is a number between -100 and 100, or false");
      bias = e[1].get<float>();
    } else if (!(e[1].is_boolean() && !e[1].get<bool>())) {
      return InvalidRequest("logit_bias: a bias is a number between -100 and 100, or false");
    }
    if (e[0].is_number_integer()) {
      if (e[0].get<int64_t>() < 0 || e[0].get<int64_t>() > INT32_MAX)
        return InvalidRequest("logit_bias: token " + e[0].dump() + " is not a token id");
      req->adjust.bias.emplace_back(static_cast<TokenId>(e[0].get<int64_t>()), bias);
    } else if (e[0].is_string() && sm.model != nullptr) {
      if (e[0].get<std::string>().size() > kLimits.max_stop_bytes)
        return InvalidRequest("logit_bias: a text is at most " + std::to_string(kLimits.max_stop_bytes) + " bytes");
      for (const TokenId t : sm.model->tokenizer().Encode(e[0].get<std::string>(), false, false))
        req->adjust.bias.emplace_back(t, bias);
    } else {
      return InvalidRequest(kShape);
    }
  }
  if (req->adjust.bias.size() > kLimits.max_logit_bias)
    return InvalidRequest("logit_bias: at most " + std::to_string(kLimits.max_logit_bias) + " tokens");
  return std::nullopt;
}

// /completion's prompt: a string, token ids, or a mix ([12, "text", 34]; BOS first when the mix
// opens with text and the model adds one); one prompt per request.
std::optional<ApiError> ParsePrompt(const Json& body, const ServedModel& sm, RawPrompt* raw) {
  if (!Has(body, "prompt")) return InvalidRequest("prompt: field required (a string or an array of tokens)");
  const Json* p = &body["prompt"];
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    raw->text = p->get<std::string>();
    return std::nullopt;
  }
  if (!p->is_array() || p->empty()) return InvalidRequest("prompt: expected a string or a non-empty array of tokens");
  size_t bytes = 0;
  for (const Json& x : *p) {
    if (x.is_array()) return InvalidRequest("prompt: one prompt per request is supported");
    if (x.is_string()) {
      bytes += x.get<std::string>().size();
    } else if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) {
      return InvalidRequest("prompt: expected token ids and strings, got " + JsonTypeName(x));
    }
  }
  if (bytes > static_cast<size_t>(std::max<int64_t>(sm.n_ctx, 1)) * 16)
    return InvalidRequest("prompt is too long: " + std::to_string(bytes) + " bytes of text cannot fit a " +
                          std::to_string(sm.n_ctx) + "-token context");
  const Tokenizer& tok = sm.model->tokenizer();
  for (size_t i = 0; i < p->size(); ++i) {
    const Json& x = (*p)[i];
    if (x.is_number_integer()) {
      raw->ids.push_back(static_cast<TokenId>(x.get<int64_t>()));
    } else {
      const std::vector<TokenId> ids = tok.Encode(x.get<std::string>(), /*add_special=*/i == 0, false);
      raw->ids.insert(raw->ids.end(), ids.begin(), ids.end());
    }
  }
  if (raw->ids.empty()) return InvalidRequest("prompt: empty");
  return std::nullopt;
}

std::optional<ApiError> ParseInfill(const Json& body, RawPrompt* raw) {
  raw->infill = true;
  std::string suffix;
  if (auto e = OptString(body, "input_prefix", "", &raw->text)) return e;
  if (auto e = OptString(body, "input_suffix", "", &suffix)) return e;
  if (auto e = OptString(body, "prompt", "", &raw->middle)) return e;
  raw->suffix = std::move(suffix);
  if (!Has(body, "input_extra")) return std::nullopt;
  const Json& extra = body["input_extra"];
  if (!extra.is_array()) return InvalidRequest("input_extra: expected an array of {filename, text} objects");
  if (extra.size() > kMaxInfillFiles)
    return InvalidRequest("input_extra: at most " + std::to_string(kMaxInfillFiles) + " entries");
  for (size_t i = 0; i < extra.size(); ++i) {
    const std::string where = "input_extra[" + std::to_string(i) + "]";
    if (!extra[i].is_object() || !extra[i].contains("text") || !extra[i]["text"].is_string())
      return InvalidRequest(where + ".text: field required (a string)");
    InfillFile f{"tmp", extra[i]["text"].get<std::string>()};
    if (auto e = OptString(extra[i], "filename", where, &f.name)) return e;
    raw->extra.push_back(std::move(f));
  }
  return std::nullopt;
}

const char* StopType(FinishReason f) {
  switch (f) {
    case FinishReason::kEndTurn:
    case FinishReason::kToolUse:
      return "eos";
    case FinishReason::kMaxTokens:
      return "limit";
    case FinishReason::kStopSequence:
      return "word";
    case FinishReason::kCancelled:
      break;
  }
  return "none";
}

// A float setting as the request spelled it (0.95, not 0.949999988079071).
double Setting(float v) {
  return std::round(static_cast<double>(v) * 1e6) / 1e6;
}

bool ValidUtf8(const std::string& s) {
  try {
    (void)Json(s).dump();  // the strict handler throws on invalid UTF-8
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// A piece as llama.cpp shows it: the text when it is valid UTF-8, else its bytes.
Json PieceJson(const std::string& piece) {
  if (ValidUtf8(piece)) return piece;
  Json bytes = Json::array();
  for (const unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

std::optional<ApiError> ParseLlamaCompletion(const Json& body, const ServedModel& sm, bool infill, ChatRequest* req,
                                             LlamaOptions* opts) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  opts->infill = infill;
  opts->model = sm.id;
  if (auto e = OptString(body, "model", "", &opts->model)) return e;
  if (auto e = CheckUnsupported(body)) return e;
  req->raw.on = true;
  if (auto e = infill ? ParseInfill(body, &req->raw) : ParsePrompt(body, sm, &req->raw)) return e;
  // What the OpenAI fields parser reads, under OpenAI's names.
  Json common = Json::object();
  for (const char* key : {"stream", "stop", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                          "presence_penalty", "frequency_penalty"})
    if (body.contains(key)) common[key] = body[key];
  if (Has(body, "logit_bias"))
    if (auto e = ParseLogitBias(body["logit_bias"], sm, req, &common)) return e;
  OpenAIOptions oo;
  if (auto e = ParseOpenAICommon(common, req, &oo)) return e;
  opts->stream = oo.stream;
  // n_predict (or max_tokens): -1 is up to the context; 0 evaluates the prompt into the cache.
  for (const char* key : {"n_predict", "max_tokens"}) {
    if (!Has(body, key)) continue;
    int64_t n = -1;
    if (auto e = OptInt(body, key, -1, INT32_MAX, &n)) return e;
    req->max_tokens = n;
    break;
  }
  if (Has(body, "seed")) {
    if (!body["seed"].is_number_integer()) return InvalidRequest("seed: expected an integer (negative: random)");
    // Negative (llama.cpp's default -1): a random seed.
    if (body["seed"].get<int64_t>() >= 0) req->seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  int64_t n = 0;
  if (auto e = OptInt(body, "n_probs", 0, kMaxProbs, &n)) return e;
  if (n > 0) {
    opts->n_probs = static_cast<int>(n);
    req->logprobs = opts->n_probs;
  }
  n = 0;
  if (auto e = OptInt(body, "n_indent", 0, 1 << 16, &n)) return e;
  opts->min_indent = req->min_indent = static_cast<int>(n);
  n = 0;
  if (auto e = OptInt(body, "t_max_predict_ms", 0, INT32_MAX, &n)) return e;
  opts->max_predict_ms = req->max_predict_ms = n;
  // Accepted with llama.cpp's types and no effect here: t_max_prompt_ms (llama.cpp does not act
  // on it either), n_keep (no context shift: a prompt that does not fit is refused), id_slot (the
  // scheduler places requests), cache_prompt (the prefix cache is always on; it never changes an
  // answer), timings_per_token.
  for (const char* key : {"t_max_prompt_ms", "n_keep", "id_slot"}) {
    int64_t ignored = 0;
    if (auto e = OptInt(body, key, -1, INT32_MAX, &ignored)) return e;
  }
  for (const char* key : {"cache_prompt", "timings_per_token"}) {
    bool ignored = false;
    if (auto e = OptBool(body, key, "", &ignored)) return e;
  }
  if (auto e = OptBool(body, "return_tokens", "", &opts->return_tokens)) return e;
  req->token_ids = opts->return_tokens || opts->stream;
  bool ignore_eos = false;
  if (auto e = OptBool(body, "ignore_eos", "", &ignore_eos)) return e;
  if (ignore_eos && sm.model != nullptr) {
    const Tokenizer& tok = sm.model->tokenizer();
    for (TokenId t = 0; t < tok.vocab_size(); ++t)
      if (tok.IsEndOfGeneration(t)) req->adjust.bias.emplace_back(t, -100.0f);
  }
  if (Has(body, "response_fields")) {
    const Json& f = body["response_fields"];
    if (!f.is_array() || f.size() > kMaxResponseFields)
      return InvalidRequest("response_fields: expected an array of at most " + std::to_string(kMaxResponseFields) +
                            " field names");
    for (const Json& x : f) {
      if (!x.is_string()) return InvalidRequest("response_fields: expected an array of field names");
      opts->response_fields.push_back(x.get<std::string>());
    }
  }
  if (Has(body, "json_schema")) {
    const Json& schema = body["json_schema"];
    if (!schema.is_object()) return InvalidRequest("json_schema: expected a JSON Schema object");
    req->format = schema.empty() ? OutputFormat::kJsonObject : OutputFormat::kJsonSchema;
    req->format_schema = schema;
  }
  if (auto e = ParseGuidedOutput(body, req)) return e;  // `grammar` (GBNF)
  if (Has(body, "samplers")) {
    if (auto e = ParseSamplers(body["samplers"], &opts->samplers)) return e;
    auto named = [&](const char* s) {
      return std::find(opts->samplers.begin(), opts->samplers.end(), s) != opts->samplers.end();
    };
    // A sampler left out of the chain does not run (llama.cpp's reading): no temperature is
    // temperature 1, no penalties none.
    if (!named("top_k")) req->top_k = 0;
    if (!named("top_p")) req->top_p = 1.0f;
    if (!named("min_p")) req->min_p = 0.0f;
    if (!named("temperature")) req->temperature = 1.0f;
    if (!named("penalties")) {
      req->adjust.repetition_penalty = 1.0f;
      req->adjust.frequency_penalty = req->adjust.presence_penalty = 0.0f;
    }
    req->infill_sampler = named("infill");
  }
  return std::nullopt;
}

LlamaWriter::LlamaWriter(LlamaOptions opts, const ServedModel& sm, const PreparedChat& prepared)
    : opts_(std::move(opts)),
      tok_(sm.model->tokenizer()),
      n_ctx_(sm.n_ctx),
      prompt_text_(tok_.Decode(prepared.prompt, /*render_special=*/true)),
      trimmed_(prepared.prompt_trimmed),
      evaluated_(static_cast<int64_t>(prepared.prompt.size())) {
  const SamplingParams& s = prepared.params.sampling;
  const LogitAdjust& a = prepared.params.adjust;
  Json stop = Json::array();
  for (const std::string& x : prepared.parser.stop_sequences) stop.push_back(x);
  settings_ = {{"n_ctx", n_ctx_},
               {"n_predict", prepared.max_tokens},
               {"model", opts_.model},
               {"seed", prepared.params.seeded ? Json(prepared.params.seed) : Json(-1)},
               {"temperature", Setting(s.temperature)},
               {"top_k", s.top_k},
               {"top_p", Setting(s.top_p)},
               {"min_p", Setting(s.min_p)},
               {"repeat_penalty", Setting(a.repetition_penalty)},
               {"presence_penalty", Setting(a.presence_penalty)},
               {"frequency_penalty", Setting(a.frequency_penalty)},
               {"stop", stop},
               {"n_probs", opts_.n_probs},
               {"n_indent", opts_.min_indent},
               {"t_max_predict_ms", opts_.max_predict_ms},
               {"stream", opts_.stream}};
  if (!opts_.samplers.empty()) settings_["samplers"] = opts_.samplers;
}

Json LlamaWriter::Probabilities(const std::vector<TokenLogprob>& lps) const {
  auto entry = [&](TokenId id, float logprob) {
    const std::string piece = tok_.TokenToPiece(id, /*render_special=*/true);
    Json bytes = Json::array();
    for (const unsigned char c : piece) bytes.push_back(static_cast<int>(c));
    return Json{{"id", id}, {"token", PieceJson(piece)}, {"bytes", bytes}, {"logprob", logprob}};
  };
  Json out = Json::array();
  for (const TokenLogprob& t : lps) {
    Json e = entry(t.id, t.logprob);
    Json top = Json::array();
    for (const auto& [id, l] : t.top) top.push_back(entry(id, l));
    e["top_logprobs"] = std::move(top);
    out.push_back(std::move(e));
  }
  return out;
}

std::string LlamaWriter::Event(const StreamEvent& ev) {
  if (ev.kind == StreamEvent::Kind::kStarted) return "";
  if (ev.kind == StreamEvent::Kind::kError) return "data: " + OpenAIErrorBody(ev.error) + "\n\n";
  predicted_ += static_cast<int64_t>(ev.tokens.size());
  if (opts_.return_tokens) tokens_.insert(tokens_.end(), ev.tokens.begin(), ev.tokens.end());
  const Json probs = opts_.n_probs > 0 ? Probabilities(ev.logprobs) : Json();
  if (opts_.n_probs > 0)
    for (const Json& p : probs) probs_.push_back(p);
  if (ev.kind == StreamEvent::Kind::kDone) {
    done_ = ev;
    if (!opts_.stream) return "";
    last_probs_ = probs;  // the tokens no chunk carried
    Json last = Result();
    last["content"] = "";  // the stream carried it
    return "data: " + DumpWireJson(last) + "\n\n";
  }
  // Text (a raw prompt has no reasoning or tool sections).
  content_ += ev.text;
  has_new_line_ = has_new_line_ || ev.text.find('\n') != std::string::npos;
  if (!opts_.stream || (ev.text.empty() && ev.tokens.empty())) return "";
  Json chunk = {{"index", 0},
                {"content", ev.text},
                {"tokens", ev.tokens},
                {"stop", false},
                {"id_slot", -1},
                {"tokens_predicted", predicted_},
                {"tokens_evaluated", evaluated_}};
  if (opts_.n_probs > 0) chunk["completion_probabilities"] = probs;
  return "data: " + DumpWireJson(chunk) + "\n\n";
}

Json LlamaWriter::Result() {
  const double prompt_ms = done_.prefill_s * 1e3, predicted_ms = done_.decode_s * 1e3;
  const int64_t prompt_n = std::max<int64_t>(0, done_.input_tokens - done_.cache_read_tokens);
  const int64_t predicted_n = done_.output_tokens;
  auto per = [](double ms, int64_t n) { return n > 0 ? ms / static_cast<double>(n) : 0.0; };
  auto rate = [](double ms, int64_t n) { return ms > 0 ? 1e3 * static_cast<double>(n) / ms : 0.0; };
  Json full = {{"index", 0},
               {"content", content_},
               {"tokens", tokens_},
               {"id_slot", -1},
               {"stop", true},
               {"model", opts_.model},
               {"tokens_predicted", predicted_n},
               {"tokens_evaluated", done_.input_tokens},
               {"generation_settings", settings_},
               {"prompt", prompt_text_},
               {"has_new_line", has_new_line_},
               {"truncated", trimmed_},
               {"stop_type", StopType(done_.finish)},
               {"stopping_word", done_.stop_sequence},
               {"tokens_cached", done_.cache_read_tokens},
               {"timings",
                {{"cache_n", done_.cache_read_tokens},
                 {"prompt_n", prompt_n},
                 {"prompt_ms", prompt_ms},
                 {"prompt_per_token_ms", per(prompt_ms, prompt_n)},
                 {"prompt_per_second", rate(prompt_ms, prompt_n)},
                 {"predicted_n", predicted_n},
                 {"predicted_ms", predicted_ms},
                 {"predicted_per_token_ms", per(predicted_ms, predicted_n)},
                 {"predicted_per_second", rate(predicted_ms, predicted_n)}}}};
  if (opts_.n_probs > 0) full["completion_probabilities"] = opts_.stream ? last_probs_ : probs_;
  return Filtered(std::move(full));
}

Json LlamaWriter::Filtered(Json full) const {
  if (opts_.response_fields.empty()) return full;
  Json out = Json::object();
  for (const std::string& f : opts_.response_fields) {
    const size_t slash = f.find('/');
    if (slash == std::string::npos) {
      if (full.contains(f)) out[f] = full[f];
      continue;
    }
    const std::string outer = f.substr(0, slash), inner = f.substr(slash + 1);
    if (full.contains(outer) && full[outer].is_object() && full[outer].contains(inner)) out[inner] = full[outer][inner];
  }
  return out;
}

std::optional<ApiError> LlamaTokenize(const Json& body, const ServedModel& sm, Json* out) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  if (!Has(body, "content") || !body["content"].is_string())
    return InvalidRequest("content: field required (the text to tokenize)");
  const std::string& text = body["content"].get_ref<const std::string&>();
  if (text.size() > static_cast<size_t>(std::max<int64_t>(sm.n_ctx, 1)) * 16)
    return InvalidRequest("content is too long: " + std::to_string(text.size()) + " bytes cannot fit a " +
                          std::to_string(sm.n_ctx) + "-token context");
  bool add_special = false, parse_special = false, with_pieces = false;
  if (auto e = OptBool(body, "add_special", "", &add_special)) return e;
  if (auto e = OptBool(body, "parse_special", "", &parse_special)) return e;
  if (auto e = OptBool(body, "with_pieces", "", &with_pieces)) return e;
  const Tokenizer& tok = sm.model->tokenizer();
  Json tokens = Json::array();
  for (const TokenId id : tok.Encode(text, add_special, parse_special)) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", PieceJson(tok.TokenToPiece(id, /*render_special=*/true))}});
    } else {
      tokens.push_back(id);
    }
  }
  *out = {{"tokens", std::move(tokens)}};
  return std::nullopt;
}

std::optional<ApiError> LlamaDetokenize(const Json& body, const ServedModel& sm, Json* out) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  if (!Has(body, "tokens") || !body["tokens"].is_array())
    return InvalidRequest("tokens: field required (an array of token ids)");
  const int64_t n_vocab = sm.model->tokenizer().vocab_size();
  std::vector<TokenId> ids;
  for (const Json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
      return InvalidRequest("tokens: " + t.dump() + " is not a token id (0.." + std::to_string(n_vocab - 1) + ")");
    ids.push_back(static_cast<TokenId>(t.get<int64_t>()));
  }
  *out = {{"content", sm.model->tokenizer().Decode(ids, /*render_special=*/true)}};
  return std::nullopt;
}

Json LlamaProps(const ServedModel& sm, int64_t slots) {
  const SamplingParams& s = sm.default_sampling;
  return {{"default_generation_settings",
           {{"n_ctx", sm.n_ctx},
            {"params",
             {{"n_predict", -1},
              {"temperature", Setting(s.temperature)},
              {"top_k", s.top_k},
              {"top_p", Setting(s.top_p)},
              {"min_p", Setting(s.min_p)}}}}},
          {"total_slots", slots},
          {"model_alias", sm.id},
          {"model_path", sm.id},
          {"modalities", {{"vision", false}, {"audio", false}}},
          {"build_info", "mererun"}};
}

}  // namespace mr::server
