#include "server/output_constraint.h"

#include <list>
#include <mutex>
#include <unordered_map>

#include "base/log.h"
#include "runtime/gbnf.h"
#include "runtime/json_grammar.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;
using Expr = GrammarBuilder::Expr;

// Compiled grammars by key, least recently used dropped past kCapacity.
class GrammarCache {
 public:
  static GrammarCache& Get() {
    static GrammarCache c;
    return c;
  }
  std::shared_ptr<const Grammar> Find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second.second);
    return it->second.first;
  }
  void Put(const std::string& key, std::shared_ptr<const Grammar> g) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.count(key)) return;
    order_.push_front(key);
    map_[key] = {std::move(g), order_.begin()};
    while (map_.size() > kCapacity) {
      map_.erase(order_.back());
      order_.pop_back();
    }
  }

 private:
  static constexpr size_t kCapacity = 32;
  std::mutex mu_;
  std::list<std::string> order_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const Grammar>, std::list<std::string>::iterator>> map_;
};

// One tool's arguments: its schema; outside the supported subset, an error for a strict or
// forced tool, else any JSON object.
Result<Expr> ToolArgs(GrammarBuilder& b, const ChatTool& t, size_t index, bool forced) {
  Result<Expr> args = JsonSchemaExpr(b, t.parameters, {t.strict});
  if (args.ok()) return args;
  if (t.strict || forced)
    return InvalidArgument("tools[" + std::to_string(index) + "] (\"" + t.name +
                           "\") input_schema: " + args.status().message());
  MR_LOGD("server", "tool \"%s\": %s; its arguments are constrained to any JSON object", t.name.c_str(),
          args.status().message().c_str());
  return JsonAnyObject(b);
}

// One tool's `NAME", "arguments": ARGS}` (what follows the name prefix).
Result<Expr> ToolBody(GrammarBuilder& b, const ToolCallMarkup& m, const ChatTool& t, size_t index, bool forced) {
  Result<Expr> args = ToolArgs(b, t, index, forced);
  if (!args.ok()) return args;
  return b.Seq({b.Literal(t.name + m.arguments_prefix), *args, b.Literal(m.end)});
}

// The calls of `tools` from after the name prefix to the end of the object: one of
// `NAME", "arguments": ARGS}`.
Result<Expr> Calls(GrammarBuilder& b, const ToolCallMarkup& m, const std::vector<ChatTool>& tools, bool forced) {
  std::vector<Expr> options;
  for (size_t i = 0; i < tools.size(); ++i) {
    Result<Expr> e = ToolBody(b, m, tools[i], i, forced);
    if (!e.ok()) return e;
    options.push_back(*e);
  }
  return b.Alt(options);
}

// A whole tagged call: OPEN \n? {"name": "CALL \n? CLOSE.
Expr TaggedCall(GrammarBuilder& b, const ToolCallMarkup& m, const Expr& calls) {
  return b.Seq({b.Literal(m.open), b.Opt(b.Literal("\n")), b.Literal(m.name_prefix), calls, b.Opt(b.Literal("\n")),
                b.Literal(m.close)});
}

// Harmony (model/chat_format.h HarmonyMarkup): what follows a call's recipient
// `to=functions.NAME` up to its body, in either place the model puts the recipient:
// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>` (in_channel) or
// `to=functions.NAME<|channel|>commentary json<|message|>` (after the role).
Expr HarmonyCallHeaderRest(GrammarBuilder& b, bool in_channel) {
  const HarmonyMarkup& h = Harmony();
  const Expr type = b.Opt(b.Seq({b.Opt(b.Literal(" ")), b.Opt(b.Literal(h.constrain)), b.Literal("json")}));
  if (in_channel) return b.Seq({type, b.Literal(h.message)});
  return b.Seq({b.Literal(h.channel + h.commentary), type, b.Literal(h.message)});
}

// Under auto the grammar starts at a recipient in a header (HarmonyAutoTriggers), not at any
// `to=functions.` in prose: `<|channel|>commentary to=functions.`, `<|start|>assistant
// to=functions.`, or `to=functions.` at the start of the turn (the prompt ends with
// `<|start|>assistant`) or right after a call.
TokenConstraint::Options HarmonyAutoTriggers(bool tools, bool structured) {
  const HarmonyMarkup& h = Harmony();
  const std::string to = h.recipient + h.functions;
  TokenConstraint::Options o;
  if (tools) {
    o.triggers = {h.channel + h.commentary + " " + to, h.start + "assistant " + to};
    o.start_triggers = {to};
  }
  if (structured) o.triggers.push_back(h.channel + h.final_channel);
  // Several calls in one generation, as the tagged families: after a server-run tool search
  // the model goes on (its result is injected), and its next call is constrained again. A
  // structured answer stays the end, only end-of-generation may follow it; the same grammar
  // cannot also re-arm, so with structured output a call leaves only end-of-generation too
  // (known limit, docs/api.md: after a search that loads no tool, which would rebuild the
  // constraint, the generation can only end).
  o.repeat = tools && !structured;
  return o;
}

