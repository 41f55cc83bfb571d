#include "server/anthropic_api.h"

#include <algorithm>
#include <set>

#include "server/documents.h"
#include "server/request_fields.h"
#include "server/signing.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& j) {
  return DumpWireJson(j);
}

void AppendPara(std::string* s, const std::string& t) {
  if (!s->empty() && !t.empty()) *s += "\n\n";
  *s += t;
}

// A cache_control breakpoint inside one text being assembled from blocks: the text's length
// right after the marked block.
struct CacheMark {
  size_t len = 0;
  bool one_hour = false;
};

// A block's cache_control ({"type": "ephemeral", "ttl": "5m" | "1h"}, ttl optional). Absent or
// null: *marked = false.
std::optional<ApiError> CacheControl(const Json& b, const std::string& where, bool* marked, bool* one_hour) {
  *marked = false;
  *one_hour = false;
  if (!b.is_object() || !b.contains("cache_control") || b["cache_control"].is_null()) return std::nullopt;
  const Json& cc = b["cache_control"];
  const std::string w = where + ".cache_control";
  if (!cc.is_object() || !cc.contains("type") || cc["type"] != "ephemeral")
    return InvalidRequest(
        w + ": expected {\"type\": \"ephemeral\"} with an optional \"ttl\" of \"5m\" or \"1h\", got " + Dump(cc));
  if (cc.contains("ttl") && !cc["ttl"].is_null()) {
    if (cc["ttl"] != "5m" && cc["ttl"] != "1h")
      return InvalidRequest(w + ".ttl: expected \"5m\" or \"1h\", got " + Dump(cc["ttl"]));
    *one_hour = cc["ttl"] == "1h";
  }
  *marked = true;
  return std::nullopt;
}

// Billing metadata Claude Code sends as its first system block (it changes every request):
// not an instruction, and it would defeat KV reuse between requests.
bool IsBillingHeader(const std::string& text) {
  return text.rfind("x-anthropic-billing-header:", 0) == 0;
}

// A block's "type" when it is an object with a string type, else "".
std::string BlockType(const Json& b) {
  if (!b.is_object()) return "";
  auto it = b.find("type");
  return it != b.end() && it->is_string() ? it->get<std::string>() : "";
}

const RequestLimits kLimits;

std::optional<ApiError> CheckCount(size_t n, size_t max, const std::string& where) {
  if (n <= max) return std::nullopt;
  return InvalidRequest(where + ": at most " + std::to_string(max) + " entries, got " + std::to_string(n));
}

// System prompt blocks (a dropped billing header included), with their cache_control marks.
std::optional<ApiError> SystemText(const Json& sys, const std::string& where, std::string* out,
                                   std::vector<CacheMark>* marks) {
  if (sys.is_string()) {
    *out = sys.get<std::string>();
    return std::nullopt;
  }
  if (!sys.is_array()) return InvalidRequest(where + ": expected a string or an array of text blocks");
  if (auto e = CheckCount(sys.size(), kLimits.max_content_blocks, where)) return e;
  for (size_t i = 0; i < sys.size(); ++i) {
    const Json& b = sys[i];
    const std::string w = where + "[" + std::to_string(i) + "]";
    if (BlockType(b) != "text" || !b.contains("text") || !b["text"].is_string())
      return InvalidRequest(w + ": expected a text block {\"type\": \"text\", \"text\": ...}");
    bool marked = false, one_hour = false;
    if (auto e = CacheControl(b, w, &marked, &one_hour)) return e;
    const std::string& t = b["text"].get_ref<const std::string&>();
    if (!IsBillingHeader(t)) AppendPara(out, t);
    if (marked) marks->push_back({out->size(), one_hour});
  }
  return std::nullopt;
}

ApiError TextOnly(const ServedModel& sm, const std::string& where) {
  return InvalidRequest(where + ": image content is not supported: model '" + sm.id +
                        "' is text-only; remove the image block or describe the image in text");
}

// The names of a list of tool_reference blocks, each a deferred tool (else 400).
std::optional<ApiError> ToolReferences(const Json& refs, const std::string& where, const ToolSearchConfig& search,
                                       std::vector<std::string>* names) {
  if (!refs.is_array()) return InvalidRequest(where + ": expected an array of tool_reference blocks");
  for (size_t k = 0; k < refs.size(); ++k) {
    const Json& r = refs[k];
    const std::string w = where + "[" + std::to_string(k) + "]";
    if (BlockType(r) != "tool_reference" || !r.contains("tool_name") || !r["tool_name"].is_string())
      return InvalidRequest(w + ": expected {\"type\": \"tool_reference\", \"tool_name\": ...}");
    const std::string n = r["tool_name"].get<std::string>();
    if (search.Find(n) == nullptr)
      return InvalidRequest(w + ".tool_name: \"" + n + "\" is not a tool with defer_loading: true in tools");
    names->push_back(n);
  }
  return std::nullopt;
}

