#include "runtime/grammar.h"

#include <algorithm>
#include <atomic>

#include "model/unicode.h"

namespace mr {

namespace {
// Bounds against pathological grammars (ambiguous alternatives multiply stacks): expansion depth
// without consuming a byte, and stacks per state. Grammars built by json_grammar stay far below.
constexpr int kMaxExpandDepth = 256;
constexpr size_t kMaxStacks = 4096;

// The ASCII bytes that may appear unescaped in a JSON string (0x20..0x7f but '"' and '\\').
ByteSet JsonStringAscii() {
  ByteSet s;
  for (int c = 0x20; c < 0x80; ++c) s.set(static_cast<size_t>(c));
  s.reset('"');
  s.reset('\\');
  return s;
}

// The characters that may appear unescaped in a JSON string.
const GrammarBuilder::CodePointRanges& JsonStringChars() {
  static const GrammarBuilder::CodePointRanges r = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
  return r;
}

bool InRanges(const GrammarBuilder::CodePointRanges& r, uint32_t c) {
  auto it = std::upper_bound(r.begin(), r.end(), std::pair<uint32_t, uint32_t>{c, UINT32_MAX});
  return it != r.begin() && std::prev(it)->second >= c;
}

// Whether `piece` is whole characters of `ranges`: well-formed UTF-8 (no overlong forms,
// surrogates or code points past U+10FFFF) whose every code point is in them.
bool IsPlainText(std::string_view piece, const GrammarBuilder::CodePointRanges& ranges) {
  size_t i = 0;
  while (i < piece.size()) {
    const size_t len = unicode::WellFormedUtf8Length(piece, i);
    if (len == 0) return false;
    uint32_t c = static_cast<uint8_t>(piece[i]);
    if (len > 1) {
      c &= 0x3Fu >> (len - 1);
      for (size_t k = 1; k < len; ++k) c = (c << 6) | (static_cast<uint8_t>(piece[i + k]) & 0x3F);
    }
    if (!InRanges(ranges, c)) return false;
    i += len;
  }
  return !piece.empty();
}

// Splits [lo, hi] into ranges whose UTF-8 encodings are byte-wise products of byte ranges (the
// classic UTF-8 range split); surrogates are left out.
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) SplitUtf8(lo, 0xD7FF, out);
    if (hi > 0xDFFF) SplitUtf8(0xE000, hi, out);
    return;
  }
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      SplitUtf8(lo, edge, out);
      SplitUtf8(edge + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitUtf8(lo, lo | m, out);
        SplitUtf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitUtf8(lo, (hi & ~m) - 1, out);
        SplitUtf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, z;
  unicode::AppendUtf8(lo, &a);
  unicode::AppendUtf8(hi, &z);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(z[k]));
  out->push_back(std::move(seq));
}
}  // namespace

ByteSet JsonSimpleEscapes() {
  ByteSet s;
  for (char c : std::string_view("\"\\/bfnrt")) s.set(static_cast<uint8_t>(c));
  return s;
}

// ---- Builder ----

GrammarBuilder::GrammarBuilder() = default;

uint32_t GrammarBuilder::SetIndex(const ByteSet& set) {
  // A loop's ASCII set is its own (its index marks the loop), never shared with an equal set.
  for (size_t i = 0; i < sets_.size(); ++i)
    if (set_loop_[i] < 0 && sets_[i] == set) return static_cast<uint32_t>(i);
  sets_.push_back(set);
  set_loop_.push_back(-1);
  return static_cast<uint32_t>(sets_.size() - 1);
}

GrammarBuilder::Expr GrammarBuilder::Bytes(const ByteSet& set) {
  return Expr{{{Elem{Elem::kBytes, SetIndex(set)}}}};
}

GrammarBuilder::Expr GrammarBuilder::Byte(uint8_t c) {
  ByteSet s;
  s.set(c);
  return Bytes(s);
}

GrammarBuilder::Expr GrammarBuilder::Range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(static_cast<size_t>(c));
  return Bytes(s);
}

GrammarBuilder::Expr GrammarBuilder::Literal(std::string_view text) {
  Expr e{{{}}};
  for (char c : text) {
    ByteSet s;
    s.set(static_cast<uint8_t>(c));
    e.alts[0].push_back(Elem{Elem::kBytes, SetIndex(s)});
  }
  return e;
}

