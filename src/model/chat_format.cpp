#include "model/chat_format.h"

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "base/log.h"
#include "model/gguf.h"
#include "model/jinja.h"

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
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
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
    case nlohmann::ordered_json::value_t::string:
      PyEscape(v.get_ref<const std::string&>(), out);
      break;
    case nlohmann::ordered_json::value_t::boolean:
      *out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      *out += "null";
      break;
    default:
      *out += v.dump();
      break;  // numbers
  }
}

// The rendered prompt under construction: template scaffolding (may spell control tokens) and
// content (message text, tool definitions, calls and results: tokenized as text).
class Prompt {
 public:
  Prompt& Lit(std::string_view s) {
    text_ += s;
    return *this;
  }
  Prompt& Content(std::string_view s) {
    if (s.empty()) return *this;
    if (!spans_.empty() && spans_.back().end == text_.size()) {
      spans_.back().end += s.size();  // adjacent content: one span
    } else {
      spans_.push_back({text_.size(), text_.size() + s.size()});
    }
    text_ += s;
    return *this;
  }
  bool empty() const { return text_.empty(); }
  RenderedChat Take() { return {std::move(text_), std::move(spans_), {}}; }

 private:
  std::string text_;
  std::vector<TextSpan> spans_;
};

// Qwen2.5's tools section of the system turn.
void ToolsSection(const std::vector<ChatTool>& tools, Prompt* p) {
  p->Lit(
      "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
  for (const ChatTool& t : tools) p->Lit("\n").Content(ToolDefinitionJson(t));
  p->Lit(
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call>");
}

void ToolCall(const ChatToolCall& call, Prompt* p) {
  std::string name;
  PyEscape(call.name, &name);
  p->Lit("<tool_call>\n{\"name\": ").Content(name).Lit(", \"arguments\": ").Content(PyJsonDumps(call.arguments));
  p->Lit("}\n</tool_call>");
}

// The body of an assistant turn: its text, then its tool calls.
void Reasoning(const ChatMessage& m, Prompt* p) {
  const ReasoningMarkup& r = ReasoningMarkupFor(ChatFamily::kChatML);  // one convention for all
  if (!m.reasoning.empty()) p->Lit(r.open).Content(m.reasoning).Lit(r.close);
}

// Reasoning, text, then the calls one per line (as the model writes them after </think>).
void AssistantBody(const ChatMessage& m, Prompt* p) {
  Reasoning(m, p);
  p->Content(m.content);
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    if (!m.content.empty() || i > 0) p->Lit("\n");
    ToolCall(m.tool_calls[i], p);
  }
}

void ToolResponse(const ChatMessage& m, Prompt* p) {
  p->Lit("<tool_response>\n").Content(m.content).Lit("\n</tool_response>");
}

}  // namespace

namespace {

// The parsed chat template of a model file, parsed once per distinct template text; nullptr when
// it does not parse (the error is logged once).
std::shared_ptr<const jinja::Template> ParsedTemplate(const std::string& source) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const jinja::Template>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(source);
  if (it != cache.end()) return it->second;
  Result<jinja::Template> t = jinja::Template::Parse(source);
  std::shared_ptr<const jinja::Template> parsed;
  if (t.ok()) {
    parsed = std::make_shared<const jinja::Template>(std::move(*t));
  } else {
    MR_LOGW("chat", "the model's chat template does not parse (%s): plain text prompts instead",
            t.status().message().c_str());
  }
  cache.emplace(source, parsed);
  return parsed;
}

// The text of special token `key` (tokenizer.ggml.bos_token_id, ...) from the vocabulary.
std::string SpecialTokenText(const gguf::GgufFile& f, const char* key) {
  const std::optional<int64_t> id = f.GetInt(key);
  const std::vector<std::string>* tokens = f.GetStringArray("tokenizer.ggml.tokens");
  if (!id || !tokens || *id < 0 || *id >= static_cast<int64_t>(tokens->size())) return "";
  return (*tokens)[static_cast<size_t>(*id)];
}

// Drops text[0, n) and moves the spans with it.
void EraseFront(RenderedChat* r, size_t n) {
  r->text.erase(0, n);
  std::vector<TextSpan> kept;
  for (const TextSpan& sp : r->literal) {
    if (sp.end <= n) continue;
    kept.push_back({sp.begin > n ? sp.begin - n : 0, sp.end - n});
  }
  r->literal = std::move(kept);
}

