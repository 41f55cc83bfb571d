#include "runtime/gbnf.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>

#include "model/unicode.h"

namespace mr {
namespace {

using Expr = GrammarBuilder::Expr;

constexpr int kMaxRepeat = 2000;                  // llama.cpp's MAX_REPETITION_THRESHOLD
constexpr int kMaxDepth = 128;                    // nested parentheses (the parser recurses)
constexpr size_t kMaxElements = size_t{1} << 17;  // grammar elements once repetitions are unrolled
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kLoopAscii = 48;  // ASCII characters of a class that make its repetition a CharLoop

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive code point ranges

struct Node;
using Sequence = std::vector<Node>;
using Alternatives = std::vector<Sequence>;

struct Node {
  enum Kind { kLiteral, kClass, kRef, kGroup } kind = kLiteral;
  std::vector<uint32_t> text;  // kLiteral: code points
  Ranges ranges;               // kClass: sorted, disjoint, negation applied
  size_t rule = 0;             // kRef
  Alternatives group;          // kGroup
  int min = 1, max = 1;        // repetitions; max -1: unbounded
  size_t pos = 0;              // offset in the grammar text, for errors
};

struct Rule {
  std::string name;
  Alternatives body;
  bool defined = false;
  size_t def_pos = 0, ref_pos = 0;
};

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsSurrogate(uint32_t c) {
  return c >= 0xD800 && c <= 0xDFFF;
}

// Sorted and merged; with `negate`, the complement within [0, kMaxCodePoint].
Ranges Normalize(Ranges r, bool negate) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (const auto& [lo, hi] : r) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (!negate) return merged;
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : merged) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

// Applies a repetition to n; a repetition of a repetition groups the inner one first.
void SetRepetition(Node* n, int lo, int hi) {
  if (n->min != 1 || n->max != 1) {
    Node g;
    g.kind = Node::kGroup;
    g.pos = n->pos;
    g.group = {{std::move(*n)}};
    *n = std::move(g);
  }
  n->min = lo;
  n->max = hi;
}

// The value of the `digits` hex digits at s[at..], or -1 when there are fewer.
int64_t HexValue(std::string_view s, size_t at, int digits) {
  int64_t v = 0;
  for (int i = 0; i < digits; ++i) {
    const char h = at + static_cast<size_t>(i) < s.size() ? s[at + static_cast<size_t>(i)] : '\0';
    int d = -1;
    if (h >= '0' && h <= '9') d = h - '0';
    if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
    if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// The text being compiled, for error positions ("line L, column C: ...").
struct Source {
  std::string_view s;
  Status Error(size_t pos, const std::string& message) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < s.size(); ++i) {
      if (s[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgument("line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + message);
  }
};

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}
  Source source() const { return Source{s_}; }

  Status Parse() {
    Space(true);
    while (!AtEnd())
      if (Status st = ParseRule(); !st.ok()) return st;
    return Status::Ok();
  }

  std::vector<Rule>& rules() { return rules_; }
  const Rule* Find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &rules_[it->second];
  }
  size_t IndexOf(std::string_view name) const { return index_.at(std::string(name)); }

  Status Error(size_t pos, const std::string& message) const { return source().Error(pos, message); }

 private:
  bool AtEnd() const { return p_ >= s_.size(); }
  char Peek(size_t k = 0) const { return p_ + k < s_.size() ? s_[p_ + k] : '\0'; }

  // Blanks and comments; newlines only where `newline_ok` (llama.cpp's rule: a rule ends at the
  // end of its line outside parentheses).
  void Space(bool newline_ok) {
    while (!AtEnd()) {
      const char c = s_[p_];
      if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
        ++p_;
      } else if (c == '#') {
        while (!AtEnd() && s_[p_] != '\r' && s_[p_] != '\n') ++p_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    const size_t start = p_;
    while (!AtEnd() && IsWordChar(s_[p_])) ++p_;
    return std::string(s_.substr(start, p_ - start));
  }

  size_t RuleIndex(const std::string& name, size_t pos) {
    auto [it, added] = index_.emplace(name, rules_.size());
    if (added) {
      rules_.push_back(Rule{name, {}, false, 0, pos});
    }
    return it->second;
  }

  Status ParseRule() {
    const size_t start = p_;
    const std::string name = Name();
    if (name.empty()) return Error(start, "expected a rule name, found " + Describe(start));
    Space(false);
    if (s_.substr(p_, 3) != "::=") return Error(p_, "expected '::=' after rule name '" + name + "'");
    p_ += 3;
    Space(true);
    Alternatives body;
    if (Status st = ParseAlternatives(&body, false, 0); !st.ok()) return st;
    if (Peek() == '\r') {
      ++p_;
      if (Peek() == '\n') ++p_;
    } else if (Peek() == '\n') {
      ++p_;
    } else if (!AtEnd()) {
      return Error(p_, "unexpected " + Describe(p_) + " in rule '" + name + "'");
    }
    Space(true);
    const size_t i = RuleIndex(name, start);
    if (rules_[i].defined)
      return Error(start, "rule '" + name + "' is defined twice (first at " + Position(rules_[i].def_pos) + ")");
    rules_[i].defined = true;
    rules_[i].def_pos = start;
    rules_[i].body = std::move(body);
    return Status::Ok();
  }

  Status ParseAlternatives(Alternatives* out, bool nested, int depth) {
    out->emplace_back();
    if (Status st = ParseSequence(&out->back(), nested, depth); !st.ok()) return st;
    while (Peek() == '|') {
      ++p_;
      Space(true);
      out->emplace_back();
      if (Status st = ParseSequence(&out->back(), nested, depth); !st.ok()) return st;
    }
    return Status::Ok();
  }

  Status ParseSequence(Sequence* out, bool nested, int depth) {
    while (!AtEnd()) {
      const size_t start = p_;
      const char c = Peek();
      if (c == '"') {
        ++p_;
        Node n;
        n.pos = start;
        while (Peek() != '"') {
          if (AtEnd()) return Error(start, "unterminated string literal");
          Result<uint32_t> ch = Char();
          if (!ch.ok()) return ch.status();
          if (IsSurrogate(*ch)) return Error(start, "a surrogate code point cannot be written as UTF-8");
          n.text.push_back(*ch);
        }
        ++p_;
        out->push_back(std::move(n));
      } else if (c == '[') {
        ++p_;
        const bool negate = Peek() == '^';
        if (negate) ++p_;
        Ranges r;
        while (Peek() != ']') {
          if (AtEnd()) return Error(start, "unterminated character class");
          const size_t at = p_;
          Result<uint32_t> lo = Char();
          if (!lo.ok()) return lo.status();
          uint32_t hi = *lo;
          if (Peek() == '-' && p_ + 1 < s_.size() && s_[p_ + 1] != ']') {
            ++p_;
            Result<uint32_t> end = Char();
            if (!end.ok()) return end.status();
            hi = *end;
            if (hi < *lo) return Error(at, "the range's end comes before its start");
          }
          r.emplace_back(*lo, hi);
        }
        ++p_;
        Node n;
        n.kind = Node::kClass;
        n.ranges = Normalize(std::move(r), negate);
        n.pos = start;
        out->push_back(std::move(n));
      } else if (c == '<' || (c == '!' && Peek(1) == '<')) {
        return Error(start, "token matches (<[id]>, <text>, !<...>) are not supported: grammars here match text");
      } else if (IsWordChar(c)) {
        const std::string name = Name();
        Node n;
        n.kind = Node::kRef;
        n.rule = RuleIndex(name, start);
        n.pos = start;
        out->push_back(std::move(n));
      } else if (c == '(') {
        if (depth + 1 > kMaxDepth) return Error(start, "parentheses nested deeper than " + std::to_string(kMaxDepth));
        ++p_;
        Space(true);
        Node n;
        n.kind = Node::kGroup;
        n.pos = start;
        if (Status st = ParseAlternatives(&n.group, true, depth + 1); !st.ok()) return st;
        if (Peek() != ')')
          return Error(p_, "expected ')' to close the '(' at " + Position(start) + ", found " + Describe(p_));
        ++p_;
        out->push_back(std::move(n));
      } else if (c == '.') {
        ++p_;
        Node n;
        n.kind = Node::kClass;
        n.ranges = {{0, kMaxCodePoint}};
        n.pos = start;
        out->push_back(std::move(n));
      } else if (c == '*' || c == '+' || c == '?') {
        if (out->empty()) return Error(start, std::string("'") + c + "' must follow an item");
        ++p_;
        SetRepetition(&out->back(), c == '+' ? 1 : 0, c == '?' ? 1 : -1);
      } else if (c == '{') {
        if (out->empty()) return Error(start, "'{' must follow an item");
        ++p_;
        Space(nested);
        int lo = 0, hi = 0;
        if (Status st = Int(&lo); !st.ok()) return st;
        Space(nested);
        if (Peek() == ',') {
          ++p_;
          Space(nested);
          if (IsDigit(Peek())) {
            if (Status st = Int(&hi); !st.ok()) return st;
            Space(nested);
          } else {
            hi = -1;
          }
        } else {
          hi = lo;
        }
        if (Peek() != '}') return Error(p_, "expected '}' to close the repetition, found " + Describe(p_));
        ++p_;
        if (hi != -1 && hi < lo) return Error(start, "the repetition's maximum is below its minimum");
        SetRepetition(&out->back(), lo, hi);
      } else {
        break;
      }
      Space(nested);
    }
    return Status::Ok();
  }

  Status Int(int* v) {
    const size_t start = p_;
    int64_t x = 0;
    while (IsDigit(Peek())) {
      x = std::min<int64_t>(x * 10 + (Peek() - '0'), int64_t{1} << 40);
      ++p_;
    }
    if (p_ == start) return Error(start, "expected an integer, found " + Describe(start));
    if (x > kMaxRepeat)
      return Error(start, "repetition count " + std::to_string(x) + " is above " + std::to_string(kMaxRepeat));
    *v = static_cast<int>(x);
    return Status::Ok();
  }

  // One character of a literal or class: an escape, or a UTF-8 encoded code point.
  Result<uint32_t> Char() {
    const size_t start = p_;
    if (Peek() == '\\') {
      const char e = Peek(1);
      p_ += 2;
      int digits = 0;
      switch (e) {
        case 'x':
          digits = 2;
          break;
        case 'u':
          digits = 4;
          break;
        case 'U':
          digits = 8;
          break;
        case 't':
          return uint32_t{'\t'};
        case 'r':
          return uint32_t{'\r'};
        case 'n':
          return uint32_t{'\n'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
          return static_cast<uint32_t>(e);
        default:
          return Error(start, "unknown escape " + Describe(start + 1, "\\"));
      }
      const int64_t v = HexValue(s_, p_, digits);
      if (v < 0) return Error(start, "expected " + std::to_string(digits) + " hex digits after \\" + e);
      p_ += static_cast<size_t>(digits);
      if (v > kMaxCodePoint) return Error(start, "code point above U+10FFFF");
      return static_cast<uint32_t>(v);
    }
    const auto b0 = static_cast<uint8_t>(Peek());
    int len = 0;
    uint32_t c = 0, least = 0;
    if (b0 < 0x80) {
      ++p_;
      return b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, c = b0 & 0x1F, least = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, c = b0 & 0x0F, least = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, c = b0 & 0x07, least = 0x10000;
    } else {
      return Error(start, "invalid UTF-8 in the grammar");
    }
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<uint8_t>(Peek(static_cast<size_t>(i)));
      if (p_ + static_cast<size_t>(i) >= s_.size() || (b & 0xC0) != 0x80)
        return Error(start, "invalid UTF-8 in the grammar");
      c = (c << 6) | (b & 0x3F);
    }
    if (c < least || c > kMaxCodePoint || IsSurrogate(c)) return Error(start, "invalid UTF-8 in the grammar");
    p_ += static_cast<size_t>(len);
    return c;
  }

  std::string Position(size_t pos) const {
    const std::string m = Error(pos, "").message();
    return m.substr(0, m.size() - 2);
  }

  // The character at pos, quoted, for messages ("'x'", "end of input", "a newline").
  std::string Describe(size_t pos, const char* prefix = "") const {
    if (pos >= s_.size()) return "the end of the grammar";
    const char c = s_[pos];
    if (c == '\n' || c == '\r') return "the end of the line";
    if (static_cast<uint8_t>(c) < 0x20 || static_cast<uint8_t>(c) >= 0x7F) {
      static const char* kHex = "0123456789abcdef";
      const auto u = static_cast<uint8_t>(c);
      return std::string("byte 0x") + kHex[u >> 4] + kHex[u & 15];
    }
    return std::string("'") + prefix + c + "'";
  }

  std::string_view s_;
  size_t p_ = 0;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, size_t> index_;
};

// Nullability, the repetition check and left recursion, over the parsed rules.
class Checker {
 public:
  Checker(Source p, const std::vector<Rule>& rules) : p_(p), rules_(rules), nullable_(rules.size(), false) {}

  Status Run() {
    for (const Rule& r : rules_)
      if (!r.defined) return p_.Error(r.ref_pos, "undefined rule '" + r.name + "'");
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < rules_.size(); ++i) {
        if (!nullable_[i] && AltsNullable(rules_[i].body)) {
          nullable_[i] = true;
          changed = true;
        }
      }
    }
    for (const Rule& r : rules_)
      if (Status st = CheckStars(r.body); !st.ok()) return st;
    // Left recursion: a cycle in "rule A can begin with rule B".
    first_.assign(rules_.size(), {});
    for (size_t i = 0; i < rules_.size(); ++i) FirstRefs(rules_[i].body, &first_[i]);
    std::vector<int> color(rules_.size(), 0);
    std::vector<size_t> path;
    for (size_t i = 0; i < rules_.size(); ++i)
      if (Status st = Visit(i, &color, &path); !st.ok()) return st;
    return Status::Ok();
  }

 private:
  bool BaseNullable(const Node& n) const {
    switch (n.kind) {
      case Node::kLiteral:
        return n.text.empty();
      case Node::kClass:
        return false;
      case Node::kRef:
        return nullable_[n.rule];
      case Node::kGroup:
        return AltsNullable(n.group);
    }
    return false;
  }
  bool NodeNullable(const Node& n) const { return n.min == 0 || BaseNullable(n); }
  bool AltsNullable(const Alternatives& alts) const {
    for (const Sequence& s : alts)
      if (std::all_of(s.begin(), s.end(), [&](const Node& n) { return NodeNullable(n); })) return true;
    return false;
  }

  Status CheckStars(const Alternatives& alts) const {
    for (const Sequence& s : alts) {
      for (const Node& n : s) {
        if (n.max == -1 && BaseNullable(n))
          return p_.Error(n.pos,
                          "an unbounded repetition ('*', '+' or '{m,}') of an item that can match the empty "
                          "string");
        if (n.kind == Node::kGroup)
          if (Status st = CheckStars(n.group); !st.ok()) return st;
      }
    }
    return Status::Ok();
  }

  void FirstRefs(const Alternatives& alts, std::vector<size_t>* out) const {
    for (const Sequence& s : alts) {
      for (const Node& n : s) {
        if (n.kind == Node::kRef) out->push_back(n.rule);
        if (n.kind == Node::kGroup) FirstRefs(n.group, out);
        if (!NodeNullable(n)) break;
      }
    }
  }

  Status Visit(size_t i, std::vector<int>* color, std::vector<size_t>* path) const {
    if ((*color)[i] == 2) return Status::Ok();
    if ((*color)[i] == 1) {
      std::string cycle;
      for (auto it = std::find(path->begin(), path->end(), i); it != path->end(); ++it)
        cycle += rules_[*it].name + " -> ";
      return p_.Error(rules_[i].def_pos, "rule '" + rules_[i].name + "' is left-recursive (" + cycle + rules_[i].name +
                                             "); rewrite it with repetition");
    }
    (*color)[i] = 1;
    path->push_back(i);
    for (size_t j : first_[i])
      if (Status st = Visit(j, color, path); !st.ok()) return st;
    path->pop_back();
    (*color)[i] = 2;
    return Status::Ok();
  }

  Source p_;
  const std::vector<Rule>& rules_;
  std::vector<bool> nullable_;
  std::vector<std::vector<size_t>> first_;
};

// JSON-string mode (JSON Schema `pattern`): the grammar emits the characters as a JSON string
// body holds them, so '"', '\\' and the control characters appear as their escapes.
bool NeedsJsonEscape(uint32_t c) {
  return c == '"' || c == '\\' || c < 0x20;
}

// The escape JSON writers use for c (NeedsJsonEscape): the short forms, else \u00xx.
std::string JsonEscape(uint32_t c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      break;
  }
  static const char* kHex = "0123456789abcdef";
  return std::string("\\u00") + kHex[(c >> 4) & 0xF] + kHex[c & 0xF];
}