GrammarBuilder::Expr GrammarBuilder::StringChar() {
  return Bytes(JsonStringAscii());  // SetIndex never returns a loop's set
}

GrammarBuilder::Expr GrammarBuilder::Utf8NonAscii() {
  return CodePoints({{0x80, 0x10FFFF}});  // Unicode's table 3-7: 8 lead-byte forms
}

GrammarBuilder::Expr GrammarBuilder::JsonStringBody() {
  const ByteSet simple = JsonSimpleEscapes();
  ByteSet hex;
  for (char c : std::string_view("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
  // \uXXXX names a Unicode scalar value or, as a pair, a high then a low surrogate: a lone
  // surrogate (\ud800) is not JSON a parser accepts, so the grammar must not produce it.
  ByteSet d, not_d, high, low;
  for (char c : std::string_view("dD")) d.set(static_cast<uint8_t>(c));
  not_d = hex & ~d;
  for (char c : std::string_view("89abAB")) high.set(static_cast<uint8_t>(c));
  for (char c : std::string_view("cdefCDEF")) low.set(static_cast<uint8_t>(c));
  const Expr hex2 = Repeat(Bytes(hex), 2, 2);
  const Expr scalar = Alt({Seq({Bytes(not_d), Repeat(Bytes(hex), 3, 3)}), Seq({Bytes(d), Range('0', '7'), hex2})});
  const Expr pair = Seq({Bytes(d), Bytes(high), hex2, Literal("\\u"), Bytes(d), Bytes(low), hex2});
  const Expr escape = Seq({Byte('\\'), Alt({Bytes(simple), Seq({Byte('u'), Alt({scalar, pair})})})});
  return CharLoop(JsonStringChars(), {escape});
}

GrammarBuilder::Expr GrammarBuilder::CodePoints(const CodePointRanges& ranges) {
  ByteSet ascii;
  std::vector<Expr> options;
  for (const auto& [lo, hi] : ranges) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) ascii.set(c);
    if (hi < 0x80) continue;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    SplitUtf8(std::max<uint32_t>(lo, 0x80), hi, &seqs);
    for (const auto& seq : seqs) {
      std::vector<Expr> bytes;
      for (const auto& [a, z] : seq) bytes.push_back(Range(a, z));
      options.push_back(Seq(bytes));
    }
  }
  if (ascii.any()) options.insert(options.begin(), Bytes(ascii));
  return Alt(options);
}

GrammarBuilder::Expr GrammarBuilder::CharLoop(const CodePointRanges& ranges, const std::vector<Expr>& others) {
  CodePointRanges high;
  ByteSet ascii;
  for (const auto& [lo, hi] : ranges) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) ascii.set(c);
    if (hi >= 0x80) high.emplace_back(std::max<uint32_t>(lo, 0x80), hi);
  }
  std::vector<Expr> body = {CodePoints(high)};
  if (ascii.any()) {  // the loop's own ASCII set: a stack at it is in the loop
    sets_.push_back(ascii);
    set_loop_.push_back(static_cast<int32_t>(loops_.size()));
    loops_.push_back(ranges);
    body.push_back(Expr{{{Elem{Elem::kBytes, static_cast<uint32_t>(sets_.size() - 1)}}}});
  }
  body.insert(body.end(), others.begin(), others.end());
  return Star(Alt(body));
}

GrammarBuilder::Expr GrammarBuilder::AsRule(const Expr& e) {
  if (e.alts.size() == 1) return e;
  const uint32_t r = DeclareRule();
  DefineRule(r, e);
  return Ref(r);
}

GrammarBuilder::Expr GrammarBuilder::Seq(const std::vector<Expr>& parts) {
  Expr out{{{}}};
  for (const Expr& p : parts) {
    const Expr one = AsRule(p);
    for (const Elem& el : one.alts[0]) out.alts[0].push_back(el);
  }
  return out;
}

GrammarBuilder::Expr GrammarBuilder::Alt(const std::vector<Expr>& options) {
  Expr out;
  for (const Expr& o : options)
    for (const auto& a : o.alts)
      if (std::find(out.alts.begin(), out.alts.end(), a) == out.alts.end()) out.alts.push_back(a);
  return out;
}

