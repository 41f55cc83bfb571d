// Context-free grammars over bytes, matched incrementally, and the token masks they induce.
//
//   GrammarBuilder b;                          // expressions are values: alternatives of sequences
//   auto root = b.Seq({b.Literal("{\"a\": "), b.Plus(b.Range('0', '9')), b.Literal("}")});
//   std::shared_ptr<const Grammar> g = b.Build(root);
//   GrammarState s = g->Start();
//   s.Advance('{');  ...                        // false: the byte is not allowed here
//
// A state is the set of parse stacks (positions in the grammar still open), as in an Earley /
// GLR parser restricted to grammars without left recursion: advancing by a byte keeps the
// stacks whose next element accepts it and expands rule references until every stack's top is
// a byte set (or the stack is empty: the input so far is a complete sentence). Repetition is
// right-recursive with tail calls dropped, so stacks do not grow with the length of a string.
//
// Token masks (TokenMasker): a trie over the vocabulary's byte pieces is walked from the state,
// pruning a subtree at the first byte no stack accepts. Inside a character loop (CharLoop: a JSON
// string's characters, a GBNF `[^"\\]*`), the tokens made only of whole characters of the loop
// (well-formed UTF-8 whose code points are all in its set) are allowed without a walk, since the
// loop consumes any of them, and only the other tokens are walked.
//
// Thread-safety: Grammar and TokenMasker are immutable once built; a GrammarState belongs to one
// thread.
#pragma once

#include <bitset>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace mr {

using ByteSet = std::bitset<256>;

// The bytes that may follow a backslash in a JSON string as a one-byte escape (" \\ / b f n r t).
ByteSet JsonSimpleEscapes();

class Grammar;

// Builds a grammar from expressions. An expression is a list of alternatives, each a sequence
// of elements (a byte set or a reference to a rule); combinators that need a rule of their own
// (alternatives inside a sequence, repetition) create one.
class GrammarBuilder {
 public:
  struct Elem {
    enum Kind : uint8_t { kBytes, kRef };
    Kind kind;
    uint32_t arg;  // byte set index or rule index
    bool operator==(const Elem&) const = default;
  };
  struct Expr {
    std::vector<std::vector<Elem>> alts;
  };

  GrammarBuilder();

  Expr Empty() const { return Expr{{{}}}; }
  Expr Bytes(const ByteSet& set);
  Expr Byte(uint8_t c);
  Expr Range(uint8_t lo, uint8_t hi);
  Expr Literal(std::string_view s);
  // One ASCII byte allowed unescaped in a JSON string (not the free-string loop's set: for
  // bounded strings).
  Expr StringChar();
  // One well-formed UTF-8 character of 2 to 4 bytes.
  Expr Utf8NonAscii();
  // The inside of a JSON string: (unescaped character | escape sequence)*, a CharLoop.
  Expr JsonStringBody();
  // Unicode code points as inclusive ranges, sorted and disjoint.
  using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
  // One character of `ranges` as its well-formed UTF-8 encoding (surrogates have none): a byte
  // set for the ASCII ones, sequences of byte ranges for the others.
  Expr CodePoints(const CodePointRanges& ranges);
  // Zero or more of: a character of `ranges`, or a sentence of one of `others` (none empty). A
  // character loop: token masks allow every token made only of its characters without walking
  // it (TokenMasker). `ranges` must hold an ASCII character (else it is a plain Star).
  Expr CharLoop(const CodePointRanges& ranges, const std::vector<Expr>& others = {});
  Expr Seq(const std::vector<Expr>& parts);
  Expr Alt(const std::vector<Expr>& options);
  Expr Opt(const Expr& e) { return Alt({e, Empty()}); }
  // Zero or more; `e` must not match the empty string.
  Expr Star(const Expr& e);
  Expr Plus(const Expr& e) { return Seq({e, Star(e)}); }
  // Between lo and hi repetitions (hi >= lo; unrolled).
  Expr Repeat(const Expr& e, int lo, int hi);

  // Rules by number, for recursion: declare, refer, define later (a rule never defined matches
  // nothing).
  uint32_t DeclareRule();
  Expr Ref(uint32_t rule) const { return Expr{{{Elem{Elem::kRef, rule}}}}; }
  void DefineRule(uint32_t rule, const Expr& body);

  std::shared_ptr<const Grammar> Build(const Expr& root);

 private:
  uint32_t SetIndex(const ByteSet& set);
  Expr AsRule(const Expr& e);  // one element: a reference to a rule holding e (e itself if simple)

  std::vector<ByteSet> sets_;
  std::vector<int32_t> set_loop_;  // per set: the character loop whose ASCII element it is, or -1
  std::vector<CodePointRanges> loops_;
  std::vector<std::vector<std::vector<Elem>>> rules_;
  std::vector<bool> defined_;
};

class Grammar;