// Keeps text[0, n).
void Truncate(RenderedChat* r, size_t n) {
  r->text.resize(n);
  std::vector<TextSpan> kept;
  for (const TextSpan& sp : r->literal) {
    if (sp.begin >= n) break;
    kept.push_back({sp.begin, std::min(sp.end, n)});
  }
  r->literal = std::move(kept);
}

// Harmony's template renders one call per assistant message (tool_calls[0]) and names each
// tool result after the call before it, so an assistant message with parallel calls becomes one
// message per call, each followed by its result (matched by id, else by position): the order
// the model itself works in. messages[0, n) only.
std::vector<ChatMessage> OneCallPerTurn(const std::vector<ChatMessage>& in, size_t n) {
  std::vector<ChatMessage> out;
  size_t i = 0;
  while (i < n) {
    const ChatMessage& m = in[i];
    if (m.role != "assistant" || m.tool_calls.size() <= 1) {
      out.push_back(m);
      ++i;
      continue;
    }
    size_t j = i + 1;  // the results: the tool messages right after
    while (j < n && in[j].role == "tool") ++j;
    std::vector<bool> used(j - i - 1, false);
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      ChatMessage turn;
      if (k == 0) turn = m;  // the text and reasoning stay with the first call
      turn.role = "assistant";
      turn.tool_calls = {m.tool_calls[k]};
      out.push_back(std::move(turn));
      size_t pick = SIZE_MAX;
      for (size_t r = 0; r < used.size() && pick == SIZE_MAX; ++r)
        if (!used[r] && !m.tool_calls[k].id.empty() && in[i + 1 + r].tool_call_id == m.tool_calls[k].id) pick = r;
      if (pick == SIZE_MAX && k < used.size() && !used[k]) pick = k;
      if (pick != SIZE_MAX) {
        used[pick] = true;
        out.push_back(in[i + 1 + pick]);
      }
    }
    for (size_t r = 0; r < used.size(); ++r)
      if (!used[r]) out.push_back(in[i + 1 + r]);
    i = j;
  }
  return out;
}

// The conversation as transformers passes it to a template: OpenAI-style messages (tool calls
// with their arguments as an object, reasoning as reasoning_content), tools as
// {"type": "function", "function": {...}}, bos_token and eos_token. Harmony's template reads the
// reasoning from `thinking` and refuses an assistant message with calls that has both it and
// text: the reasoning is kept (as llama.cpp passes it), and `reasoning_effort`.
// messages[0, n) only.
nlohmann::ordered_json TemplateContext(const gguf::GgufFile& f, const std::vector<ChatMessage>& messages, size_t n,
                                       const ChatRenderOptions& opts, bool add_generation_prompt, bool harmony) {
  using J = nlohmann::ordered_json;
  J msgs = J::array();
  const bool has_system = n > 0 && messages[0].role == "system";
  if (!has_system && !opts.system_suffix.empty())
    msgs.push_back(J{{"role", "system"}, {"content", opts.system_suffix}});
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    J o = J::object();
    o["role"] = m.role;
    o["content"] = i == 0 && has_system ? m.content + opts.system_suffix : m.content;
    if (!m.reasoning.empty()) {
      o[harmony ? "thinking" : "reasoning_content"] = m.reasoning;
      if (harmony && !m.tool_calls.empty()) o.erase("content");
    }
    if (!m.tool_calls.empty()) {
      J calls = J::array();
      for (const ChatToolCall& c : m.tool_calls) {
        calls.push_back(
            J{{"id", c.id}, {"type", "function"}, {"function", J{{"name", c.name}, {"arguments", c.arguments}}}});
      }
      o["tool_calls"] = std::move(calls);
    }
    if (m.role == "tool" && !m.tool_call_id.empty()) o["tool_call_id"] = m.tool_call_id;
    msgs.push_back(std::move(o));
  }
  J ctx = J::object();
  ctx["messages"] = std::move(msgs);
  if (!opts.tools.empty()) {
    J tools = J::array();
    for (const ChatTool& t : opts.tools) {
      J fn = J::object();
      fn["name"] = t.name;
      if (!t.description.empty()) fn["description"] = t.description;
      fn["parameters"] = t.parameters;
      tools.push_back(J{{"type", "function"}, {"function", std::move(fn)}});
    }
    ctx["tools"] = std::move(tools);
  }
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (opts.enable_thinking.has_value()) ctx["enable_thinking"] = *opts.enable_thinking;
  if (harmony) {
    const std::string effort = !opts.reasoning_effort.empty()                               ? opts.reasoning_effort
                               : opts.enable_thinking.has_value() && !*opts.enable_thinking ? "low"
                                                                                            : "";
    if (!effort.empty()) ctx["reasoning_effort"] = effort;
  }
  ctx["bos_token"] = SpecialTokenText(f, "tokenizer.ggml.bos_token_id");
  ctx["eos_token"] = SpecialTokenText(f, "tokenizer.ggml.eos_token_id");
  return ctx;
}

