#include "server/openai_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>

#include "runtime/gbnf.h"
#include "server/request_fields.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& j) {
  return DumpWireJson(j);
}

const RequestLimits kLimits;

std::optional<ApiError> ContentText(const Json& c, const ServedModel& sm, const std::string& where, std::string* out) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return InvalidRequest(where + ": expected a string or an array of content parts");
  if (c.size() > kLimits.max_content_blocks)
    return InvalidRequest(where + ": at most " + std::to_string(kLimits.max_content_blocks) + " content parts");
  for (size_t k = 0; k < c.size(); ++k) {
    const Json& p = c[k];
    const std::string type =
        p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "";
    if (type == "text" && p.contains("text") && p["text"].is_string()) {
      if (!out->empty()) *out += "\n\n";
      *out += p["text"].get<std::string>();
    } else if (type == "image_url" || type == "input_audio" || type == "file") {
      return InvalidRequest(where + "[" + std::to_string(k) + "]: " + type + " content is not supported: model '" +
                            sm.id + "' is text-only; send text parts");
    } else {
      return InvalidRequest(where + "[" + std::to_string(k) + "]: unsupported content part type \"" + type + "\"");
    }
  }
  return std::nullopt;
}

const char* FinishName(FinishReason f) {
  switch (f) {
    case FinishReason::kMaxTokens:
      return "length";
    case FinishReason::kToolUse:
      return "tool_calls";
    default:
      return "stop";
  }
}

// The legacy (text completions) logprobs object: parallel arrays, one entry per token.
constexpr const char* kLegacyLogprobKeys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};

Json EmptyLegacyLogprobs() {
  Json lp = Json::object();
  for (const char* k : kLegacyLogprobKeys) lp[k] = Json::array();
  return lp;
}