class Emitter {
 public:
  Emitter(GrammarBuilder& b, const std::vector<Rule>& rules, Source p, bool json)
      : b_(b), rules_(rules), p_(p), json_(json) {}

  Result<Expr> Run(size_t root) {
    for (size_t i = 0; i < rules_.size(); ++i) ids_.push_back(b_.DeclareRule());
    for (size_t i = 0; i < rules_.size(); ++i) {
      Result<Expr> e = Alts(rules_[i].body);
      if (!e.ok()) return e;
      b_.DefineRule(ids_[i], *e);
    }
    return b_.Ref(ids_[root]);
  }

 private:
  Result<Expr> Alts(const Alternatives& alts) {
    std::vector<Expr> options;
    for (const Sequence& s : alts) {
      std::vector<Expr> parts;
      for (const Node& n : s) {
        Result<Expr> e = One(n);
        if (!e.ok()) return e;
        parts.push_back(std::move(*e));
      }
      options.push_back(b_.Seq(parts));
    }
    return b_.Alt(options);
  }

  Result<Expr> One(const Node& n) {
    // An unbounded repetition of free text is a character loop, emitted once; the copies a
    // minimum asks for come before it.
    std::optional<Expr> loop;
    if (n.max == -1) {
      Result<std::optional<Expr>> l = TextLoop(n);
      if (!l.ok()) return l.status();
      loop = std::move(*l);
      if (loop && n.min == 0) return *loop;
    }
    Result<Expr> base = Base(n);
    if (!base.ok()) return base;
    Expr e = std::move(*base);
    size_t size = 0;
    for (const auto& a : e.alts) size += a.size();
    const int copies = n.max == -1 ? n.min + 1 : n.max;
    if (copies > 1 && (e.alts.size() != 1 || size > 1)) {  // repeated: one reference per copy
      const uint32_t r = b_.DeclareRule();
      b_.DefineRule(r, e);
      e = b_.Ref(r);
      size = 1;
    }
    elements_ += size * static_cast<size_t>(std::max(copies, 1));
    if (elements_ > kMaxElements)
      return p_.Error(n.pos, "the grammar is too large once its repetitions are unrolled (over " +
                                 std::to_string(kMaxElements) + " elements)");
    if (n.min == 1 && n.max == 1) return e;
    if (n.min == 0 && n.max == 1) return b_.Opt(e);
    if (n.max == -1) {
      const Expr rest = loop ? *loop : b_.Star(e);
      return n.min == 0 ? rest : b_.Seq({b_.Repeat(e, n.min, n.min), rest});
    }
    return b_.Repeat(e, n.min, n.max);
  }

