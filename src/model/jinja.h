// A Jinja template engine for Hugging Face chat templates (tokenizer.chat_template in GGUF files).
//
// It renders the way transformers' apply_chat_template configures python jinja2: an
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls, the globals
// raise_exception(msg) and strftime_now(fmt), and tojson as json.dumps(ensure_ascii=False).
// Output is byte-identical to jinja2 on the templates in tests/fixtures/jinja (checked by
// jinja_test.cpp against scripts/jinja_fixtures.py).
//
// Templates come from model files downloaded from anywhere: anything unsupported is a parse or
// render error with a line number, and Options' limits bound time, memory and recursion.
//
// Provenance: every string taken from the render context (message content, tool definitions, ...)
// is request data, every string written in the template is scaffolding. Values carry a per-byte
// flag through concatenation, filters and methods (a derived byte of unclear origin counts as
// data), and Output::data lists the data bytes of the result so that the caller can tokenize them
// without parsing special tokens: a user message cannot forge a turn with "<|im_end|>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/tokenizer.h"

namespace mr::jinja {

struct Options {
  std::string now_date;                // "YYYY-MM-DD" that strftime_now reports; empty: today (local time)
  size_t max_output_bytes = 16 << 20;  // also bounds every intermediate string and list
  int64_t max_steps = 10'000'000;      // statements, expressions and loop iterations evaluated
  int max_depth = 256;                 // nested macro calls and expression evaluation
};

struct Output {
  std::string text;
  std::vector<TextSpan> data;  // sorted, disjoint, non-empty byte ranges of text that are request data
};

struct Node;

class Template {
 public:
  // Errors (kInvalidArgument) name the line: "[jinja] line 3: unexpected 'endfor'".
  static Result<Template> Parse(std::string_view source);

  // context: the template's variables, e.g. {"messages": [...], "tools": [...], "bos_token": "<s>",
  // "add_generation_prompt": true}. Errors: the template's raise_exception (message kept as is
  // after "[jinja] line N: "), type errors as jinja2 raises them, and exceeded limits.
  // Thread-safe: a parsed Template is immutable.
  Result<Output> Render(const nlohmann::ordered_json& context, const Options& opts = {}) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace mr::jinja