// Characters (Unicode code points) in UTF-8 bytes: text_offset's unit.
int64_t Utf8Chars(std::string_view s) {
  int64_t n = 0;
  for (const unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// One token's entry at text offset `*offset`, which then moves past the token's text as the
// output shows it (a control token adds none). A NaN logprob (a prompt's first token) is null.
void AppendLegacyLogprob(const Tokenizer& tok, const TokenLogprob& t, int64_t* offset, Json* lp) {
  const bool none = std::isnan(t.logprob);
  Json top = Json::object();
  for (const auto& [id, l] : t.top) top[tok.TokenToPiece(id, /*render_special=*/true)] = l;
  (*lp)["tokens"].push_back(tok.TokenToPiece(t.id, /*render_special=*/true));
  (*lp)["token_logprobs"].push_back(none ? Json() : Json(t.logprob));
  (*lp)["top_logprobs"].push_back(none ? Json() : std::move(top));
  (*lp)["text_offset"].push_back(*offset);
  *offset += Utf8Chars(tok.TokenToPiece(t.id, /*render_special=*/false));
}

// response_format: text, json_object, or json_schema with its schema.
std::optional<ApiError> ParseResponseFormat(const Json& body, ChatRequest* req) {
  const Json* response_format = nullptr;
  if (auto e = OptObject(body, "response_format", "", &response_format)) return e;
  std::string format_type = "text";
  if (response_format != nullptr)
    if (auto e = OptString(*response_format, "type", "response_format", &format_type)) return e;
  if (format_type == "json_object") {
    req->format = OutputFormat::kJsonObject;
  } else if (format_type == "json_schema") {
    const Json* js = nullptr;
    if (auto e = OptObject(*response_format, "json_schema", "response_format", &js)) return e;
    if (js == nullptr || !js->contains("schema") || !(*js)["schema"].is_object())
      return InvalidRequest("response_format.json_schema.schema: field required (a JSON schema object)");
    req->format = OutputFormat::kJsonSchema;
    req->format_schema = (*js)["schema"];
  } else if (format_type != "text") {
    return InvalidRequest("response_format.type: expected \"text\", \"json_object\" or \"json_schema\"");
  }
  return ParseGuidedOutput(body, req);
}

}  // namespace

std::optional<ApiError> ParseGuidedOutput(const Json& body, ChatRequest* req) {
  constexpr size_t kMaxChoiceOptions = 1024;
  const Json* so = nullptr;
  if (auto e = OptObject(body, "structured_outputs", "", &so)) return e;
  struct Field {
    const Json* obj;
    const char* key;
    std::string name;
  };
  const Field fields[] = {{&body, "grammar", "grammar"},
                          {&body, "guided_grammar", "guided_grammar"},
                          {&body, "guided_choice", "guided_choice"},
                          {&body, "guided_json", "guided_json"},
                          {&body, "guided_regex", "guided_regex"},
                          {so, "grammar", "structured_outputs.grammar"},
                          {so, "choice", "structured_outputs.choice"},
                          {so, "json", "structured_outputs.json"},
                          {so, "regex", "structured_outputs.regex"},
                          {so, "json_object", "structured_outputs.json_object"}};
  for (const Field& f : fields) {
    if (f.obj == nullptr || !f.obj->contains(f.key) || (*f.obj)[f.key].is_null()) continue;
    const Json& v = (*f.obj)[f.key];
    const std::string key = f.key;
    if (key == "grammar" && v.is_string() && v.get<std::string>().empty()) continue;  // llama.cpp's default
    if (key == "json_object" && v.is_boolean() && !v.get<bool>()) continue;
    if (req->format != OutputFormat::kText)
      return InvalidRequest(f.name +
                            ": one output format per request (response_format, json_schema, grammar, "
                            "guided_* and structured_outputs each set one)");
    if (key == "grammar" || key == "guided_grammar") {
      if (!v.is_string())
        return InvalidRequest(f.name + ": expected a GBNF grammar (a string), got " + JsonTypeName(v));
      req->format = OutputFormat::kGrammar;
      req->format_grammar = v.get<std::string>();
    } else if (key == "guided_choice" || key == "choice") {
      if (!v.is_array() || v.empty() || v.size() > kMaxChoiceOptions)
        return InvalidRequest(f.name + ": expected an array of 1 to " + std::to_string(kMaxChoiceOptions) + " strings");
      std::vector<std::string> options;
      for (const Json& o : v) {
        if (!o.is_string()) return InvalidRequest(f.name + ": expected an array of strings");
        options.push_back(o.get<std::string>());
      }
      req->format = OutputFormat::kGrammar;
      req->format_grammar = GbnfChoice(options);
    } else if (key == "guided_json" || key == "json") {
      Json schema = v;
      if (v.is_string()) {  // text from the request: its nesting is bounded as the body's is
        const std::string& text = v.get_ref<const std::string&>();
        if (JsonDepth(text, kLimits.max_json_depth) > kLimits.max_json_depth)
          return InvalidRequest(f.name + ": nested deeper than " + std::to_string(kLimits.max_json_depth) + " levels");
        schema = Json::parse(text, nullptr, false);
      }
      if (!schema.is_object())
        return InvalidRequest(f.name + ": expected a JSON schema (an object, or one encoded as a string)");
      req->format = schema.empty() ? OutputFormat::kJsonObject : OutputFormat::kJsonSchema;
      req->format_schema = std::move(schema);
    } else if (key == "json_object") {
      if (!v.is_boolean()) return InvalidRequest(f.name + ": expected a boolean");
      req->format = OutputFormat::kJsonObject;
    } else {  // guided_regex, structured_outputs.regex
      if (!v.is_string())
        return InvalidRequest(f.name + ": expected a regular expression (a string), got " + JsonTypeName(v));
      req->format = OutputFormat::kRegex;
      req->format_grammar = v.get<std::string>();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseOpenAICommon(const Json& body, ChatRequest* req, OpenAIOptions* opts) {
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return InvalidRequest("stream: expected a boolean");
    opts->stream = body["stream"].get<bool>();
  }
  const Json* stream_options = nullptr;
  if (auto e = OptObject(body, "stream_options", "", &stream_options)) return e;
  if (stream_options != nullptr)
    if (auto e = OptBool(*stream_options, "include_usage", "stream_options", &opts->include_usage)) return e;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (body.contains(key) && !body[key].is_null()) {
      // 0 only where the prompt's echo is the answer (/v1/completions scoring a text).
      const int64_t least = opts->echo ? 0 : 1;
      if (!body[key].is_number_integer() || body[key].get<int64_t>() < least)
        return InvalidRequest(std::string(key) + ": expected an integer >= " + std::to_string(least));
      req->max_tokens = body[key].get<int64_t>();
      break;
    }
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& s = body["stop"];
    if (s.is_string()) {
      req->stop_sequences.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const Json& x : s) {
        if (!x.is_string()) return InvalidRequest("stop: expected a string or an array of strings");
        req->stop_sequences.push_back(x.get<std::string>());
      }
    } else {
      return InvalidRequest("stop: expected a string or an array of strings");
    }
    if (auto e = CheckStopSequences(req->stop_sequences, "stop", kLimits)) return e;
  }
  if (body.contains("temperature") && !body["temperature"].is_null()) {
    if (!body["temperature"].is_number() || body["temperature"].get<double>() < 0 ||
        body["temperature"].get<double>() > 2)
      return InvalidRequest("temperature: expected a number between 0 and 2");
    req->temperature = body["temperature"].get<float>();
  }
  if (body.contains("top_p") && !body["top_p"].is_null()) {
    if (!body["top_p"].is_number() || body["top_p"].get<double>() <= 0 || body["top_p"].get<double>() > 1)
      return InvalidRequest("top_p: expected a number in (0, 1]");
    req->top_p = body["top_p"].get<float>();
  }
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) return InvalidRequest("seed: expected an integer");
    req->seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (body.contains("n") && !body["n"].is_null()) {
    if (!body["n"].is_number_integer() || body["n"].get<int64_t>() < 1 || body["n"].get<int64_t>() > kMaxChoices)
      return InvalidRequest("n: expected an integer between 1 and " + std::to_string(kMaxChoices));
    opts->n = static_cast<int>(body["n"].get<int64_t>());
  }
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const Json& lb = body["logit_bias"];
    if (!lb.is_object()) return InvalidRequest("logit_bias: expected an object of token id -> bias");
    if (lb.size() > kLimits.max_logit_bias)
      return InvalidRequest("logit_bias: at most " + std::to_string(kLimits.max_logit_bias) + " entries");
    for (const auto& [key, v] : lb.items()) {
      TokenId id = -1;
      const char* end = key.data() + key.size();
      const auto [ptr, ec] = std::from_chars(key.data(), end, id);
      if (key.empty() || ec != std::errc() || ptr != end || id < 0)
        return InvalidRequest("logit_bias: key \"" + key + "\" is not a token id");
      if (!v.is_number() || v.get<double>() < -100 || v.get<double>() > 100)
        return InvalidRequest("logit_bias[\"" + key + "\"]: expected a number between -100 and 100");
      req->adjust.bias.emplace_back(id, v.get<float>());
    }
  }
  // Accepted and ignored, but of their documented type.
  const Json* metadata = nullptr;
  if (auto e = OptObject(body, "metadata", "", &metadata)) return e;
  std::string user;
  if (auto e = OptString(body, "user", "", &user)) return e;
  // vLLM's and llama.cpp's extensions, which OpenAI clients such as Open WebUI send.
  if (body.contains("top_k") && !body["top_k"].is_null()) {
    if (!body["top_k"].is_number_integer() || body["top_k"].get<int64_t>() < -1 ||
        body["top_k"].get<int64_t>() > INT32_MAX)
      return InvalidRequest("top_k: expected an integer >= -1 (-1 or 0: off)");
    req->top_k = static_cast<int>(std::max<int64_t>(body["top_k"].get<int64_t>(), 0));
  }
  if (body.contains("min_p") && !body["min_p"].is_null()) {
    if (!body["min_p"].is_number() || body["min_p"].get<double>() < 0 || body["min_p"].get<double>() > 1)
      return InvalidRequest("min_p: expected a number between 0 and 1");
    req->min_p = body["min_p"].get<float>();
  }
  for (const char* key : {"repetition_penalty", "repeat_penalty"}) {
    if (!body.contains(key) || body[key].is_null()) continue;
    if (!body[key].is_number() || body[key].get<double>() <= 0 || body[key].get<double>() > 10)
      return InvalidRequest(std::string(key) + ": expected a number in (0, 10] (1: off)");
    req->adjust.repetition_penalty = body[key].get<float>();
  }
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    if (!body.contains(key) || body[key].is_null()) continue;
    if (!body[key].is_number() || body[key].get<double>() < -2 || body[key].get<double>() > 2)
      return InvalidRequest(std::string(key) + ": expected a number between -2 and 2");
    (key[0] == 'f' ? req->adjust.frequency_penalty : req->adjust.presence_penalty) = body[key].get<float>();
  }
  return std::nullopt;
}