  // n itself, without its repetition.
  Result<Expr> Base(const Node& n) {
    switch (n.kind) {
      case Node::kLiteral: {
        std::string bytes;
        for (uint32_t c : n.text) {
          if (json_ && NeedsJsonEscape(c)) {
            bytes += JsonEscape(c);
          } else {
            unicode::AppendUtf8(c, &bytes);
          }
        }
        return b_.Literal(bytes);
      }
      case Node::kClass: {
        if (!json_) return b_.CodePoints(n.ranges);
        Ranges raw;
        std::vector<Expr> options = JsonSplit(n.ranges, &raw);
        if (!raw.empty()) options.insert(options.begin(), b_.CodePoints(raw));
        return b_.Alt(options);
      }
      case Node::kRef:
        return b_.Ref(ids_[n.rule]);
      case Node::kGroup:
        return Alts(n.group);
    }
    return Expr{};
  }

  // The character loop of n's unbounded repetition when n is a class of free text, or a group one
  // of whose alternatives is (`([^"\\] | "\\" escape)*`), so that token masks inside it need not
  // walk the tokens made of its characters; nullopt otherwise.
  Result<std::optional<Expr>> TextLoop(const Node& n) {
    auto text_class = [](const Node& x, bool once) {
      if (x.kind != Node::kClass || (once && (x.min != 1 || x.max != 1))) return false;
      uint32_t ascii = 0;
      for (const auto& [lo, hi] : x.ranges)
        if (lo < 0x80) ascii += std::min<uint32_t>(hi, 0x7F) - lo + 1;
      return ascii >= kLoopAscii;
    };
    // JSON-string mode: the loop's characters are those a string holds raw; the others' escapes
    // join the loop's other alternatives.
    auto loop = [&](const Ranges& ranges, std::vector<Expr> others) {
      if (!json_) return b_.CharLoop(ranges, others);
      Ranges raw;
      std::vector<Expr> escapes = JsonSplit(ranges, &raw);
      escapes.insert(escapes.end(), others.begin(), others.end());
      return b_.CharLoop(raw, escapes);
    };
    if (text_class(n, false)) return std::optional<Expr>(loop(n.ranges, {}));
    if (n.kind != Node::kGroup) return std::optional<Expr>();
    for (size_t i = 0; i < n.group.size(); ++i) {
      if (n.group[i].size() != 1 || !text_class(n.group[i][0], true)) continue;
      Alternatives rest = n.group;
      rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i));
      std::vector<Expr> others;
      if (!rest.empty()) {
        Result<Expr> r = Alts(rest);
        if (!r.ok()) return r.status();
        others.push_back(*r);
      }
      return std::optional<Expr>(loop(n.group[i][0].ranges, others));
    }
    return std::optional<Expr>();
  }

  // JSON-string mode: *raw = the code points of `ranges` a string holds as they are; returns the
  // escapes of the others in `ranges`.
  std::vector<Expr> JsonSplit(const Ranges& ranges, Ranges* raw) {
    std::vector<Expr> escapes;
    for (const auto& [lo, hi] : ranges) {
      uint32_t from = lo;
      for (uint32_t c = lo; c <= hi && c <= 0x5C; ++c) {
        if (!NeedsJsonEscape(c)) continue;
        if (c > from) raw->emplace_back(from, c - 1);
        escapes.push_back(b_.Literal(JsonEscape(c)));
        from = c + 1;
      }
      if (from <= hi) raw->emplace_back(from, hi);
    }
    return escapes;
  }

  GrammarBuilder& b_;
  const std::vector<Rule>& rules_;
  Source p_;
  bool json_ = false;
  std::vector<uint32_t> ids_;
  size_t elements_ = 0;
};

