// Byte-level BPE ("gpt2" tokenizer model): pre-tokenize the text into words with the model's
// splitter, map each word's UTF-8 bytes to GPT-2's printable stand-ins, then merge adjacent
// symbols by merge rank (lowest rank first, leftmost first on ties) as llama.cpp's
// llm_tokenizer_bpe_session does.
#include <algorithm>
#include <cstdio>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace mr::tokenizer_internal {
namespace {

class BpeTokenizer final : public TokenizerBase {
 public:
  BpeTokenizer(std::unique_ptr<Vocab> vocab, unicode::PreSplit split, const std::vector<std::string>& merges)
      : TokenizerBase(std::move(vocab)), split_(split) {
    const Vocab& v = this->vocab();
    id_ranks_.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      // Split at the first space after the first byte (a merge's left side may be a space).
      const size_t pos = m.find(' ', 1);
      std::string_view left, right;
      if (pos != std::string::npos) {
        left = std::string_view(m).substr(0, pos);
        right = std::string_view(m).substr(pos + 1);
      }
      const TokenId l = v.Find(left), r = v.Find(right);
      if (l != -1 && r != -1) {
        id_ranks_.emplace(PairKey(l, r), static_cast<int32_t>(i));  // the first duplicate wins
      } else {
        std::string key(left);
        key += '\n';
        key += right;
        text_ranks_.emplace(std::move(key), static_cast<int32_t>(i));
      }
    }
    BuildPieces();
  }

 protected:
  void EncodeRaw(std::string_view text, bool /*after_special*/, std::vector<TokenId>* out) const override {
    const std::vector<uint32_t> cpts = unicode::DecodeUtf8(text);
    const std::vector<size_t> lens = unicode::PreTokenize(split_, cpts);
    size_t start = 0;
    std::string word;
    for (size_t len : lens) {
      word.clear();
      std::string utf8;
      for (size_t i = start; i < start + len; ++i) {
        utf8.clear();
        unicode::AppendUtf8(cpts[i], &utf8);
        for (unsigned char b : utf8) word += unicode::ByteToUnicode(b);
      }
      start += len;
      EncodeWord(word, out);
    }
  }

  std::string NormalPiece(const std::string& token_text) const override {
    // Each code point is a byte's stand-in; anything else is reported inline as llama.cpp does.
    std::string out;
    for (uint32_t cpt : unicode::DecodeUtf8(token_text)) {
      const int b = unicode::UnicodeToByte(cpt);
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
      } else {
        std::string utf8;
        unicode::AppendUtf8(cpt, &utf8);
        out += "[UNK_BYTE_0x";
        char hex[3];
        for (unsigned char c : utf8) {
          std::snprintf(hex, sizeof(hex), "%02x", c);
          out += hex;
        }
        out += token_text + "]";
      }
    }
    return out;
  }

 private:
  struct Symbol {
    int32_t prev, next;
    size_t offset, len;  // bytes of the word
    TokenId id;          // vocabulary id of the symbol's text, -1 when not a token
  };
  struct Bigram {
    int32_t rank;
    int32_t left, right;
    size_t size;  // bytes of left + right when queued
  };
  struct BigramOrder {  // priority_queue top = lowest rank, then leftmost
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  static uint64_t PairKey(TokenId l, TokenId r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }

  int32_t Rank(const Symbol& l, const Symbol& r, std::string_view word) const {
    if (l.id != -1 && r.id != -1) {
      auto it = id_ranks_.find(PairKey(l.id, r.id));
      return it == id_ranks_.end() ? -1 : it->second;
    }
    if (text_ranks_.empty()) return -1;
    std::string key(word.substr(l.offset, l.len));
    key += '\n';
    key += word.substr(r.offset, r.len);
    auto it = text_ranks_.find(key);
    return it == text_ranks_.end() ? -1 : it->second;
  }

  void EncodeWord(const std::string& word, std::vector<TokenId>* out) const {
    const Vocab& v = vocab();
    if (word.empty()) return;
    if (v.ignore_merges) {
      if (TokenId id = v.Find(word); id != -1) {
        out->push_back(id);
        return;
      }
    }
    const std::string_view w(word);
    auto text_of = [&](const Symbol& s) { return w.substr(s.offset, s.len); };
    std::vector<Symbol> syms;
    for (size_t off = 0; off < word.size();) {
      const size_t len = std::min(word.size() - off, unicode::Utf8SeqLen(word[off]));
      const int32_t idx = static_cast<int32_t>(syms.size());
      syms.push_back({idx - 1, off + len == word.size() ? -1 : idx + 1, off, len, v.Find(w.substr(off, len))});
      off += len;
    }

    std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
    auto try_add = [&](int32_t l, int32_t r) {
      if (l == -1 || r == -1) return;
      const int32_t rank = Rank(syms[l], syms[r], w);
      if (rank < 0) return;
      queue.push({rank, l, r, syms[l].len + syms[r].len});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);

    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = syms[b.left];
      Symbol& r = syms[b.right];
      // Stale: one side was merged away or grew since this pair was queued (symbols only
      // grow rightwards from a fixed start, so equal sizes mean equal texts).
      if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.size) continue;
      l.len += r.len;
      l.id = v.Find(text_of(l));
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }

    for (int32_t i = 0; i != -1; i = syms[i].next) {
      const Symbol& s = syms[i];
      if (s.len == 0) continue;
      if (s.id != -1) {
        out->push_back(s.id);
        continue;
      }
      const std::string_view piece = text_of(s);
      // Not in the vocabulary: llama.cpp looks up each byte of the symbol as a one-byte token
      // and drops the ones that are not tokens.
      for (char c : piece) {
        if (TokenId id = v.Find(std::string_view(&c, 1)); id != -1) out->push_back(id);
      }
    }
  }

  unicode::PreSplit split_;
  // Merge rank (position in tokenizer.ggml.merges) by the ids of its two sides; merges whose
  // sides are not both tokens are kept by text ("left\nright"), normally none.
  std::unordered_map<uint64_t, int32_t> id_ranks_;
  StringMap text_ranks_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(std::unique_ptr<Vocab> vocab, const gguf::GgufFile& file) {
  const std::string& pre = vocab->pre;
  unicode::PreSplit split = unicode::PreSplit::kGpt2;
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r") {
    split = unicode::PreSplit::kDigitsGpt2;
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    split = unicode::PreSplit::kQwen2;
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") {
    split = unicode::PreSplit::kLlama3;
  } else if (pre == "gpt-4o") {
    split = unicode::PreSplit::kGpt4o;
  }  // gpt-2, phi-2: kGpt2 (LoadVocab rejected every other value)

  const std::vector<std::string>* merges = file.GetStringArray("tokenizer.ggml.merges");
  if (merges == nullptr) {
    return InvalidArgument("[tokenizer] missing string array 'tokenizer.ggml.merges'");
  }
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(vocab), split, *merges));
}

}  // namespace mr::tokenizer_internal