GrammarBuilder::Expr GrammarBuilder::Star(const Expr& e) {
  // R -> a_1 R | ... | a_n R | (empty), one alternative per alternative of e.
  const uint32_t r = DeclareRule();
  Expr body;
  for (const auto& a : e.alts) {
    body.alts.push_back(a);
    body.alts.back().push_back(Elem{Elem::kRef, r});
  }
  body.alts.emplace_back();
  DefineRule(r, body);
  return Ref(r);
}

GrammarBuilder::Expr GrammarBuilder::Repeat(const Expr& e, int lo, int hi) {
  std::vector<Expr> parts(static_cast<size_t>(std::max(lo, 0)), e);
  Expr tail = Empty();
  for (int i = std::max(lo, 0); i < hi; ++i) tail = Opt(Seq({e, tail}));
  parts.push_back(tail);
  return Seq(parts);
}

uint32_t GrammarBuilder::DeclareRule() {
  rules_.emplace_back();
  defined_.push_back(false);
  return static_cast<uint32_t>(rules_.size() - 1);
}

void GrammarBuilder::DefineRule(uint32_t rule, const Expr& body) {
  rules_[rule] = body.alts;
  defined_[rule] = true;
}

std::shared_ptr<const Grammar> GrammarBuilder::Build(const Expr& root) {
  const uint32_t r = DeclareRule();
  DefineRule(r, root);
  static std::atomic<uint64_t> next_id{1};
  auto g = std::make_shared<Grammar>();
  g->id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  g->sets_ = sets_;
  g->set_loop_ = set_loop_;
  g->loops_ = loops_;
  g->root_ = r;
  g->rule_alts_.resize(rules_.size());
  for (size_t i = 0; i < rules_.size(); ++i) {
    // A rule declared and never defined (a compile that failed half way, its expression then
    // replaced) has no alternatives: it matches nothing.
    for (const auto& alt : rules_[i]) {
      g->rule_alts_[i].push_back(static_cast<uint32_t>(g->elems_.size()));
      for (const Elem& el : alt)
        g->elems_.push_back({el.kind == Elem::kBytes ? Grammar::FlatElem::kBytes : Grammar::FlatElem::kRef, el.arg});
      g->elems_.push_back({Grammar::FlatElem::kEnd, 0});
    }
  }
  return g;
}

// ---- Matching ----

void Grammar::Expand(GrammarState::Stack& st, std::vector<GrammarState::Stack>* out, int depth) const {
  if (depth > kMaxExpandDepth || out->size() >= kMaxStacks) return;
  if (st.empty()) {
    out->push_back(st);
    return;
  }
  const uint32_t pos = st.back();
  const FlatElem& e = elems_[pos];
  switch (e.kind) {
    case FlatElem::kBytes:
      out->push_back(st);
      return;
    case FlatElem::kEnd:
      st.pop_back();
      Expand(st, out, depth + 1);
      st.push_back(pos);
      return;
    case FlatElem::kRef: {
      st.pop_back();
      // The continuation after the reference; dropped when the alternative ends there (a tail
      // call), so right recursion does not grow the stack.
      const bool cont = elems_[pos + 1].kind != FlatElem::kEnd;
      if (cont) st.push_back(pos + 1);
      for (uint32_t start : rule_alts_[e.arg]) {
        st.push_back(start);
        Expand(st, out, depth + 1);
        st.pop_back();
      }
      if (cont) st.pop_back();
      st.push_back(pos);
      return;
    }
  }
}

void Grammar::Normalize(std::vector<GrammarState::Stack>* stacks) {
  std::sort(stacks->begin(), stacks->end());
  stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
}

GrammarState Grammar::Start() const {
  GrammarState s;
  s.g_ = this;
  for (uint32_t start : rule_alts_[root_]) {
    GrammarState::Stack st{start};
    Expand(st, &s.stacks_, 0);
  }
  Normalize(&s.stacks_);
  return s;
}

bool GrammarState::Advance(uint8_t c) {
  if (g_ == nullptr) return false;
  std::vector<Stack> next;
  for (const Stack& st : stacks_) {
    if (st.empty()) continue;
    const uint32_t top = st.back();
    if (!g_->sets_[g_->elems_[top].arg].test(c)) continue;
    Stack s(st.begin(), st.end() - 1);
    if (g_->elems_[top + 1].kind != Grammar::FlatElem::kEnd) s.push_back(top + 1);
    g_->Expand(s, &next, 0);
  }
  Grammar::Normalize(&next);
  stacks_ = std::move(next);
  return !stacks_.empty();
}