// The structured answer of a request whose format is not text: any JSON object, JSON of the
// schema (strict), or the sentences of its GBNF grammar.
Result<Expr> AnswerExpr(GrammarBuilder& b, const ConstraintRequest& req) {
  if (req.format == OutputFormat::kJsonObject) return JsonAnyObject(b);
  if (ExactTextFormat(req.format)) {
    const bool regex = req.format == OutputFormat::kRegex;
    Result<Expr> g = regex ? RegexExpr(b, req.grammar) : GbnfExpr(b, req.grammar);
    if (!g.ok()) return InvalidArgument((regex ? "regex: " : "grammar: ") + g.status().message());
    return g;
  }
  Result<Expr> e = JsonSchemaExpr(b, req.schema, {/*strict=*/true});
  if (!e.ok()) return InvalidArgument("output format schema: " + e.status().message());
  return e;
}

// Harmony's constraint. A forced call's header is in the prompt (ForcedToolCallPrefix): the
// grammar holds the name (any tool) and the arguments; under auto it starts at a recipient in a
// header (HarmonyAutoTriggers); a structured answer is the body of the final message (the
// analysis before it is free).
Result<Expr> HarmonyGrammar(GrammarBuilder& b, const ConstraintRequest& req, bool tools, bool forced, bool structured) {
  const HarmonyMarkup& h = Harmony();
  if (forced && req.tool_choice == ToolChoice::kTool) {
    for (size_t i = 0; i < req.tools.size(); ++i)
      if (req.tools[i].name == req.forced_tool) return ToolArgs(b, req.tools[i], i, /*forced=*/true);
    return InvalidArgument("tool_choice: no tool named \"" + req.forced_tool + "\"");
  }
  std::vector<Expr> in_channel, after_role;  // NAME HEADER-REST ARGS of each tool
  for (size_t i = 0; tools && i < req.tools.size(); ++i) {
    Result<Expr> args = ToolArgs(b, req.tools[i], i, forced);
    if (!args.ok()) return args;
    const Expr name = b.Literal(req.tools[i].name);
    if (forced) {
      in_channel.push_back(b.Seq({name, b.Literal(" " + h.constrain + "json" + h.message), *args}));
    } else {
      in_channel.push_back(b.Seq({name, HarmonyCallHeaderRest(b, true), *args}));
      after_role.push_back(b.Seq({name, HarmonyCallHeaderRest(b, false), *args}));
    }
  }
  if (forced) return b.Alt(in_channel);
  std::vector<Expr> forms;
  if (!in_channel.empty()) {
    const std::string to = h.recipient + h.functions;
    forms.push_back(b.Seq({b.Literal(h.channel + h.commentary + " " + to), b.Alt(in_channel)}));
    forms.push_back(b.Seq({b.Opt(b.Literal(h.start + "assistant ")), b.Literal(to), b.Alt(after_role)}));
  }
  if (structured) {
    Result<Expr> answer = AnswerExpr(b, req);
    if (!answer.ok()) return answer;
    if (ExactTextFormat(req.format)) {  // the grammar is the whole final message
      forms.push_back(b.Seq({b.Literal(h.channel + h.final_channel + h.message), *answer}));
    } else {
      const Expr ws = b.Repeat(b.Alt({b.Literal(" "), b.Literal("\n")}), 0, 4);
      forms.push_back(b.Seq({b.Literal(h.channel + h.final_channel),
                             b.Opt(b.Seq({b.Opt(b.Literal(" ")), b.Opt(b.Literal(h.constrain)), b.Literal("json")})),
                             b.Literal(h.message), ws, *answer}));
    }
  }
  return b.Alt(forms);
}