// Text of a tool_result's content (a string or text blocks), with its blocks' cache_control marks.
std::optional<ApiError> ToolResultText(const ServedModel& sm, const Json& c, const std::string& where,
                                       const ToolSearchConfig& search, std::string* out, std::vector<CacheMark>* marks,
                                       std::set<std::string>* loaded) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return InvalidRequest(where + ": expected a string or an array of content blocks");
  if (auto e = CheckCount(c.size(), kLimits.max_content_blocks, where)) return e;
  for (size_t k = 0; k < c.size(); ++k) {
    const Json& b = c[k];
    const std::string w = where + "[" + std::to_string(k) + "]";
    const std::string type = BlockType(b);
    bool marked = false, one_hour = false;
    if (auto e = CacheControl(b, w, &marked, &one_hour)) return e;
    if (type == "text" && b.contains("text") && b["text"].is_string()) {
      if (!out->empty()) *out += "\n";
      *out += b["text"].get<std::string>();
      if (marked) marks->push_back({out->size(), one_hour});
    } else if (type == "image") {
      return TextOnly(sm, w);
    } else if (type == "tool_reference") {  // a client-side tool search's result
      std::vector<std::string> names;
      if (auto e = ToolReferences(Json::array({b}), where, search, &names)) return e;
      loaded->insert(names.begin(), names.end());
      if (!out->empty()) *out += "\n";
      *out += ToolReferencesText(search, names);
    } else if (type == "document") {
      Result<std::string> doc = DocumentText(b, w);
      if (!doc.ok()) return InvalidRequest(doc.status().message());
      if (!out->empty()) *out += "\n";
      *out += *doc;
    } else if (type == "search_result") {
      return InvalidRequest(w + ": " + type + " blocks in tool results are not supported; send text blocks");
    } else {
      return InvalidRequest(w + ": unsupported content block type \"" + type + "\" in a tool result");
    }
  }
  return std::nullopt;
}

// tools: custom tools (input_schema) and the tool search server tools; defer_loading tools go
// to the search's catalog instead of the prompt.
std::optional<ApiError> ParseTools(const Json& body, bool has_system, std::vector<ChatTool>* tools,
                                   ToolSearchConfig* search, std::vector<CacheCut>* tool_cuts) {
  if (!body.contains("tools") || body["tools"].is_null()) return std::nullopt;
  const Json& ts = body["tools"];
  if (!ts.is_array()) return InvalidRequest("tools: expected an array");
  if (auto e = CheckCount(ts.size(), kLimits.max_tools, "tools")) return e;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Json& t = ts[i];
    const std::string w = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return InvalidRequest(w + ": expected an object");
    const std::string type = t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : "custom";
    bool marked = false, one_hour = false;
    if (auto e = CacheControl(t, w, &marked, &one_hour)) return e;
    bool deferred = false;
    if (auto e = OptBool(t, "defer_loading", w, &deferred)) return e;
    const bool regex = type == "tool_search_tool_regex_20251119" || type == "tool_search_tool_regex";
    const bool bm25 = type == "tool_search_tool_bm25_20251119" || type == "tool_search_tool_bm25";
    if (regex || bm25) {
      if (search->kind != ToolSearchKind::kNone) return InvalidRequest(w + ": only one tool search tool may be given");
      if (deferred) return InvalidRequest(w + ".defer_loading: the tool search tool itself cannot be deferred");
      search->kind = regex ? ToolSearchKind::kRegex : ToolSearchKind::kBm25;
      search->name = regex ? "tool_search_tool_regex" : "tool_search_tool_bm25";
      if (auto e = OptString(t, "name", w, &search->name)) return e;
      if (auto e = CheckToolName(search->name, w + ".name", kLimits.max_tool_name_bytes)) return e;
      tools->push_back(ChatTool{search->name, "", {}, false});  // the definition is filled in below
      if (marked) tool_cuts->push_back({has_system ? size_t{1} : size_t{0}, std::nullopt, tools->size(), one_hour});
      continue;
    }
    if (type != "custom")
      return InvalidRequest(w + ".type: server tool \"" + type +
                            "\" is not supported by this server; "
                            "define it as a custom tool with an input_schema");
    if (!t.contains("name") || !t["name"].is_string()) return InvalidRequest(w + ".name: field required");
    if (auto e = CheckToolName(t["name"].get<std::string>(), w + ".name", kLimits.max_tool_name_bytes)) return e;
    if (!t.contains("input_schema") || !t["input_schema"].is_object())
      return InvalidRequest(w + ".input_schema: field required (a JSON schema object)");
    ChatTool tool;
    tool.name = t["name"].get<std::string>();
    if (auto e = OptString(t, "description", w, &tool.description)) return e;
    if (auto e = OptBool(t, "strict", w, &tool.strict)) return e;
    tool.parameters = t["input_schema"];
    if (deferred) {  // not shown to the model until a search (or a tool_reference) loads it
      search->deferred.push_back(std::move(tool));
    } else {
      tools->push_back(std::move(tool));
    }
    // The tools follow the system text in the rendered prompt, so a tool's prefix keeps it.
    if (marked) tool_cuts->push_back({has_system ? size_t{1} : size_t{0}, std::nullopt, tools->size(), one_hour});
  }
  for (ChatTool& t : *tools)
    if (search->kind != ToolSearchKind::kNone && t.name == search->name) t = search->AsTool();
  return std::nullopt;
}