RenderedChat RenderTemplate(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages,
                            const ChatRenderOptions& opts) {
  const bool harmony = family == ChatFamily::kHarmony;
  RenderedChat out;
  const std::shared_ptr<const jinja::Template> t = ParsedTemplate(f.GetString("tokenizer.chat_template").value_or(""));
  if (!t) {
    out.error = "the model's chat template does not parse";
    return out;
  }
  // Continuing a final assistant message: render without a generation prompt and cut the text
  // right after that message's content (what transformers' continue_final_message does).
  const bool open_last = opts.continue_final && !messages.empty() && messages.back().role == "assistant" &&
                         !messages.back().content.empty();
  size_t n = messages.size();  // an empty final assistant message to continue: a generation prompt
  if (opts.continue_final && !open_last && n > 0 && messages[n - 1].role == "assistant") --n;
  const bool generation_prompt = opts.add_generation_prompt && !open_last;
  const std::vector<ChatMessage> split = harmony ? OneCallPerTurn(messages, n) : std::vector<ChatMessage>{};
  Result<jinja::Output> r = t->Render(
      TemplateContext(f, harmony ? split : messages, harmony ? split.size() : n, opts, generation_prompt, harmony),
      jinja::Options{});
  if (!r.ok()) {
    out.error = r.status().message();
    return out;
  }
  out.text = std::move(r->text);
  out.literal = std::move(r->data);
  // The template ends a final answer with <|return|> (the end of generation it trains); in a
  // prompt that goes on, a message ends with <|end|> (llama.cpp does the same).
  const std::string kReturn = "<|return|>";
  if (harmony && !generation_prompt && out.text.size() >= kReturn.size() &&
      out.text.compare(out.text.size() - kReturn.size(), kReturn.size(), kReturn) == 0) {
    Truncate(&out, out.text.size() - kReturn.size());
    out.text += Harmony().end;
  }
  if (open_last) {
    const size_t at = out.text.rfind(messages.back().content);
    if (at == std::string::npos) {
      out = RenderedChat{};
      out.error = "the model's chat template does not show the final assistant message to continue";
      return out;
    }
    Truncate(&out, at + messages.back().content.size());
  }
  // The tokenizer adds BOS itself when the model asks for it; the template's own would double it.
  const std::string bos = SpecialTokenText(f, "tokenizer.ggml.bos_token_id");
  if (!bos.empty() && out.text.compare(0, bos.size(), bos) == 0) EraseFront(&out, bos.size());
  out.text += opts.assistant_prefix;
  return out;
}

}  // namespace

ChatFamily DetectChatFamily(const gguf::GgufFile& f) {
  const std::string tmpl = f.GetString("tokenizer.chat_template").value_or("");
  if (tmpl.find("<|im_start|>") != std::string::npos) return ChatFamily::kChatML;
  if (tmpl.find("<start_of_turn>") != std::string::npos) return ChatFamily::kGemma;
  if (!tmpl.empty() && ParsedTemplate(tmpl)) {
    const HarmonyMarkup& h = Harmony();
    if (tmpl.find(h.channel) != std::string::npos && tmpl.find(h.message) != std::string::npos)
      return ChatFamily::kHarmony;
    return ChatFamily::kTemplate;
  }
  const std::string arch = f.GetString("general.architecture").value_or("");
  if (arch == "gemma2" || arch == "gemma3") return ChatFamily::kGemma;
  if (arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" || arch == "smollm3") return ChatFamily::kChatML;
  return ChatFamily::kNone;
}

const char* ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatML:
      return "chatml";
    case ChatFamily::kGemma:
      return "gemma";
    case ChatFamily::kNone:
      return "none";
    case ChatFamily::kTemplate:
      return "template";
    case ChatFamily::kHarmony:
      return "harmony";
  }
  return "?";
}

std::string PyJsonDumps(const nlohmann::ordered_json& v) {
  std::string out;
  PyDump(v, &out);
  return out;
}

std::string ToolDefinitionJson(const ChatTool& t) {
  nlohmann::ordered_json fn = nlohmann::ordered_json::object();
  fn["name"] = t.name;
  if (!t.description.empty()) fn["description"] = t.description;
  fn["parameters"] = t.parameters;
  nlohmann::ordered_json wrapped = nlohmann::ordered_json::object();
  wrapped["type"] = "function";
  wrapped["function"] = std::move(fn);
  return PyJsonDumps(wrapped);
}