bool GrammarState::AdvanceAll(std::string_view bytes) {
  for (char c : bytes)
    if (!Advance(static_cast<uint8_t>(c))) return false;
  return true;
}

bool GrammarState::accepting() const {
  for (const Stack& st : stacks_)
    if (st.empty()) return true;
  return false;
}

bool GrammarState::finished() const {
  if (stacks_.empty()) return false;
  for (const Stack& st : stacks_)
    if (!st.empty()) return false;
  return true;
}

ByteSet GrammarState::NextBytes() const {
  ByteSet s;
  for (const Stack& st : stacks_)
    if (!st.empty()) s |= g_->sets_[g_->elems_[st.back()].arg];
  return s;
}

int GrammarState::loop() const {
  if (g_ == nullptr) return -1;
  for (const Stack& st : stacks_) {
    if (st.empty()) continue;
    const int32_t loop = g_->set_loop_[g_->elems_[st.back()].arg];
    if (loop >= 0) return loop;
  }
  return -1;
}

// ---- Token masks ----

void TokenMasker::Trie::Build(std::vector<std::pair<std::string_view, TokenId>> entries) {
  std::sort(entries.begin(), entries.end());
  nodes.assign(1, Node{});
  token_ids.clear();
  struct Work {
    uint32_t node;
    size_t lo, hi, depth;
  };
  std::vector<Work> work{{0, 0, entries.size(), 0}};
  while (!work.empty()) {
    const Work w = work.back();
    work.pop_back();
    size_t i = w.lo;
    nodes[w.node].first_token = static_cast<uint32_t>(token_ids.size());
    while (i < w.hi && entries[i].first.size() == w.depth) token_ids.push_back(entries[i++].second);
    nodes[w.node].n_tokens = static_cast<uint32_t>(token_ids.size()) - nodes[w.node].first_token;
    const uint32_t first_child = static_cast<uint32_t>(nodes.size());
    uint32_t n_children = 0;
    for (size_t j = i; j < w.hi;) {
      const char b = entries[j].first[w.depth];
      size_t k = j;
      while (k < w.hi && entries[k].first[w.depth] == b) ++k;
      Node child;
      child.byte = static_cast<uint8_t>(b);
      nodes.push_back(child);
      work.push_back({first_child + n_children, j, k, w.depth + 1});
      ++n_children;
      j = k;
    }
    nodes[w.node].first_child = first_child;
    nodes[w.node].n_children = n_children;
  }
}

TokenMasker::TokenMasker(const Tokenizer& tok, int64_t n_vocab) : n_vocab_(n_vocab) {
  pieces_.resize(static_cast<size_t>(n_vocab));
  eog_.assign(static_cast<size_t>(n_vocab), 0);
  std::vector<std::pair<std::string_view, TokenId>> all;
  for (TokenId t = 0; t < n_vocab; ++t) {
    eog_[t] = tok.IsEndOfGeneration(t) ? 1 : 0;
    const TokenAttr a = tok.attr(t);
    if (a == TokenAttr::kControl || a == TokenAttr::kUnknown || a == TokenAttr::kUnused) continue;
    pieces_[t] = tok.TokenToPiece(t, /*render_special=*/false);
    if (pieces_[t].empty()) continue;
    all.emplace_back(pieces_[t], t);
  }
  all_.Build(std::move(all));
  (void)Loop(JsonStringChars());  // every tool call and structured output has strings
}

std::shared_ptr<const TokenMasker::LoopTable> TokenMasker::Loop(const GrammarBuilder::CodePointRanges& ranges) const {
  std::lock_guard<std::mutex> lock(loops_mu_);
  if (auto it = loops_.find(ranges); it != loops_.end()) return it->second;
  auto table = std::make_shared<LoopTable>();
  table->plain.assign(static_cast<size_t>(n_vocab_), 0);
  std::vector<std::pair<std::string_view, TokenId>> special;
  for (TokenId t = 0; t < n_vocab_; ++t) {
    const std::string& p = pieces_[static_cast<size_t>(t)];
    if (p.empty()) continue;
    if (IsPlainText(p, ranges)) {
      table->plain[static_cast<size_t>(t)] = 1;
    } else {
      special.emplace_back(p, t);
    }
  }
  table->special.Build(std::move(special));
  if (loops_.size() >= kMaxLoopTables) {  // drop the others (tables in use live on in their callers)
    for (auto it = loops_.begin(); it != loops_.end();)
      it = it->first == JsonStringChars() ? std::next(it) : loops_.erase(it);
  }
  loops_.emplace(ranges, table);
  return table;
}

