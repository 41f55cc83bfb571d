// libFuzzer target: generated text (split into chunks at input-chosen points) through the
// streaming output parser (reasoning, tool calls against a schema, stop sequences), then the
// Anthropic and OpenAI writers. Every SSE `data:` line and every final JSON body must be valid
// JSON whatever the model emits. Seeds: tests/fuzz/corpus/output.
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

void CheckSse(const std::string& sse) {
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find('\n', pos);
    const std::string line = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (line == "[DONE]") continue;
    if (Json::parse(line, nullptr, false).is_discarded()) {
      std::fprintf(stderr, "invalid JSON in an SSE line: %s\n", line.c_str());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  using namespace mr::server;
  OutputParser::Options o;
  o.start_in_reasoning = data[0] & 1;
  o.parse_tool_calls = data[0] & 2;
  o.stop_sequences = {"STOP", "\n\n\n"};
  if (data[0] & 4) o.tool_call_prefill = "<tool_call>\n{\"name\": \"";
  mr::ChatTool tool;
  tool.name = "read";
  tool.parameters = Json::parse(R"({"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                                   "required": ["path"]})");
  o.tools = {tool};
  OutputParser parser(o);
  const size_t step = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  ServedModel sm;
  sm.id = "fuzz";
  sm.signing_key = "k";
  AnthropicOptions ao;
  ao.stream = true;
  AnthropicWriter aw(sm, ao, 10);
  OpenAIOptions oo;
  oo.stream = true;
  oo.include_usage = true;
  OpenAIWriter ow(oo, 10);
  CheckSse(aw.Start());
  CheckSse(ow.Start());
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
    }
    events.clear();
  };
  // Whole UTF-8 characters only, as the engine feeds it; invalid bytes pass as they are.
  for (size_t i = 0; i < text.size() && !parser.stopped();) {
    size_t n = std::min(step, text.size() - i);
    while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;  // no split character
    parser.Feed(text.substr(i, n), &events);
    flush();
    i += n;
  }
  parser.Finish(&events);
  flush();
  StreamEvent done;
  done.kind = StreamEvent::Kind::kDone;
  done.finish = parser.stopped() ? FinishReason::kStopSequence : FinishReason::kEndTurn;
  done.stop_sequence = parser.matched_stop_sequence();
  CheckSse(aw.Event(done));
  CheckSse(ow.Event(done));
  (void)aw.Message().dump(-1, ' ', false, Json::error_handler_t::replace);
  return 0;
}