class GrammarState {
 public:
  GrammarState() = default;
  // Consumes one byte; false (and the state is dead) when no stack accepts it.
  bool Advance(uint8_t c);
  bool AdvanceAll(std::string_view bytes);
  // The input so far is a complete sentence.
  bool accepting() const;
  // Nothing more can be consumed (every stack is empty); accepting then.
  bool finished() const;
  bool dead() const { return stacks_.empty(); }
  // The character loop (GrammarBuilder::CharLoop) a stack of the state is in, or -1 (the first
  // one found: any such loop consumes every token made of its characters).
  int loop() const;
  bool in_free_string() const { return loop() >= 0; }
  // Bytes some stack accepts next.
  ByteSet NextBytes() const;
  const Grammar* grammar() const { return g_; }

 private:
  friend class Grammar;
  friend class TokenMasker;
  using Stack = std::vector<uint32_t>;  // positions in Grammar::elems_, top last
  const Grammar* g_ = nullptr;
  std::vector<Stack> stacks_;  // sorted, unique; each top is a byte set, or empty
};

class Grammar {
 public:
  GrammarState Start() const;
  size_t n_rules() const { return rule_alts_.size(); }
  const GrammarBuilder::CodePointRanges& loop_ranges(int loop) const { return loops_[static_cast<size_t>(loop)]; }

 private:
  friend class GrammarBuilder;
  friend class GrammarState;
  friend class TokenMasker;
  struct FlatElem {
    enum Kind : uint8_t { kBytes, kRef, kEnd };
    Kind kind;
    uint32_t arg;
  };
  // Pushes onto `out` every expansion of `stack` whose top is a byte set (or that is empty).
  void Expand(GrammarState::Stack& stack, std::vector<GrammarState::Stack>* out, int depth) const;
  static void Normalize(std::vector<GrammarState::Stack>* stacks);

  std::vector<ByteSet> sets_;
  std::vector<int32_t> set_loop_;
  std::vector<GrammarBuilder::CodePointRanges> loops_;
  std::vector<FlatElem> elems_;
  std::vector<std::vector<uint32_t>> rule_alts_;  // start position of each alternative
  uint32_t root_ = 0;
  uint64_t id_ = 0;  // unique per Build in this process (TokenMasker's cache key)
};

// The vocabulary's byte pieces as tries, for computing which tokens a grammar state allows.
class TokenMasker {
 public:
  explicit TokenMasker(const Tokenizer& tok, int64_t n_vocab);

  // allowed[t] = 1 when token t's bytes can be consumed from `state` (end-of-generation tokens:
  // when the state is accepting). Resized to n_vocab.
  void Mask(const GrammarState& state, std::vector<uint8_t>* allowed) const;
  // Whether token t's bytes can be consumed from `state` (what Mask computes for one token).
  bool Allows(const GrammarState& state, TokenId t) const;
  const std::string& piece(TokenId t) const { return pieces_[static_cast<size_t>(t)]; }
  bool is_eog(TokenId t) const { return eog_[static_cast<size_t>(t)] != 0; }
  int64_t n_vocab() const { return n_vocab_; }

 private:
  struct Trie {
    struct Node {
      uint32_t first_child = 0, n_children = 0;  // children are contiguous in nodes
      uint32_t first_token = 0, n_tokens = 0;    // tokens whose piece ends here (in token_ids)
      uint8_t byte = 0;
    };
    std::vector<Node> nodes;  // nodes[0] is the root
    std::vector<TokenId> token_ids;
    void Build(std::vector<std::pair<std::string_view, TokenId>> entries);
  };
  // Sets allowed[t] for the tokens of `trie` whose bytes `state` consumes, and appends them to ids.
  void Walk(const Trie& trie, const GrammarState& state, std::vector<uint8_t>* allowed,
            std::vector<TokenId>* ids) const;

  // Per character loop's code point set: the tokens made only of its characters (plain), and a
  // trie of the others. Built on first use (~20-60 ms), kept for kMaxLoopTables sets (the JSON
  // string's always).
  struct LoopTable {
    std::vector<uint8_t> plain;
    Trie special;
  };
  std::shared_ptr<const LoopTable> Loop(const GrammarBuilder::CodePointRanges& ranges) const;
  static constexpr size_t kMaxLoopTables = 8;
  mutable std::mutex loops_mu_;
  mutable std::map<GrammarBuilder::CodePointRanges, std::shared_ptr<const LoopTable>> loops_;

  // Masks by (grammar, state): the tokens the walk allowed, over the base (none, or a loop's
  // plain tokens). A state recurs in every call of the same tool and in speculative drafts; its
  // walk costs ~1-2 ms on a 152k vocabulary, a hit a copy of the base. Least recently used
  // entries go past kCacheIds ids in all.
  static constexpr size_t kCacheIds = size_t{1} << 22;
  struct CacheEntry {
    std::vector<TokenId> ids;
    std::list<std::string>::iterator lru;
  };
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, CacheEntry> cache_;
  mutable std::list<std::string> cache_lru_;  // most recent first
  mutable size_t cache_ids_ = 0;

  int64_t n_vocab_ = 0;
  std::vector<std::string> pieces_;
  std::vector<uint8_t> eog_;
  Trie all_;  // every token with a non-empty piece
};

}  // namespace mr
