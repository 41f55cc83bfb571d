#include "server/ollama_api.h"

#include <ctime>

#include "model/chat_format.h"
#include "model/gguf.h"
#include "model/model.h"
#include "server/openai_api.h"
#include "server/request_fields.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

bool Has(const Json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

// RFC 3339 in UTC, as Ollama writes created_at and modified_at.
std::string Rfc3339(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int64_t Nanos(double seconds) {
  return static_cast<int64_t>(seconds * 1e9);
}

// options.* and format under the OpenAI names (into `out`, which the OpenAI parsers read).
std::optional<ApiError> TranslateOptions(const Json& body, Json* out) {
  const Json* options = nullptr;
  if (auto e = OptObject(body, "options", "", &options)) return e;
  if (options != nullptr) {
    for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty",
                            "presence_penalty", "frequency_penalty"})
      if (options->contains(key)) (*out)[key] = (*options)[key];
    // -1 (endless) and -2 (until the context is full) are both "up to the context" here.
    if (Has(*options, "num_predict")) {
      const Json& n = (*options)["num_predict"];
      if (!n.is_number_integer() || n.get<int64_t>() < -2 || n.get<int64_t>() > INT32_MAX)
        return InvalidRequest("options.num_predict: expected an integer >= -2");
      if (n.get<int64_t>() > 0) (*out)["max_tokens"] = n;
      if (n.get<int64_t>() == 0) return InvalidRequest("options.num_predict: 0 generates nothing; send at least 1");
    }
    for (const char* key : {"mirostat", "typical_p", "tfs_z"}) {
      if (!Has(*options, key)) continue;
      const Json& v = (*options)[key];
      const double off = std::string(key) == "mirostat" ? 0.0 : 1.0;
      if (!v.is_number() || v.get<double>() != off)
        return InvalidRequest(std::string("options.") + key + ": not supported by this server (only its off value)");
    }
    // num_ctx, num_thread, num_gpu, num_batch, use_mmap...: the server's own settings, not a
    // request's (a prompt longer than the server's context is refused).
  }
  if (Has(body, "format")) {
    const Json& f = body["format"];
    if (f.is_string() && f.get<std::string>() == "json") {
      (*out)["response_format"] = {{"type", "json_object"}};
    } else if (f.is_object()) {
      (*out)["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", f}}}};
    } else if (!(f.is_string() && f.get<std::string>().empty())) {
      return InvalidRequest("format: expected \"json\" or a JSON schema object");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> CheckNoImages(const Json& obj, const std::string& where, const ServedModel& sm) {
  if (Has(obj, "images") && !(obj["images"].is_array() && obj["images"].empty()))
    return InvalidRequest(where + "images: model '" + sm.id + "' is text-only; send text");
  return std::nullopt;
}

// think: only for models that reason natively (Ollama refuses the others too).
std::optional<ApiError> ApplyThink(const Json& body, const ServedModel& sm, ChatRequest* req) {
  if (!Has(body, "think")) return std::nullopt;
  const Json& t = body["think"];
  const bool on = (t.is_boolean() && t.get<bool>()) || (t.is_string() && !t.get<std::string>().empty());
  if (!t.is_boolean() && !t.is_string()) return InvalidRequest("think: expected a boolean");
  if (!on) return std::nullopt;
  if (!ReasonsNatively(sm)) return InvalidRequest("\"" + sm.id + "\" does not support thinking");
  req->thinking_budget = sm.n_ctx;  // bounded by max_tokens and the context
  return std::nullopt;
}

std::optional<ApiError> TranslateChat(const Json& body, const ServedModel& sm, Json* out, bool* load_only) {
  if (!Has(body, "messages")) {
    *load_only = true;
    return std::nullopt;
  }
  const Json& msgs = body["messages"];
  if (!msgs.is_array()) return InvalidRequest("messages: expected an array");
  if (msgs.empty()) {
    *load_only = true;
    return std::nullopt;
  }
  Json messages = Json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "].";
    if (!m.is_object()) return InvalidRequest("messages[" + std::to_string(i) + "]: expected an object");
    if (auto e = CheckNoImages(m, where, sm)) return e;
    Json om = Json::object();
    for (const char* key : {"role", "content"})
      if (m.contains(key)) om[key] = m[key];
    if (Has(m, "tool_calls")) {
      if (!m["tool_calls"].is_array()) return InvalidRequest(where + "tool_calls: expected an array");
      Json calls = Json::array();
      for (const Json& c : m["tool_calls"]) {
        Json oc = c;
        if (oc.is_object()) oc["type"] = "function";
        calls.push_back(std::move(oc));
      }
      om["tool_calls"] = std::move(calls);
    }
    messages.push_back(std::move(om));
  }
  (*out)["messages"] = std::move(messages);
  if (body.contains("tools")) (*out)["tools"] = body["tools"];
  return std::nullopt;
}

}  // namespace

