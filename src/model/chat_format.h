// Chat formats per model family, rendering messages to the prompt text the model was trained on.
// Detected from the GGUF chat template (tokenizer.chat_template) and architecture.
//
// ChatML (Qwen2.5, SmolLM2) follows Qwen2.5's template, tools included: the tool list goes into
// the system turn as `{"type": "function", "function": {...}}` lines inside <tools></tools>, the
// model answers with `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, and tool
// results come back as a user turn of <tool_response> blocks. SmolLM2 and Gemma have no tool
// convention of their own; they get the same one (Gemma's system text, tools included, is
// prepended to the first user turn as its template does with system messages). JSON inside the
// prompt is written as Python's json.dumps does (", " and ": " separators, non-ASCII kept), since
// Hugging Face templates render `tojson` that way.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace mr {
namespace gguf {
class GgufFile;
}

// kTemplate: the model's own tokenizer.chat_template rendered by the Jinja engine (model/jinja.h),
// for templates that are neither ChatML nor Gemma (Llama 3, Phi-3, Mistral, ...); ChatML and Gemma
// keep their hand-written formats, which also teach a tool convention to models whose template has
// none (SmolLM2, Gemma 3). kHarmony: OpenAI's harmony format (gpt-oss), rendered by the model's
// own template like kTemplate but with channels instead of tags in the model's output
// (HarmonyMarkup).
enum class ChatFamily { kChatML, kGemma, kNone, kTemplate, kHarmony };

struct ChatToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool
  // assistant: reasoning rendered before the answer as `<think>\nTEXT\n</think>\n\n` (what the
  // model wrote under prompted reasoning); empty: none.
  std::string reasoning;
};

struct ChatTool {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // JSON schema
  bool strict = false;  // the arguments must be decoded under the full schema (Anthropic `strict`)
};

// The tool-call markup of a family (every family here uses the Qwen2.5/Hermes form):
//   OPEN {"name": "NAME", "arguments": ARGS} CLOSE
// with a newline after OPEN and before CLOSE as the model writes them; also recognized (not
// taught): the object inside a ```json fence.
struct ToolCallMarkup {
  std::string open = "<tool_call>";
  std::string close = "</tool_call>";
  std::string name_prefix = "{\"name\": \"";             // before the tool's name
  std::string arguments_prefix = "\", \"arguments\": ";  // between the name and the arguments
  std::string end = "}";                                 // after the arguments
  // Other wrappers small models put the same object in: a fenced JSON block (coder models), and
  // the <tools></tools> tags the Hermes template wraps tool definitions in (Qwen2.5 copies them).
  struct Wrapper {
    std::string open, close;
  };
  std::vector<Wrapper> wrappers = {{"```json\n", "```"}, {"<tools>\n", "</tools>"}};
};
const ToolCallMarkup& ToolCallMarkupFor(ChatFamily family);

// The family's reasoning convention (every family here uses <think>). Most models have no
// reasoning of their own: the server asks for it in the system prompt and opens the section.
// Models that reason natively (HasNativeReasoning: Qwen3) are not told; the server opens the
// section when thinking is on and, when it is off, opens the turn with an empty section (`skip`),
// which is what their template renders for enable_thinking=false.
struct ReasoningMarkup {
  std::string open_tag = "<think>";      // how the model itself opens a section (adaptive thinking)
  std::string open = "<think>\n";        // the assistant turn starts with it when reasoning is prompted
  std::string end = "</think>";          // where the reasoning ends (what the output parser looks for)
  std::string close = "\n</think>\n\n";  // injected when the budget is spent; after replayed reasoning
  std::string instruction =              // appended to the system prompt
      "\n\nBefore you answer, think step by step inside <think></think> tags; then write your answer.";
  std::string skip = "<think>\n\n</think>\n\n";  // native reasoning, thinking off
};
const ReasoningMarkup& ReasoningMarkupFor(ChatFamily family);

