// Tokenizers built from GGUF metadata (tokenizer.ggml.*), no external library:
//  - "gpt2": byte-level BPE with the model's pre-tokenizer (tokenizer.ggml.pre: smollm, qwen2, ...)
//  - "llama": SentencePiece-style BPE over scores with byte fallback (gemma3 uses this)
// Token ids must be identical to llama.cpp's for the same GGUF (tests/fixtures/tokenizer/).
//
// Thread-safety: immutable after construction; Encode/Decode may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace mr {
namespace gguf { class GgufFile; }

using TokenId = int32_t;

enum class TokenAttr : uint8_t { kNormal, kControl, kUserDefined, kByte, kUnknown, kUnused };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  static Result<std::unique_ptr<Tokenizer>> FromGguf(const gguf::GgufFile& file);

  // Text -> ids. add_special: prepend BOS (and append EOS) when the model's metadata asks for it
  // (tokenizer.ggml.add_bos_token / add_eos_token), as llama.cpp's llama_tokenize does.
  // parse_special: text that spells a control/user-defined token (e.g. "<|im_start|>") becomes
  // that token; otherwise it is tokenized as plain text.
  virtual std::vector<TokenId> Encode(std::string_view text, bool add_special, bool parse_special) const = 0;

  // Bytes of one token as it appears in output text (byte tokens give their byte; control tokens
  // give "" unless render_special, in which case their text).
  virtual std::string TokenToPiece(TokenId id, bool render_special) const = 0;

  // ids -> text; concatenation of pieces (with SentencePiece's leading-space handling).
  virtual std::string Decode(const std::vector<TokenId>& ids, bool render_special) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual TokenId bos_id() const = 0;  // -1 when none
  virtual TokenId eos_id() const = 0;  // -1 when none
  virtual bool IsEndOfGeneration(TokenId id) const = 0;  // eos, eot, <|im_end|>, <end_of_turn> ...
  virtual TokenAttr attr(TokenId id) const = 0;
  virtual const std::string& text(TokenId id) const = 0;  // raw vocab string
  virtual TokenId Find(std::string_view token_text) const = 0;  // -1 when absent
};

}  // namespace mr