std::string OllamaErrorBody(const ApiError& e) {
  return DumpWireJson(Json{{"error", e.message}});
}

std::optional<ApiError> ParseOllamaRequest(const Json& body, const ServedModel& sm, bool chat, ChatRequest* req,
                                           OllamaOptions* opts) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  opts->chat = chat;
  opts->model = sm.id;
  if (auto e = OptString(body, "model", "", &opts->model)) return e;
  if (auto e = OptBool(body, "stream", "", &opts->stream)) return e;
  if (auto e = CheckNoImages(body, "", sm)) return e;
  Json o = Json::object();
  if (auto e = TranslateOptions(body, &o)) return e;
  OpenAIOptions oo;
  if (chat) {
    if (auto e = TranslateChat(body, sm, &o, &opts->load_only)) return e;
    if (opts->load_only) return std::nullopt;
    if (auto e = ParseOpenAIRequest(o, sm, req, &oo)) return e;
    return ApplyThink(body, sm, req);
  }
  std::string prompt, suffix, system, tmpl;
  bool raw = false;
  if (auto e = OptString(body, "prompt", "", &prompt)) return e;
  if (auto e = OptString(body, "suffix", "", &suffix)) return e;
  if (auto e = OptString(body, "system", "", &system)) return e;
  if (auto e = OptString(body, "template", "", &tmpl)) return e;
  if (auto e = OptBool(body, "raw", "", &raw)) return e;
  if (!tmpl.empty()) return InvalidRequest("template: overriding the model's template is not supported");
  if (Has(body, "context") && !(body["context"].is_array() && body["context"].empty()))
    return InvalidRequest("context: not supported (deprecated by Ollama); send the conversation to /api/chat");
  if (prompt.empty() && suffix.empty()) {
    opts->load_only = true;
    return std::nullopt;
  }
  if (raw || !suffix.empty()) {  // the prompt as it is, or fill in the middle with the suffix
    o["prompt"] = prompt;
    if (!suffix.empty()) o["suffix"] = suffix;
    if (!o.contains("max_tokens")) o["max_tokens"] = sm.n_ctx;  // Ollama's default: until it stops
    if (auto e = ParseCompletionRequest(o, sm, req, &oo)) return e;
  } else {
    o["messages"] = Json::array();
    if (!system.empty()) o["messages"].push_back({{"role", "system"}, {"content", system}});
    o["messages"].push_back({{"role", "user"}, {"content", prompt}});
    if (auto e = ParseOpenAIRequest(o, sm, req, &oo)) return e;
  }
  return ApplyThink(body, sm, req);
}

OllamaWriter::OllamaWriter(OllamaOptions opts) : opts_(std::move(opts)) {}

Json OllamaWriter::Message(const std::string& content, const std::string& thinking, const Json& tool_calls) const {
  Json m = {{"role", "assistant"}, {"content", content}};
  if (!thinking.empty()) m["thinking"] = thinking;
  if (!tool_calls.empty()) m["tool_calls"] = tool_calls;
  return m;
}

Json OllamaWriter::Line(Json message_or_text, bool done) const {
  Json line = {{"model", opts_.model}, {"created_at", Rfc3339(std::time(nullptr))}};
  if (opts_.chat) {
    line["message"] = std::move(message_or_text);
  } else {
    line["response"] = std::move(message_or_text);
  }
  line["done"] = done;
  return line;
}

