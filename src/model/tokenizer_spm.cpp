// SentencePiece-style BPE ("llama" tokenizer model, used by gemma3): spaces become U+2581,
// the text is split into UTF-8 characters, and adjacent symbols are merged while their
// concatenation is a vocabulary token, highest score first (leftmost on ties), as llama.cpp's
// llm_tokenizer_spm_session does. Symbols left that are not tokens fall back to byte tokens
// (<0xXX>).
#include <algorithm>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace mr::tokenizer_internal {
namespace {

constexpr std::string_view kSpaceMarker = "\xe2\x96\x81";  // U+2581

class SpmTokenizer final : public TokenizerBase {
 public:
  explicit SpmTokenizer(std::unique_ptr<Vocab> vocab) : TokenizerBase(std::move(vocab)) {
    const Vocab& v = this->vocab();
    static const char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
      TokenId id = v.Find(name);
      if (id == -1) id = v.Find(std::string(1, static_cast<char>(b)));
      byte_tokens_[b] = id;
    }
    BuildPieces();
  }

 protected:
  void EncodeRaw(std::string_view raw, bool after_special, std::vector<TokenId>* out) const override {
    std::string text;
    text.reserve(raw.size() + 8);
    if (vocab().add_space_prefix && after_special) text += kSpaceMarker;
    for (char c : raw) {
      if (c == ' ')
        text += kSpaceMarker;
      else
        text.push_back(c);
    }
    Session(text, out);
  }

  std::string NormalPiece(const std::string& token_text) const override {
    std::string out;
    out.reserve(token_text.size());
    for (size_t i = 0; i < token_text.size();) {
      if (token_text.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) {
        out.push_back(' ');
        i += kSpaceMarker.size();
      } else {
        out.push_back(token_text[i++]);
      }
    }
    return out;
  }

 private:
  struct Symbol {
    int32_t prev, next;
    size_t offset, len;
  };
  struct Bigram {
    float score;
    int32_t left, right;
    size_t size;
  };
  struct BigramOrder {  // priority_queue top = highest score, then leftmost
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  void Session(const std::string& text, std::vector<TokenId>* out) const {
    const Vocab& v = vocab();
    std::vector<Symbol> syms;
    for (size_t off = 0; off < text.size();) {
      const size_t len = std::min(text.size() - off, unicode::Utf8SeqLen(text[off]));
      const int32_t idx = static_cast<int32_t>(syms.size());
      syms.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
      off += len;
    }
    if (syms.empty()) return;
    const std::string_view t(text);

    std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
    // Text of a merged pair -> the pair, for re-segmenting a symbol that is not a token (the
    // last pair queued with that text wins, as in llama.cpp).
    std::unordered_map<std::string_view, std::pair<int32_t, int32_t>> rev_merge;
    auto try_add = [&](int32_t l, int32_t r) {
      if (l == -1 || r == -1) return;
      const std::string_view pair_text = t.substr(syms[l].offset, syms[l].len + syms[r].len);
      const TokenId id = v.Find(pair_text);
      if (id == -1) return;
      queue.push({v.tokens[id].score, l, r, pair_text.size()});
      rev_merge[pair_text] = {l, r};
    };
    for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);

    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = syms[b.left];
      Symbol& r = syms[b.right];
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }

    // Depth-first re-segmentation, iterative (rev_merge chains can be as long as the text).
    // Like llama.cpp it reads the pair's symbols as they are now; the step budget only guards
    // against cycles that malformed UTF-8 could build (then bytes are emitted instead).
    std::vector<int32_t> stack;
    size_t budget = 4 * syms.size() + 16;
    for (int32_t i = 0; i != -1; i = syms[i].next) {
      stack.push_back(i);
      while (!stack.empty()) {
        const Symbol& s = syms[stack.back()];
        stack.pop_back();
        const std::string_view piece = t.substr(s.offset, s.len);
        if (TokenId id = v.Find(piece); id != -1) {
          out->push_back(id);
          continue;
        }
        auto it = rev_merge.find(piece);
        if (it == rev_merge.end() || budget == 0) {
          for (char c : piece) {
            // llama.cpp throws when a byte has no token; an unknown token is the closest
            // non-throwing equivalent (never happens with a complete <0xXX> set).
            const TokenId id = byte_tokens_[static_cast<uint8_t>(c)];
            if (id != -1)
              out->push_back(id);
            else if (v.unk != -1)
              out->push_back(v.unk);
          }
          continue;
        }
        budget -= std::min<size_t>(budget, 2);
        stack.push_back(it->second.second);  // right after left
        stack.push_back(it->second.first);
      }
    }
  }

  TokenId byte_tokens_[256];
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(std::unique_ptr<Vocab> vocab) {
  return std::unique_ptr<Tokenizer>(new SpmTokenizer(std::move(vocab)));
}

}  // namespace mr::tokenizer_internal
