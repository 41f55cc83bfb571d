#include "server/openai_api.h"

#include <ctime>

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::optional<ApiError> ContentText(const Json& c, const ServedModel& sm, const std::string& where, std::string* out) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return InvalidRequest(where + ": expected a string or an array of content parts");
  for (size_t k = 0; k < c.size(); ++k) {
    const Json& p = c[k];
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if (type == "text" && p.contains("text") && p["text"].is_string()) {
      if (!out->empty()) *out += "\n\n";
      *out += p["text"].get<std::string>();
    } else if (type == "image_url" || type == "input_audio" || type == "file") {
      return InvalidRequest(where + "[" + std::to_string(k) + "]: " + type + " content is not supported: model '" + sm.id +
                            "' is text-only; send text parts");
    } else {
      return InvalidRequest(where + "[" + std::to_string(k) + "]: unsupported content part type \"" + type + "\"");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseOpenAIRequest(const Json& body, const ServedModel& sm, ChatRequest* req, OpenAIOptions* opts) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  opts->model = body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : sm.id;
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return InvalidRequest("messages: field required (a non-empty array)");
  const Json& msgs = body["messages"];
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return InvalidRequest(where + ".role: field required");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return InvalidRequest(where + ".role: unsupported role \"" + role + "\"");
    ChatMessage msg{role, "", {}, {}};
    if (m.contains("content"))
      if (auto e = ContentText(m["content"], sm, where + ".content", &msg.content)) return e;
    if (role == "tool") msg.tool_call_id = m.value("tool_call_id", "");
    if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        const Json& tc = m["tool_calls"][k];
        const std::string w = where + ".tool_calls[" + std::to_string(k) + "]";
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          return InvalidRequest(w + ".function: field required");
        const Json& fn = tc["function"];
        ChatToolCall call;
        call.id = tc.value("id", "");
        if (!fn.contains("name") || !fn["name"].is_string()) return InvalidRequest(w + ".function.name: field required");
        call.name = fn["name"].get<std::string>();
        if (fn.contains("arguments")) {
          if (fn["arguments"].is_string()) {
            call.arguments = Json::parse(fn["arguments"].get<std::string>(), nullptr, false);
            if (call.arguments.is_discarded() || !call.arguments.is_object())
              return InvalidRequest(w + ".function.arguments: expected a JSON object encoded as a string");
          } else if (fn["arguments"].is_object()) {
            call.arguments = fn["arguments"];
          }
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    req->messages.push_back(std::move(msg));
  }

  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return InvalidRequest("stream: expected a boolean");
    opts->stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && body["stream_options"].is_object())
    opts->include_usage = body["stream_options"].value("include_usage", false);
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (body.contains(key) && !body[key].is_null()) {
      if (!body[key].is_number_integer() || body[key].get<int64_t>() < 1)
        return InvalidRequest(std::string(key) + ": expected an integer >= 1");
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
  }
  if (body.contains("temperature") && !body["temperature"].is_null()) {
    if (!body["temperature"].is_number() || body["temperature"].get<double>() < 0 || body["temperature"].get<double>() > 2)
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
  if (body.contains("n") && !body["n"].is_null() && body["n"] != 1)
    return InvalidRequest("n: only 1 choice per request is supported");
  if (body.value("logprobs", false)) return InvalidRequest("logprobs: not supported by this server; remove the field");
  if (body.contains("response_format") && body["response_format"].is_object() &&
      body["response_format"].value("type", "text") != "text")
    return InvalidRequest("response_format: only {\"type\": \"text\"} is supported by this server");

  std::vector<ChatTool> tools;
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return InvalidRequest("tools: expected an array");
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const Json& t = body["tools"][i];
      const std::string w = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || t.value("type", "function") != "function" || !t.contains("function") || !t["function"].is_object())
        return InvalidRequest(w + ": expected {\"type\": \"function\", \"function\": {...}}");
      const Json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string()) return InvalidRequest(w + ".function.name: field required");
      ChatTool tool;
      tool.name = fn["name"].get<std::string>();
      if (fn.contains("description") && fn["description"].is_string()) tool.description = fn["description"].get<std::string>();
      if (fn.contains("parameters") && fn["parameters"].is_object()) tool.parameters = fn["parameters"];
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
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() && tc["function"].contains("name")) {
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
  if (body.contains("parallel_tool_calls") && body["parallel_tool_calls"].is_boolean())
    req->single_tool_call = !body["parallel_tool_calls"].get<bool>();
  if (choice == "required" && !tools.empty()) {
    req->tool_call_prefill = "<tool_call>\n{\"name\": \"";
    req->single_tool_call = true;
  } else if (choice == "function") {
    req->tool_call_prefill = "<tool_call>\n{\"name\": \"" + forced + "\", \"arguments\": ";
    req->single_tool_call = true;
  }
  if (req->messages.back().role == "assistant" && req->messages.back().tool_calls.empty())
    req->render.continue_final = true;
  return std::nullopt;
}