RenderedChat ToolResultTurn(ChatFamily family, const std::string& name, const std::string& result) {
  Prompt p;
  if (family == ChatFamily::kHarmony) {
    // The call's <|call|> was never generated (the server stopped at the end of its arguments);
    // then the result as the template renders a tool message, and the assistant's next message.
    const HarmonyMarkup& h = Harmony();
    p.Lit(h.call + h.start + h.functions).Content(name);
    p.Lit(" " + h.recipient + "assistant" + h.channel + h.commentary + h.message).Content(PyJsonDumps(result));
    p.Lit(h.end + h.start + "assistant");
  } else if (family == ChatFamily::kTemplate) {
    // A template has no piece for "a tool result mid-turn" that could be cut out of it: the
    // result stays inside the assistant turn as a Hermes tool response.
    p.Lit("\n");
    ToolResponse(ChatMessage{"tool", result, {}, {}, {}}, &p);
    p.Lit("\n");
  } else if (family == ChatFamily::kGemma) {
    p.Lit("<end_of_turn>\n<start_of_turn>user\n");
    ToolResponse(ChatMessage{"tool", result, {}, {}, {}}, &p);
    p.Lit("<end_of_turn>\n<start_of_turn>model\n");
  } else {
    p.Lit("<|im_end|>\n<|im_start|>user\n");
    ToolResponse(ChatMessage{"tool", result, {}, {}, {}}, &p);
    p.Lit("<|im_end|>\n<|im_start|>assistant\n");
  }
  return p.Take();
}

const ToolCallMarkup& ToolCallMarkupFor(ChatFamily /*family*/) {
  static const ToolCallMarkup kHermes;
  return kHermes;
}

const ReasoningMarkup& ReasoningMarkupFor(ChatFamily family) {
  static const ReasoningMarkup kThinkTags;
  // Harmony reasons in its analysis channel unasked; a spent budget ends the message and opens
  // the final one.
  static const ReasoningMarkup kAnalysis = [] {
    const HarmonyMarkup& h = Harmony();
    ReasoningMarkup r;
    r.open_tag = r.open = h.channel + h.analysis + h.message;
    r.end = h.end;
    r.close = h.end + h.start + "assistant" + h.channel + h.final_channel + h.message;
    r.instruction.clear();
    r.skip.clear();
    return r;
  }();
  return family == ChatFamily::kHarmony ? kAnalysis : kThinkTags;
}

const HarmonyMarkup& Harmony() {
  static const HarmonyMarkup kMarkup;
  return kMarkup;
}

std::string OpenAssistantTurn(ChatFamily family, const RenderedChat& prompt) {
  if (family != ChatFamily::kHarmony) return "";
  const std::string open = Harmony().start + "assistant";
  // The last opening in the scaffolding (request text may spell one too).
  for (size_t at = prompt.text.rfind(open); at != std::string::npos; at = prompt.text.rfind(open, at - 1)) {
    bool literal = false;
    for (const TextSpan& sp : prompt.literal) literal |= sp.begin < at + open.size() && at < sp.end;
    if (!literal) return prompt.text.substr(at + open.size());
    if (at == 0) break;
  }
  return "";
}

bool HasNativeReasoning(const gguf::GgufFile& f) {
  const std::optional<std::string> t = f.GetString("tokenizer.chat_template");
  return t && t->find("enable_thinking") != std::string::npos;
}

std::string ForcedToolCallPrefix(ChatFamily family, const std::string& name) {
  if (family == ChatFamily::kHarmony) {
    const HarmonyMarkup& h = Harmony();
    std::string s = h.channel + h.commentary + " " + h.recipient + h.functions;
    if (!name.empty()) s += name + " " + h.constrain + "json" + h.message;
    return s;
  }
  const ToolCallMarkup& m = ToolCallMarkupFor(family);
  std::string s = m.open + "\n" + m.name_prefix;
  if (!name.empty()) s += name + m.arguments_prefix;
  return s;
}

std::string RenderToolCall(const ChatToolCall& call) {
  Prompt p;
  ToolCall(call, &p);
  return p.Take().text;
}

std::string RenderChat(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages,
                       const ChatRenderOptions& opts) {
  return RenderChatSpans(family, f, messages, opts).text;
}

