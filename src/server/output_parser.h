// Splits generated text, as it streams, into reasoning, visible text and tool calls.
//
//   reasoning  — text before "</think>" when the turn starts inside a prompted <think> section
//                (see docs/api.md, "thinking"). Tool-call markup in there is never parsed: it
//                stays literal reasoning text.
//   text       — everything else, with stop sequences cut (generation stops at the first one) and
//                whitespace around tool calls and at the end trimmed.
//   tool calls — `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/Hermes
//                convention, model/chat_format.h ToolCallMarkup), or the same object in one
//                of the markup's other wrappers (a ```json fence, Qwen2.5-Coder's habit, or
//                <tools></tools>, copied from the template), parsed once complete and validated
//                against the tool's input schema; a call that does not parse or validate is
//                passed on as literal text (a fenced block that is no call is text as written).
//                Small models often drop the tags: a bare JSON object
//                `{"name": ..., "arguments": ...}` at the start of the answer (or right after a
//                call) that names a tool and validates is a call too, and so is an array of such
//                objects (Mistral's `[TOOL_CALLS]` body, whose control token is not text; Llama
//                3.x's `parameters` key is read as `arguments`); any other JSON is text.
//
// Harmony (gpt-oss, Options::harmony; model/chat_format.h HarmonyMarkup) has channels instead:
//   reasoning  — the body of an analysis message.
//   text       — the bodies of final messages and of commentary messages to no tool (preambles),
//                stop sequences cut as above. Output without any harmony header is text too.
//   tool calls — a message addressed `to=functions.NAME`: its body is the arguments object,
//                complete when the object closes (the model's <|call|> that follows ends the
//                generation), validated against NAME's schema; a body that does not parse or
//                validate (unterminated, malformed, an unknown tool) is passed on as text. A
//                marker outside the object's strings ends the body (it cannot be JSON).
// Harmony's markers never reach a block: in a body, <|end|> (or the text of <|call|>,
// <|return|>) ends the message, <|start|> or <|channel|> starts the next header (the model
// skipped the end), and <|message|> or <|constrain|> is dropped.
//
// Text that may be the start of a marker ("</think>", "<tool_call>", a stop sequence) is held
// back until it is decided, so nothing has to be taken back from a client. Input must be fed in
// whole UTF-8 characters. Not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/chat_format.h"

namespace mr::server {

struct ParsedEvent {
  enum class Kind { kText, kReasoning, kToolCall };
  Kind kind = Kind::kText;
  std::string text;   // kText, kReasoning
  ChatToolCall call;  // kToolCall (id left empty; the API layer names it)
};

class OutputParser {
 public:
  struct Options {
    bool start_in_reasoning = false;
    // The model may open a reasoning section itself: `reasoning_open` (after whitespace) at the
    // very start of the output starts one (adaptive thinking); anything else is the answer.
    bool may_open_reasoning = false;
    std::string reasoning_open = ReasoningMarkupFor(ChatFamily::kChatML).open_tag;
    bool parse_tool_calls = false;
    std::vector<ChatTool> tools;  // for name and schema validation
    std::vector<std::string> stop_sequences;
    // The start of a forced tool call placed at the end of the prompt (the model continues
    // inside it), e.g. "<tool_call>\n{\"name\": \"". The parser starts inside the call.
    std::string tool_call_prefill;
    ToolCallMarkup markup;
    std::string reasoning_end = ReasoningMarkupFor(ChatFamily::kChatML).end;  // ends the reasoning section
    // OpenAI harmony channels instead of tags (the options above about reasoning and the
    // prefill do not apply), starting after `turn_prefill`: what the prompt's open assistant
    // turn already holds (model/chat_format.h OpenAssistantTurn); only its state counts (stop
    // sequences are looked for in the generated text, as with the other families).
    bool harmony = false;
    std::string turn_prefill;
    // The text exactly as generated: no whitespace dropped at its start or end (/v1/completions,
    // where the output continues the prompt).
    bool verbatim = false;
    // verbatim only, > 0: a line after the first that starts (its first character other than a
    // space or tab, a newline included) with fewer spaces and tabs than this ends the output, that
    // line's indentation left out (llama.cpp's n_indent: a completion stops where its block does).
    int min_indent = 0;
  };