// The messages; each content block with cache_control adds a cut (the conversation truncated
// right after that block) to `cuts`.
std::optional<ApiError> ParseMessages(const Json& msgs, const ServedModel& sm, const ToolSearchConfig& search,
                                      std::vector<ChatMessage>* out, std::vector<CacheCut>* cuts,
                                      std::set<std::string>* loaded) {
  if (auto e = CheckCount(msgs.size(), kLimits.max_messages, "messages")) return e;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return InvalidRequest(where + ": expected an object");
    const std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
    if (role != "user" && role != "assistant" && role != "system")
      return InvalidRequest(where + ".role: expected \"user\", \"assistant\" or \"system\", got " +
                            (m.contains("role") ? Dump(m["role"]) : "nothing"));
    if (!m.contains("content")) return InvalidRequest(where + ".content: field required");
    const Json& c = m["content"];
    if (role == "system") {
      ChatMessage sys{"system", "", {}, {}, {}};
      std::vector<CacheMark> marks;
      if (auto e = SystemText(c, where + ".content", &sys.content, &marks)) return e;
      for (const CacheMark& mk : marks) {
        CacheCut cut{out->size(), std::nullopt, SIZE_MAX, mk.one_hour};
        if (mk.len > 0) cut.partial = ChatMessage{"system", sys.content.substr(0, mk.len), {}, {}, {}};
        cuts->push_back(std::move(cut));
      }
      if (!sys.content.empty()) out->push_back(std::move(sys));  // Claude Code sends empty ones
      continue;
    }
    ChatMessage msg{role, "", {}, {}, {}};
    if (c.is_string()) {
      msg.content = c.get<std::string>();
      out->push_back(std::move(msg));
      continue;
    }
    if (!c.is_array()) return InvalidRequest(where + ".content: expected a string or an array of content blocks");
    if (auto e = CheckCount(c.size(), kLimits.max_content_blocks, where + ".content")) return e;
    for (size_t j = 0; j < c.size(); ++j) {
      const Json& b = c[j];
      const std::string w = where + ".content[" + std::to_string(j) + "]";
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
        return InvalidRequest(w + ": expected a content block with a \"type\"");
      const std::string type = b["type"].get<std::string>();
      bool marked = false, one_hour = false;
      if (auto e = CacheControl(b, w, &marked, &one_hour)) return e;
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) return InvalidRequest(w + ".text: field required");
        AppendPara(&msg.content, b["text"].get<std::string>());
      } else if (type == "image") {
        return TextOnly(sm, w);
      } else if (type == "document") {
        Result<std::string> doc = DocumentText(b, w);
        if (!doc.ok()) return InvalidRequest(doc.status().message());
        AppendPara(&msg.content, *doc);
      } else if (type == "tool_result" && role == "user") {
        if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
          return InvalidRequest(w + ".tool_use_id: field required");
        ChatMessage tool{"tool", "", {}, b["tool_use_id"].get<std::string>(), {}};
        std::vector<CacheMark> marks;
        if (b.contains("content"))
          if (auto e = ToolResultText(sm, b["content"], w + ".content", search, &tool.content, &marks, loaded))
            return e;
        const std::string error_prefix = "Error: ";
        bool is_error = false;
        if (auto e = OptBool(b, "is_error", w, &is_error)) return e;
        if (is_error) tool.content = error_prefix + tool.content;
        // Text the user wrote before the results stays before them.
        if (!msg.content.empty()) {
          out->push_back(msg);
          msg.content.clear();
        }
        for (const CacheMark& mk : marks) {
          ChatMessage part = tool;
          part.content.resize(mk.len + (is_error ? error_prefix.size() : 0));
          cuts->push_back({out->size(), std::move(part), SIZE_MAX, mk.one_hour});
        }
        out->push_back(std::move(tool));
      } else if (type == "tool_use" && role == "assistant") {
        ChatToolCall call;
        if (!b.contains("name") || !b["name"].is_string()) return InvalidRequest(w + ".name: field required");
        if (auto e = OptString(b, "id", w, &call.id)) return e;
        call.name = b["name"].get<std::string>();
        if (b.contains("input")) call.arguments = b["input"];
        if (!call.arguments.is_object()) return InvalidRequest(w + ".input: expected an object");
        msg.tool_calls.push_back(std::move(call));
      } else if (type == "thinking" && role == "assistant") {
        const std::string text =
            b.contains("thinking") && b["thinking"].is_string() ? b["thinking"].get<std::string>() : "";
        const std::string sig =
            b.contains("signature") && b["signature"].is_string() ? b["signature"].get<std::string>() : "";
        if (!VerifyThinking(sm.signing_key, sm.id, text, sig))
          return InvalidRequest(w +
                                ".signature: invalid signature for this thinking block (altered, or signed by "
                                "another server or an earlier run); send it back unchanged or drop it");
        // Kept with the message; PrepareChat replays only the current tool loop's reasoning.
        AppendPara(&msg.reasoning, text);
      } else if (type == "server_tool_use" && role == "assistant") {
        ChatToolCall call;
        if (auto e = OptString(b, "id", w, &call.id)) return e;
        if (!b.contains("name") || !b["name"].is_string() || search.kind == ToolSearchKind::kNone ||
            b["name"] != search.name)
          return InvalidRequest(w + ".name: a server_tool_use must name the tool search tool given in tools");
        call.name = search.name;
        if (b.contains("input")) call.arguments = b["input"];
        if (!call.arguments.is_object()) return InvalidRequest(w + ".input: expected an object");
        msg.tool_calls.push_back(std::move(call));
      } else if (type == "tool_search_tool_result" && role == "assistant") {
        // The search's result: the tool's response turn, then the assistant's turn goes on.
        ChatMessage tool{"tool", "", {}, "", {}};
        if (auto e = OptString(b, "tool_use_id", w, &tool.tool_call_id)) return e;
        const Json content = b.contains("content") ? b["content"] : Json();
        if (BlockType(content) == "tool_search_tool_search_result") {
          std::vector<std::string> names;
          if (auto e = ToolReferences(content.contains("tool_references") ? content["tool_references"] : Json(),
                                      w + ".content.tool_references", search, &names))
            return e;
          loaded->insert(names.begin(), names.end());
          tool.content = ToolReferencesText(search, names);
        } else if (BlockType(content) == "tool_search_tool_result_error") {
          ToolSearchOutcome err;
          err.error_code = content.contains("error_code") && content["error_code"].is_string()
                               ? content["error_code"].get<std::string>()
                               : "unavailable";
          tool.content = ToolSearchErrorText(err);
        } else {
          return InvalidRequest(w + ".content: expected a tool_search_tool_search_result or an error");
        }
        out->push_back(std::move(msg));
        msg = ChatMessage{role, "", {}, {}, {}};
        out->push_back(std::move(tool));
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Accepted and dropped: this server never produces one, so there is nothing to decode.
      } else if (type == "search_result" || type == "web_search_tool_result" || type == "container_upload" ||
                 type == "mcp_tool_use" || type == "mcp_tool_result") {
        return InvalidRequest(w + ": content blocks of type \"" + type + "\" are not supported by this server");
      } else {
        return InvalidRequest(w + ": unsupported content block type \"" + type + "\" in a " + role + " message");
      }
      if (marked) {
        CacheCut cut{out->size(), std::nullopt, SIZE_MAX, one_hour};
        if (!msg.content.empty() || !msg.tool_calls.empty()) cut.partial = msg;
        cuts->push_back(std::move(cut));
      }
    }
    if (!msg.content.empty() || !msg.tool_calls.empty() || !msg.reasoning.empty() || out->empty() ||
        out->back().role != "tool")
      out->push_back(std::move(msg));
  }
  return std::nullopt;
}

