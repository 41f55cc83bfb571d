// Shared parts of the tokenizers (tokenizer.cpp, tokenizer_bpe.cpp, tokenizer_spm.cpp): the
// vocabulary as llama.cpp's llama_vocab loads it from GGUF metadata, the special-token
// partition, and the Tokenizer methods common to both algorithms. Not a public API.
//
// Behaviour follows llama.cpp's src/llama-vocab.cpp (the reference for token ids); where this
// code differs on purpose it says so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model/tokenizer.h"

namespace mr::tokenizer_internal {

// Token attribute bits, as llama_token_attr (a token can carry several, e.g. control|unused).
enum AttrBits : uint16_t {
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
  // Whitespace next to the token is dropped when the special-token partition splits text around
  // it: before it (LSTRIP) or after it (RSTRIP). Not in GGUF files: set per model by name, as
  // llama.cpp does (SetStripAttributes).
  kAttrLStrip = 1 << 7,
  kAttrRStrip = 1 << 8,
};

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint16_t attr = kAttrNormal;
};

// One piece of the input after the special-token partition: raw text or a token id.
struct Fragment {
  TokenId token = -1;  // -1: raw text [offset, offset + length) of the input
  size_t offset = 0;
  size_t length = 0;
};

// Hash for string-keyed unordered maps searched with string_views.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct Vocab {
  Vocab() = default;
  Vocab(const Vocab&) = delete;  // `index` points into `tokens`
  Vocab& operator=(const Vocab&) = delete;

  enum class Kind { kSpm, kBpe };
  Kind kind = Kind::kBpe;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre

  std::vector<TokenData> tokens;
  // text -> id; a later duplicate wins. Keys view tokens[i].text (filled once, never resized).
  std::unordered_map<std::string_view, TokenId> index;

  TokenId bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
  TokenId fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool clean_spaces = false;
  bool ignore_merges = false;
  std::unordered_set<TokenId> eog;

  // Control, user-defined and unknown tokens, longest text first (llama.cpp's
  // cache_special_tokens, ordered by the same std::sort so ties break identically).
  std::vector<TokenId> special_by_length;
  // Trie over the texts of special_by_length, to find which of them occur in an input.
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t rank = -1;                              // index into special_by_length of the token ending here
  };
  std::vector<TrieNode> trie;

  TokenId Find(std::string_view text) const {
    auto it = index.find(text);
    return it == index.end() ? -1 : it->second;
  }
  bool Valid(TokenId id) const { return id >= 0 && id < static_cast<TokenId>(tokens.size()); }
};

// Loads everything but the algorithm-specific data (merges) from tokenizer.ggml.*.
Result<std::unique_ptr<Vocab>> LoadVocab(const gguf::GgufFile& file);

// llama.cpp's tokenizer_st_partition: every special token (longest first) that occurs in a raw
// fragment splits it, leftmost occurrences first. Control and unknown tokens only take part
// when parse_special, and not where an occurrence overlaps one of `literal` (sorted, disjoint
// byte spans of text; may be null); user-defined tokens always do.
std::vector<Fragment> PartitionSpecial(const Vocab& vocab, std::string_view text, bool parse_special,
                                       const std::vector<TextSpan>* literal = nullptr);

// The Tokenizer methods that do not depend on the algorithm.
class TokenizerBase : public Tokenizer {
 public:
  explicit TokenizerBase(std::unique_ptr<Vocab> vocab);

  std::vector<TokenId> EncodeFragments(std::string_view text, bool add_special, bool parse_special,
                                       const std::vector<TextSpan>* literal) const;
  std::vector<TokenId> Encode(std::string_view text, bool add_special, bool parse_special) const override;
  std::vector<TokenId> EncodeTemplated(std::string_view text, bool add_special,
                                       const std::vector<TextSpan>& literal) const override;
  std::string TokenToPiece(TokenId id, bool render_special) const override;
  std::string Decode(const std::vector<TokenId>& ids, bool render_special) const override;

  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_->tokens.size()); }
  TokenId bos_id() const override { return vocab_->bos; }
  TokenId eos_id() const override { return vocab_->eos; }
  TokenId eot_id() const override { return vocab_->eot >= 0 ? vocab_->eot : vocab_->eos; }
  bool IsEndOfGeneration(TokenId id) const override { return vocab_->eog.count(id) > 0; }
  FimTokens fim() const override {
    return {vocab_->fim_pre, vocab_->fim_suf, vocab_->fim_mid, vocab_->fim_rep, vocab_->fim_sep};
  }
  TokenAttr attr(TokenId id) const override;
  const std::string& text(TokenId id) const override;
  TokenId Find(std::string_view token_text) const override { return vocab_->Find(token_text); }

  const Vocab& vocab() const { return *vocab_; }

 protected:
  // Appends the ids of one raw fragment. `after_special`: the fragment starts the input or
  // follows a special token (SentencePiece's space prefix goes there).
  virtual void EncodeRaw(std::string_view text, bool after_special, std::vector<TokenId>* out) const = 0;
  // Output bytes of a normal token (its text decoded per the algorithm).
  virtual std::string NormalPiece(const std::string& token_text) const = 0;
  // Must be called by the subclass constructor once NormalPiece works.
  void BuildPieces();

  std::unique_ptr<Vocab> vocab_;
  std::vector<std::string> pieces_;  // per id, with special tokens rendered
};

Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(std::unique_ptr<Vocab> vocab, const gguf::GgufFile& file);
Result<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(std::unique_ptr<Vocab> vocab);

}  // namespace mr::tokenizer_internal