OpenAIWriter::OpenAIWriter(OpenAIOptions opts, int64_t input_tokens)
    : opts_(std::move(opts)), id_(RandomId("chatcmpl-")), created_(static_cast<int64_t>(std::time(nullptr))),
      input_tokens_(input_tokens) {}

std::string OpenAIWriter::Chunk(Json delta, const Json& finish) const {
  Json c = {{"id", id_},
            {"object", "chat.completion.chunk"},
            {"created", created_},
            {"model", opts_.model},
            {"choices", Json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
  return "data: " + Dump(c) + "\n\n";
}

std::string OpenAIWriter::Start() { return Chunk({{"role", "assistant"}, {"content", ""}}, nullptr); }

std::string OpenAIWriter::Event(const StreamEvent& ev) {
  switch (ev.kind) {
    case StreamEvent::Kind::kText:
      content_ += ev.text;
      return ev.text.empty() ? "" : Chunk({{"content", ev.text}}, nullptr);
    case StreamEvent::Kind::kReasoning:
      reasoning_ += ev.text;
      return ev.text.empty() ? "" : Chunk({{"reasoning_content", ev.text}}, nullptr);
    case StreamEvent::Kind::kToolCall: {
      const std::string args = Dump(ev.call.arguments);
      Json tc = {{"id", RandomId("call_")}, {"type", "function"}, {"function", {{"name", ev.call.name}, {"arguments", args}}}};
      tool_calls_.push_back(tc);
      Json delta_tc = tc;
      delta_tc["index"] = tool_calls_.size() - 1;
      return Chunk({{"tool_calls", Json::array({delta_tc})}}, nullptr);
    }
    case StreamEvent::Kind::kDone: {
      output_tokens_ = ev.output_tokens;
      cached_tokens_ = ev.cache_read_tokens;
      switch (ev.finish) {
        case FinishReason::kMaxTokens: finish_ = "length"; break;
        case FinishReason::kToolUse: finish_ = "tool_calls"; break;
        default: finish_ = "stop"; break;
      }
      std::string out = Chunk(Json::object(), finish_);
      if (opts_.include_usage) {
        Json u = {{"id", id_},
                  {"object", "chat.completion.chunk"},
                  {"created", created_},
                  {"model", opts_.model},
                  {"choices", Json::array()},
                  {"usage", Usage()}};
        out += "data: " + Dump(u) + "\n\n";
      }
      return out + "data: [DONE]\n\n";
    }
    case StreamEvent::Kind::kError:
      return "data: " + OpenAIErrorBody(ev.error) + "\n\n";
  }
  return "";
}

Json OpenAIWriter::Completion() const {
  Json msg = {{"role", "assistant"}, {"content", content_.empty() && !tool_calls_.empty() ? Json() : Json(content_)}};
  if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
  if (!tool_calls_.empty()) msg["tool_calls"] = tool_calls_;
  return {{"id", id_},
          {"object", "chat.completion"},
          {"created", created_},
          {"model", opts_.model},
          {"choices", Json::array({{{"index", 0}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish_}}})},
          {"usage", Usage()}};
}

Json OpenAIWriter::Usage() const {
  return {{"prompt_tokens", input_tokens_},
          {"completion_tokens", output_tokens_},
          {"total_tokens", input_tokens_ + output_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

}  // namespace mr::server