// Adaptive thinking's reasoning budget per output_config.effort (absent: "high", Anthropic's
// default effort). The model may close its reasoning sooner; the budget is the most it gets.
int64_t EffortBudget(const std::string& effort) {
  if (effort == "low") return 128;
  if (effort == "medium") return 256;
  if (effort == "xhigh") return 2048;
  if (effort == "max") return 4096;
  return 1024;  // "high" or absent
}

// {"type": TYPE, "value": N} with TYPE one of `types`; *out = N.
std::optional<ApiError> TypedCount(const Json& o, const std::string& where, std::initializer_list<const char*> types,
                                   std::string* type, int64_t* out) {
  if (!o.is_object() || !o.contains("type") || !o["type"].is_string())
    return InvalidRequest(where + ": expected an object with a \"type\"");
  *type = o["type"].get<std::string>();
  bool known = false;
  for (const char* t : types) known |= *type == t;
  if (!known) return InvalidRequest(where + ".type: unsupported value \"" + *type + "\"");
  if (*type == "all") return std::nullopt;
  if (!o.contains("value") || !o["value"].is_number_integer() || o["value"].get<int64_t>() < 0)
    return InvalidRequest(where + ".value: expected an integer >= 0");
  *out = o["value"].get<int64_t>();
  return std::nullopt;
}

