#include "model/chat_format.h"

#include <cstdio>

#include "model/gguf.h"

namespace mr {
namespace {

// The default system prompt a ChatML template inserts when the conversation has none.
// Templates spell it inside a string literal as '<|im_start|>system\nYOU ARE ...<|im_end|>',
// with either an escaped or a literal newline.
std::string DefaultSystemPrompt(const std::string& tmpl) {
  for (const std::string marker : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    size_t p = tmpl.find(marker);
    while (p != std::string::npos) {
      const size_t start = p + marker.size();
      const size_t end = tmpl.find("<|im_end|>", start);
      if (end == std::string::npos) break;
      std::string s = tmpl.substr(start, end - start);
      if (!s.empty() && s.find("{{") == std::string::npos && s.find("{%") == std::string::npos &&
          s.find('\'') == std::string::npos) {
        return s;
      }
      p = tmpl.find(marker, end);
    }
  }
  // Qwen2.5's template names its default only in the tools branch as a bare literal.
  const std::string qwen = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  if (tmpl.find(qwen) != std::string::npos) return qwen;
  return "";
}

void PyEscape(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void PyDump(const nlohmann::ordered_json& v, std::string* out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        PyEscape(it.key(), out);
        *out += ": ";
        PyDump(it.value(), out);
      }
      out->push_back('}');
      break;
    }
    case nlohmann::ordered_json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) *out += ", ";
        first = false;
        PyDump(e, out);
      }
      out->push_back(']');
      break;
    }
    case nlohmann::ordered_json::value_t::string: PyEscape(v.get_ref<const std::string&>(), out); break;
    case nlohmann::ordered_json::value_t::boolean: *out += v.get<bool>() ? "true" : "false"; break;
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded: *out += "null"; break;
    default: *out += v.dump(); break;  // numbers
  }
}

// Qwen2.5's tools section of the system turn.
std::string ToolsSection(const std::vector<ChatTool>& tools) {
  std::string s =
      "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ChatTool& t : tools) {
    nlohmann::ordered_json fn = nlohmann::ordered_json::object();
    fn["name"] = t.name;
    if (!t.description.empty()) fn["description"] = t.description;
    fn["parameters"] = t.parameters;
    nlohmann::ordered_json wrapped = nlohmann::ordered_json::object();
    wrapped["type"] = "function";
    wrapped["function"] = std::move(fn);
    s += "\n" + PyJsonDumps(wrapped);
  }
  s += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
       "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
       "<args-json-object>}\n</tool_call>";
  return s;
}

// The body of an assistant turn: its text, then its tool calls.
std::string AssistantBody(const ChatMessage& m) {
  std::string s = m.content;
  for (const ChatToolCall& c : m.tool_calls) {
    if (!s.empty()) s += "\n";
    s += RenderToolCall(c);
  }
  return s;
}

std::string ToolResponse(const ChatMessage& m) { return "<tool_response>\n" + m.content + "\n</tool_response>"; }

}  // namespace

ChatFamily DetectChatFamily(const gguf::GgufFile& f) {
  const std::string tmpl = f.GetString("tokenizer.chat_template").value_or("");
  if (tmpl.find("<|im_start|>") != std::string::npos) return ChatFamily::kChatML;
  if (tmpl.find("<start_of_turn>") != std::string::npos) return ChatFamily::kGemma;
  const std::string arch = f.GetString("general.architecture").value_or("");
  if (arch == "gemma3") return ChatFamily::kGemma;
  if (arch == "qwen2") return ChatFamily::kChatML;
  return ChatFamily::kNone;
}

const char* ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatML: return "chatml";
    case ChatFamily::kGemma: return "gemma";
    case ChatFamily::kNone: return "none";
  }
  return "?";
}

std::string PyJsonDumps(const nlohmann::ordered_json& v) {
  std::string out;
  PyDump(v, &out);
  return out;
}

std::string RenderToolCall(const ChatToolCall& call) {
  std::string s = "<tool_call>\n{\"name\": ";
  PyEscape(call.name, &s);
  s += ", \"arguments\": " + PyJsonDumps(call.arguments) + "}\n</tool_call>";
  return s;
}

std::string RenderChat(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages,
                       const ChatRenderOptions& opts) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  const size_t n = messages.size();
  const bool open_last = opts.continue_final && n > first && messages[n - 1].role == "assistant";
  std::string system;
  if (has_system) {
    system = messages[0].content;
  } else if (family == ChatFamily::kChatML) {
    system = DefaultSystemPrompt(f.GetString("tokenizer.chat_template").value_or(""));
  }
  system += opts.system_suffix;
  if (!opts.tools.empty()) system += ToolsSection(opts.tools);

  std::string out;
  switch (family) {
    case ChatFamily::kChatML: {
      if (!system.empty()) out += "<|im_start|>system\n" + system + "<|im_end|>\n";
      for (size_t i = first; i < n; ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "tool") {
          if (i == first || messages[i - 1].role != "tool") out += "<|im_start|>user";
          out += "\n" + ToolResponse(m);
          if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
          continue;
        }
        if (m.role == "assistant" && !m.tool_calls.empty()) {
          out += "<|im_start|>assistant";
          if (!m.content.empty()) out += "\n" + m.content;
          for (const ChatToolCall& c : m.tool_calls) out += "\n" + RenderToolCall(c);
        } else {
          out += "<|im_start|>" + m.role + "\n" + m.content;
        }
        if (open_last && i + 1 == n) break;
        out += "<|im_end|>\n";
      }
      if (!open_last) out += "<|im_start|>assistant\n";
      break;
    }
    case ChatFamily::kGemma: {
      // Gemma has no system role: the template prepends the system text to the first user turn.
      std::string pending_system = system.empty() ? "" : system + "\n\n";
      for (size_t i = first; i < n; ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
          pending_system += m.content + "\n\n";
          continue;
        }
        std::string body;
        const bool tool = m.role == "tool";
        if (tool) {
          body = ToolResponse(m);
          // Consecutive tool results share one user turn.
          if (i > first && messages[i - 1].role == "tool") {
            out += "\n" + body;
            if (i + 1 == n || messages[i + 1].role != "tool") out += "<end_of_turn>\n";
            continue;
          }
        } else {
          body = m.role == "assistant" ? AssistantBody(m) : m.content;
        }
        const std::string role = m.role == "assistant" ? "model" : "user";
        out += "<start_of_turn>" + role + "\n" + pending_system + body;
        pending_system.clear();
        if (open_last && i + 1 == n) break;
        if (!tool || i + 1 == n || messages[i + 1].role != "tool") out += "<end_of_turn>\n";
      }
      if (!open_last) out += "<start_of_turn>model\n";
      break;
    }
    case ChatFamily::kNone:
      if (!system.empty()) out += system + "\n";
      for (size_t i = first; i < n; ++i) {
        const ChatMessage& m = messages[i];
        out += m.role == "assistant" ? AssistantBody(m) : m.role == "tool" ? ToolResponse(m) : m.content;
        if (!(open_last && i + 1 == n)) out += "\n";
      }
      break;
  }
  out += opts.assistant_prefix;
  return out;
}

}  // namespace mr
