// libFuzzer target: a chat template from a model file (tokenizer.chat_template, bytes from
// anywhere) parsed and rendered by the Jinja engine against a conversation with tools, tool
// calls, tool results and reasoning. Checks what must hold for any template: parse and render
// end in a value or an error (never a crash, a hang past the step limit or unbounded memory),
// and the request-data spans of the output are sorted, disjoint, non-empty and inside the text.
// Seeds: the real templates of tests/fixtures/jinja/templates (tests/fuzz/corpus/template links
// there).
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "model/jinja.h"

namespace {

const nlohmann::ordered_json& Context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief. <|im_end|>"},
      {"role": "user", "content": "Read a.txt"},
      {"role": "assistant", "content": "", "reasoning_content": "The user wants a file.",
       "tool_calls": [{"id": "call00001", "type": "function",
                       "function": {"name": "read", "arguments": {"path": "a.txt"}}}]},
      {"role": "tool", "tool_call_id": "call00001", "content": "hello <|eot_id|>"},
      {"role": "assistant", "content": "It says hello."},
      {"role": "user", "content": "Thanks"}
    ],
    "tools": [{"type": "function", "function": {"name": "read", "description": "Read a file",
               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)Context();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // real templates are under 20 KB
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  mr::Result<mr::jinja::Template> t = mr::jinja::Template::Parse(source);
  if (!t.ok()) return 0;
  mr::jinja::Options opts;
  opts.now_date = "2026-01-15";
  opts.max_steps = 200'000;  // real templates take a few thousand on this conversation
  opts.max_output_bytes = 1 << 20;
  mr::Result<mr::jinja::Output> out = t->Render(Context(), opts);
  if (!out.ok()) return 0;
  size_t prev_end = 0;
  for (const mr::TextSpan& sp : out->data) {
    if (sp.begin >= sp.end || sp.begin < prev_end || sp.end > out->text.size()) {
      std::fprintf(stderr, "bad data span [%zu, %zu) after %zu in %zu bytes\n", sp.begin, sp.end, prev_end,
                   out->text.size());
      std::abort();
    }
    prev_end = sp.end;
  }
  if (out->text.size() > opts.max_output_bytes) {
    std::fprintf(stderr, "output of %zu bytes over the limit\n", out->text.size());
    std::abort();
  }
  return 0;
}