Result<Expr> Compile(GrammarBuilder& b, const std::vector<Rule>& rules, size_t root, Source src, bool json = false) {
  Checker check(src, rules);
  if (Status st = check.Run(); !st.ok()) return st;
  Emitter emit(b, rules, src, json);
  return emit.Run(root);
}

// Regular expressions (vLLM's guided_regex) into the same rules: one rule, the whole pattern,
// matched against the whole output.
class RegexParser {
 public:
  explicit RegexParser(std::string_view s) : s_(s) {}

  Result<Alternatives> Parse() {
    Alternatives alts;
    if (Status st = ParseAlternatives(&alts, 0); !st.ok()) return st;
    if (!AtEnd()) return Error(p_, "unbalanced ')'");
    return alts;
  }
  Source source() const { return Source{s_}; }
  // Per alternative of the whole pattern: anchored at its start ('^'), at its end ('$').
  const std::vector<std::pair<bool, bool>>& anchors() const { return anchors_; }
  bool nested_anchor() const { return nested_anchor_; }  // '^' or '$' at the edge of a group

 private:
  bool AtEnd() const { return p_ >= s_.size(); }
  char Peek(size_t k = 0) const { return p_ + k < s_.size() ? s_[p_ + k] : '\0'; }
  Status Error(size_t pos, const std::string& m) const { return source().Error(pos, m); }