// context_management.edits: clear_tool_uses_20250919 and clear_thinking_20251015.
std::optional<ApiError> ParseContextEdits(const Json& cm, std::vector<ContextEdit>* edits) {
  if (!cm.contains("edits") || cm["edits"].is_null()) return std::nullopt;
  if (!cm["edits"].is_array())
    return InvalidRequest("context_management.edits: expected an array, got " + JsonTypeName(cm["edits"]));
  if (auto e = CheckCount(cm["edits"].size(), 8, "context_management.edits")) return e;
  for (size_t i = 0; i < cm["edits"].size(); ++i) {
    const Json& e = cm["edits"][i];
    const std::string w = "context_management.edits[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("type") || !e["type"].is_string())
      return InvalidRequest(w + ": expected an object with a \"type\"");
    ContextEdit edit;
    const std::string type = e["type"].get<std::string>();
    std::string t;
    if (type == "clear_tool_uses_20250919") {
      edit.kind = ContextEdit::Kind::kClearToolUses;
      if (e.contains("trigger") && !e["trigger"].is_null()) {
        if (auto err = TypedCount(e["trigger"], w + ".trigger", {"input_tokens", "tool_uses"}, &t, &edit.trigger_value))
          return err;
        edit.trigger_on_tool_uses = t == "tool_uses";
      }
      if (e.contains("keep") && !e["keep"].is_null())
        if (auto err = TypedCount(e["keep"], w + ".keep", {"tool_uses"}, &t, &edit.keep)) return err;
      if (e.contains("clear_at_least") && !e["clear_at_least"].is_null())
        if (auto err =
                TypedCount(e["clear_at_least"], w + ".clear_at_least", {"input_tokens"}, &t, &edit.clear_at_least))
          return err;
      if (e.contains("exclude_tools") && !e["exclude_tools"].is_null()) {
        if (!e["exclude_tools"].is_array()) return InvalidRequest(w + ".exclude_tools: expected an array of names");
        for (const Json& n : e["exclude_tools"]) {
          if (!n.is_string()) return InvalidRequest(w + ".exclude_tools: expected an array of names");
          edit.exclude_tools.push_back(n.get<std::string>());
        }
      }
      if (e.contains("clear_tool_inputs") && !e["clear_tool_inputs"].is_null()) {
        const Json& c = e["clear_tool_inputs"];
        if (c.is_boolean()) {
          edit.clear_all_inputs = c.get<bool>();
        } else if (c.is_array()) {
          for (const Json& n : c) {
            if (!n.is_string()) return InvalidRequest(w + ".clear_tool_inputs: expected a boolean or tool names");
            edit.clear_inputs_of.push_back(n.get<std::string>());
          }
        } else {
          return InvalidRequest(w + ".clear_tool_inputs: expected a boolean or tool names");
        }
      }
    } else if (type == "clear_thinking_20251015") {
      edit.kind = ContextEdit::Kind::kClearThinking;
      edit.keep = 1;
      if (e.contains("keep") && !e["keep"].is_null()) {
        if (e["keep"].is_string() && e["keep"] == "all") {
          edit.keep = -1;
        } else {
          if (auto err = TypedCount(e["keep"], w + ".keep", {"thinking_turns", "all"}, &t, &edit.keep)) return err;
          if (t == "all") edit.keep = -1;
        }
      }
    } else {
      return InvalidRequest(w + ".type: expected \"clear_tool_uses_20250919\" or \"clear_thinking_20251015\"");
    }
    edits->push_back(std::move(edit));
  }
  return std::nullopt;
}