// OpenAI harmony (gpt-oss). The model writes a sequence of messages
//   <|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT][ [<|constrain|>]TYPE]<|message|>BODY<|end|>
// (the first one without `<|start|>assistant`, which the prompt ends with; the recipient may
// also follow the role: `<|start|>assistant to=functions.NAME<|channel|>commentary json`).
// Channels: analysis (reasoning), commentary (tool calls, addressed `to=functions.NAME` with
// JSON arguments as the body, and preambles the user may see), final (the answer). Generation
// ends with <|return|> after the answer or <|call|> after a call: end-of-generation tokens, never
// text. <|start|>, <|channel|>, <|message|>, <|constrain|> and <|end|> are user-defined tokens
// that detokenize as their text, so the output parser sees them.
struct HarmonyMarkup {
  std::string start = "<|start|>";
  std::string channel = "<|channel|>";
  std::string message = "<|message|>";
  std::string end = "<|end|>";
  std::string constrain = "<|constrain|>";
  std::string call = "<|call|>";   // ends a call (end of generation; written when a turn is injected)
  std::string ret = "<|return|>";  // ends the answer (end of generation)
  std::string recipient = "to=";
  std::string functions = "functions.";  // the namespace of the request's tools
  std::string analysis = "analysis";
  std::string commentary = "commentary";
  std::string final_channel = "final";
};
const HarmonyMarkup& Harmony();
// The model's template takes `enable_thinking` (Qwen3, SmolLM3): it reasons without being asked.
bool HasNativeReasoning(const gguf::GgufFile& f);

struct ChatRenderOptions {
  std::vector<ChatTool> tools;
  // Appended to the system text (a default system prompt is used when there is none).
  std::string system_suffix;
  // Text placed after the opened assistant turn (a forced tool call's start, a <think> tag).
  std::string assistant_prefix;
  // The last message is an assistant turn to continue (prefill): it is left open and no new
  // turn is started; assistant_prefix then follows its text.
  bool continue_final = false;
  // kTemplate: false renders without opening the assistant turn (the template's
  // add_generation_prompt); the hand-written families always open it.
  bool add_generation_prompt = true;
  // kTemplate: the template's `enable_thinking` (models with native reasoning); unset: not passed.
  std::optional<bool> enable_thinking;
  // kHarmony: the template's `reasoning_effort` ("low", "medium", "high"); empty: "low" when
  // enable_thinking is false (harmony models always reason; this is the least), else the
  // template's default.
  std::string reasoning_effort;
};

ChatFamily DetectChatFamily(const gguf::GgufFile& f);
const char* ChatFamilyName(ChatFamily family);

// Render messages and open the assistant turn (add_generation_prompt). The text is meant to be
// tokenized with parse_special = true; BOS is added by the tokenizer when the model asks for it.
// ChatML models get their template's default system prompt when none is given (SmolLM2, Qwen2.5).
std::string RenderChat(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages,
                       const ChatRenderOptions& opts = {});

// A rendered prompt and the byte spans of its text that came from the request (message text,
// tool definitions, tool calls and results): Tokenizer::EncodeTemplated keeps control tokens
// out of those, so only the template's own scaffolding produces turn markers.
struct RenderedChat {
  std::string text;
  std::vector<TextSpan> literal;  // sorted, disjoint
  // kTemplate: why the model's template refused the conversation (its raise_exception message,
  // or an engine error); text is then empty. Always empty for the hand-written families.
  std::string error;
};
RenderedChat RenderChatSpans(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages,
                             const ChatRenderOptions& opts = {});

// JSON as Python's json.dumps(ensure_ascii=False) writes it (what templates' `tojson` gives).
std::string PyJsonDumps(const nlohmann::ordered_json& v);

// One tool as the tools section lists it: {"type": "function", "function": {name, description,
// parameters}} (Python json.dumps form).
std::string ToolDefinitionJson(const ChatTool& tool);

// The text that follows a completed tool call when a tool's result comes back within the same
// generation (a server-run tool): the assistant turn ends, the result comes as the tool's
// response turn, and the next assistant turn opens (what RenderChat gives for the same history).
// `name`: the called tool (harmony addresses the result from it).
RenderedChat ToolResultTurn(ChatFamily family, const std::string& name, const std::string& result);

// What the assistant turn at the end of a rendered prompt already holds (kHarmony: the text
// after the last `<|start|>assistant`: a forced call's header, an opened analysis message, a
// final message to continue); the output parser starts from there. Empty for the other families.
std::string OpenAssistantTurn(ChatFamily family, const RenderedChat& prompt);

// The assistant-turn prefix that forces a call: the call opened up to the name (`name` empty:
// any tool) or up to the arguments of `name` (kHarmony: a commentary message addressed
// `to=functions.`, or `to=functions.NAME <|constrain|>json<|message|>`).
std::string ForcedToolCallPrefix(ChatFamily family, const std::string& name);

// The text of one tool call in the model's convention, without surrounding newlines:
// <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
std::string RenderToolCall(const ChatToolCall& call);

}  // namespace mr