std::optional<ApiError> ParseOpenAIRequest(const Json& body, const ServedModel& sm, ChatRequest* req,
                                           OpenAIOptions* opts) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  opts->model = sm.id;
  if (auto e = OptString(body, "model", "", &opts->model)) return e;
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return InvalidRequest("messages: field required (a non-empty array)");
  const Json& msgs = body["messages"];
  if (msgs.size() > kLimits.max_messages)
    return InvalidRequest("messages: at most " + std::to_string(kLimits.max_messages) + " messages");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return InvalidRequest(where + ".role: field required");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return InvalidRequest(where + ".role: unsupported role \"" + role + "\"");
    ChatMessage msg{role, "", {}, {}, {}};
    if (m.contains("content"))
      if (auto e = ContentText(m["content"], sm, where + ".content", &msg.content)) return e;
    if (role == "tool")
      if (auto e = OptString(m, "tool_call_id", where, &msg.tool_call_id)) return e;
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() && !m["tool_calls"].is_array())
      return InvalidRequest(where + ".tool_calls: expected an array, got " + JsonTypeName(m["tool_calls"]));
    if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        const Json& tc = m["tool_calls"][k];
        const std::string w = where + ".tool_calls[" + std::to_string(k) + "]";
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          return InvalidRequest(w + ".function: field required");
        const Json& fn = tc["function"];
        ChatToolCall call;
        if (auto e = OptString(tc, "id", w, &call.id)) return e;
        if (!fn.contains("name") || !fn["name"].is_string())
          return InvalidRequest(w + ".function.name: field required");
        call.name = fn["name"].get<std::string>();
        if (fn.contains("arguments")) {
          if (fn["arguments"].is_string()) {
            call.arguments = Json::parse(fn["arguments"].get<std::string>(), nullptr, false);
            if (call.arguments.is_discarded() || !call.arguments.is_object())
              return InvalidRequest(w + ".function.arguments: expected a JSON object encoded as a string");
          } else if (fn["arguments"].is_object()) {
            call.arguments = fn["arguments"];
          } else if (!fn["arguments"].is_null()) {
            return InvalidRequest(w + ".function.arguments: expected a JSON object encoded as a string");
          }
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    req->messages.push_back(std::move(msg));
  }

  if (auto e = ParseOpenAICommon(body, req, opts)) return e;
  if (auto e = OptBool(body, "logprobs", "", &opts->logprobs)) return e;
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    const Json& t = body["top_logprobs"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > 20)
      return InvalidRequest("top_logprobs: expected an integer between 0 and 20");
    if (!opts->logprobs) return InvalidRequest("top_logprobs: requires logprobs: true");
    req->logprobs = static_cast<int>(t.get<int64_t>());
  }
  if (opts->logprobs) {
    req->logprobs = std::max(req->logprobs, 0);
    if (sm.model != nullptr) opts->tokenizer = &sm.model->tokenizer();  // parse-only callers have no model
  }
  if (auto e = ParseResponseFormat(body, req)) return e;
  std::string reasoning_effort;
  if (auto e = OptString(body, "reasoning_effort", "", &reasoning_effort)) return e;
  // An effort turns a native reasoner's reasoning on (bounded by max_tokens and the context);
  // "none" and no effort leave it off.
  if (!reasoning_effort.empty() && reasoning_effort != "none" && ReasonsNatively(sm)) req->thinking_budget = sm.n_ctx;
  // For templates that take one (gpt-oss's low / medium / high); other values are ignored.
  if (reasoning_effort == "minimal" || reasoning_effort == "none") reasoning_effort = "low";
  if (reasoning_effort == "xhigh") reasoning_effort = "high";
  if (reasoning_effort == "low" || reasoning_effort == "medium" || reasoning_effort == "high")
    req->render.reasoning_effort = reasoning_effort;
  std::vector<ChatTool> tools;
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return InvalidRequest("tools: expected an array");
    if (body["tools"].size() > kLimits.max_tools)
      return InvalidRequest("tools: at most " + std::to_string(kLimits.max_tools) + " tools");
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const Json& t = body["tools"][i];
      const std::string w = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || (t.contains("type") && t["type"] != "function") || !t.contains("function") ||
          !t["function"].is_object())
        return InvalidRequest(w + ": expected {\"type\": \"function\", \"function\": {...}}");
      const Json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string()) return InvalidRequest(w + ".function.name: field required");
      ChatTool tool;
      tool.name = fn["name"].get<std::string>();
      if (auto e = CheckToolName(tool.name, w + ".function.name", kLimits.max_tool_name_bytes)) return e;
      if (auto e = OptString(fn, "description", w + ".function", &tool.description)) return e;
      const Json* parameters = nullptr;
      if (auto e = OptObject(fn, "parameters", w + ".function", &parameters)) return e;
      if (parameters != nullptr) tool.parameters = *parameters;
      if (auto e = OptBool(fn, "strict", w + ".function", &tool.strict)) return e;
      tools.push_back(std::move(tool));
    }
  }
  std::string choice = "auto";
  std::string forced;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      choice = tc.get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        return InvalidRequest("tool_choice: expected \"auto\", \"none\", \"required\" or a function");
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name")) {
      choice = "function";
      forced = tc["function"]["name"].is_string() ? tc["function"]["name"].get<std::string>() : "";
      bool found = false;
      for (const ChatTool& t : tools) found |= t.name == forced;
      if (!found) return InvalidRequest("tool_choice.function.name: no tool named \"" + forced + "\" in tools");
    } else {
      return InvalidRequest("tool_choice: expected \"auto\", \"none\", \"required\" or a function");
    }
  }
  if (choice != "none") {
    req->render.tools = tools;
    req->parse_tool_calls = !tools.empty();
  }
  bool parallel = true;
  if (auto e = OptBool(body, "parallel_tool_calls", "", &parallel)) return e;
  req->single_tool_call = !parallel;
  req->tool_choice = choice == "required"   ? ToolChoice::kAny
                     : choice == "function" ? ToolChoice::kTool
                     : choice == "none"     ? ToolChoice::kNone
                                            : ToolChoice::kAuto;
  req->forced_tool = forced;
  if (req->messages.back().role == "assistant" && req->messages.back().tool_calls.empty())
    req->render.continue_final = true;
  return std::nullopt;
}

