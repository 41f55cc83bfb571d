#include "server/responses_api.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "model/tokenizer.h"
#include "server/openai_api.h"
#include "server/request_fields.h"

namespace mr::server {

using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// The store

void ResponseStore::Put(StoredResponse r) {
  if (!r.response.contains("id") || !r.response["id"].is_string()) return;
  const std::string id = r.response["id"].get<std::string>();
  const size_t bytes = DumpWireJson(r.response).size() + DumpWireJson(r.input_items).size();
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(id);
  if (bytes > max_bytes_ || max_responses_ == 0) return;
  by_id_[id] = Entry{std::move(r), bytes};
  bytes_ += bytes;
  order_.push_back(id);
  while (!order_.empty() && (by_id_.size() > max_responses_ || bytes_ > max_bytes_)) EraseLocked(order_.front());
}

bool ResponseStore::EraseLocked(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second.bytes;
  by_id_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));
  return true;
}

std::optional<StoredResponse> ResponseStore::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second.r;
}

bool ResponseStore::Delete(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return EraseLocked(id);
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

// ---------------------------------------------------------------------------------------------
// Requests

namespace {

const RequestLimits kLimits;

bool Has(const Json& obj, const char* key) {
  return obj.contains(key) && !obj[key].is_null();
}

std::string TypeOf(const Json& obj) {
  return obj.is_object() && obj.contains("type") && obj["type"].is_string() ? obj["type"].get<std::string>() : "";
}

// A content part's text as a chat text part; images, files and audio are refused (text-only).
std::optional<ApiError> TextParts(const Json& content, const ServedModel& sm, const std::string& where, Json* out) {
  if (content.is_string()) {
    out->push_back({{"type", "text"}, {"text", content}});
    return std::nullopt;
  }
  if (!content.is_array()) return InvalidRequest(where + ": expected a string or an array of content parts");
  if (content.size() > kLimits.max_content_blocks)
    return InvalidRequest(where + ": at most " + std::to_string(kLimits.max_content_blocks) + " content parts");
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& p = content[k];
    const std::string w = where + "[" + std::to_string(k) + "]";
    const std::string type = TypeOf(p);
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type == "input_text" || type == "output_text" || type == "text" || type == "refusal") {
      if (!p.contains(key) || !p[key].is_string()) return InvalidRequest(w + "." + key + ": field required (a string)");
      out->push_back({{"type", "text"}, {"text", p[key]}});
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return InvalidRequest(w + ": " + type + " content is not supported: model '" + sm.id +
                            "' is text-only; send input_text parts");
    } else {
      return InvalidRequest(w + ".type: unsupported content part type \"" + type + "\"");
    }
  }
  return std::nullopt;
}

// A reasoning item's text: its reasoning_text content, else its summary's text.
std::string ReasoningText(const Json& item) {
  std::string text;
  for (const char* key : {"content", "summary"}) {
    if (!item.contains(key) || !item[key].is_array()) continue;
    for (const Json& p : item[key])
      if (p.is_object() && p.contains("text") && p["text"].is_string()) {
        if (!text.empty()) text += "\n\n";
        text += p["text"].get<std::string>();
      }
    if (!text.empty()) break;
  }
  return text;
}

// Input items -> Chat Completions messages. reasoning[i]: what reasoning items before it left
// for chat message i (an assistant message). Function calls join the assistant message before
// them (the model's own output order: reasoning, text, calls).
class Conversation {
 public:
  explicit Conversation(const ServedModel& sm) : sm_(sm) {}