  Status ParseAlternatives(Alternatives* out, int depth) {
    do {
      if (!out->empty()) ++p_;  // the '|'
      out->emplace_back();
      if (depth == 0) anchors_.emplace_back(false, false);
      if (Status st = ParseSequence(&out->back(), depth); !st.ok()) return st;
    } while (Peek() == '|');
    return Status::Ok();
  }

  Status ParseSequence(Sequence* out, int depth) {
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      const size_t start = p_;
      const char c = Peek();
      Node n;
      n.pos = start;
      if (c == '^' || c == '$') {
        // Anchors: the whole output is matched, so they are redundant where they can stand.
        const bool edge = c == '^' ? out->empty() : (p_ + 1 == s_.size() || Peek(1) == '|' || Peek(1) == ')');
        if (!edge) return Error(start, std::string("'") + c + "' is supported only at the start / end of the pattern");
        if (depth == 0) {
          (c == '^' ? anchors_.back().first : anchors_.back().second) = true;
        } else {
          nested_anchor_ = true;
        }
        ++p_;
        continue;
      } else if (c == '*' || c == '+' || c == '?') {
        if (out->empty()) return Error(start, std::string("'") + c + "' must follow an item");
        ++p_;
        Quantify(&out->back(), c == '+' ? 1 : 0, c == '?' ? 1 : -1);
        continue;
      } else if (c == '{' && !out->empty() && IsQuantifier()) {
        int lo = 0, hi = -1;
        if (Status st = Braces(&lo, &hi); !st.ok()) return st;
        Quantify(&out->back(), lo, hi);
        continue;
      } else if (c == '(') {
        if (depth + 1 > kMaxDepth) return Error(start, "groups nested deeper than " + std::to_string(kMaxDepth));
        ++p_;
        if (Peek() == '?') {
          if (Peek(1) == ':') {
            p_ += 2;
          } else if ((Peek(1) == 'P' && Peek(2) == '<') || (Peek(1) == '<' && Peek(2) != '=' && Peek(2) != '!')) {
            while (!AtEnd() && Peek() != '>') ++p_;  // a named group: the name does not matter here
            if (AtEnd()) return Error(start, "unterminated group name");
            ++p_;
          } else {
            return Error(start,
                         "(?...) constructs other than (?:...) and named groups (lookaround, flags) are not "
                         "supported");
          }
        }
        n.kind = Node::kGroup;
        if (Status st = ParseAlternatives(&n.group, depth + 1); !st.ok()) return st;
        if (Peek() != ')') return Error(start, "unterminated group");
        ++p_;
      } else if (c == '[') {
        if (Status st = Class(&n); !st.ok()) return st;
      } else if (c == '.') {
        ++p_;
        n.kind = Node::kClass;
        n.ranges = Normalize({{'\n', '\n'}}, true);  // any character but a newline
      } else if (c == '\\') {
        if (Status st = Escape(&n, false); !st.ok()) return st;
      } else {
        Result<uint32_t> cp = Utf8();
        if (!cp.ok()) return cp.status();
        n.text = {*cp};
      }
      out->push_back(std::move(n));
    }
    return Status::Ok();
  }

  // After an item: a quantifier, then an optional lazy '?' or possessive '+' (same language).
  void Quantify(Node* n, int lo, int hi) {
    SetRepetition(n, lo, hi);
    if (Peek() == '?' || Peek() == '+') ++p_;
  }

  // '{' starts a quantifier ({m}, {m,}, {m,n}, {,n}); otherwise it is a literal brace.
  bool IsQuantifier() const {
    size_t i = p_ + 1, digits = 0;
    while (i < s_.size() && IsDigit(s_[i])) ++i, ++digits;
    if (i < s_.size() && s_[i] == ',') {
      ++i;
      while (i < s_.size() && IsDigit(s_[i])) ++i, ++digits;
    }
    return digits > 0 && i < s_.size() && s_[i] == '}';
  }
  Status Braces(int* lo, int* hi) {
    const size_t start = p_;
    ++p_;
    auto number = [&](int* v) {
      int64_t x = 0;
      while (IsDigit(Peek())) {
        x = std::min<int64_t>(x * 10 + (Peek() - '0'), int64_t{1} << 40);
        ++p_;
      }
      *v = static_cast<int>(std::min<int64_t>(x, INT32_MAX));
      return x;
    };
    int64_t a = IsDigit(Peek()) ? number(lo) : (*lo = 0);
    int64_t z = a;
    if (Peek() == ',') {
      ++p_;
      z = IsDigit(Peek()) ? number(hi) : -1;
      if (z == -1) *hi = -1;
    } else {
      *hi = *lo;
    }
    ++p_;  // '}'
    if (a > kMaxRepeat || z > kMaxRepeat) return Error(start, "repetition count above " + std::to_string(kMaxRepeat));
    if (*hi != -1 && *hi < *lo) return Error(start, "the repetition's maximum is below its minimum");
    return Status::Ok();
  }

  Status Class(Node* n) {
    const size_t start = p_;
    ++p_;
    const bool negate = Peek() == '^';
    if (negate) ++p_;
    Ranges r;
    bool first = true;
    while (AtEnd() || Peek() != ']' || first) {
      if (AtEnd()) return Error(start, "unterminated character class");
      first = false;
      const size_t at = p_;
      Ranges item;
      if (Peek() == '\\') {
        Node e;
        if (Status st = Escape(&e, true); !st.ok()) return st;
        if (e.kind == Node::kClass) {  // \d, \w, \s inside a class: no range from them
          r.insert(r.end(), e.ranges.begin(), e.ranges.end());
          continue;
        }
        item = {{e.text[0], e.text[0]}};
      } else {
        Result<uint32_t> cp = Utf8();
        if (!cp.ok()) return cp.status();
        item = {{*cp, *cp}};
      }
      if (Peek() == '-' && Peek(1) != ']' && Peek(1) != '\0') {
        ++p_;
        uint32_t hi = 0;
        if (Peek() == '\\') {
          Node e;
          if (Status st = Escape(&e, true); !st.ok()) return st;
          if (e.kind == Node::kClass) return Error(at, "a range cannot end at a class escape");
          hi = e.text[0];
        } else {
          Result<uint32_t> cp = Utf8();
          if (!cp.ok()) return cp.status();
          hi = *cp;
        }
        if (hi < item[0].first) return Error(at, "the range's end comes before its start");
        item[0].second = hi;
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    ++p_;
    n->kind = Node::kClass;
    n->ranges = Normalize(std::move(r), negate);
    n->pos = start;
    return Status::Ok();
  }

  // A backslash escape: a class (\d \D \w \W \s \S) or one character.
  Status Escape(Node* n, bool in_class) {
    const size_t start = p_;
    const char e = Peek(1);
    if (e == '\0') return Error(start, "a pattern cannot end with '\\'");
    p_ += 2;
    const Ranges digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const Ranges space = {{'\t', '\r'}, {' ', ' '}};
    auto cls = [&](const Ranges& r, bool negate) {
      n->kind = Node::kClass;
      n->ranges = Normalize(r, negate);
      return Status::Ok();
    };
    auto chr = [&](uint32_t c) {
      n->kind = Node::kLiteral;
      n->text = {c};
      return Status::Ok();
    };
    switch (e) {
      case 'd':
        return cls(digit, false);
      case 'D':
        return cls(digit, true);
      case 'w':
        return cls(word, false);
      case 'W':
        return cls(word, true);
      case 's':
        return cls(space, false);
      case 'S':
        return cls(space, true);
      case 'n':
        return chr('\n');
      case 't':
        return chr('\t');
      case 'r':
        return chr('\r');
      case 'f':
        return chr('\f');
      case 'v':
        return chr('\v');
      case 'a':
        return chr('\a');
      case '0':
        return chr(0);
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        const int64_t v = HexValue(s_, p_, digits);
        if (v < 0) return Error(start, std::string("expected ") + std::to_string(digits) + " hex digits after \\" + e);
        p_ += static_cast<size_t>(digits);
        if (v > kMaxCodePoint || IsSurrogate(static_cast<uint32_t>(v)))
          return Error(start, "not a Unicode scalar value");
        return chr(static_cast<uint32_t>(v));
      }
      case 'b':
        if (in_class) return chr('\b');
        [[fallthrough]];
      case 'B':
      case 'A':
      case 'Z':
      case 'z':
      case 'G':
        return Error(start, std::string("the anchor \\") + e + " is not supported");
      default:
        if ((e >= '1' && e <= '9') || e == 'k') return Error(start, "backreferences are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || static_cast<uint8_t>(e) >= 0x80)
          return Error(start, std::string("unknown escape \\") + e);
        return chr(static_cast<uint8_t>(e));  // escaped punctuation stands for itself
    }
  }

  Result<uint32_t> Utf8() {
    const size_t start = p_;
    const size_t len = unicode::WellFormedUtf8Length(s_, p_);
    if (len == 0) return Error(start, "invalid UTF-8 in the pattern");
    const std::vector<uint32_t> cps = unicode::DecodeUtf8(s_.substr(p_, len));
    p_ += len;
    return cps[0];
  }

  std::string_view s_;
  size_t p_ = 0;
  std::vector<std::pair<bool, bool>> anchors_;
  bool nested_anchor_ = false;
};

}  // namespace