OpenAIWriterBase::OpenAIWriterBase(OpenAIOptions opts, const char* id_prefix, int64_t input_tokens)
    : opts_(std::move(opts)),
      id_(opts_.id.empty() ? RandomId(id_prefix) : opts_.id),
      created_(static_cast<int64_t>(std::time(nullptr))),
      input_tokens_(input_tokens) {}

void OpenAIWriterBase::Note(const StreamEvent& ev) {
  lp_pending_.insert(lp_pending_.end(), ev.logprobs.begin(), ev.logprobs.end());
  if (ev.kind == StreamEvent::Kind::kStarted || ev.kind == StreamEvent::Kind::kDone)
    cached_tokens_ = ev.cache_read_tokens;
  if (ev.kind == StreamEvent::Kind::kDone) {
    output_tokens_ = ev.output_tokens;
    finish_ = FinishName(ev.finish);
  }
}

Json OpenAIWriterBase::Usage() const {
  return {{"prompt_tokens", input_tokens_},
          {"completion_tokens", output_tokens_},
          {"total_tokens", input_tokens_ + output_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

std::string OpenAIWriterBase::EndOfChoices(const char* object, int64_t output_tokens) {
  output_tokens_ = output_tokens;
  return StreamEnd(object);
}

std::string OpenAIWriterBase::StreamEnd(const char* object) const {
  std::string out;
  if (opts_.include_usage) {
    const Json u = {{"id", id_},
                    {"object", object},
                    {"created", created_},
                    {"model", opts_.model},
                    {"choices", Json::array()},
                    {"usage", Usage()}};
    out += "data: " + Dump(u) + "\n\n";
  }
  return out + "data: [DONE]\n\n";
}

OpenAIWriter::OpenAIWriter(OpenAIOptions opts, int64_t input_tokens)
    : OpenAIWriterBase(std::move(opts), "chatcmpl-", input_tokens) {}

std::string OpenAIWriter::Chunk(Json delta, const Json& finish) {
  Json c = {{"id", id_},
            {"object", "chat.completion.chunk"},
            {"created", created_},
            {"model", opts_.model},
            {"choices", Json::array({{{"index", opts_.index},
                                      {"delta", std::move(delta)},
                                      {"logprobs", TakeLogprobs()},
                                      {"finish_reason", finish}}})}};
  return "data: " + Dump(c) + "\n\n";
}

namespace {

Json LogprobEntry(const Tokenizer& tok, TokenId id, float logprob) {
  const std::string piece = tok.TokenToPiece(id, /*render_special=*/true);
  Json bytes = Json::array();
  for (unsigned char b : piece) bytes.push_back(b);
  return {{"token", piece}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

}  // namespace

Json OpenAILogprobContent(const Tokenizer& tok, const std::vector<TokenLogprob>& lps) {
  Json content = Json::array();
  for (const TokenLogprob& lp : lps) {
    Json e = LogprobEntry(tok, lp.id, lp.logprob);
    Json top = Json::array();
    for (const auto& [t, l] : lp.top) top.push_back(LogprobEntry(tok, t, l));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return content;
}

Json OpenAIWriter::TakeLogprobs() {
  if (!opts_.logprobs || opts_.tokenizer == nullptr) return nullptr;
  Json content = OpenAILogprobContent(*opts_.tokenizer, lp_pending_);
  for (const Json& e : content) lp_content_.push_back(e);
  lp_pending_.clear();
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

std::string OpenAIWriter::Start() {
  return Chunk({{"role", "assistant"}, {"content", ""}}, nullptr);
}

std::string OpenAIWriter::Event(const StreamEvent& ev) {
  Note(ev);
  switch (ev.kind) {
    case StreamEvent::Kind::kStarted:
      return "";
    case StreamEvent::Kind::kText:
      content_ += ev.text;
      return ev.text.empty() ? "" : Chunk({{"content", ev.text}}, nullptr);
    case StreamEvent::Kind::kReasoning:
      reasoning_ += ev.text;
      return ev.text.empty() ? "" : Chunk({{"reasoning_content", ev.text}}, nullptr);
    case StreamEvent::Kind::kServerTool:  // Anthropic's tool search only
      return "";
    case StreamEvent::Kind::kToolCall: {
      const std::string args = Dump(ev.call.arguments);
      Json tc = {
          {"id", RandomId("call_")}, {"type", "function"}, {"function", {{"name", ev.call.name}, {"arguments", args}}}};
      tool_calls_.push_back(tc);
      Json delta_tc = tc;
      delta_tc["index"] = tool_calls_.size() - 1;
      return Chunk({{"tool_calls", Json::array({delta_tc})}}, nullptr);
    }
    case StreamEvent::Kind::kDone:
      return Chunk(Json::object(), finish_) + (opts_.choice_of_many ? "" : StreamEnd("chat.completion.chunk"));
    case StreamEvent::Kind::kError:
      return "data: " + OpenAIErrorBody(ev.error) + "\n\n";
  }
  return "";
}

Json OpenAIWriter::Completion() {
  TakeLogprobs();  // every token's entry into lp_content_ (a non-streamed response writes no chunk)
  Json msg = {{"role", "assistant"}, {"content", content_.empty() && !tool_calls_.empty() ? Json() : Json(content_)}};
  if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
  if (!tool_calls_.empty()) msg["tool_calls"] = tool_calls_;
  return {{"id", id_},
          {"object", "chat.completion"},
          {"created", created_},
          {"model", opts_.model},
          {"choices",
           Json::array({{{"index", opts_.index},
                         {"message", msg},
                         {"logprobs", opts_.logprobs ? Json{{"content", lp_content_}, {"refusal", nullptr}} : Json()},
                         {"finish_reason", finish_}}})},
          {"usage", Usage()}};
}

std::optional<ApiError> ParseCompletionRequest(const Json& body, const ServedModel& sm, ChatRequest* req,
                                               OpenAIOptions* opts) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  opts->model = sm.id;
  if (auto e = OptString(body, "model", "", &opts->model)) return e;
  req->raw.on = true;
  if (!body.contains("prompt") || body["prompt"].is_null())
    return InvalidRequest("prompt: field required (a string or an array of token ids)");
  const Json* p = &body["prompt"];
  constexpr const char* kPromptShape = "prompt: expected a string, an array of token ids, or one of either in an array";
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    req->raw.text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) return InvalidRequest("prompt: empty");
    for (const Json& x : *p) {
      if (x.is_string() || x.is_array())
        return InvalidRequest("prompt: one prompt per request is supported (send the others as their own requests)");
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        return InvalidRequest(kPromptShape);
      req->raw.ids.push_back(static_cast<TokenId>(x.get<int64_t>()));
    }
  } else {
    return InvalidRequest(kPromptShape);
  }
  if (body.contains("suffix") && !body["suffix"].is_null()) {
    if (!body["suffix"].is_string()) return InvalidRequest("suffix: expected a string");
    req->raw.suffix = body["suffix"].get<std::string>();
  }
  req->max_tokens = 16;  // the API's default
  if (auto e = OptBool(body, "echo", "", &opts->echo)) return e;
  if (auto e = ParseOpenAICommon(body, req, opts)) return e;
  if (body.contains("best_of") && !body["best_of"].is_null() && body["best_of"] != opts->n)
    return InvalidRequest("best_of: only equal to n is supported (every choice generated is returned)");
  // vLLM's extension: the continuation constrained as on the chat endpoint.
  if (auto e = ParseResponseFormat(body, req)) return e;
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    const Json& l = body["logprobs"];
    if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() > 20)
      return InvalidRequest("logprobs: expected an integer between 0 and 20 (alternatives per token)");
    opts->logprobs = true;
    req->logprobs = static_cast<int>(l.get<int64_t>());
    if (opts->echo) {  // the prompt's tokens are scored too (a whole, unstreamed answer)
      if (opts->stream) return InvalidRequest("logprobs with echo: not streamed; send stream: false");
      req->prompt_logprobs = req->logprobs;
    }
    if (sm.model != nullptr) opts->tokenizer = &sm.model->tokenizer();
  }
  return std::nullopt;
}

CompletionWriter::CompletionWriter(OpenAIOptions opts, int64_t input_tokens, std::string echo)
    : OpenAIWriterBase(std::move(opts), "cmpl-", input_tokens),
      text_(std::move(echo)),
      offset_(Utf8Chars(text_)),
      lp_all_(EmptyLegacyLogprobs()) {}

std::string CompletionWriter::Chunk(const std::string& text, const Json& finish) {
  const Json c = {
      {"id", id_},
      {"object", "text_completion"},
      {"created", created_},
      {"model", opts_.model},
      {"choices",
       Json::array(
           {{{"text", text}, {"index", opts_.index}, {"logprobs", TakeLogprobs()}, {"finish_reason", finish}}})}};
  return "data: " + Dump(c) + "\n\n";
}

Json CompletionWriter::TakeLogprobs() {
  if (!opts_.logprobs || opts_.tokenizer == nullptr) return nullptr;
  Json lp = EmptyLegacyLogprobs();
  for (const TokenLogprob& t : lp_pending_) AppendLegacyLogprob(*opts_.tokenizer, t, &offset_, &lp);
  lp_pending_.clear();
  for (const char* k : kLegacyLogprobKeys)
    for (const Json& x : lp[k]) lp_all_[k].push_back(x);
  return lp;
}

void CompletionWriter::AddPromptLogprobs(const std::vector<TokenLogprob>& prompt) {
  if (!opts_.logprobs || opts_.tokenizer == nullptr) return;
  Json lp = EmptyLegacyLogprobs();
  int64_t offset = 0;  // the prompt opens the echoed text
  for (const TokenLogprob& t : prompt) AppendLegacyLogprob(*opts_.tokenizer, t, &offset, &lp);
  for (const char* k : kLegacyLogprobKeys) {
    for (const Json& x : lp_all_[k]) lp[k].push_back(x);
    lp_all_[k] = std::move(lp[k]);
  }
}

std::string CompletionWriter::Start() {
  return text_.empty() ? "" : Chunk(text_, nullptr);
}

std::string CompletionWriter::Event(const StreamEvent& ev) {
  Note(ev);
  switch (ev.kind) {
    case StreamEvent::Kind::kStarted:
      return "";
    case StreamEvent::Kind::kText:
    case StreamEvent::Kind::kReasoning:  // a raw prompt has no reasoning section: text either way
      text_ += ev.text;
      return ev.text.empty() ? "" : Chunk(ev.text, nullptr);
    case StreamEvent::Kind::kToolCall:
    case StreamEvent::Kind::kServerTool:
      return "";  // no tools on this endpoint
    case StreamEvent::Kind::kDone:
      if (!ev.prompt_logprobs.empty()) AddPromptLogprobs(ev.prompt_logprobs);
      return Chunk("", finish_) + (opts_.choice_of_many ? "" : StreamEnd("text_completion"));
    case StreamEvent::Kind::kError:
      return "data: " + OpenAIErrorBody(ev.error) + "\n\n";
  }
  return "";
}

Json CompletionWriter::Completion() {
  TakeLogprobs();
  return {{"id", id_},
          {"object", "text_completion"},
          {"created", created_},
          {"model", opts_.model},
          {"choices", Json::array({{{"text", text_},
                                    {"index", opts_.index},
                                    {"logprobs", opts_.logprobs ? lp_all_ : Json()},
                                    {"finish_reason", finish_}}})},
          {"usage", Usage()}};
}

}  // namespace mr::server