RenderedChat RenderChatSpans(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages,
                             const ChatRenderOptions& opts) {
  if (family == ChatFamily::kTemplate || family == ChatFamily::kHarmony)
    return RenderTemplate(family, f, messages, opts);
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  const size_t n = messages.size();
  const bool open_last = opts.continue_final && n > first && messages[n - 1].role == "assistant";
  // The system text: the caller's (content) or the template's default (scaffolding), the
  // server's suffix, then the tool definitions.
  Prompt system;
  if (has_system) {
    system.Content(messages[0].content);
  } else if (family == ChatFamily::kChatML) {
    system.Lit(DefaultSystemPrompt(f.GetString("tokenizer.chat_template").value_or("")));
  }
  system.Lit(opts.system_suffix);
  if (!opts.tools.empty()) ToolsSection(opts.tools, &system);
  RenderedChat sys = system.Take();
  auto put_system = [&sys](Prompt* p) {
    size_t pos = 0;
    for (const TextSpan& sp : sys.literal) {
      p->Lit(std::string_view(sys.text).substr(pos, sp.begin - pos));
      p->Content(std::string_view(sys.text).substr(sp.begin, sp.end - sp.begin));
      pos = sp.end;
    }
    p->Lit(std::string_view(sys.text).substr(pos));
  };

  Prompt out;
  switch (family) {
    case ChatFamily::kChatML: {
      if (!sys.text.empty()) {
        out.Lit("<|im_start|>system\n");
        put_system(&out);
        out.Lit("<|im_end|>\n");
      }
      for (size_t i = first; i < n; ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "tool") {
          if (i == first || messages[i - 1].role != "tool") out.Lit("<|im_start|>user");
          out.Lit("\n");
          ToolResponse(m, &out);
          if (i + 1 == n || messages[i + 1].role != "tool") out.Lit("<|im_end|>\n");
          continue;
        }
        if (m.role == "assistant" && !m.reasoning.empty()) {
          out.Lit("<|im_start|>assistant\n");
          AssistantBody(m, &out);
        } else if (m.role == "assistant" && !m.tool_calls.empty()) {
          out.Lit("<|im_start|>assistant");
          if (!m.content.empty()) out.Lit("\n").Content(m.content);
          for (const ChatToolCall& c : m.tool_calls) {
            out.Lit("\n");
            ToolCall(c, &out);
          }
        } else {
          // The role is one of the four the API layer admits, never free text.
          out.Lit("<|im_start|>" + m.role + "\n").Content(m.content);
        }
        if (open_last && i + 1 == n) break;
        out.Lit("<|im_end|>\n");
      }
      if (!open_last) out.Lit("<|im_start|>assistant\n");
      break;
    }
    case ChatFamily::kGemma: {
      // Gemma has no system role: the template prepends the system text to the first user turn.
      bool pending = !sys.text.empty();
      std::vector<const ChatMessage*> pending_messages;  // later system messages
      auto put_pending = [&](Prompt* p) {
        if (pending) {
          put_system(p);
          p->Lit("\n\n");
        }
        for (const ChatMessage* sm : pending_messages) p->Content(sm->content).Lit("\n\n");
        pending = false;
        pending_messages.clear();
      };
      for (size_t i = first; i < n; ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
          pending_messages.push_back(&m);
          continue;
        }
        const bool tool = m.role == "tool";
        // Consecutive tool results share one user turn.
        if (tool && i > first && messages[i - 1].role == "tool") {
          out.Lit("\n");
          ToolResponse(m, &out);
          if (i + 1 == n || messages[i + 1].role != "tool") out.Lit("<end_of_turn>\n");
          continue;
        }
        out.Lit(m.role == "assistant" ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        put_pending(&out);
        if (tool) {
          ToolResponse(m, &out);
        } else if (m.role == "assistant") {
          AssistantBody(m, &out);
        } else {
          out.Content(m.content);
        }
        if (open_last && i + 1 == n) break;
        if (!tool || i + 1 == n || messages[i + 1].role != "tool") out.Lit("<end_of_turn>\n");
      }
      if (!open_last) out.Lit("<start_of_turn>model\n");
      break;
    }
    case ChatFamily::kTemplate:  // rendered above
    case ChatFamily::kHarmony:
    case ChatFamily::kNone:
      if (!sys.text.empty()) {
        put_system(&out);
        out.Lit("\n");
      }
      for (size_t i = first; i < n; ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "assistant") {
          AssistantBody(m, &out);
        } else if (m.role == "tool") {
          ToolResponse(m, &out);
        } else {
          out.Content(m.content);
        }
        if (!(open_last && i + 1 == n)) out.Lit("\n");
      }
      break;
  }
  out.Lit(opts.assistant_prefix);
  return out.Take();
}

}  // namespace mr