  std::optional<ApiError> Add(const Json& item, const std::string& where) {
    if (!item.is_object()) return InvalidRequest(where + ": expected an object");
    std::string type = TypeOf(item);
    if (type.empty() && item.contains("role")) type = "message";  // EasyInputMessage
    if (type == "message") return AddMessage(item, where);
    if (type == "function_call") {
      for (const char* key : {"call_id", "name", "arguments"})
        if (!item.contains(key) || !item[key].is_string())
          return InvalidRequest(where + "." + key + ": field required (a string)");
      Json& m = Assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
      m["tool_calls"].push_back({{"id", item["call_id"]},
                                 {"type", "function"},
                                 {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
      return std::nullopt;
    }
    if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string())
        return InvalidRequest(where + ".call_id: field required (a string)");
      if (!item.contains("output")) return InvalidRequest(where + ".output: field required");
      Json parts = Json::array();
      if (auto e = TextParts(item["output"], sm_, where + ".output", &parts)) return e;
      Push({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", std::move(parts)}});
      return std::nullopt;
    }
    if (type == "reasoning") {
      const std::string text = ReasoningText(item);
      if (!text.empty()) pending_reasoning_ += (pending_reasoning_.empty() ? "" : "\n\n") + text;
      return std::nullopt;
    }
    if (type == "item_reference")
      return InvalidRequest(where +
                            ": item_reference is not supported; send the item itself, or continue with "
                            "previous_response_id");
    return InvalidRequest(where + ".type: unsupported input item type \"" + type +
                          "\" (this server takes message, function_call, function_call_output and reasoning items)");
  }

  void AddSystem(const std::string& text) { Push({{"role", "system"}, {"content", text}}); }

  Json& messages() { return messages_; }
  const std::vector<std::string>& reasoning() const { return reasoning_; }

 private:
  std::optional<ApiError> AddMessage(const Json& item, const std::string& where) {
    std::string role;
    if (auto e = OptString(item, "role", where, &role)) return e;
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      return InvalidRequest(where + ".role: expected \"user\", \"assistant\", \"system\" or \"developer\"");
    if (!item.contains("content")) return InvalidRequest(where + ".content: field required");
    Json parts = Json::array();
    if (auto e = TextParts(item["content"], sm_, where + ".content", &parts)) return e;
    if (role == "assistant") {
      Json& m = Assistant();
      for (Json& p : parts) m["content"].push_back(std::move(p));
      return std::nullopt;
    }
    Push({{"role", role}, {"content", std::move(parts)}});
    return std::nullopt;
  }

  // The assistant message to extend: the last message when it is one, else a new one; reasoning
  // items before it go with it.
  Json& Assistant() {
    if (messages_.empty() || messages_.back()["role"] != "assistant")
      Push({{"role", "assistant"}, {"content", Json::array()}});
    std::string& r = reasoning_.back();
    if (!pending_reasoning_.empty()) r += (r.empty() ? "" : "\n\n") + pending_reasoning_;
    pending_reasoning_.clear();
    return messages_.back();
  }

  // Reasoning belongs to the assistant turn right after it: a user, system or tool message
  // between them drops it.
  void Push(Json m) {
    if (m["role"] != "assistant") pending_reasoning_.clear();
    messages_.push_back(std::move(m));
    reasoning_.emplace_back();
  }

  const ServedModel& sm_;
  Json messages_ = Json::array();
  std::vector<std::string> reasoning_;
  std::string pending_reasoning_;
};

// Gives an input item the id and type the stored list shows (a string input is one user message).
Json StoredItem(Json item) {
  if (!item.contains("type")) item["type"] = "message";
  if (!item.contains("id") || !item["id"].is_string()) {
    const std::string type = item["type"].is_string() ? item["type"].get<std::string>() : "";
    const char* prefix = type == "function_call"          ? "fc_"
                         : type == "function_call_output" ? "fco_"
                         : type == "reasoning"            ? "rs_"
                                                          : "msg_";
    item["id"] = RandomId(prefix);
  }
  return item;
}

// Tools that run on OpenAI's servers: this server cannot run them, so they are left out of the
// prompt (the model cannot call them) instead of failing clients that list them by default
// (Codex CLI sends web_search); forcing one is refused.
bool IsHostedTool(const std::string& type) {
  return type.rfind("web_search", 0) == 0 || type == "file_search" || type == "code_interpreter" ||
         type == "image_generation" || type == "computer_use_preview" || type == "computer" || type == "mcp";
}

// One function tool (flat: name, description, parameters, strict) as a chat tool; `ns`: the
// namespace it was listed in ("" for none).
std::optional<ApiError> AddFunction(const Json& t, const std::string& w, const std::string& ns, Json* out,
                                    std::map<std::string, std::string>* namespaces) {
  if (!t.contains("name") || !t["name"].is_string()) return InvalidRequest(w + ".name: field required (a string)");
  const std::string name = t["name"].get<std::string>();
  if (namespaces->count(name) != 0)
    return InvalidRequest(w + ".name: a second tool named \"" + name.substr(0, 128) + "\"");
  (*namespaces)[name] = ns;
  Json fn = Json::object();
  for (const char* key : {"name", "description", "parameters", "strict"})
    if (Has(t, key)) fn[key] = t[key];
  out->push_back({{"type", "function"}, {"function", std::move(fn)}});
  return std::nullopt;
}

// tools[]: function tools, namespaces of function tools (their calls come back with `namespace`),
// hosted tools (left out, above). The response echoes the list as sent.
std::optional<ApiError> TranslateTools(const Json& body, Json* chat, ResponsesOptions* opts) {
  if (!Has(body, "tools")) return std::nullopt;
  const Json& tools = body["tools"];
  if (!tools.is_array()) return InvalidRequest("tools: expected an array");
  if (tools.size() > kLimits.max_tools)
    return InvalidRequest("tools: at most " + std::to_string(kLimits.max_tools) + " tools");
  Json out = Json::array();
  std::map<std::string, std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string w = "tools[" + std::to_string(i) + "]";
    const std::string type = TypeOf(t);
    if (type == "function") {
      if (auto e = AddFunction(t, w, "", &out, &names)) return e;
    } else if (type == "namespace") {
      std::string ns;
      if (auto e = OptString(t, "name", w, &ns)) return e;
      if (ns.empty() || !t.contains("tools") || !t["tools"].is_array())
        return InvalidRequest(w + ": a namespace needs a name and tools (an array of function tools)");
      if (t["tools"].size() > kLimits.max_tools)
        return InvalidRequest(w + ".tools: at most " + std::to_string(kLimits.max_tools) + " tools");
      for (size_t k = 0; k < t["tools"].size(); ++k) {
        const Json& f = t["tools"][k];
        const std::string wk = w + ".tools[" + std::to_string(k) + "]";
        if (TypeOf(f) != "function") return InvalidRequest(wk + ".type: a namespace holds function tools");
        if (auto e = AddFunction(f, wk, ns, &out, &names)) return e;
      }
    } else if (!IsHostedTool(type)) {
      return InvalidRequest(w + ".type: \"" + type.substr(0, 64) +
                            "\" tools are not supported by this server (function and namespace tools; hosted tools "
                            "are listed but not offered)");
    }
  }
  if (out.size() > kLimits.max_tools)
    return InvalidRequest("tools: at most " + std::to_string(kLimits.max_tools) + " function tools in all");
  for (const auto& [name, ns] : names)
    if (!ns.empty()) opts->tool_namespace[name] = ns;
  opts->echo["tools"] = tools;
  if (!out.empty()) (*chat)["tools"] = std::move(out);
  return std::nullopt;
}

std::optional<ApiError> TranslateToolChoice(const Json& body, Json* chat, Json* echo) {
  if (!Has(body, "tool_choice")) return std::nullopt;
  const Json& tc = body["tool_choice"];
  (*echo)["tool_choice"] = tc;
  if (tc.is_string()) {
    (*chat)["tool_choice"] = tc;  // auto, none, required (the chat parser checks the value)
    return std::nullopt;
  }
  if (TypeOf(tc) == "function" && tc.contains("name") && tc["name"].is_string()) {
    (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    return std::nullopt;
  }
  return InvalidRequest(
      "tool_choice: expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
      "\"name\": ...} (allowed_tools and hosted tools cannot be forced here)");
}

// text.format -> response_format; text.verbosity is accepted (the model has no such control).
std::optional<ApiError> TranslateText(const Json& body, Json* chat, Json* echo) {
  const Json* text = nullptr;
  if (auto e = OptObject(body, "text", "", &text)) return e;
  (*echo)["text"] = {{"format", {{"type", "text"}}}};
  if (text == nullptr) return std::nullopt;
  std::string verbosity;
  if (auto e = OptString(*text, "verbosity", "text", &verbosity)) return e;
  if (!verbosity.empty() && verbosity != "low" && verbosity != "medium" && verbosity != "high")
    return InvalidRequest("text.verbosity: expected \"low\", \"medium\" or \"high\"");
  if (!verbosity.empty()) (*echo)["text"]["verbosity"] = verbosity;
  const Json* format = nullptr;
  if (auto e = OptObject(*text, "format", "text", &format)) return e;
  if (format == nullptr) return std::nullopt;
  const std::string type = TypeOf(*format);
  if (type == "json_schema") {
    if (!format->contains("schema") || !(*format)["schema"].is_object())
      return InvalidRequest("text.format.schema: field required (a JSON schema object)");
    Json js = {{"name", Has(*format, "name") ? (*format)["name"] : Json("response")}, {"schema", (*format)["schema"]}};
    if (Has(*format, "strict")) js["strict"] = (*format)["strict"];
    (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
  } else if (type == "json_object" || type == "text") {
    (*chat)["response_format"] = {{"type", type}};
  } else {
    return InvalidRequest("text.format.type: expected \"text\", \"json_object\" or \"json_schema\"");
  }
  (*echo)["text"]["format"] = *format;
  return std::nullopt;
}

// Fields whose only supported value is their off state, and settings that need OpenAI's platform.
std::optional<ApiError> RefuseUnsupported(const Json& body) {
  bool background = false;
  if (auto e = OptBool(body, "background", "", &background)) return e;
  if (background) return InvalidRequest("background: not supported by this server; send the request without it");
  if (Has(body, "conversation"))
    return InvalidRequest("conversation: not supported by this server; continue with previous_response_id");
  if (Has(body, "prompt"))
    return InvalidRequest("prompt: reusable prompts live on OpenAI's platform; send instructions and input instead");
  std::string truncation = "disabled";
  if (auto e = OptString(body, "truncation", "", &truncation)) return e;
  if (truncation != "disabled")
    return InvalidRequest(
        "truncation: only \"disabled\" is supported (a conversation longer than the context "
        "is refused, never cut silently)");
  if (Has(body, "include")) {
    if (!body["include"].is_array()) return InvalidRequest("include: expected an array of strings");
    for (const Json& x : body["include"])
      if (!x.is_string()) return InvalidRequest("include: expected an array of strings");
  }
  // Accepted and ignored, but of their documented types.
  for (const char* key : {"service_tier", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"}) {
    std::string ignored;
    if (auto e = OptString(body, key, "", &ignored)) return e;
  }
  const Json* ignored = nullptr;
  if (auto e = OptObject(body, "stream_options", "", &ignored)) return e;
  if (Has(body, "max_tool_calls") && (!body["max_tool_calls"].is_number_integer() || body["max_tool_calls"] < 1))
    return InvalidRequest("max_tool_calls: expected an integer >= 1");
  return std::nullopt;
}

bool Includes(const Json& body, const char* what) {
  if (!Has(body, "include") || !body["include"].is_array()) return false;
  for (const Json& x : body["include"])
    if (x == what) return true;
  return false;
}

}  // namespace

std::optional<ApiError> ParseResponsesRequest(const Json& body, const ServedModel& sm, const ResponseStore* store,
                                              ChatRequest* req, ResponsesOptions* opts) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  if (auto e = RefuseUnsupported(body)) return e;
  opts->model = sm.id;
  if (auto e = OptString(body, "model", "", &opts->model)) return e;
  if (auto e = OptBool(body, "stream", "", &opts->stream)) return e;
  if (auto e = OptBool(body, "store", "", &opts->store)) return e;
  if (sm.model != nullptr) opts->tokenizer = &sm.model->tokenizer();
  Json& echo = opts->echo;
  echo = {{"instructions", nullptr}, {"max_output_tokens", nullptr}, {"previous_response_id", nullptr},
          {"tools", Json::array()},  {"tool_choice", "auto"},        {"parallel_tool_calls", true}};

  // The conversation: the previous response's, then instructions and this input.
  Json items = Json::array();
  std::string previous;
  if (auto e = OptString(body, "previous_response_id", "", &previous)) return e;
  if (!previous.empty()) {
    std::optional<StoredResponse> prev = store != nullptr ? store->Get(previous) : std::nullopt;
    if (!prev)
      return InvalidRequest("previous_response_id: no stored response '" + previous.substr(0, 64) +
                            "' (stored responses are kept in memory, a bounded number, until the server restarts; "
                            "one created with store: false is never kept)");
    items = prev->input_items;
    for (const Json& o : prev->response["output"]) items.push_back(o);
    echo["previous_response_id"] = previous;
  }
  const size_t first_new = items.size();
  if (!body.contains("input") || body["input"].is_null()) return InvalidRequest("input: field required");
  const Json& input = body["input"];
  if (input.is_string()) {
    items.push_back({{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", input}}}}});
  } else if (input.is_array()) {
    if (input.size() > kLimits.max_messages)
      return InvalidRequest("input: at most " + std::to_string(kLimits.max_messages) + " items");
    for (const Json& it : input) items.push_back(it);
  } else {
    return InvalidRequest("input: expected a string or an array of input items");
  }
  std::string instructions;
  if (auto e = OptString(body, "instructions", "", &instructions)) return e;
  if (Has(body, "instructions")) echo["instructions"] = instructions;

  Conversation conv(sm);
  if (!instructions.empty()) conv.AddSystem(instructions);
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string where = i < first_new ? "previous_response_id's item " + std::to_string(i)
                                            : "input[" + std::to_string(i - first_new) + "]";
    if (auto e = conv.Add(items[i], where)) return e;
  }
  if (conv.messages().empty()) return InvalidRequest("input: empty (send at least one message)");

  // The Chat Completions request this is.
  Json chat = {{"model", opts->model}, {"messages", std::move(conv.messages())}};
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "frequency_penalty",
                          "presence_penalty", "logit_bias", "metadata", "user", "parallel_tool_calls", "stop"})
    if (body.contains(key)) chat[key] = body[key];
  if (Has(body, "max_output_tokens")) {
    chat["max_tokens"] = body["max_output_tokens"];
    echo["max_output_tokens"] = body["max_output_tokens"];
  }
  if (auto e = TranslateTools(body, &chat, opts)) return e;
  if (auto e = TranslateToolChoice(body, &chat, &echo)) return e;
  if (auto e = TranslateText(body, &chat, &echo)) return e;
  const Json* reasoning = nullptr;
  if (auto e = OptObject(body, "reasoning", "", &reasoning)) return e;
  echo["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  std::string effort;
  if (reasoning != nullptr) {
    std::string summary;
    if (auto e = OptString(*reasoning, "effort", "reasoning", &effort)) return e;
    if (auto e = OptString(*reasoning, "summary", "reasoning", &summary)) return e;
    static const char* const kEfforts[] = {"", "none", "minimal", "low", "medium", "high", "xhigh"};
    if (std::find(std::begin(kEfforts), std::end(kEfforts), effort) == std::end(kEfforts))
      return InvalidRequest(
          "reasoning.effort: expected \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
    if (!effort.empty()) {
      chat["reasoning_effort"] = effort;
      echo["reasoning"]["effort"] = effort;
    }
    if (!summary.empty()) echo["reasoning"]["summary"] = summary;
  }
  OpenAIOptions oo;
  if (auto e = ParseOpenAIRequest(chat, sm, req, &oo)) {
    // The chat parser names its own fields; say which of ours they were.
    std::string& m = e->message;
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"max_tokens:", "max_output_tokens:"},
                                   {"response_format.", "text.format."},
                                   {"messages", "input, as chat messages: messages"}})
      if (m.rfind(from, 0) == 0) m = to + m.substr(from.size());
    return e;
  }
  // A model that reasons natively reasons by default here, as OpenAI's reasoning models do on
  // this API (the chat parser turned it on for an explicit effort; "none" turns it off).
  if (ReasonsNatively(sm) && effort.empty()) req->thinking_budget = sm.n_ctx;
  const std::vector<std::string>& r = conv.reasoning();
  for (size_t i = 0; i < r.size() && i < req->messages.size(); ++i)
    if (!r[i].empty()) req->messages[i].reasoning = r[i];

  if (Has(body, "top_logprobs")) {
    const Json& t = body["top_logprobs"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > 20)
      return InvalidRequest("top_logprobs: expected an integer between 0 and 20");
    req->logprobs = static_cast<int>(t.get<int64_t>());
    echo["top_logprobs"] = t;
  }
  if (Includes(body, "message.output_text.logprobs")) {
    opts->logprobs = true;
    req->logprobs = std::max(req->logprobs, 0);
  } else {
    req->logprobs = -1;  // top_logprobs alone returns none, as OpenAI's
  }
  if (Has(body, "parallel_tool_calls")) echo["parallel_tool_calls"] = body["parallel_tool_calls"];
  // The request's values as sent, else the model's defaults (floats, shown to 6 digits).
  auto shown = [](float v) { return std::round(static_cast<double>(v) * 1e6) / 1e6; };
  echo["temperature"] = Has(body, "temperature") ? body["temperature"] : Json(shown(sm.default_sampling.temperature));
  echo["top_p"] = Has(body, "top_p") ? body["top_p"] : Json(shown(sm.default_sampling.top_p));
  echo["truncation"] = "disabled";
  echo["store"] = opts->store;
  echo["metadata"] = Has(body, "metadata") ? body["metadata"] : Json::object();
  echo["user"] = Has(body, "user") ? body["user"] : Json();
  for (size_t i = first_new; i < items.size(); ++i) opts->input_items.push_back(StoredItem(items[i]));
  if (first_new > 0) {  // the chain's items first, as stored
    Json all(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(first_new));
    for (Json& x : opts->input_items) all.push_back(std::move(x));
    opts->input_items = std::move(all);
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Responses

ResponsesWriter::ResponsesWriter(ResponsesOptions opts, int64_t input_tokens, ResponseStore* store)
    : opts_(std::move(opts)),
      store_(opts_.store ? store : nullptr),
      id_(RandomId("resp_")),
      created_(static_cast<int64_t>(std::time(nullptr))),
      input_tokens_(input_tokens) {}

Json ResponsesWriter::Response() const {
  Json r = {{"id", id_},
            {"object", "response"},
            {"created_at", created_},
            {"status", status_},
            {"error", error_},
            {"incomplete_details", incomplete_details_},
            {"model", opts_.model},
            {"output", output_}};
  if (open_ != Item::kNone) r["output"].back()["content"][0]["text"] = text_;  // the open item so far
  if (completed_at_ > 0) r["completed_at"] = completed_at_;
  for (const auto& [k, v] : opts_.echo.items()) r[k] = v;
  if (status_ != "in_progress") {
    r["usage"] = {{"input_tokens", input_tokens_},
                  {"input_tokens_details", {{"cached_tokens", cached_tokens_}}},
                  {"output_tokens", output_tokens_},
                  {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
                  {"total_tokens", input_tokens_ + output_tokens_}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

std::string ResponsesWriter::Emit(const char* type, Json ev) {
  if (!opts_.stream) return "";
  Json e = {{"type", type}, {"sequence_number", seq_++}};
  for (auto& [k, v] : ev.items()) e[k] = std::move(v);
  return std::string("event: ") + type + "\ndata: " + DumpWireJson(e) + "\n\n";
}

std::string ResponsesWriter::Start() {
  std::string s = Emit("response.created", {{"response", Response()}});
  return s + Emit("response.in_progress", {{"response", Response()}});
}

std::string ResponsesWriter::KeepAlive() {
  if (status_ != "in_progress") return "";
  return Emit("response.in_progress", {{"response", Response()}});
}

Json ResponsesWriter::Logprobs(const std::vector<TokenLogprob>& lps) const {
  if (!opts_.logprobs || opts_.tokenizer == nullptr) return Json::array();
  return OpenAILogprobContent(*opts_.tokenizer, lps);
}

std::string ResponsesWriter::Open(Item kind) {
  std::string s = Close();
  open_ = kind;
  text_.clear();
  const int64_t index = static_cast<int64_t>(output_.size());
  Json item, part;
  if (kind == Item::kMessage) {
    item = {{"id", RandomId("msg_")},
            {"type", "message"},
            {"status", "in_progress"},
            {"role", "assistant"},
            {"content", Json::array()}};
    part = {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}};
    if (opts_.logprobs) part["logprobs"] = Json::array();
  } else {
    item = {{"id", RandomId("rs_")}, {"type", "reasoning"}, {"summary", Json::array()}, {"content", Json::array()}};
    part = {{"type", "reasoning_text"}, {"text", ""}};
  }
  const std::string item_id = item["id"];
  s += Emit("response.output_item.added", {{"output_index", index}, {"item", item}});
  item["content"].push_back(part);
  output_.push_back(std::move(item));
  return s + Emit("response.content_part.added",
                  {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
}

std::string ResponsesWriter::Close() {
  if (open_ == Item::kNone) return "";
  const int64_t index = static_cast<int64_t>(output_.size()) - 1;
  Json& item = output_.back();
  const std::string item_id = item["id"];
  Json& part = item["content"][0];
  part["text"] = text_;  // kept in text_ while open: one copy, not one per token
  std::string s;
  const Json where = {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}};
  if (open_ == Item::kMessage) {
    item["status"] = status_ == "incomplete" ? "incomplete" : "completed";
    Json done = where;
    done["text"] = text_;
    done["logprobs"] = part.contains("logprobs") ? part["logprobs"] : Json::array();
    s += Emit("response.output_text.done", std::move(done));
  } else {
    if (opts_.tokenizer != nullptr)
      reasoning_tokens_ +=
          static_cast<int64_t>(opts_.tokenizer->Encode(text_, /*add_special=*/false, /*parse_special=*/false).size());
    Json done = where;
    done["text"] = text_;
    s += Emit("response.reasoning_text.done", std::move(done));
  }
  Json pd = where;
  pd["part"] = part;
  s += Emit("response.content_part.done", std::move(pd));
  s += Emit("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Item::kNone;
  text_.clear();
  return s;
}

std::string ResponsesWriter::Event(const StreamEvent& ev) {
  std::string s;
  switch (ev.kind) {
    case StreamEvent::Kind::kStarted:
      cached_tokens_ = ev.cache_read_tokens;
      return "";
    case StreamEvent::Kind::kServerTool:  // Anthropic's tool search only
      return "";
    case StreamEvent::Kind::kText:
    case StreamEvent::Kind::kReasoning: {
      const Item kind = ev.kind == StreamEvent::Kind::kText ? Item::kMessage : Item::kReasoning;
      if (ev.text.empty() && ev.logprobs.empty()) return "";
      if (open_ != kind) s += Open(kind);
      text_ += ev.text;
      Json& part = output_.back()["content"][0];
      Json delta = {{"item_id", output_.back()["id"]},
                    {"output_index", output_.size() - 1},
                    {"content_index", 0},
                    {"delta", ev.text}};
      if (kind == Item::kMessage) {
        Json lps = Logprobs(ev.logprobs);
        if (part.contains("logprobs"))
          for (const Json& x : lps) part["logprobs"].push_back(x);
        delta["logprobs"] = std::move(lps);
        return s + Emit("response.output_text.delta", std::move(delta));
      }
      return s + Emit("response.reasoning_text.delta", std::move(delta));
    }
    case StreamEvent::Kind::kToolCall: {
      s += Close();
      const int64_t index = static_cast<int64_t>(output_.size());
      const std::string args = DumpWireJson(ev.call.arguments);
      Json item = {{"id", RandomId("fc_")}, {"type", "function_call"},      {"status", "in_progress"},
                   {"arguments", ""},       {"call_id", RandomId("call_")}, {"name", ev.call.name}};
      if (auto ns = opts_.tool_namespace.find(ev.call.name); ns != opts_.tool_namespace.end())
        item["namespace"] = ns->second;
      const Json where = {{"item_id", item["id"]}, {"output_index", index}};
      s += Emit("response.output_item.added", {{"output_index", index}, {"item", item}});
      Json delta = where;
      delta["delta"] = args;
      s += Emit("response.function_call_arguments.delta", std::move(delta));
      Json done = where;
      done["arguments"] = args;
      done["name"] = ev.call.name;
      s += Emit("response.function_call_arguments.done", std::move(done));
      item["arguments"] = args;
      item["status"] = "completed";
      s += Emit("response.output_item.done", {{"output_index", index}, {"item", item}});
      output_.push_back(std::move(item));
      return s;
    }
    case StreamEvent::Kind::kDone: {
      cached_tokens_ = ev.cache_read_tokens;
      output_tokens_ = ev.output_tokens;
      if (ev.finish == FinishReason::kMaxTokens) {
        status_ = "incomplete";
        incomplete_details_ = {{"reason", "max_output_tokens"}};
      }
      s += Close();
      if (status_ != "incomplete") status_ = "completed";
      completed_at_ = static_cast<int64_t>(std::time(nullptr));
      const Json r = Response();
      if (store_ != nullptr) store_->Put({r, opts_.input_items});
      return s + Emit(status_ == "completed" ? "response.completed" : "response.incomplete", {{"response", r}});
    }
    case StreamEvent::Kind::kError: {
      s += Close();
      status_ = "failed";
      error_ = {{"code", ev.error.type == ApiErrorType::kOverloaded ? "server_is_overloaded" : "server_error"},
                {"message", ev.error.message}};
      return s + Emit("response.failed", {{"response", Response()}});
    }
  }
  return s;
}

std::optional<ApiError> ResponseInputItemList(const StoredResponse& r, const std::string& order, int64_t limit,
                                              const std::string& after, Json* out) {
  if (order != "asc" && order != "desc") return InvalidRequest("order: expected \"asc\" or \"desc\"");
  if (limit < 1 || limit > 100) return InvalidRequest("limit: expected an integer between 1 and 100");
  std::vector<const Json*> items;
  for (const Json& x : r.input_items) items.push_back(&x);
  if (order == "desc") std::reverse(items.begin(), items.end());
  size_t from = 0;
  if (!after.empty()) {
    auto it = std::find_if(items.begin(), items.end(), [&](const Json* x) { return (*x).value("id", "") == after; });
    if (it == items.end()) return InvalidRequest("after: no input item '" + after.substr(0, 64) + "' in this response");
    from = static_cast<size_t>(it - items.begin()) + 1;
  }
  Json data = Json::array();
  for (size_t i = from; i < items.size() && static_cast<int64_t>(data.size()) < limit; ++i) data.push_back(*items[i]);
  const bool more = from + data.size() < items.size();
  *out = {{"object", "list"},
          {"data", data},
          {"first_id", data.empty() ? Json() : data.front()["id"]},
          {"last_id", data.empty() ? Json() : data.back()["id"]},
          {"has_more", more}};
  return std::nullopt;
}

}  // namespace mr::server