  explicit OutputParser(Options opts);

  void Feed(std::string_view text, std::vector<ParsedEvent>* out);
  // End of generation: flush what was held back (an unterminated tool call is parsed as if closed).
  void Finish(std::vector<ParsedEvent>* out);

  bool in_reasoning() const { return mode_ == Mode::kReasoning; }
  bool stopped() const { return stopped_; }  // a stop sequence matched: generation must stop
  const std::string& matched_stop_sequence() const { return matched_stop_; }
  bool cut_by_indent() const { return indent_cut_; }  // stopped by Options::min_indent
  int tool_calls() const { return tool_calls_; }
  // A tool that becomes callable mid-generation (found by the server's tool search).
  void AddTool(const ChatTool& tool) { opts_.tools.push_back(tool); }

 private:
  // A bare JSON body at the answer's start: one call object, or an array of them; false (and the
  // body stays text) unless every one is a valid call.
  bool ParseBareToolCalls(const std::string& body, std::vector<ChatToolCall>* calls) const;
  // kHarmony*: a message header up to <|message|>, a text body, a call's body (kReasoning: an
  // analysis body).
  enum class Mode {
    kMaybeReasoning,
    kReasoning,
    kContent,
    kToolCall,
    kBareJson,
    kHarmonyHeader,
    kHarmonyText,
    kHarmonyCall
  };
  void Process(std::vector<ParsedEvent>* out, bool final);
  void ProcessHarmony(std::vector<ParsedEvent>* out, bool final);
  // kHarmonyHeader: starts the message whose header is `header`.
  void StartHarmonyMessage(std::string_view header);
  void CompleteHarmonyCall(const std::string& body, std::vector<ParsedEvent>* out);
  // kToolCall: where close_ starts in tool_buf_ outside the body's JSON strings, or npos.
  size_t FindToolCallClose();
  // Advances the JSON string state (json_in_string_, json_escape_) over c: true when c belongs
  // to a string, its quotes included.
  bool JsonStringByte(char c);
  void EmitText(std::string_view s, std::vector<ParsedEvent>* out);
  void EmitReasoning(std::string_view s, std::vector<ParsedEvent>* out);
  void CompleteToolCall(const std::string& body, std::vector<ParsedEvent>* out);

  Options opts_;
  Mode mode_ = Mode::kContent;
  std::string buf_;              // undecided input
  std::string tool_buf_;         // body of the open tool call (or of a bare JSON object)
  std::string open_, close_;     // kToolCall: the markers of the open call (tag or fence)
  size_t tool_close_from_ = 0;   // kToolCall: scanned up to here (json_* hold the state there)
  int json_depth_ = 0;           // kBareJson: brace depth
  bool json_in_string_ = false;  // kBareJson, kToolCall: inside a JSON string (after a backslash)
  bool json_escape_ = false;
  std::string held_ws_;  // trailing whitespace of the text, emitted once more text follows
  // Harmony: the last bytes emitted as text / as reasoning (what a marker may have begun).
  std::string text_tail_, reasoning_tail_;
  bool skip_ws_ = true;  // drop whitespace at the start of text
  bool stopped_ = false;
  std::string matched_stop_;
  // Options::min_indent: at the start of a line (after a newline), its indentation so far.
  bool line_head_ = false;
  std::string indent_;
  bool indent_cut_ = false;
  // Options::min_indent: what of `s` is shown (all, or up to a line that ends the output).
  std::string CutAtIndent(std::string_view s);
  int tool_calls_ = 0;
  // kHarmonyCall: the message's whole recipient (`functions.NAME` for a request's tool; any
  // other, `python` or `browser.search`, makes the body text).
  std::string call_name_;
};

// Parses a tool call body `{"name": ..., "arguments": {...}}` and validates it against `tools`.
// Returns false with *why set when it is not a valid call.
bool ParseToolCall(std::string_view body, const std::vector<ChatTool>& tools, ChatToolCall* call, std::string* why);
// The call of tool `name` with `args` (an object), validated against `tools` as ParseToolCall does.
bool ValidateToolCall(const std::string& name, nlohmann::ordered_json args, const std::vector<ChatTool>& tools,
                      ChatToolCall* call, std::string* why);

}  // namespace mr::server