std::string OllamaWriter::Event(const StreamEvent& ev) {
  Json piece;
  std::string text, thinking;
  Json calls = Json::array();
  switch (ev.kind) {
    case StreamEvent::Kind::kStarted:
    case StreamEvent::Kind::kServerTool:
      return "";
    case StreamEvent::Kind::kText:
      text = ev.text;
      break;
    case StreamEvent::Kind::kReasoning:
      thinking = ev.text;
      break;
    case StreamEvent::Kind::kToolCall:
      calls.push_back({{"function", {{"name", ev.call.name}, {"arguments", ev.call.arguments}}}});
      break;
    case StreamEvent::Kind::kDone:
      done_ = ev;
      return opts_.stream ? DumpWireJson(Result()) + "\n" : "";
    case StreamEvent::Kind::kError:
      return OllamaErrorBody(ev.error) + "\n";
  }
  content_ += text;
  thinking_ += thinking;
  for (const Json& c : calls) tool_calls_.push_back(c);
  if (!opts_.stream || (text.empty() && thinking.empty() && calls.empty())) return "";
  Json line = opts_.chat ? Line(Message(text, thinking, calls), false) : Line(text, false);
  if (!opts_.chat && !thinking.empty()) line["thinking"] = thinking;
  return DumpWireJson(line) + "\n";
}

Json OllamaWriter::Result() const {
  if (opts_.load_only) {
    Json r = opts_.chat ? Line(Message("", "", Json::array()), true) : Line("", true);
    r["done_reason"] = "load";
    return r;
  }
  const bool stream = opts_.stream;  // a stream's last line carries no text of its own
  Json r = opts_.chat ? Line(stream ? Message("", "", Json::array()) : Message(content_, thinking_, tool_calls_), true)
                      : Line(stream ? "" : content_, true);
  if (!opts_.chat && !stream && !thinking_.empty()) r["thinking"] = thinking_;
  r["done_reason"] = done_.finish == FinishReason::kMaxTokens ? "length" : "stop";
  r["total_duration"] = Nanos(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  r["load_duration"] = 0;
  r["prompt_eval_count"] = std::max<int64_t>(0, done_.input_tokens - done_.cache_read_tokens);
  r["prompt_eval_duration"] = Nanos(done_.prefill_s);
  r["eval_count"] = done_.output_tokens;
  r["eval_duration"] = Nanos(done_.decode_s);
  return r;
}

namespace {

// general.file_type (llama.cpp's llama_ftype) by name.
std::string FileTypeName(int64_t t) {
  static const std::pair<int64_t, const char*> kNames[] = {
      {0, "F32"},     {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
      {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
      {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {32, "BF16"},   {38, "MXFP4_MOE"}};
  for (const auto& [v, name] : kNames)
    if (v == t) return name;
  return "unknown";
}

Json Details(const ServedModel& sm) {
  std::string family = "unknown", quant = "unknown", size;
  if (sm.model != nullptr) {
    family = sm.model->config().arch_name;
    if (auto s = sm.model->file().GetString("general.size_label")) size = *s;
    if (auto t = sm.model->file().GetInt("general.file_type")) quant = FileTypeName(*t);
  }
  return {{"parent_model", ""},     {"format", "gguf"},
          {"family", family},       {"families", Json::array({family})},
          {"parameter_size", size}, {"quantization_level", quant}};
}

Json Entry(const ServedModel& sm) {
  return {{"name", sm.id},
          {"model", sm.id},
          {"modified_at", Rfc3339(static_cast<std::time_t>(sm.created_unix))},
          {"size", sm.model != nullptr ? static_cast<int64_t>(sm.model->file().file_size()) : 0},
          {"digest", sm.identity_hash},
          {"details", Details(sm)}};
}

}  // namespace

Json OllamaTags(const ServedModel& sm) {
  return {{"models", Json::array({Entry(sm)})}};
}

Json OllamaPs(const ServedModel& sm) {
  Json e = Entry(sm);
  e["expires_at"] = "2999-12-31T23:59:59Z";  // loaded for the server's life
  e["size_vram"] = 0;
  e["context_length"] = sm.n_ctx;
  return {{"models", Json::array({e})}};
}

Json OllamaShow(const ServedModel& sm) {
  Json caps = Json::array({"completion", "tools"});
  if (sm.model != nullptr && sm.model->tokenizer().fim().ok()) caps.push_back("insert");
  if (ReasonsNatively(sm)) caps.push_back("thinking");
  const std::string arch = sm.model != nullptr ? sm.model->config().arch_name : "unknown";
  return {{"modelfile", ""},
          {"parameters", ""},
          {"template", ""},
          {"details", Details(sm)},
          {"model_info", {{"general.architecture", arch}, {arch + ".context_length", sm.n_ctx}}},
          {"capabilities", caps},
          {"modified_at", Rfc3339(static_cast<std::time_t>(sm.created_unix))}};
}

}  // namespace mr::server