void TokenMasker::Walk(const Trie& trie, const GrammarState& state, std::vector<uint8_t>* allowed,
                       std::vector<TokenId>* ids) const {
  // Depth-first over the trie; states[d] is the state after the first d bytes of the path.
  struct Frame {
    uint32_t node;
    uint32_t next_child;
  };
  std::vector<GrammarState> states{state};
  std::vector<ByteSet> next{state.NextBytes()};
  std::vector<Frame> path{{0, 0}};
  while (!path.empty()) {
    Frame& f = path.back();
    const Trie::Node& node = trie.nodes[f.node];
    if (f.next_child == node.n_children) {
      path.pop_back();
      states.pop_back();
      next.pop_back();
      continue;
    }
    const uint32_t ci = node.first_child + f.next_child++;
    const Trie::Node& child = trie.nodes[ci];
    if (!next.back().test(child.byte)) continue;
    GrammarState s = states.back();
    if (!s.Advance(child.byte)) continue;
    for (uint32_t i = 0; i < child.n_tokens; ++i) {
      const TokenId t = trie.token_ids[child.first_token + i];
      (*allowed)[static_cast<size_t>(t)] = 1;
      ids->push_back(t);
    }
    if (child.n_children == 0) continue;
    next.push_back(s.NextBytes());
    states.push_back(std::move(s));
    path.push_back({ci, 0});
  }
}

void TokenMasker::Mask(const GrammarState& state, std::vector<uint8_t>* allowed) const {
  if (state.finished()) {
    allowed->assign(eog_.begin(), eog_.end());
    return;
  }
  if (state.dead() || state.grammar() == nullptr) {  // nothing can follow
    allowed->assign(static_cast<size_t>(n_vocab_), 0);
    return;
  }
  const int32_t loop = state.loop();
  const std::shared_ptr<const LoopTable> table = loop >= 0 ? Loop(state.grammar()->loop_ranges(loop)) : nullptr;
  if (table != nullptr) {
    allowed->assign(table->plain.begin(), table->plain.end());
  } else {
    allowed->assign(static_cast<size_t>(n_vocab_), 0);
  }
  // The key: the grammar's id, the base (its loop), and the state's parse stacks (sorted and
  // unique, so equal states give equal keys).
  std::string key;
  const uint64_t gid = state.grammar()->id_;
  key.append(reinterpret_cast<const char*>(&gid), sizeof gid);
  key.append(reinterpret_cast<const char*>(&loop), sizeof loop);
  for (const GrammarState::Stack& st : state.stacks_) {
    const uint32_t n = static_cast<uint32_t>(st.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    key.append(reinterpret_cast<const char*>(st.data()), st.size() * sizeof(uint32_t));
  }
  bool hit = false;
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      for (const TokenId t : it->second.ids) (*allowed)[static_cast<size_t>(t)] = 1;
      cache_lru_.splice(cache_lru_.begin(), cache_lru_, it->second.lru);
      hit = true;
    }
  }
  if (!hit) {
    std::vector<TokenId> ids;
    Walk(table != nullptr ? table->special : all_, state, allowed, &ids);
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (!cache_.count(key) && ids.size() <= kCacheIds) {
      cache_ids_ += ids.size();
      cache_lru_.push_front(key);
      cache_.emplace(std::move(key), CacheEntry{std::move(ids), cache_lru_.begin()});
      while (cache_ids_ > kCacheIds) {
        auto old = cache_.find(cache_lru_.back());
        cache_ids_ -= old->second.ids.size();
        cache_.erase(old);
        cache_lru_.pop_back();
      }
    }
  }
  if (state.accepting())
    for (size_t t = 0; t < eog_.size(); ++t) (*allowed)[t] |= eog_[t];
}

bool TokenMasker::Allows(const GrammarState& state, TokenId t) const {
  if (t < 0 || t >= n_vocab_) return false;
  if (eog_[t]) return state.accepting();
  const std::string& p = pieces_[t];
  if (p.empty()) return false;
  GrammarState s = state;
  return s.AdvanceAll(p);
}

}  // namespace mr
