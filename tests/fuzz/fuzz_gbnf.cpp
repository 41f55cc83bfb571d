// libFuzzer target: a GBNF grammar from a request's `grammar` field (bytes from any web page)
// compiled by runtime/gbnf.h and walked; an input whose first byte is '~' is a regular expression
// (guided_regex) instead, the rest of it the pattern, and '@' a JSON Schema `pattern` (JSON-string
// mode, search semantics). Checks what must hold for any grammar text: compiling
// ends in a grammar or an error (never a crash, a hang or unbounded memory: the nesting, count and
// element bounds); on the compiled grammar, the bytes NextBytes names are exactly the bytes
// Advance takes, along a walk chosen by the input; and the token mask of the shared model's
// vocabulary agrees with the per-token check at the walk's end. Seeds: tests/fuzz/corpus/gbnf.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fuzz_common.h"
#include "runtime/gbnf.h"
#include "runtime/grammar.h"

namespace {

const mr::TokenMasker& Masker() {
  static const mr::TokenMasker m(mr::fuzz::SharedModel().tokenizer(), mr::fuzz::SharedModel().config().n_vocab);
  return m;
}

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_gbnf: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)Masker();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 * 1024) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  mr::GrammarBuilder b;
  mr::Result<mr::GrammarBuilder::Expr> root = !text.empty() && text[0] == '~'   ? mr::RegexExpr(b, text.substr(1))
                                              : !text.empty() && text[0] == '@' ? mr::JsonPatternExpr(b, text.substr(1))
                                                                                : mr::GbnfExpr(b, text);
  if (!root.ok()) {
    if (root.status().message().empty()) Fail("an error without a message");
    return 0;
  }
  const std::shared_ptr<const mr::Grammar> g = b.Build(*root);
  mr::GrammarState s = g->Start();
  uint64_t h = 1469598103934665603ull;  // the walk's choices: FNV-1a of the input
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  for (int step = 0; step < 64 && !s.dead(); ++step) {
    const mr::ByteSet next = s.NextBytes();
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      mr::GrammarState t = s;
      if (t.Advance(static_cast<uint8_t>(c)) != next.test(static_cast<size_t>(c)))
        Fail("NextBytes disagrees with Advance");
      n += next.test(static_cast<size_t>(c)) ? 1 : 0;
    }
    if (n == 0) break;  // complete, or stuck at a class that holds nothing (`root ::= []`)
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    int pick = static_cast<int>((h >> 33) % static_cast<uint64_t>(n));
    for (int c = 0; c < 256; ++c) {
      if (next.test(static_cast<size_t>(c)) && pick-- == 0) {
        s.Advance(static_cast<uint8_t>(c));
        break;
      }
    }
  }
  std::vector<uint8_t> mask;
  Masker().Mask(s, &mask);
  for (mr::TokenId t = 0; t < Masker().n_vocab(); t += 97)
    if ((mask[static_cast<size_t>(t)] != 0) != Masker().Allows(s, t))
      Fail("the trie mask disagrees with the token check");
  return 0;
}
