#include "runtime/gbnf.h"

#include <algorithm>
#include <cstdint>
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

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

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

  Status Error(size_t pos, const std::string& message) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgument("line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + message);
  }

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
        Repeat(&out->back(), c == '+' ? 1 : 0, c == '?' ? 1 : -1);
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
        Repeat(&out->back(), lo, hi);
      } else {
        break;
      }
      Space(nested);
    }
    return Status::Ok();
  }

  static void Repeat(Node* n, int lo, int hi) {
    if (n->min != 1 || n->max != 1) {  // a repetition of a repetition: group it
      Node g;
      g.kind = Node::kGroup;
      g.pos = n->pos;
      g.group = {{std::move(*n)}};
      *n = std::move(g);
    }
    n->min = lo;
    n->max = hi;
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
      uint64_t v = 0;
      for (int i = 0; i < digits; ++i) {
        const char h = Peek();
        int d = -1;
        if (h >= '0' && h <= '9') d = h - '0';
        if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
        if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
        if (d < 0) return Error(start, "expected " + std::to_string(digits) + " hex digits after \\" + e);
        v = v * 16 + static_cast<uint64_t>(d);
        ++p_;
      }
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
  Checker(const Parser& p, const std::vector<Rule>& rules) : p_(p), rules_(rules), nullable_(rules.size(), false) {}

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

  const Parser& p_;
  const std::vector<Rule>& rules_;
  std::vector<bool> nullable_;
  std::vector<std::vector<size_t>> first_;
};

class Emitter {
 public:
  Emitter(GrammarBuilder& b, const std::vector<Rule>& rules, const Parser& p) : b_(b), rules_(rules), p_(p) {}

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
    Expr e;
    switch (n.kind) {
      case Node::kLiteral: {
        std::string bytes;
        for (uint32_t c : n.text) unicode::AppendUtf8(c, &bytes);
        e = b_.Literal(bytes);
        break;
      }
      case Node::kClass:
        e = b_.CodePoints(n.ranges);
        break;
      case Node::kRef:
        e = b_.Ref(ids_[n.rule]);
        break;
      case Node::kGroup: {
        Result<Expr> g = Alts(n.group);
        if (!g.ok()) return g;
        e = std::move(*g);
        break;
      }
    }
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
      Result<Expr> loop = Loop(n, e);
      if (!loop.ok()) return loop;
      return n.min == 0 ? *loop : b_.Seq({b_.Repeat(e, n.min, n.min), *loop});
    }
    return b_.Repeat(e, n.min, n.max);
  }

  // The unbounded repetition of n (its expression e): a character loop when n is a class of
  // free text, or a group one of whose alternatives is (`([^"\\] | "\\" escape)*`), so token
  // masks inside it need not walk the tokens made of its characters; else a plain Star.
  Result<Expr> Loop(const Node& n, const Expr& e) {
    auto text_class = [](const Node& x, bool once) {
      if (x.kind != Node::kClass || (once && (x.min != 1 || x.max != 1))) return false;
      uint32_t ascii = 0;
      for (const auto& [lo, hi] : x.ranges)
        if (lo < 0x80) ascii += std::min<uint32_t>(hi, 0x7F) - lo + 1;
      return ascii >= kLoopAscii;
    };
    if (text_class(n, false)) return b_.CharLoop(n.ranges);
    if (n.kind == Node::kGroup) {
      for (size_t i = 0; i < n.group.size(); ++i) {
        if (n.group[i].size() != 1 || !text_class(n.group[i][0], true)) continue;
        Alternatives rest = n.group;
        rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i));
        std::vector<Expr> others;
        if (!rest.empty()) {
          Result<Expr> r = Alts(rest);
          if (!r.ok()) return r;
          others.push_back(*r);
        }
        return b_.CharLoop(n.group[i][0].ranges, others);
      }
    }
    return b_.Star(e);
  }

  GrammarBuilder& b_;
  const std::vector<Rule>& rules_;
  const Parser& p_;
  std::vector<uint32_t> ids_;
  size_t elements_ = 0;
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
  Checker check(p, p.rules());
  if (Status st = check.Run(); !st.ok()) return st;
  Emitter emit(b, p.rules(), p);
  return emit.Run(p.IndexOf(root));
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