// Structured outputs: {"type": "json_schema", "schema": {...}} (decoded under the schema).
std::optional<ApiError> ParseOutputFormat(const Json& f, const std::string& where, ChatRequest* req) {
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    return InvalidRequest(where + ": expected an object with a \"type\"");
  if (f["type"] != "json_schema") return InvalidRequest(where + ".type: expected \"json_schema\"");
  if (!f.contains("schema") || !f["schema"].is_object())
    return InvalidRequest(where + ".schema: field required (a JSON schema object)");
  req->format = OutputFormat::kJsonSchema;
  req->format_schema = f["schema"];
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseAnthropicRequest(const Json& body, const ServedModel& sm, bool count_only,
                                              ChatRequest* req, AnthropicOptions* opts) {
  if (!body.is_object()) return InvalidRequest("the request body must be a JSON object");
  if (!body.contains("model") || !body["model"].is_string()) return InvalidRequest("model: field required (a string)");
  opts->model = body["model"].get<std::string>();

  int64_t max_tokens = -1;
  if (body.contains("max_tokens")) {
    const Json& mt = body["max_tokens"];
    // 0 warms the cache: the prompt is evaluated and cached, the answer has no content.
    if (!mt.is_number_integer() || mt.get<int64_t>() < 0) return InvalidRequest("max_tokens: expected an integer >= 0");
    max_tokens = mt.get<int64_t>();
  } else if (!count_only) {
    return InvalidRequest("max_tokens: field required");
  }
  req->max_tokens = max_tokens;

  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return InvalidRequest("messages: field required (a non-empty array)");

  // cache_control breakpoints, collected per section and joined in Anthropic's order
  // (tools, system, messages).
  std::vector<CacheCut> tool_cuts, system_cuts, message_cuts;
  const bool has_system = body.contains("system") && !body["system"].is_null();
  if (has_system) {
    ChatMessage sys{"system", "", {}, {}, {}};
    std::vector<CacheMark> marks;
    if (auto e = SystemText(body["system"], "system", &sys.content, &marks)) return e;
    for (const CacheMark& mk : marks)
      system_cuts.push_back(
          {0, ChatMessage{"system", sys.content.substr(0, mk.len), {}, {}, {}}, SIZE_MAX, mk.one_hour});
    req->messages.push_back(std::move(sys));
  }
  std::vector<ChatTool> tools;
  if (auto e = ParseTools(body, has_system, &tools, &req->tool_search, &tool_cuts)) return e;
  std::set<std::string> loaded;  // deferred tools loaded by tool_reference blocks in the history
  if (auto e = ParseMessages(body["messages"], sm, req->tool_search, &req->messages, &message_cuts, &loaded)) return e;
  for (const std::string& n : loaded) req->loaded_tools.push_back(*req->tool_search.Find(n));
  if (std::none_of(req->messages.begin(), req->messages.end(), [](const ChatMessage& m) { return m.role != "system"; }))
    return InvalidRequest("messages: at least one user or assistant message with content is required");
  if (req->messages.back().role == "assistant") req->render.continue_final = true;

  if (body.contains("stream")) {
    if (!body["stream"].is_boolean()) return InvalidRequest("stream: expected a boolean");
    opts->stream = body["stream"].get<bool>();
  }
  if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) {
    const Json& s = body["stop_sequences"];
    if (!s.is_array()) return InvalidRequest("stop_sequences: expected an array of strings");
    for (const Json& x : s) {
      if (!x.is_string()) return InvalidRequest("stop_sequences: expected an array of strings");
      req->stop_sequences.push_back(x.get<std::string>());
      if (req->stop_sequences.size() > kLimits.max_stop_sequences) break;  // reported just below
    }
    if (auto e = CheckStopSequences(req->stop_sequences, "stop_sequences", kLimits)) return e;
  }
  if (body.contains("temperature") && !body["temperature"].is_null()) {
    const Json& t = body["temperature"];
    if (!t.is_number() || t.get<double>() < 0.0 || t.get<double>() > 2.0)
      return InvalidRequest("temperature: expected a number between 0 and 2");
    req->temperature = t.get<float>();
  }
  if (body.contains("top_p") && !body["top_p"].is_null()) {
    const Json& t = body["top_p"];
    if (!t.is_number() || t.get<double>() <= 0.0 || t.get<double>() > 1.0)
      return InvalidRequest("top_p: expected a number in (0, 1]");
    req->top_p = t.get<float>();
  }
  if (body.contains("top_k") && !body["top_k"].is_null()) {
    const Json& t = body["top_k"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0) return InvalidRequest("top_k: expected an integer >= 0");
    req->top_k = static_cast<int>(std::min<int64_t>(t.get<int64_t>(), 1 << 30));
  }

  // Tools.
  for (auto* part : {&tool_cuts, &system_cuts, &message_cuts})
    for (CacheCut& c : *part) req->cache_cuts.push_back(std::move(c));
  if (req->cache_cuts.size() > 4)
    return InvalidRequest("A maximum of 4 blocks with cache_control may be provided. Found " +
                          std::to_string(req->cache_cuts.size()) + ".");
  for (size_t i = 1; i < req->cache_cuts.size(); ++i)
    if (req->cache_cuts[i].one_hour && !req->cache_cuts[i - 1].one_hour)
      return InvalidRequest(
          "cache_control: a ttl=\"1h\" breakpoint cannot come after a ttl=\"5m\" one; breakpoints with "
          "the longer ttl must come first (in the order tools, system, messages)");
  std::string choice = "auto";
  std::string forced_name;
  bool single = false;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
      return InvalidRequest("tool_choice: expected an object with a \"type\"");
    choice = tc["type"].get<std::string>();
    if (choice != "auto" && choice != "any" && choice != "tool" && choice != "none")
      return InvalidRequest("tool_choice.type: expected \"auto\", \"any\", \"tool\" or \"none\"");
    if (auto e = OptBool(tc, "disable_parallel_tool_use", "tool_choice", &single)) return e;
    if (choice == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string()) return InvalidRequest("tool_choice.name: field required");
      forced_name = tc["name"].get<std::string>();
      bool found = false;
      for (const ChatTool& t : tools) found |= t.name == forced_name;
      for (const ChatTool& t : req->loaded_tools) found |= t.name == forced_name;
      if (!found) return InvalidRequest("tool_choice.name: no tool named \"" + forced_name + "\" in tools");
    }
    if ((choice == "any" || choice == "tool") && tools.empty())
      return InvalidRequest("tool_choice: \"" + choice + "\" needs at least one tool in tools");
  }
  if (choice != "none") {
    req->render.tools = tools;
    req->parse_tool_calls = !tools.empty();
  }
  req->single_tool_call = single;

  // Reasoning: these models have none of their own; see docs/api.md.
  std::string effort;
  if (body.contains("output_config") && !body["output_config"].is_null()) {
    const Json& oc = body["output_config"];
    if (!oc.is_object()) return InvalidRequest("output_config: expected an object");
    if (oc.contains("format") && !oc["format"].is_null())
      if (auto e = ParseOutputFormat(oc["format"], "output_config.format", req)) return e;
    if (oc.contains("effort") && !oc["effort"].is_null()) {
      effort = oc["effort"].is_string() ? oc["effort"].get<std::string>() : "";
      if (effort != "low" && effort != "medium" && effort != "high" && effort != "xhigh" && effort != "max")
        return InvalidRequest("output_config.effort: expected \"low\", \"medium\", \"high\", \"xhigh\" or \"max\"");
    }
  }
  if (body.contains("output_format") && !body["output_format"].is_null())  // the beta's name for it
    if (auto e = ParseOutputFormat(body["output_format"], "output_format", req)) return e;
  int64_t budget = 0;
  bool adaptive = false;
  if (body.contains("thinking") && !body["thinking"].is_null()) {
    const Json& th = body["thinking"];
    if (!th.is_object() || !th.contains("type") || !th["type"].is_string())
      return InvalidRequest("thinking: expected an object with a \"type\"");
    const std::string type = th["type"].get<std::string>();
    if (type == "enabled") {
      if (!th.contains("budget_tokens") || !th["budget_tokens"].is_number_integer() ||
          th["budget_tokens"].get<int64_t>() < 1)
        return InvalidRequest("thinking.budget_tokens: expected an integer >= 1");
      budget = th["budget_tokens"].get<int64_t>();
      if (max_tokens > 0 && budget >= max_tokens)
        return InvalidRequest("max_tokens must be greater than thinking.budget_tokens");
    } else if (type == "adaptive") {
      adaptive = true;
      // At most half of max_tokens, so an answer has room; too little to reason in: none.
      budget = EffortBudget(effort);
      if (max_tokens > 0) budget = std::min<int64_t>(budget, max_tokens / 2);
      if (budget < 16) budget = 0;
    } else if (type != "disabled") {
      return InvalidRequest("thinking.type: expected \"enabled\", \"adaptive\" or \"disabled\"");
    }
    std::string display;
    if (auto e = OptString(th, "display", "thinking", &display)) return e;
    if (!display.empty() && display != "summarized" && display != "omitted")
      return InvalidRequest("thinking.display: expected \"summarized\" or \"omitted\"");
    opts->thinking_omitted = display == "omitted";
  }
  if (budget > 0 && (choice == "any" || choice == "tool"))
    return InvalidRequest("tool_choice: \"" + choice +
                          "\" cannot be used with thinking; use \"auto\" or disable thinking");
  if (req->render.continue_final) budget = 0;  // a prefilled answer is continued as is
  req->thinking_budget = budget;
  req->thinking_adaptive = adaptive;
  // For templates that take a reasoning effort (gpt-oss's low / medium / high).
  if (!effort.empty()) req->render.reasoning_effort = effort == "low" || effort == "medium" ? effort : "high";

  req->tool_choice = choice == "any"    ? ToolChoice::kAny
                     : choice == "tool" ? ToolChoice::kTool
                     : choice == "none" ? ToolChoice::kNone
                                        : ToolChoice::kAuto;
  req->forced_tool = forced_name;

  // Fields that are accepted and ignored still have to be of their documented type.
  const Json* metadata = nullptr;
  if (auto e = OptObject(body, "metadata", "", &metadata)) return e;
  if (metadata != nullptr) {
    std::string user_id;
    if (auto e = OptString(*metadata, "user_id", "metadata", &user_id)) return e;
  }
  const Json* context_management = nullptr;
  if (auto e = OptObject(body, "context_management", "", &context_management)) return e;
  if (context_management != nullptr) {
    req->context_management = true;
    if (auto e = ParseContextEdits(*context_management, &req->context_edits)) return e;
  }
  std::string service_tier;
  if (auto e = OptString(body, "service_tier", "", &service_tier)) return e;
  if (body.contains("mcp_servers") && body["mcp_servers"].is_array() && !body["mcp_servers"].empty())
    return InvalidRequest("mcp_servers: MCP connectors are not supported by this server; remove the field");
  if (body.contains("container") && !body["container"].is_null())
    return InvalidRequest("container: code-execution containers are not supported by this server; remove the field");
  return std::nullopt;
}

