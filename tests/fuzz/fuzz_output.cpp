// libFuzzer target: generated text (split into chunks at input-chosen points) through the
// streaming output parser (reasoning, tool calls against a schema, stop sequences), then the
// Anthropic, OpenAI chat and OpenAI text-completion writers (the last echoing the text's first
// bytes as a prompt), streaming (every SSE `data:` line) and whole (Message(),
// Completion()), ending in a finish reason or an error event chosen by the input. Everything a
// writer emits must be valid JSON whatever the model emits. Seeds: tests/fuzz/corpus/output.
//
// Alongside, a verbatim parser (raw prompts: /v1/completions, /completion, /infill) with
// n_indent = byte 1 % 5 and the same stop sequences must show a prefix of the text, byte for byte.
//
// Input: byte 0 flags, byte 1 chunk size, the rest is the generated text.
//   bit 0 start in reasoning, bit 1 parse tool calls, bit 2 forced tool call prefill,
//   bit 3 thinking display "omitted", bit 4 a kStarted event with cache counts first,
//   bits 5-7 the end: 0 as the parser says (stop sequence or end turn), 1 max tokens,
//   2 tool use, 3 cancelled, 4 an error event (the text's first bytes as its message), 5-7 as 0.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/anthropic_api.h"
#include "server/openai_api.h"
#include "server/output_parser.h"

namespace {

using Json = nlohmann::ordered_json;

// Validity only (Json::accept: the parser without building the document).
void CheckJson(std::string_view text, const char* what) {
  if (!Json::accept(text.begin(), text.end())) {
    std::fprintf(stderr, "invalid JSON in %s: %.*s\n", what, static_cast<int>(text.size()), text.data());
    std::abort();
  }
}

void CheckSse(const std::string& sse) {
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find('\n', pos);
    const std::string_view line = std::string_view(sse).substr(pos + 6, end - pos - 6);
    pos = end;
    if (line == "[DONE]") continue;
    CheckJson(line, "an SSE line");
  }
}

const mr::ChatTool& Tool() {
  static const mr::ChatTool tool = [] {
    mr::ChatTool t;
    t.name = "read";
    t.parameters =
        Json::parse(R"({"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                                   "required": ["path"]})");
    return t;
  }();
  return tool;
}

const mr::server::ServedModel& Served() {
  static const mr::server::ServedModel sm = [] {
    mr::server::ServedModel s;
    s.id = "fuzz";
    s.signing_key = "k";
    return s;
  }();
  return sm;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  using namespace mr::server;
  const uint8_t flags = data[0];
  OutputParser::Options o;
  o.start_in_reasoning = flags & 1;
  o.parse_tool_calls = flags & 2;
  o.stop_sequences = {"STOP", "\n\n\n"};
  if (flags & 4) o.tool_call_prefill = "<tool_call>\n{\"name\": \"";
  o.tools = {Tool()};
  OutputParser parser(o);
  OutputParser::Options vo;
  vo.verbatim = true;
  vo.min_indent = data[1] % 5;
  vo.stop_sequences = o.stop_sequences;
  OutputParser verbatim(vo);
  std::vector<ParsedEvent> verbatim_events;
  const size_t step = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  AnthropicOptions ao;
  ao.stream = true;
  ao.thinking_omitted = flags & 8;
  AnthropicWriter aw(Served(), ao, 10);
  OpenAIOptions oo;
  oo.stream = true;
  oo.include_usage = true;
  OpenAIWriter ow(oo, 10);
  CompletionWriter cw(oo, 10, std::string(text.substr(0, std::min<size_t>(text.size(), data[1] % 4))));
  if (flags & 16) {
    StreamEvent started;
    started.kind = StreamEvent::Kind::kStarted;
    started.input_tokens = 10;
    started.cache_read_tokens = data[1] % 11;
    started.cache_creation_5m_tokens = (10 - started.cache_read_tokens) / 2;
    started.cache_creation_1h_tokens = data[1] & 1;
    CheckSse(aw.Event(started));
    CheckSse(ow.Event(started));
    CheckSse(cw.Event(started));
  }
  CheckSse(aw.Start());
  CheckSse(ow.Start());
  CheckSse(cw.Start());
  std::vector<ParsedEvent> events;
  auto flush = [&] {
    for (ParsedEvent& e : events) {
      StreamEvent ev;
      ev.kind = e.kind == ParsedEvent::Kind::kText        ? StreamEvent::Kind::kText
                : e.kind == ParsedEvent::Kind::kReasoning ? StreamEvent::Kind::kReasoning
                                                          : StreamEvent::Kind::kToolCall;
      ev.text = e.text;
      ev.call = e.call;
      CheckSse(aw.Event(ev));
      CheckSse(ow.Event(ev));
      CheckSse(cw.Event(ev));
    }
    events.clear();
  };
  // Whole UTF-8 characters only, as the engine feeds it; invalid bytes pass as they are.
  for (size_t i = 0; i < text.size() && !parser.stopped();) {
    size_t n = std::min(step, text.size() - i);
    while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;  // no split character
    parser.Feed(text.substr(i, n), &events);
    verbatim.Feed(text.substr(i, n), &verbatim_events);
    flush();
    i += n;
  }
  parser.Finish(&events);
  flush();
  verbatim.Finish(&verbatim_events);
  std::string shown;
  for (const ParsedEvent& e : verbatim_events) shown += e.text;
  if (text.substr(0, shown.size()) != shown) {
    std::fprintf(stderr, "the verbatim parser showed text that was not generated\n");
    std::abort();
  }
  StreamEvent done;
  done.kind = StreamEvent::Kind::kDone;
  done.finish = parser.stopped() ? FinishReason::kStopSequence : FinishReason::kEndTurn;
  done.stop_sequence = parser.matched_stop_sequence();
  done.input_tokens = 10;
  done.output_tokens = static_cast<int64_t>(text.size());
  switch (flags >> 5) {
    case 1:
      done.finish = FinishReason::kMaxTokens;
      break;
    case 2:
      done.finish = FinishReason::kToolUse;
      break;
    case 3:
      done.finish = FinishReason::kCancelled;
      break;
    case 4:
      done.kind = StreamEvent::Kind::kError;
      done.error = {data[1] & 1 ? ApiErrorType::kOverloaded : ApiErrorType::kApi, std::string(text.substr(0, 64))};
      break;
    default:
      break;
  }
  CheckSse(aw.Event(done));
  CheckSse(ow.Event(done));
  CheckSse(cw.Event(done));
  // The non-streaming bodies, serialized as the HTTP layer does.
  const auto replace = Json::error_handler_t::replace;
  CheckJson(aw.Message().dump(-1, ' ', false, replace), "Message()");
  CheckJson(ow.Completion().dump(-1, ' ', false, replace), "Completion()");
  CheckJson(cw.Completion().dump(-1, ' ', false, replace), "CompletionWriter::Completion()");
  return 0;
}