std::string CacheKey(const ConstraintRequest& r) {
  Json k = Json::object();
  k["family"] = static_cast<int>(r.family);
  k["choice"] = static_cast<int>(r.tool_choice);
  k["forced"] = r.forced_tool;
  k["format"] = static_cast<int>(r.format);
  k["schema"] = r.schema;
  k["grammar"] = r.grammar;
  k["reasoning"] = r.reasoning;
  Json tools = Json::array();
  for (const ChatTool& t : r.tools) tools.push_back({t.name, t.strict, t.parameters});
  k["tools"] = std::move(tools);
  return k.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

Result<std::shared_ptr<TokenConstraint>> BuildOutputConstraint(const ConstraintRequest& req,
                                                               std::shared_ptr<const TokenMasker> masker) {
  const bool tools = !req.tools.empty() && req.tool_choice != ToolChoice::kNone;
  const bool structured = req.format != OutputFormat::kText;
  if (!tools && !structured) return std::shared_ptr<TokenConstraint>();
  if (tools && ExactTextFormat(req.format))
    return InvalidArgument("grammar: cannot be combined with tools (send one or the other)");
  const ToolCallMarkup& m = ToolCallMarkupFor(req.family);
  TokenConstraint::Options opts;
  const bool forced = tools && (req.tool_choice == ToolChoice::kAny || req.tool_choice == ToolChoice::kTool);
  const bool harmony = req.family == ChatFamily::kHarmony;
  if (harmony) {
    if (!forced) opts = HarmonyAutoTriggers(tools, structured);
  } else if (!forced && !structured) {
    // auto: lazy, for every call the model opens, tagged or in a fence.
    opts.triggers = {m.open};
    for (const ToolCallMarkup::Wrapper& w : m.wrappers) opts.triggers.push_back(w.open + "{");
    opts.start_triggers = {m.name_prefix};  // a bare call object at the start of the answer
    opts.repeat = true;
  } else if (structured && !forced && req.reasoning) {
    opts.triggers = {ReasoningMarkupFor(req.family).end};  // the structured answer follows the reasoning
  }
  const std::string key = CacheKey(req);
  std::shared_ptr<const Grammar> g = GrammarCache::Get().Find(key);
  if (g == nullptr) {
    GrammarBuilder b;
    Expr root;
    if (harmony) {
      Result<Expr> e = HarmonyGrammar(b, req, tools, forced, structured);
      if (!e.ok()) return e.status();
      root = *e;
    } else if (forced && req.tool_choice == ToolChoice::kTool) {
      // The prompt ends with `OPEN\n{"name": "NAME", "arguments": `.
      const ChatTool* tool = nullptr;
      size_t index = 0;
      for (size_t i = 0; i < req.tools.size(); ++i)
        if (req.tools[i].name == req.forced_tool) tool = &req.tools[index = i];
      if (tool == nullptr) return InvalidArgument("tool_choice: no tool named \"" + req.forced_tool + "\"");
      Result<Expr> args = ToolArgs(b, *tool, index, /*forced=*/true);
      if (!args.ok()) return args.status();
      root = b.Seq({*args, b.Literal(m.end), b.Opt(b.Literal("\n")), b.Literal(m.close)});
    } else if (forced) {
      // The prompt ends with `OPEN\n{"name": "`.
      Result<Expr> calls = Calls(b, m, req.tools, /*forced=*/true);
      if (!calls.ok()) return calls.status();
      root = b.Seq({*calls, b.Opt(b.Literal("\n")), b.Literal(m.close)});
    } else {
      std::optional<Expr> tagged;
      if (tools) {
        Result<Expr> calls = Calls(b, m, req.tools, /*forced=*/false);
        if (!calls.ok()) return calls.status();
        tagged = TaggedCall(b, m, *calls);
        if (!structured) {
          // An object in another wrapper: the model may have started it pretty-printed
          // (`{\n  "name": "`); the rest is compact.
          const Expr ws = b.Repeat(b.Alt({b.Literal(" "), b.Literal("\n")}), 0, 8);
          std::vector<Expr> forms = {*tagged};
          for (const ToolCallMarkup::Wrapper& w : m.wrappers)
            forms.push_back(b.Seq({b.Literal(w.open + "{"), ws, b.Literal("\"name\":"), b.Opt(b.Literal(" ")),
                                   b.Literal("\""), *calls, b.Opt(b.Literal("\n")), b.Literal(w.close)}));
          forms.push_back(b.Seq({b.Literal(m.name_prefix), *calls}));  // bare
          root = b.Alt(forms);
        }
      }
      if (structured) {
        Result<Expr> answer = AnswerExpr(b, req);
        if (!answer.ok()) return answer.status();
        // A JSON answer may start after a little whitespace; a grammar says exactly what it allows.
        const Expr ws = b.Repeat(b.Alt({b.Literal(" "), b.Literal("\n")}), 0, 4);
        root = ExactTextFormat(req.format) ? *answer : b.Seq({ws, *answer});
        if (req.reasoning) root = b.Seq({b.Literal(ReasoningMarkupFor(req.family).end), root});
        if (tagged && !req.reasoning) root = b.Alt({root, *tagged});  // or a tool call instead
      }
    }
    g = b.Build(root);
    GrammarCache::Get().Put(key, g);
  }
  return std::make_shared<TokenConstraint>(std::move(g), std::move(masker), std::move(opts));
}

}  // namespace mr::server