AnthropicWriter::AnthropicWriter(const ServedModel& sm, AnthropicOptions opts, int64_t input_tokens)
    : sm_(sm), opts_(std::move(opts)), id_(RandomId("msg_")), input_tokens_(input_tokens) {}

std::string AnthropicWriter::Sse(const char* event, const Json& data) {
  return std::string("event: ") + event + "\ndata: " + Dump(data) + "\n\n";
}

std::string AnthropicWriter::Ping() {
  return Sse("ping", {{"type", "ping"}});
}

std::string AnthropicWriter::Start() {
  Json msg = Message();
  msg["stop_reason"] = nullptr;
  msg["usage"]["output_tokens"] = 0;
  return Sse("message_start", {{"type", "message_start"}, {"message", std::move(msg)}});
}

std::string AnthropicWriter::OpenBlock(Block b, Json start) {
  std::string out = CloseBlock();
  open_ = b;
  content_.push_back(start);
  return out +
         Sse("content_block_start",
             {{"type", "content_block_start"}, {"index", content_.size() - 1}, {"content_block", std::move(start)}});
}

std::string AnthropicWriter::CloseBlock() {
  if (open_ == Block::kNone) return "";
  std::string out;
  const size_t index = content_.size() - 1;
  if (open_ == Block::kThinking) {
    Json& block = content_.back();
    const std::string sig = SignThinking(sm_.signing_key, sm_.id, block["thinking"].get<std::string>());
    block["signature"] = sig;
    out += Sse("content_block_delta", {{"type", "content_block_delta"},
                                       {"index", index},
                                       {"delta", {{"type", "signature_delta"}, {"signature", sig}}}});
  }
  open_ = Block::kNone;
  return out + Sse("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
}

std::string AnthropicWriter::Event(const StreamEvent& ev) {
  std::string out;
  switch (ev.kind) {
    case StreamEvent::Kind::kStarted:  // counts for message_start (written by Start() after this)
      cache_read_tokens_ = ev.cache_read_tokens;
      cache_creation_5m_tokens_ = ev.cache_creation_5m_tokens;
      cache_creation_1h_tokens_ = ev.cache_creation_1h_tokens;
      break;
    case StreamEvent::Kind::kText: {
      if (ev.text.empty()) break;
      if (open_ != Block::kText) out += OpenBlock(Block::kText, {{"type", "text"}, {"text", ""}});
      content_.back()["text"].get_ref<std::string&>() += ev.text;  // appended in place: linear in the reply
      out += Sse("content_block_delta", {{"type", "content_block_delta"},
                                         {"index", content_.size() - 1},
                                         {"delta", {{"type", "text_delta"}, {"text", ev.text}}}});
      break;
    }
    case StreamEvent::Kind::kReasoning: {
      if (open_ != Block::kThinking)
        out += OpenBlock(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      if (opts_.thinking_omitted || ev.text.empty()) break;
      content_.back()["thinking"].get_ref<std::string&>() += ev.text;
      out += Sse("content_block_delta", {{"type", "content_block_delta"},
                                         {"index", content_.size() - 1},
                                         {"delta", {{"type", "thinking_delta"}, {"thinking", ev.text}}}});
      break;
    }
    case StreamEvent::Kind::kServerTool:
    case StreamEvent::Kind::kToolCall: {
      const bool server = ev.kind == StreamEvent::Kind::kServerTool;
      const std::string id = RandomId(server ? "srvtoolu_" : "toolu_");
      Json start = {{"type", server ? "server_tool_use" : "tool_use"},
                    {"id", id},
                    {"name", ev.call.name},
                    {"input", Json::object()}};
      out += OpenBlock(Block::kToolUse, start);
      content_.back()["input"] = ev.call.arguments;
      out += Sse("content_block_delta",
                 {{"type", "content_block_delta"},
                  {"index", content_.size() - 1},
                  {"delta", {{"type", "input_json_delta"}, {"partial_json", Dump(ev.call.arguments)}}}});
      out += CloseBlock();
      if (server) {  // the search ran on the server: its result block follows at once
        out += OpenBlock(Block::kToolUse,
                         {{"type", "tool_search_tool_result"}, {"tool_use_id", id}, {"content", ev.server_result}});
        out += CloseBlock();
      }
      break;
    }
    case StreamEvent::Kind::kDone: {
      out += CloseBlock();
      output_tokens_ = ev.output_tokens;
      cache_read_tokens_ = ev.cache_read_tokens;
      cache_creation_5m_tokens_ = ev.cache_creation_5m_tokens;
      cache_creation_1h_tokens_ = ev.cache_creation_1h_tokens;
      switch (ev.finish) {
        case FinishReason::kEndTurn:
        case FinishReason::kCancelled:
          stop_reason_ = "end_turn";
          break;
        case FinishReason::kMaxTokens:
          stop_reason_ = "max_tokens";
          break;
        case FinishReason::kStopSequence:
          stop_reason_ = "stop_sequence";
          break;
        case FinishReason::kToolUse:
          stop_reason_ = "tool_use";
          break;
      }
      if (ev.finish == FinishReason::kStopSequence) stop_sequence_ = ev.stop_sequence;
      Json delta = {{"type", "message_delta"},
                    {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence_}}},
                    {"usage", Usage()}};
      if (!opts_.context_management.is_null()) delta["context_management"] = opts_.context_management;
      out += Sse("message_delta", delta);
      out += Sse("message_stop", {{"type", "message_stop"}});
      break;
    }
    case StreamEvent::Kind::kError:
      out += Sse("error", {{"type", "error"},
                           {"error", {{"type", AnthropicErrorName(ev.error.type)}, {"message", ev.error.message}}}});
      break;
  }
  return out;
}

Json AnthropicWriter::Message() const {
  Json msg = {{"id", id_},
              {"type", "message"},
              {"role", "assistant"},
              {"model", opts_.model},
              {"content", content_},
              {"stop_reason", stop_reason_.empty() ? Json() : Json(stop_reason_)},
              {"stop_sequence", stop_sequence_},
              {"usage", Usage()}};
  if (!opts_.context_management.is_null()) msg["context_management"] = opts_.context_management;
  return msg;
}

Json AnthropicWriter::Usage() const {
  const int64_t creation = cache_creation_5m_tokens_ + cache_creation_1h_tokens_;
  return {{"input_tokens", std::max<int64_t>(0, input_tokens_ - cache_read_tokens_ - creation)},
          {"cache_creation_input_tokens", creation},
          {"cache_read_input_tokens", cache_read_tokens_},
          {"cache_creation",
           {{"ephemeral_5m_input_tokens", cache_creation_5m_tokens_},
            {"ephemeral_1h_input_tokens", cache_creation_1h_tokens_}}},
          {"output_tokens", output_tokens_}};
}

}  // namespace mr::server