Result<GrammarBuilder::Expr> GbnfExpr(GrammarBuilder& b, std::string_view text, std::string_view root) {
  Parser p(text);
  if (Status st = p.Parse(); !st.ok()) return st;
  const Rule* r = p.Find(root);
  if (r == nullptr || !r->defined) {
    if (r != nullptr) return p.Error(r->ref_pos, "undefined rule '" + std::string(root) + "'");
    return InvalidArgument("the grammar has no rule named '" + std::string(root) + "'");
  }
  return Compile(b, p.rules(), p.IndexOf(root), p.source());
}

namespace {

// A regular expression as the one rule of a grammar: matched in full, or (json) as JSON Schema's
// `pattern` searches the decoded text of a JSON string body.
Result<Expr> CompileRegex(GrammarBuilder& b, std::string_view pattern, bool json) {
  RegexParser p(pattern);
  Result<Alternatives> alts = p.Parse();
  if (!alts.ok()) return alts.status();
  std::vector<Rule> rules(1);
  rules[0].name = "root";
  rules[0].defined = true;
  rules[0].body = std::move(*alts);
  if (json) {
    if (p.nested_anchor())
      return InvalidArgument("'^' and '$' are supported only at the start / end of the pattern's alternatives");
    // Search semantics: an alternative not anchored at an end may have any text on that side.
    Node any;
    any.kind = Node::kClass;
    any.ranges = Normalize({}, true);
    any.min = 0;
    any.max = -1;
    for (size_t i = 0; i < rules[0].body.size(); ++i) {
      Sequence& s = rules[0].body[i];
      if (!p.anchors()[i].first) s.insert(s.begin(), any);
      if (!p.anchors()[i].second) s.push_back(any);
    }
  }
  return Compile(b, rules, 0, p.source(), json);
}

}  // namespace

Result<GrammarBuilder::Expr> RegexExpr(GrammarBuilder& b, std::string_view pattern) {
  return CompileRegex(b, pattern, /*json=*/false);
}

Result<GrammarBuilder::Expr> JsonPatternExpr(GrammarBuilder& b, std::string_view pattern) {
  return CompileRegex(b, pattern, /*json=*/true);
}

std::string GbnfQuote(std::string_view s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<uint8_t>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string GbnfChoice(const std::vector<std::string>& options) {
  std::string g = "root ::=";
  for (size_t i = 0; i < options.size(); ++i) g += (i == 0 ? " " : " | ") + GbnfQuote(options[i]);
  return g + "\n";
}

}  // namespace mr
