// Jinja engine for chat templates; see jinja.h. Semantics follow python jinja2 3.1 with the
// sandbox and settings transformers uses; where a detail matters for output bytes the comment
// says which jinja2/Python behaviour it reproduces.
#include "model/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <unordered_map>

#include "model/unicode.h"

namespace mr::jinja {
namespace {

// Internal failures unwind with an exception; Render turns them into a Status at the boundary.
struct Error {
  int line;
  std::string message;
};

[[noreturn]] void Fail(int line, std::string message) {
  throw Error{line, std::move(message)};
}

// A string with per-byte provenance: m[i] != 0 when byte i is request data.
struct Str {
  std::string s;
  std::string m;
  void Append(const Str& o) {
    s += o.s;
    m += o.m;
  }
  void Append(std::string_view text, bool data) {
    s += text;
    m.append(text.size(), data ? 1 : 0);
  }
  Str Sub(size_t pos, size_t n) const { return Str{s.substr(pos, n), m.substr(pos, n)}; }
  bool AnyData() const { return m.find('\1') != std::string::npos; }
};

Str MakeStr(std::string s, bool data) {
  Str r;
  r.m.assign(s.size(), data ? 1 : 0);
  r.s = std::move(s);
  return r;
}

struct Value;
using List = std::vector<Value>;
struct Dict;

// Something callable: a macro, a global function, or a method bound to a value.
struct Callable {
  std::string name;
  const Node* macro = nullptr;
  std::shared_ptr<Value> self;        // bound methods
  const Node* caller_body = nullptr;  // the body of a {% call %} block, for caller()
  size_t caller_frame = 0;
};

struct Value {
  enum Kind : uint8_t { kUndef, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kFunc };
  Kind k = kUndef;
  bool data = false;  // scalars that came from the context
  // A list that jinja2 would hand out as a one-shot generator (map, select, unique, ...): always
  // truthy, not JSON serialisable, no len(), empty once iterated.
  std::shared_ptr<bool> generator_used;
  bool tuple = false;  // prints as (a, b)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const Str> s;
  std::shared_ptr<const List> l;
  std::shared_ptr<Dict> d;  // mutable only for namespace() objects
  std::shared_ptr<const Callable> fn;
  std::string undef_msg;  // why it is undefined, raised when it is used

  static Value Undef(std::string msg) {
    Value v;
    v.undef_msg = std::move(msg);
    return v;
  }
  static Value None(bool data = false) {
    Value v;
    v.k = kNone;
    v.data = data;
    return v;
  }
  static Value Bool(bool b, bool data = false) {
    Value v;
    v.k = kBool;
    v.b = b;
    v.data = data;
    return v;
  }
  static Value Int(int64_t i, bool data = false) {
    Value v;
    v.k = kInt;
    v.i = i;
    v.data = data;
    return v;
  }
  static Value Float(double f, bool data = false) {
    Value v;
    v.k = kFloat;
    v.f = f;
    v.data = data;
    return v;
  }
  static Value String(Str s) {
    Value v;
    v.k = kStr;
    v.s = std::make_shared<const Str>(std::move(s));
    return v;
  }
  static Value Text(std::string s) { return String(MakeStr(std::move(s), false)); }
  static Value MakeList(List l) {
    Value v;
    v.k = kList;
    v.l = std::make_shared<const List>(std::move(l));
    return v;
  }
  static Value Generator(List l) {
    Value v = MakeList(std::move(l));
    v.generator_used = std::make_shared<bool>(false);
    return v;
  }
  static Value Func(Callable c) {
    Value v;
    v.k = kFunc;
    v.fn = std::make_shared<const Callable>(std::move(c));
    return v;
  }
  bool IsNum() const { return k == kBool || k == kInt || k == kFloat; }
  double Num() const { return k == kFloat ? f : k == kInt ? static_cast<double>(i) : b ? 1.0 : 0.0; }
  int64_t IntVal() const { return k == kInt ? i : b ? 1 : 0; }
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;
  bool is_namespace = false;
  bool is_loop = false;  // a loop object: namespace-like for printing, but read-only
  const Value* Find(const Value& key) const;
  void Set(const Value& key, Value v);
};

Value MakeDict(Dict d) {
  Value v;
  v.k = Value::kDict;
  v.d = std::make_shared<Dict>(std::move(d));
  return v;
}

// ---- Python value semantics --------------------------------------------------------------------

const char* TypeName(const Value& v) {
  switch (v.k) {
    case Value::kUndef:
      return "Undefined";
    case Value::kNone:
      return "NoneType";
    case Value::kBool:
      return "bool";
    case Value::kInt:
      return "int";
    case Value::kFloat:
      return "float";
    case Value::kStr:
      return "str";
    case Value::kList:
      return v.generator_used ? "generator" : "list";
    case Value::kDict:
      return v.d->is_namespace ? "Namespace" : "dict";
    case Value::kFunc:
      return "function";
  }
  return "?";
}

// jinja2's object_type_repr, used in "'list object' has no attribute 'x'".
std::string ObjectTypeRepr(const Value& v) {
  if (v.k == Value::kNone) return "None";
  return std::string(TypeName(v)) + " object";
}

bool Truthy(const Value& v) {
  switch (v.k) {
    case Value::kUndef:
    case Value::kNone:
      return false;
    case Value::kBool:
      return v.b;
    case Value::kInt:
      return v.i != 0;
    case Value::kFloat:
      return v.f != 0;
    case Value::kStr:
      return !v.s->s.empty();
    case Value::kList:
      return v.generator_used || !v.l->empty();
    case Value::kDict:
      return !v.d->items.empty();
    case Value::kFunc:
      return true;
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.IsNum() && b.IsNum()) {
    if (a.k == Value::kFloat || b.k == Value::kFloat) return a.Num() == b.Num();
    return a.IntVal() == b.IntVal();
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case Value::kUndef:
    case Value::kNone:
      return true;
    case Value::kStr:
      return a.s->s == b.s->s;
    case Value::kList:
      if (a.l->size() != b.l->size()) return false;
      for (size_t i = 0; i < a.l->size(); ++i)
        if (!Equal((*a.l)[i], (*b.l)[i])) return false;
      return true;
    case Value::kDict:
      if (a.d->items.size() != b.d->items.size()) return false;
      for (const auto& [k, v] : a.d->items) {
        const Value* o = b.d->Find(k);
        if (!o || !Equal(v, *o)) return false;
      }
      return true;
    case Value::kFunc:
      return a.fn == b.fn;
    default:
      return false;
  }
}

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (Equal(k, key)) return &v;
  return nullptr;
}

void Dict::Set(const Value& key, Value v) {
  for (auto& [k, old] : items)
    if (Equal(k, key)) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

// Python's float repr: shortest round-trip digits, exponent form outside [1e-4, 1e16).
std::string FloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e_pos = sci.find('e');
  int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int n = static_cast<int>(digits.size());
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= n - 1) {
      out = digits + std::string(exp - (n - 1), '0') + ".0";
    } else if (exp >= 0) {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return sign + out;
}

// Python's repr of a str.
std::string StrRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

void Repr(const Value& v, std::string& out, bool& data, int depth);

// Python's str(): what {{ value }} prints.
void Stringify(const Value& v, Str& out, int depth = 0) {
  switch (v.k) {
    case Value::kUndef:
      return;
    case Value::kNone:
      out.Append("None", v.data);
      return;
    case Value::kBool:
      out.Append(v.b ? "True" : "False", v.data);
      return;
    case Value::kInt:
      out.Append(std::to_string(v.i), v.data);
      return;
    case Value::kFloat:
      out.Append(FloatRepr(v.f), v.data);
      return;
    case Value::kStr:
      out.Append(*v.s);
      return;
    default: {
      if (v.generator_used) Fail(0, "printing a generator is not supported");
      // Containers print as Python repr; mixed provenance is rare here, so any data makes all of it data.
      std::string text;
      bool data = false;
      Repr(v, text, data, depth);
      out.Append(text, data);
    }
  }
}

void Repr(const Value& v, std::string& out, bool& data, int depth) {
  if (depth > 64) Fail(0, "value nested too deeply to print");
  switch (v.k) {
    case Value::kStr:
      data = data || v.s->AnyData();
      out += StrRepr(v.s->s);
      return;
    case Value::kList:
      out += v.tuple ? '(' : '[';
      for (size_t i = 0; i < v.l->size(); ++i) {
        if (i) out += ", ";
        Repr((*v.l)[i], out, data, depth + 1);
      }
      if (v.tuple && v.l->size() == 1) out += ',';
      out += v.tuple ? ')' : ']';
      return;
    case Value::kDict:
      if (v.d->is_namespace) {
        out += "<Namespace>";
        return;
      }
      out += '{';
      for (size_t i = 0; i < v.d->items.size(); ++i) {
        if (i) out += ", ";
        Repr(v.d->items[i].first, out, data, depth + 1);
        out += ": ";
        Repr(v.d->items[i].second, out, data, depth + 1);
      }
      out += '}';
      return;
    case Value::kUndef:
      out += "Undefined";
      return;
    case Value::kFunc:
      out += "<function " + v.fn->name + ">";
      return;
    default: {
      Str s;
      Stringify(v, s, depth);
      data = data || s.AnyData();
      out += s.s;
    }
  }
}

Str ToStr(const Value& v) {
  if (v.k == Value::kStr) return *v.s;
  Str s;
  Stringify(v, s);
  return s;
}

// json.dumps(ensure_ascii=False, indent, separators, sort_keys), keeping string provenance per byte.
struct JsonOptions {
  int indent = -1;  // -1: None
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// Decodes the UTF-8 sequence at s[i] (advancing i past it); invalid bytes decode as themselves.
uint32_t DecodeUtf8(const std::string& s, size_t& i) {
  unsigned char c = s[i];
  int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  if (i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : c & (0x3F >> (len - 1));
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void JsonString(const Str& s, Str& out, bool ensure_ascii) {
  out.Append("\"", false);
  for (size_t i = 0; i < s.s.size(); ++i) {
    unsigned char c = s.s[i];
    bool d = s.m[i] != 0;
    switch (c) {
      case '"':
        out.Append("\\\"", d);
        break;
      case '\\':
        out.Append("\\\\", d);
        break;
      case '\n':
        out.Append("\\n", d);
        break;
      case '\r':
        out.Append("\\r", d);
        break;
      case '\t':
        out.Append("\\t", d);
        break;
      case '\b':
        out.Append("\\b", d);
        break;
      case '\f':
        out.Append("\\f", d);
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out.Append(b, d);
        } else if (c >= 0x80 && ensure_ascii) {
          size_t j = i;
          uint32_t cp = DecodeUtf8(s.s, j);
          d = s.Sub(i, j - i).AnyData();
          i = j - 1;
          char b[16];
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(b, sizeof(b), "\\u%04x", cp);
          }
          out.Append(b, d);
        } else {
          out.s += static_cast<char>(c);
          out.m += d ? 1 : 0;
        }
    }
  }
  out.Append("\"", false);
}

void ToJson(const Value& v, const JsonOptions& o, int level, Str& out, int line) {
  if (level > 128) Fail(line, "tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    if (o.indent >= 0) out.Append("\n" + std::string(static_cast<size_t>(o.indent) * lvl, ' '), false);
  };
  switch (v.k) {
    case Value::kNone:
      out.Append("null", v.data);
      return;
    case Value::kBool:
      out.Append(v.b ? "true" : "false", v.data);
      return;
    case Value::kInt:
      out.Append(std::to_string(v.i), v.data);
      return;
    case Value::kFloat:
      out.Append(std::isnan(v.f)   ? "NaN"
                 : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity")
                                   : FloatRepr(v.f),
                 v.data);
      return;
    case Value::kStr:
      JsonString(*v.s, out, o.ensure_ascii);
      return;
    case Value::kList:
      if (v.generator_used) Fail(line, "Object of type generator is not JSON serializable");
      if (v.l->empty()) {
        out.Append("[]", false);
        return;
      }
      out.Append("[", false);
      for (size_t i = 0; i < v.l->size(); ++i) {
        if (i) out.Append(o.item_sep, false);
        newline(level + 1);
        ToJson((*v.l)[i], o, level + 1, out, line);
      }
      newline(level);
      out.Append("]", false);
      return;
    case Value::kDict: {
      if (v.d->is_namespace) Fail(line, "Object of type Namespace is not JSON serializable");
      if (v.d->items.empty()) {
        out.Append("{}", false);
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.d->items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return ToStr(a->first).s < ToStr(b->first).s; });
      }
      out.Append("{", false);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out.Append(o.item_sep, false);
        newline(level + 1);
        const Value& key = items[i]->first;
        if (key.k == Value::kStr) {
          JsonString(*key.s, out, o.ensure_ascii);
        } else if (key.k == Value::kNone || key.IsNum()) {
          Str k;
          ToJson(key, o, level, k, line);
          JsonString(k, out, o.ensure_ascii);
        } else {
          Fail(line, std::string("keys must be str, int, float, bool or None, not ") + TypeName(key));
        }
        out.Append(o.key_sep, false);
        ToJson(items[i]->second, o, level + 1, out, line);
      }
      newline(level);
      out.Append("}", false);
      return;
    }
    default:
      Fail(line, std::string("Object of type ") + TypeName(v) + " is not JSON serializable");
  }
}

Value FromJson(const nlohmann::ordered_json& j, int depth) {
  if (depth > 512) Fail(0, "context nested too deeply");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None(true);
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>(), true);
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>(), true);
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u), true);
      return Value::Int(static_cast<int64_t>(u), true);
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>(), true);
    case nlohmann::ordered_json::value_t::string:
      return Value::String(MakeStr(j.get<std::string>(), true));
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(FromJson(e, depth + 1));
      return Value::MakeList(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items())
        d.items.emplace_back(Value::String(MakeStr(k, true)), FromJson(e, depth + 1));
      return MakeDict(std::move(d));
    }
    default:
      Fail(0, "unsupported value in context");
  }
}

// ---- UTF-8 helpers: Python indexes strings by code point ---------------------------------------

std::vector<size_t> CodePointStarts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  return starts;
}

bool IsSpace(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

// ---- Lexer ---------------------------------------------------------------------------------------

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok kind;
  std::string text;  // text, name, operator, or decoded string literal
  int line;
  int64_t i = 0;
  double f = 0;
};

// Jinja normalises template newlines to "\n".
std::string NormalizeNewlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    // keep_trailing_newline=False: jinja2 drops one newline at the very end of the template.
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
    if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
  }

  std::vector<Token> Run() {
    while (pos_ < src_.size()) {
      size_t start = pos_;
      size_t tag = FindTag(pos_);
      std::string_view text = src_.substr(start, tag - start);
      if (tag < src_.size()) {
        char kind = src_[tag + 1];
        char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
        if (mod == '-') {
          while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
        } else if (kind != '{' && mod != '+') {
          // lstrip_blocks: drop spaces between the line start and a block or comment tag.
          size_t nl = text.rfind('\n');
          size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
          bool line_start = l_pos > 0 || start == 0 || src_[start - 1] == '\n';
          if (line_start && l_pos < text.size() &&
              std::all_of(text.begin() + l_pos, text.end(), [](char c) { return IsSpace(c); })) {
            text = text.substr(0, l_pos);
          }
        }
      }
      if (!text.empty()) Push(Tok::kText, NormalizeNewlines(text));
      line_ += static_cast<int>(std::count(src_.begin() + start, src_.begin() + tag, '\n'));
      pos_ = tag;
      if (tag >= src_.size()) break;
      char kind = src_[tag + 1];
      pos_ += 2;
      if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) ++pos_;
      if (kind == '#') {
        size_t end = src_.find("#}", pos_);
        if (end == std::string_view::npos) Fail(line_, "unterminated comment");
        line_ += static_cast<int>(std::count(src_.begin() + pos_, src_.begin() + end, '\n'));
        char before = src_[end - 1];
        pos_ = end + 2;
        AfterBlockEnd(before);
        continue;
      }
      Push(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "");
      LexTag(kind == '{');
    }
    Push(Tok::kEof, "");
    return std::move(toks_);
  }

 private:
  size_t FindTag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  void AfterBlockEnd(char modifier) {
    if (modifier == '-') {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
    } else if (modifier != '+' && pos_ < src_.size()) {
      // trim_blocks: drop the first newline after a block or comment tag.
      if (src_[pos_] == '\n') {
        ++pos_;
        ++line_;
      } else if (src_[pos_] == '\r') {
        pos_ += (pos_ + 1 < src_.size() && src_[pos_ + 1] == '\n') ? 2 : 1;
        ++line_;
      }
    }
  }

  void Push(Tok kind, std::string text) { toks_.push_back(Token{kind, std::move(text), line_}); }

  void LexTag(bool var) {
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size())
        Fail(line_, var ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      std::string_view rest = src_.substr(pos_);
      char end_char = var ? '}' : '%';
      if (depth == 0) {
        for (std::string_view mod : {"-", "+", ""}) {
          if (var && mod == "+") continue;
          std::string end = std::string(mod) + end_char + "}";
          if (rest.substr(0, end.size()) == end) {
            pos_ += end.size();
            Push(var ? Tok::kVarEnd : Tok::kBlockEnd, "");
            if (!var) {
              AfterBlockEnd(mod.empty() ? '\0' : mod[0]);
            } else if (mod == "-") {
              AfterBlockEnd('-');
            }
            return;
          }
        }
      }
      char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
        Push(Tok::kName, std::string(rest.substr(0, n)));
        pos_ += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        LexNumber(rest);
      } else if (c == '\'' || c == '"') {
        LexString(rest);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
        std::string op;
        for (const char* o : kOps) {
          if (rest.substr(0, std::strlen(o)) == o) {
            op = o;
            break;
          }
        }
        if (op.empty()) Fail(line_, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        Push(Tok::kOp, op);
        pos_ += op.size();
      }
    }
  }

  void LexNumber(std::string_view rest) {
    size_t n = 0;
    bool is_float = false;
    std::string digits;
    auto take_digits = [&] {
      while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
        if (rest[n] != '_') digits += rest[n];
        ++n;
      }
    };
    take_digits();
    if (n + 1 < rest.size() && rest[n] == '.' && std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      digits += '.';
      ++n;
      take_digits();
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        digits += 'e';
        digits += rest.substr(n + 1, m - n - 1);
        n = m;
        take_digits();
      }
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, digits, line_};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
      if (r.ec != std::errc()) Fail(line_, "integer literal too large: " + digits);
    }
    toks_.push_back(t);
    pos_ += n;
  }

  void LexString(std::string_view rest) {
    char q = rest[0];
    std::string out;
    size_t n = 1;
    for (;; ++n) {
      if (n >= rest.size()) Fail(line_, "unterminated string literal");
      char c = rest[n];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (++n >= rest.size()) Fail(line_, "unterminated string literal");
      char e = rest[n];
      auto hex = [&](int len) {
        if (n + len >= rest.size()) Fail(line_, "truncated escape in string literal");
        uint32_t cp = 0;
        for (int k = 1; k <= len; ++k) {
          char h = rest[n + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) Fail(line_, "invalid escape in string literal");
          cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        n += len;
        if (cp > 0x10FFFF) Fail(line_, "invalid escape in string literal");
        unicode::AppendUtf8(cp, &out);
      };
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '0':
          out += '\0';
          break;
        case '\n':
          ++line_;
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        default:  // Python keeps unknown escapes as written
          out += '\\';
          out += e;
      }
    }
    Push(Tok::kString, NormalizeNewlines(out));
    pos_ += n + 1;
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> toks_;
};

// ---- AST -----------------------------------------------------------------------------------------

enum class NK {
  // expressions
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,
  kAttr,
  kItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNot,
  kNeg,
  kPos,
  kBinary,
  kAnd,
  kOr,
  kCompare,
  kCond,
  // statements
  kBody,
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kBreak,
  kContinue
};

}  // namespace

// Layout of kids by kind:
//   kAttr [obj] name; kItem [obj, key]; kSlice [obj, start?, stop?, step?]; kCall [callee, args...] + kwargs;
//   kFilter/kTest [operand, args...] + kwargs, name, negate (is not); kBinary [a, b] name=op;
//   kCompare [a, b, c...] ops; kCond [then, cond, else?]; kDict [k0, v0, k1, v1...];
//   kIf [cond0, body0, cond1, body1, ..., else_body?] (else body has a null cond before it);
//   kFor [target, iter, filter?, body, else?]; kSet [target, value]; kSetBlock [target, body, filter?];
//   kMacro [body, defaults...] name, params; kCallBlock [call, body] params; kFilterBlock [filter, body].
struct Node {
  NK kind;
  int line = 0;
  std::string name;
  Value lit;
  bool negate = false;
  std::vector<std::unique_ptr<Node>> kids;
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> kwargs;
  std::vector<std::string> ops;     // kCompare
  std::vector<std::string> params;  // kMacro
};

namespace {

using NodeP = std::unique_ptr<Node>;

NodeP MakeNode(NK kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

constexpr int kMaxParseDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  NodeP ParseTemplate() {
    auto body = ParseBody({});
    if (Cur().kind != Tok::kEof) Fail(Cur().line, "unexpected tag '" + Cur().text + "'");
    return body;
  }

 private:
  const Token& Cur() const { return t_[p_]; }
  const Token& Peek(int k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return Cur().kind == Tok::kOp && Cur().text == op; }
  bool IsName(const char* n) const { return Cur().kind == Tok::kName && Cur().text == n; }
  void Next() {
    if (p_ + 1 < t_.size()) ++p_;
  }
  void Expect(const char* op) {
    if (!IsOp(op)) Fail(Cur().line, std::string("expected '") + op + "', got '" + Describe() + "'");
    Next();
  }
  std::string Describe() const {
    switch (Cur().kind) {
      case Tok::kBlockEnd:
        return "%}";
      case Tok::kVarEnd:
        return "}}";
      case Tok::kEof:
        return "end of template";
      default:
        return Cur().text;
    }
  }
  std::string ExpectName() {
    if (Cur().kind != Tok::kName) Fail(Cur().line, "expected a name, got '" + Describe() + "'");
    std::string n = Cur().text;
    Next();
    return n;
  }
  void ExpectBlockEnd() {
    if (Cur().kind != Tok::kBlockEnd) Fail(Cur().line, "expected '%}', got '" + Describe() + "'");
    Next();
  }

  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* parser) : p(parser) {
      if (++p->depth_ > kMaxParseDepth) Fail(p->Cur().line, "template nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
  };

  // Parses statements until a block tag whose keyword is in `ends`; leaves Cur() at that keyword.
  NodeP ParseBody(const std::vector<std::string>& ends) {
    DepthGuard guard(this);
    auto body = MakeNode(NK::kBody, Cur().line);
    while (true) {
      const Token& tok = Cur();
      if (tok.kind == Tok::kEof) {
        if (!ends.empty()) Fail(tok.line, "unexpected end of template, expected '" + ends[0] + "'");
        return body;
      }
      if (tok.kind == Tok::kText) {
        auto n = MakeNode(NK::kText, tok.line);
        n->name = tok.text;
        body->kids.push_back(std::move(n));
        Next();
      } else if (tok.kind == Tok::kVarBegin) {
        Next();
        auto n = MakeNode(NK::kOutput, tok.line);
        n->kids.push_back(ParseTuple());
        if (Cur().kind != Tok::kVarEnd) Fail(Cur().line, "expected '}}', got '" + Describe() + "'");
        Next();
        body->kids.push_back(std::move(n));
      } else if (tok.kind == Tok::kBlockBegin) {
        const Token& kw = Peek();
        if (kw.kind == Tok::kName && std::find(ends.begin(), ends.end(), kw.text) != ends.end()) {
          Next();
          return body;
        }
        Next();
        body->kids.push_back(ParseStatement());
      } else {
        Fail(tok.line, "unexpected '" + Describe() + "'");
      }
    }
  }

  NodeP ParseStatement() {
    int line = Cur().line;
    std::string kw = ExpectName();
    if (kw == "if") return ParseIf(line);
    if (kw == "for") return ParseFor(line);
    if (kw == "set") return ParseSet(line);
    if (kw == "macro") return ParseMacro(line);
    if (kw == "call") return ParseCallBlock(line);
    if (kw == "filter") return ParseFilterBlock(line);
    if (kw == "break" || kw == "continue") {
      ExpectBlockEnd();
      return MakeNode(kw == "break" ? NK::kBreak : NK::kContinue, line);
    }
    Fail(line, "unsupported or unexpected tag '" + kw + "'");
  }

  NodeP ParseIf(int line) {
    auto n = MakeNode(NK::kIf, line);
    n->kids.push_back(ParseTuple());
    ExpectBlockEnd();
    while (true) {
      n->kids.push_back(ParseBody({"elif", "else", "endif"}));
      std::string kw = ExpectName();
      if (kw == "elif") {
        n->kids.push_back(ParseTuple());
        ExpectBlockEnd();
      } else if (kw == "else") {
        ExpectBlockEnd();
        n->kids.push_back(nullptr);
        n->kids.push_back(ParseBody({"endif"}));
        ExpectName();
        ExpectBlockEnd();
        return n;
      } else {
        ExpectBlockEnd();
        return n;
      }
    }
  }

  NodeP ParseAssignTarget() {
    int line = Cur().line;
    auto first = ParseTargetAtom();
    if (!IsOp(",")) return first;
    auto tuple = MakeNode(NK::kTuple, line);
    tuple->kids.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Cur().kind != Tok::kName && !IsOp("(")) break;
      tuple->kids.push_back(ParseTargetAtom());
    }
    return tuple;
  }

  NodeP ParseTargetAtom() {
    int line = Cur().line;
    if (IsOp("(")) {
      Next();
      auto t = ParseAssignTarget();
      Expect(")");
      return t;
    }
    auto n = MakeNode(NK::kName, line);
    n->name = ExpectName();
    if (IsOp(".")) {
      Next();
      auto attr = MakeNode(NK::kAttr, line);
      attr->kids.push_back(std::move(n));
      attr->name = ExpectName();
      return attr;
    }
    return n;
  }

  NodeP ParseFor(int line) {
    auto n = MakeNode(NK::kFor, line);
    n->kids.push_back(ParseAssignTarget());
    if (!IsName("in")) Fail(Cur().line, "expected 'in' in for loop");
    Next();
    n->kids.push_back(ParseTuple(/*with_condexpr=*/false));
    if (IsName("if")) {
      Next();
      n->kids.push_back(ParseTuple());
    } else {
      n->kids.push_back(nullptr);
    }
    if (IsName("recursive")) Fail(Cur().line, "recursive for loops are not supported");
    ExpectBlockEnd();
    n->kids.push_back(ParseBody({"else", "endfor"}));
    if (ExpectName() == "else") {
      ExpectBlockEnd();
      n->kids.push_back(ParseBody({"endfor"}));
      ExpectName();
    } else {
      n->kids.push_back(nullptr);
    }
    ExpectBlockEnd();
    return n;
  }

  NodeP ParseSet(int line) {
    auto target = ParseAssignTarget();
    if (IsOp("=")) {
      Next();
      auto n = MakeNode(NK::kSet, line);
      n->kids.push_back(std::move(target));
      n->kids.push_back(ParseTuple());
      ExpectBlockEnd();
      return n;
    }
    auto n = MakeNode(NK::kSetBlock, line);
    n->kids.push_back(std::move(target));
    NodeP filter;
    if (IsOp("|")) filter = ParseFilterChain(nullptr);
    ExpectBlockEnd();
    n->kids.push_back(ParseBody({"endset"}));
    ExpectName();
    ExpectBlockEnd();
    n->kids.push_back(std::move(filter));
    return n;
  }

  NodeP ParseMacro(int line) {
    auto n = MakeNode(NK::kMacro, line);
    n->name = ExpectName();
    Expect("(");
    std::vector<NodeP> defaults;
    while (!IsOp(")")) {
      if (!n->params.empty()) Expect(",");
      if (IsOp(")")) break;
      n->params.push_back(ExpectName());
      if (IsOp("=")) {
        Next();
        defaults.push_back(ParseExpression());
      } else {
        if (!defaults.empty() && defaults.back()) Fail(Cur().line, "non-default argument follows default argument");
        defaults.push_back(nullptr);
      }
    }
    Next();
    ExpectBlockEnd();
    n->kids.push_back(ParseBody({"endmacro"}));
    ExpectName();
    if (Cur().kind == Tok::kName) Next();
    ExpectBlockEnd();
    for (auto& d : defaults) n->kids.push_back(std::move(d));
    return n;
  }

  NodeP ParseCallBlock(int line) {
    auto n = MakeNode(NK::kCallBlock, line);
    if (IsOp("(")) Fail(line, "call blocks with caller arguments are not supported");
    auto call = ParseExpression();
    if (call->kind != NK::kCall) Fail(line, "expected a call in call block");
    n->kids.push_back(std::move(call));
    ExpectBlockEnd();
    n->kids.push_back(ParseBody({"endcall"}));
    ExpectName();
    ExpectBlockEnd();
    return n;
  }

  NodeP ParseFilterBlock(int line) {
    auto n = MakeNode(NK::kFilterBlock, line);
    Token pipe{Tok::kOp, "|", line};
    t_.insert(t_.begin() + static_cast<long>(p_), pipe);  // parse "filter a|b" as the chain "|a|b"
    n->kids.push_back(ParseFilterChain(nullptr));
    ExpectBlockEnd();
    n->kids.push_back(ParseBody({"endfilter"}));
    ExpectName();
    ExpectBlockEnd();
    return n;
  }

  // ---- expressions ----

  NodeP ParseTuple(bool with_condexpr = true) {
    int line = Cur().line;
    auto first = with_condexpr ? ParseExpression() : ParseOr();
    if (!IsOp(",")) return first;
    auto t = MakeNode(NK::kTuple, line);
    t->kids.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Cur().kind == Tok::kBlockEnd || Cur().kind == Tok::kVarEnd || IsOp(")") || IsName("in")) break;
      t->kids.push_back(with_condexpr ? ParseExpression() : ParseOr());
    }
    return t;
  }

  NodeP ParseExpression() {
    DepthGuard guard(this);
    int line = Cur().line;
    auto expr = ParseOr();
    while (IsName("if")) {
      Next();
      auto n = MakeNode(NK::kCond, line);
      n->kids.push_back(std::move(expr));
      n->kids.push_back(ParseOr());
      if (IsName("else")) {
        Next();
        n->kids.push_back(ParseExpression());
      } else {
        n->kids.push_back(nullptr);
      }
      expr = std::move(n);
    }
    return expr;
  }

  NodeP ParseOr() {
    auto left = ParseAnd();
    while (IsName("or")) {
      auto n = MakeNode(NK::kOr, Cur().line);
      Next();
      n->kids.push_back(std::move(left));
      n->kids.push_back(ParseAnd());
      left = std::move(n);
    }
    return left;
  }

  NodeP ParseAnd() {
    auto left = ParseNot();
    while (IsName("and")) {
      auto n = MakeNode(NK::kAnd, Cur().line);
      Next();
      n->kids.push_back(std::move(left));
      n->kids.push_back(ParseNot());
      left = std::move(n);
    }
    return left;
  }

  NodeP ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      auto n = MakeNode(NK::kNot, Cur().line);
      Next();
      n->kids.push_back(ParseNot());
      return n;
    }
    return ParseCompare();
  }

  NodeP ParseCompare() {
    int line = Cur().line;
    auto first = ParseMath1();
    NodeP cmp;
    while (true) {
      std::string op;
      if (Cur().kind == Tok::kOp && (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">="))) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().kind == Tok::kName && Peek().text == "in") {
        op = "not in";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = MakeNode(NK::kCompare, line);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  NodeP Binary(const std::string& op, NodeP a, NodeP b, int line) {
    auto n = MakeNode(NK::kBinary, line);
    n->name = op;
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }

  NodeP ParseMath1() {
    auto left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Cur().text;
      int line = Cur().line;
      Next();
      left = Binary(op, std::move(left), ParseConcat(), line);
    }
    return left;
  }

  NodeP ParseConcat() {
    auto left = ParseMath2();
    while (IsOp("~")) {
      int line = Cur().line;
      Next();
      left = Binary("~", std::move(left), ParseMath2(), line);
    }
    return left;
  }

  NodeP ParseMath2() {
    auto left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Cur().text;
      int line = Cur().line;
      Next();
      left = Binary(op, std::move(left), ParsePow(), line);
    }
    return left;
  }

  NodeP ParsePow() {
    auto left = ParseUnary(true);
    while (IsOp("**")) {
      int line = Cur().line;
      Next();
      left = Binary("**", std::move(left), ParseUnary(true), line);
    }
    return left;
  }

  NodeP ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    int line = Cur().line;
    NodeP node;
    if (IsOp("-") || IsOp("+")) {
      node = MakeNode(IsOp("-") ? NK::kNeg : NK::kPos, line);
      Next();
      node->kids.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterChain(std::move(node));
    return node;
  }

  NodeP ParsePrimary() {
    const Token& tok = Cur();
    int line = tok.line;
    auto lit = [&](Value v) {
      auto n = MakeNode(NK::kLiteral, line);
      n->lit = std::move(v);
      Next();
      return n;
    };
    switch (tok.kind) {
      case Tok::kName: {
        const std::string& s = tok.text;
        if (s == "true" || s == "True") return lit(Value::Bool(true));
        if (s == "false" || s == "False") return lit(Value::Bool(false));
        if (s == "none" || s == "None") return lit(Value::None());
        auto n = MakeNode(NK::kName, line);
        n->name = s;
        Next();
        return n;
      }
      case Tok::kString: {
        std::string s = tok.text;
        Next();
        while (Cur().kind == Tok::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Next();
        }
        auto n = MakeNode(NK::kLiteral, line);
        n->lit = Value::Text(std::move(s));
        return n;
      }
      case Tok::kInt:
        return lit(Value::Int(tok.i));
      case Tok::kFloat:
        return lit(Value::Float(tok.f));
      case Tok::kOp:
        if (tok.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return MakeNode(NK::kTuple, line);
          }
          auto first = ParseExpression();
          if (IsOp(")")) {
            Next();
            return first;
          }
          auto t = MakeNode(NK::kTuple, line);
          t->kids.push_back(std::move(first));
          while (IsOp(",")) {
            Next();
            if (IsOp(")")) break;
            t->kids.push_back(ParseExpression());
          }
          Expect(")");
          return t;
        }
        if (tok.text == "[") {
          Next();
          auto n = MakeNode(NK::kList, line);
          while (!IsOp("]")) {
            if (!n->kids.empty()) Expect(",");
            if (IsOp("]")) break;
            n->kids.push_back(ParseExpression());
          }
          Next();
          return n;
        }
        if (tok.text == "{") {
          Next();
          auto n = MakeNode(NK::kDict, line);
          while (!IsOp("}")) {
            if (!n->kids.empty()) Expect(",");
            if (IsOp("}")) break;
            n->kids.push_back(ParseExpression());
            Expect(":");
            n->kids.push_back(ParseExpression());
          }
          Next();
          return n;
        }
        break;
      default:
        break;
    }
    Fail(line, "unexpected '" + Describe() + "'");
  }

  void ParseArgs(Node* n) {
    Expect("(");
    while (!IsOp(")")) {
      if (n->kids.size() > 1 || !n->kwargs.empty())  // kids[0] is the callee or operand
        Expect(",");
      if (IsOp(")")) break;
      if (IsOp("*")) Fail(Cur().line, "*args and **kwargs in calls are not supported");
      if (Cur().kind == Tok::kName && Peek().kind == Tok::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        n->kwargs.emplace_back(key, ParseExpression());
      } else {
        if (!n->kwargs.empty()) Fail(Cur().line, "positional argument follows keyword argument");
        n->kids.push_back(ParseExpression());
      }
    }
    Next();
  }

  NodeP ParsePostfix(NodeP node) {
    while (true) {
      int line = Cur().line;
      if (IsOp(".")) {
        Next();
        if (Cur().kind == Tok::kInt) {
          auto n = MakeNode(NK::kItem, line);
          n->kids.push_back(std::move(node));
          auto idx = MakeNode(NK::kLiteral, line);
          idx->lit = Value::Int(Cur().i);
          n->kids.push_back(std::move(idx));
          Next();
          node = std::move(n);
          continue;
        }
        auto n = MakeNode(NK::kAttr, line);
        n->kids.push_back(std::move(node));
        n->name = ExpectName();
        node = std::move(n);
      } else if (IsOp("[")) {
        Next();
        node = ParseSubscript(std::move(node), line);
      } else if (IsOp("(")) {
        auto n = MakeNode(NK::kCall, line);
        n->kids.push_back(std::move(node));
        ParseArgs(n.get());
        node = std::move(n);
      } else {
        return node;
      }
    }
  }

  NodeP ParseSubscript(NodeP obj, int line) {
    NodeP parts[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        if (++colons > 2) Fail(line, "invalid slice");
        Next();
        continue;
      }
      if (parts[colons]) Fail(line, "invalid subscript");
      parts[colons] = ParseExpression();
    }
    Next();
    if (colons == 0) {
      if (!parts[0]) Fail(line, "empty subscript");
      auto n = MakeNode(NK::kItem, line);
      n->kids.push_back(std::move(obj));
      n->kids.push_back(std::move(parts[0]));
      return n;
    }
    auto n = MakeNode(NK::kSlice, line);
    n->kids.push_back(std::move(obj));
    for (auto& p : parts) n->kids.push_back(std::move(p));
    return n;
  }

  NodeP ParseFilterChain(NodeP node) {
    while (true) {
      int line = Cur().line;
      if (IsOp("|")) {
        Next();
        auto n = MakeNode(NK::kFilter, line);
        n->name = ExpectName();
        n->kids.push_back(std::move(node));
        if (IsOp("(")) ParseArgs(n.get());
        node = std::move(n);
      } else if (IsName("is")) {
        Next();
        auto n = MakeNode(NK::kTest, line);
        if (IsName("not")) {
          n->negate = true;
          Next();
        }
        n->name = ExpectName();
        n->kids.push_back(std::move(node));
        if (IsOp("(")) {
          ParseArgs(n.get());
        } else if ((Cur().kind == Tok::kName && !(IsName("else") || IsName("or") || IsName("and") || IsName("is") ||
                                                  IsName("in") || IsName("not") || IsName("if"))) ||
                   Cur().kind == Tok::kString || Cur().kind == Tok::kInt || Cur().kind == Tok::kFloat || IsOp("[") ||
                   IsOp("{")) {
          n->kids.push_back(ParsePostfix(ParsePrimary()));
        }
        node = std::move(n);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
};

// ---- Rendering -------------------------------------------------------------------------------------

enum class Flow { kNormal, kBreak, kContinue };

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

bool IsStr(const Value& v) {
  return v.k == Value::kStr;
}

// Python's str.strip family on UTF-8; chars == nullptr strips whitespace.
Str StripStr(const Str& s, const std::string* chars, bool left, bool right) {
  auto starts = CodePointStarts(s.s);
  auto cp_at = [&](size_t idx) {
    size_t b = starts[idx], e = idx + 1 < starts.size() ? starts[idx + 1] : s.s.size();
    return std::string_view(s.s).substr(b, e - b);
  };
  auto strip_it = [&](size_t idx) {
    std::string_view cp = cp_at(idx);
    if (!chars) return cp.size() == 1 && IsSpace(cp[0]);
    auto cstarts = CodePointStarts(*chars);
    for (size_t k = 0; k < cstarts.size(); ++k) {
      size_t e = k + 1 < cstarts.size() ? cstarts[k + 1] : chars->size();
      if (std::string_view(*chars).substr(cstarts[k], e - cstarts[k]) == cp) return true;
    }
    return false;
  };
  size_t lo = 0, hi = starts.size();
  if (left)
    while (lo < hi && strip_it(lo)) ++lo;
  if (right)
    while (hi > lo && strip_it(hi - 1)) --hi;
  size_t b = lo < starts.size() ? starts[lo] : s.s.size();
  size_t e = hi < starts.size() ? starts[hi] : s.s.size();
  return s.Sub(b, e - b);
}

// ASCII case mapping only: chat templates apply these to role names and scaffolding.
Str MapCase(const Str& s, const std::function<char(char, size_t)>& f) {
  Str r = s;
  for (size_t i = 0; i < r.s.size(); ++i) r.s[i] = f(r.s[i], i);
  return r;
}
char Up(char c) {
  return static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
}
char Low(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}
bool IsAlpha(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || (static_cast<unsigned char>(c) & 0x80);
}

Str Replace(const Str& s, const Str& old, const Str& rep, int64_t count) {
  Str out;
  size_t pos = 0;
  int64_t done = 0;
  if (old.s.empty()) {
    // Python inserts the replacement between every code point and at both ends.
    auto starts = CodePointStarts(s.s);
    for (size_t k = 0; k <= starts.size(); ++k) {
      if (count < 0 || done < count) {
        out.Append(rep);
        ++done;
      }
      if (k < starts.size()) {
        size_t e = k + 1 < starts.size() ? starts[k + 1] : s.s.size();
        out.Append(s.Sub(starts[k], e - starts[k]));
      }
    }
    return out;
  }
  while (count < 0 || done < count) {
    size_t hit = s.s.find(old.s, pos);
    if (hit == std::string::npos) break;
    out.Append(s.Sub(pos, hit - pos));
    // Replacing request bytes yields request bytes: data must not turn into scaffolding.
    bool data = s.Sub(hit, old.s.size()).AnyData();
    Str r = rep;
    if (data) r.m.assign(r.s.size(), 1);
    out.Append(r);
    pos = hit + old.s.size();
    ++done;
  }
  out.Append(s.Sub(pos, std::string::npos));
  return out;
}

std::vector<Str> Split(const Str& s, const Str* sep, int64_t maxsplit, bool from_right) {
  std::vector<Str> parts;
  if (!sep) {
    // Whitespace split: runs of whitespace separate, leading/trailing ignored.
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0, n = s.s.size();
    while (i < n) {
      while (i < n && IsSpace(s.s[i])) ++i;
      if (i >= n) break;
      size_t b = i;
      while (i < n && !IsSpace(s.s[i])) ++i;
      words.emplace_back(b, i);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        size_t b = words[maxsplit].first;
        words.resize(maxsplit);
        size_t e = n;
        while (e > b && IsSpace(s.s[e - 1])) --e;
        words.emplace_back(b, e);
      } else {
        size_t keep_from = words.size() - maxsplit;
        size_t e = words[keep_from - 1].second;
        size_t b = 0;
        while (b < e && IsSpace(s.s[b])) ++b;
        words.erase(words.begin(), words.begin() + keep_from);
        words.insert(words.begin(), {b, e});
      }
    }
    for (auto [b, e] : words) parts.push_back(s.Sub(b, e - b));
    return parts;
  }
  if (sep->s.empty()) Fail(0, "empty separator");
  std::vector<size_t> hits;
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(hits.size()) < maxsplit) {
      size_t h = s.s.find(sep->s, pos);
      if (h == std::string::npos) break;
      hits.push_back(h);
      pos = h + sep->s.size();
    }
  } else {
    size_t end = s.s.size();
    while ((maxsplit < 0 || static_cast<int64_t>(hits.size()) < maxsplit) && end >= sep->s.size()) {
      size_t h = s.s.rfind(sep->s, end - sep->s.size());
      if (h == std::string::npos) break;
      hits.insert(hits.begin(), h);
      end = h;
    }
  }
  size_t pos = 0;
  for (size_t h : hits) {
    parts.push_back(s.Sub(pos, h - pos));
    pos = h + sep->s.size();
  }
  parts.push_back(s.Sub(pos, std::string::npos));
  return parts;
}

class Renderer {
 public:
  Renderer(const Options& opts) : opts_(opts) {}
  ~Renderer() {
    for (const std::shared_ptr<Dict>& d : namespaces_) d->items.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  Output Run(const Node* root, const nlohmann::ordered_json& context) {
    frames_.emplace_back();
    for (const char* g : {"range", "namespace", "dict", "raise_exception", "strftime_now"}) {
      Callable c;
      c.name = g;
      frames_[0][g] = Value::Func(std::move(c));
    }
    frames_.emplace_back();
    if (!context.is_object()) Fail(0, "the context must be a JSON object");
    for (const auto& [k, v] : context.items()) frames_[1][k] = FromJson(v, 0);
    Str out;
    out_ = &out;
    Exec(root);
    Output o;
    o.text = std::move(out.s);
    for (size_t i = 0; i < out.m.size();) {
      if (!out.m[i]) {
        ++i;
        continue;
      }
      size_t b = i;
      while (i < out.m.size() && out.m[i]) ++i;
      o.data.push_back(TextSpan{b, i});
    }
    return o;
  }

 private:
  void Step(int line) {
    if (++steps_ > opts_.max_steps)
      Fail(line, "template exceeded " + std::to_string(opts_.max_steps) + " evaluation steps");
  }
  void CheckSize(size_t n, int line) const {
    if (n > opts_.max_output_bytes) Fail(line, "output exceeds " + std::to_string(opts_.max_output_bytes) + " bytes");
  }
  struct DepthGuard {
    Renderer* r;
    DepthGuard(Renderer* renderer, int line) : r(renderer) {
      if (++r->depth_ > r->opts_.max_depth)
        Fail(line, "template recursion deeper than " + std::to_string(r->opts_.max_depth));
    }
    ~DepthGuard() { --r->depth_; }
  };

  void Write(const Str& s, int line) {
    out_->Append(s);
    CheckSize(out_->s.size(), line);
  }

  // ---- variables ----

  Value Lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > base_;) {
      auto it = frames_[i].find(name);
      if (it != frames_[i].end()) return it->second;
    }
    for (size_t i : {size_t{1}, size_t{0}}) {
      if (i >= base_) continue;
      auto it = frames_[i].find(name);
      if (it != frames_[i].end()) return it->second;
    }
    return Value::Undef("'" + name + "' is undefined");
  }

  void Assign(const Node* target, const Value& v) {
    if (target->kind == NK::kName) {
      frames_.back()[target->name] = v;
    } else if (target->kind == NK::kAttr) {
      Value obj = Eval(target->kids[0].get());
      if (obj.k != Value::kDict || !obj.d->is_namespace || obj.d->is_loop)
        Fail(target->line, "can only assign attributes of namespace objects");
      obj.d->Set(Value::Text(target->name), v);
    } else if (target->kind == NK::kTuple) {
      std::vector<Value> items = Iterate(v, target->line);
      if (items.size() != target->kids.size())
        Fail(target->line,
             "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(target->kids.size()));
      for (size_t i = 0; i < items.size(); ++i) Assign(target->kids[i].get(), items[i]);
    } else {
      Fail(target->line, "cannot assign to this expression");
    }
  }

  std::vector<Value> Iterate(const Value& v, int line) {
    switch (v.k) {
      case Value::kUndef:
        return {};
      case Value::kList:
        if (v.generator_used) {
          if (*v.generator_used) return {};
          *v.generator_used = true;
        }
        return *v.l;
      case Value::kDict: {
        std::vector<Value> keys;
        for (const auto& kv : v.d->items) keys.push_back(kv.first);
        return keys;
      }
      case Value::kStr: {
        std::vector<Value> chars;
        auto starts = CodePointStarts(v.s->s);
        for (size_t i = 0; i < starts.size(); ++i) {
          size_t e = i + 1 < starts.size() ? starts[i + 1] : v.s->s.size();
          chars.push_back(Value::String(v.s->Sub(starts[i], e - starts[i])));
        }
        return chars;
      }
      default:
        Fail(line, std::string("'") + TypeName(v) + "' object is not iterable");
    }
  }

  // ---- statements ----

  Flow ExecBody(const Node* body) {
    for (const auto& k : body->kids) {
      Flow f = Exec(k.get());
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow Exec(const Node* n) {
    Step(n->line);
    switch (n->kind) {
      case NK::kBody:
        return ExecBody(n);
      case NK::kText:
        Write(MakeStr(n->name, false), n->line);
        return Flow::kNormal;
      case NK::kOutput: {
        Value v = Eval(n->kids[0].get());
        Write(ToStr(v), n->line);
        return Flow::kNormal;
      }
      case NK::kIf:
        for (size_t i = 0; i + 1 < n->kids.size(); i += 2) {
          if (!n->kids[i] || Truthy(Eval(n->kids[i].get()))) return ExecBody(n->kids[i + 1].get());
        }
        return Flow::kNormal;
      case NK::kFor:
        return ExecFor(n);
      case NK::kSet:
        Assign(n->kids[0].get(), Eval(n->kids[1].get()));
        return Flow::kNormal;
      case NK::kSetBlock: {
        Value v = Value::String(Capture(n->kids[1].get()));
        if (n->kids[2]) v = ApplyFilterChain(n->kids[2].get(), v);
        Assign(n->kids[0].get(), v);
        return Flow::kNormal;
      }
      case NK::kMacro: {
        Callable c;
        c.name = n->name;
        c.macro = n;
        frames_.back()[n->name] = Value::Func(std::move(c));
        return Flow::kNormal;
      }
      case NK::kCallBlock: {
        const Node* call = n->kids[0].get();
        Value callee = Eval(call->kids[0].get());
        auto [args, kwargs] = EvalArgs(call);
        Callable caller;
        caller.name = "caller";
        caller.caller_body = n->kids[1].get();
        caller.caller_frame = frames_.size();
        kwargs.emplace_back("caller", Value::Func(std::move(caller)));
        Write(ToStr(CallValue(callee, args, kwargs, n->line)), n->line);
        return Flow::kNormal;
      }
      case NK::kFilterBlock: {
        Value v = Value::String(Capture(n->kids[1].get()));
        Write(ToStr(ApplyFilterChain(n->kids[0].get(), v)), n->line);
        return Flow::kNormal;
      }
      case NK::kBreak:
        return Flow::kBreak;
      case NK::kContinue:
        return Flow::kContinue;
      default:
        Fail(n->line, "internal error: not a statement");
    }
  }

  Str Capture(const Node* body) {
    Str buf;
    Str* saved = out_;
    out_ = &buf;
    ExecBody(body);
    out_ = saved;
    return buf;
  }

  // Applies a chain of kFilter nodes whose innermost operand is null to v.
  Value ApplyFilterChain(const Node* chain, const Value& v) {
    if (!chain) return v;
    Value in = chain->kids[0] ? ApplyFilterChain(chain->kids[0].get(), v) : v;
    auto [args, kwargs] = EvalArgs(chain);
    return Filter(chain->name, in, args, kwargs, chain->line);
  }

  Flow ExecFor(const Node* n) {
    const Node* target = n->kids[0].get();
    std::vector<Value> items = Iterate(Eval(n->kids[1].get()), n->line);
    frames_.emplace_back();
    if (n->kids[2]) {
      std::vector<Value> kept;
      for (const auto& item : items) {
        Step(n->line);
        Assign(target, item);
        if (Truthy(Eval(n->kids[2].get()))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      Step(n->line);
      Assign(target, items[i]);
      Dict loop;
      auto set = [&](const char* k, Value v) { loop.items.emplace_back(Value::Text(k), std::move(v)); };
      set("index", Value::Int(i + 1));
      set("index0", Value::Int(i));
      set("revindex", Value::Int(len - i));
      set("revindex0", Value::Int(len - i - 1));
      set("first", Value::Bool(i == 0));
      set("last", Value::Bool(i == len - 1));
      set("length", Value::Int(len));
      set("depth", Value::Int(1));
      set("depth0", Value::Int(0));
      if (i > 0) set("previtem", items[i - 1]);
      if (i + 1 < len) set("nextitem", items[i + 1]);
      Value loop_value = MakeDict(std::move(loop));
      loop_value.d->is_namespace = true;  // attribute access only, prints like an object
      loop_value.d->is_loop = true;
      frames_.back()["loop"] = loop_value;
      if (ExecBody(n->kids[3].get()) == Flow::kBreak) break;
    }
    if (len == 0 && n->kids[4]) ExecBody(n->kids[4].get());
    frames_.pop_back();
    return Flow::kNormal;
  }

  // ---- expressions ----

  std::pair<Args, Kwargs> EvalArgs(const Node* n) {
    Args args;
    for (size_t i = 1; i < n->kids.size(); ++i) args.push_back(Eval(n->kids[i].get()));
    Kwargs kwargs;
    for (const auto& [k, v] : n->kwargs) kwargs.emplace_back(k, Eval(v.get()));
    return {std::move(args), std::move(kwargs)};
  }

  Value Eval(const Node* n) {
    Step(n->line);
    DepthGuard guard(this, n->line);
    switch (n->kind) {
      case NK::kLiteral:
        return n->lit;
      case NK::kName:
        return Lookup(n->name);
      case NK::kList:
      case NK::kTuple: {
        List l;
        for (const auto& k : n->kids) l.push_back(Eval(k.get()));
        Value v = Value::MakeList(std::move(l));
        v.tuple = n->kind == NK::kTuple;
        return v;
      }
      case NK::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < n->kids.size(); i += 2) d.Set(Eval(n->kids[i].get()), Eval(n->kids[i + 1].get()));
        return MakeDict(std::move(d));
      }
      case NK::kAttr:
        return GetAttr(Eval(n->kids[0].get()), n->name, n->line);
      case NK::kItem:
        return GetItem(Eval(n->kids[0].get()), Eval(n->kids[1].get()), n->line);
      case NK::kSlice:
        return EvalSlice(n);
      case NK::kCall: {
        Value callee = Eval(n->kids[0].get());
        auto [args, kwargs] = EvalArgs(n);
        return CallValue(callee, args, kwargs, n->line);
      }
      case NK::kFilter: {
        Value in = Eval(n->kids[0].get());
        auto [args, kwargs] = EvalArgs(n);
        return Filter(n->name, in, args, kwargs, n->line);
      }
      case NK::kTest: {
        Value in = Eval(n->kids[0].get());
        auto [args, kwargs] = EvalArgs(n);
        bool r = Test(n->name, in, args, n->line);
        return Value::Bool(n->negate ? !r : r);
      }
      case NK::kNot:
        return Value::Bool(!Truthy(Eval(n->kids[0].get())));
      case NK::kNeg:
      case NK::kPos: {
        Value v = Eval(n->kids[0].get());
        if (!v.IsNum())
          Fail(n->line, std::string("bad operand type for unary ") + (n->kind == NK::kNeg ? "-" : "+") + ": '" +
                            TypeName(v) + "'");
        if (n->kind == NK::kPos) return v.k == Value::kBool ? Value::Int(v.IntVal(), v.data) : v;
        if (v.k == Value::kFloat) return Value::Float(-v.f, v.data);
        if (v.IntVal() == INT64_MIN) Fail(n->line, "integer overflow");
        return Value::Int(-v.IntVal(), v.data);
      }
      case NK::kAnd: {
        Value a = Eval(n->kids[0].get());
        return Truthy(a) ? Eval(n->kids[1].get()) : a;
      }
      case NK::kOr: {
        Value a = Eval(n->kids[0].get());
        return Truthy(a) ? a : Eval(n->kids[1].get());
      }
      case NK::kCompare: {
        Value left = Eval(n->kids[0].get());
        for (size_t i = 0; i < n->ops.size(); ++i) {
          Value right = Eval(n->kids[i + 1].get());
          if (!Compare(n->ops[i], left, right, n->line)) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case NK::kCond:
        if (Truthy(Eval(n->kids[1].get()))) return Eval(n->kids[0].get());
        return n->kids[2] ? Eval(n->kids[2].get()) : Value::Undef("the inline if expression had no else and was false");
      case NK::kBinary:
        return Binary(n->name, Eval(n->kids[0].get()), Eval(n->kids[1].get()), n->line);
      default:
        Fail(n->line, "internal error: not an expression");
    }
  }

  [[noreturn]] void FailUndefined(const Value& v, int line) { Fail(line, v.undef_msg); }

  bool Contains(const Value& container, const Value& item, int line) {
    switch (container.k) {
      case Value::kStr:
        if (!IsStr(item))
          Fail(line, std::string("'in <string>' requires string as left operand, not ") + TypeName(item));
        return container.s->s.find(item.s->s) != std::string::npos;
      case Value::kList:
        for (const auto& e : *container.l)
          if (Equal(e, item)) return true;
        return false;
      case Value::kDict:
        return container.d->Find(item) != nullptr;
      case Value::kUndef:
        return false;
      default:
        Fail(line, std::string("argument of type '") + TypeName(container) + "' is not iterable");
    }
  }

  int Order(const Value& a, const Value& b, const std::string& op, int line) {
    if (a.IsNum() && b.IsNum()) {
      if (a.k == Value::kFloat || b.k == Value::kFloat) return a.Num() < b.Num() ? -1 : a.Num() > b.Num() ? 1 : 0;
      return a.IntVal() < b.IntVal() ? -1 : a.IntVal() > b.IntVal() ? 1 : 0;
    }
    if (IsStr(a) && IsStr(b)) return a.s->s.compare(b.s->s) < 0 ? -1 : a.s->s == b.s->s ? 0 : 1;
    if (a.k == Value::kList && b.k == Value::kList) {
      for (size_t i = 0; i < a.l->size() && i < b.l->size(); ++i) {
        if (Equal((*a.l)[i], (*b.l)[i])) continue;
        return Order((*a.l)[i], (*b.l)[i], op, line);
      }
      return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
    }
    if (a.k == Value::kUndef) FailUndefined(a, line);
    if (b.k == Value::kUndef) FailUndefined(b, line);
    Fail(line, "'" + op + "' not supported between instances of '" + TypeName(a) + "' and '" + TypeName(b) + "'");
  }

  bool Compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in") return Contains(b, a, line);
    if (op == "not in") return !Contains(b, a, line);
    int c = Order(a, b, op, line);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  Value Repeat(const Value& seq, int64_t times, int line) {
    if (times < 0) times = 0;
    if (IsStr(seq)) {
      if (seq.s->s.size() && static_cast<uint64_t>(times) > opts_.max_output_bytes / seq.s->s.size())
        Fail(line, "string repetition exceeds " + std::to_string(opts_.max_output_bytes) + " bytes");
      Str r;
      for (int64_t i = 0; i < times; ++i) r.Append(*seq.s);
      return Value::String(std::move(r));
    }
    if (seq.l->size() && static_cast<uint64_t>(times) > opts_.max_output_bytes / seq.l->size())
      Fail(line, "list repetition too large");
    List r;
    for (int64_t i = 0; i < times; ++i) r.insert(r.end(), seq.l->begin(), seq.l->end());
    return Value::MakeList(std::move(r));
  }

  Value Binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") {
      Str r = ToStr(a);
      r.Append(ToStr(b));
      CheckSize(r.s.size(), line);
      return Value::String(std::move(r));
    }
    if (a.k == Value::kUndef) FailUndefined(a, line);
    if (b.k == Value::kUndef) FailUndefined(b, line);
    bool data = a.data || b.data;
    if (op == "+") {
      if (IsStr(a) && IsStr(b)) {
        Str r = *a.s;
        r.Append(*b.s);
        CheckSize(r.s.size(), line);
        return Value::String(std::move(r));
      }
      if (a.k == Value::kList && b.k == Value::kList && !a.generator_used && !b.generator_used) {
        List r = *a.l;
        r.insert(r.end(), b.l->begin(), b.l->end());
        return Value::MakeList(std::move(r));
      }
      if (IsStr(a)) Fail(line, std::string("can only concatenate str (not \"") + TypeName(b) + "\") to str");
      if (a.k == Value::kList)
        Fail(line, std::string("can only concatenate list (not \"") + TypeName(b) + "\") to list");
    }
    if (op == "*") {
      if ((IsStr(a) || a.k == Value::kList) && (b.k == Value::kInt || b.k == Value::kBool))
        return Repeat(a, b.IntVal(), line);
      if ((IsStr(b) || b.k == Value::kList) && (a.k == Value::kInt || a.k == Value::kBool))
        return Repeat(b, a.IntVal(), line);
    }
    if (op == "%" && IsStr(a)) Fail(line, "printf-style string formatting is not supported");
    if (!a.IsNum() || !b.IsNum())
      Fail(line, "unsupported operand type(s) for " + op + ": '" + TypeName(a) + "' and '" + TypeName(b) + "'");
    bool fl = a.k == Value::kFloat || b.k == Value::kFloat;
    if (op == "/") {
      if (b.Num() == 0) Fail(line, "division by zero");
      return Value::Float(a.Num() / b.Num(), data);
    }
    if (fl) {
      double x = a.Num(), y = b.Num();
      if (op == "+") return Value::Float(x + y, data);
      if (op == "-") return Value::Float(x - y, data);
      if (op == "*") return Value::Float(x * y, data);
      if (op == "**") return Value::Float(std::pow(x, y), data);
      if (y == 0) Fail(line, "float division by zero");
      double q = std::floor(x / y);
      if (op == "//") return Value::Float(q, data);
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::Float(r, data);
    }
    int64_t x = a.IntVal(), y = b.IntVal(), r = 0;
    bool overflow = false;
    if (op == "+") {
      overflow = __builtin_add_overflow(x, y, &r);
    } else if (op == "-") {
      overflow = __builtin_sub_overflow(x, y, &r);
    } else if (op == "*") {
      overflow = __builtin_mul_overflow(x, y, &r);
    } else if (op == "**") {
      if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)), data);
      r = 1;
      for (int64_t i = 0; i < y && !overflow; ++i) {
        overflow = __builtin_mul_overflow(r, x, &r);
        if (r == 0 || r == 1) break;
        if (r == -1) {
          r = (y % 2 == 0) ? 1 : -1;
          break;
        }
      }
    } else {
      if (y == 0) Fail(line, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) Fail(line, "integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      r = op == "//" ? q : m;
    }
    if (overflow) Fail(line, "integer overflow in '" + op + "'");
    return Value::Int(r, data);
  }

  // Python slice semantics over n elements.
  static std::vector<size_t> SliceIndices(int64_t n, const Value* start, const Value* stop, const Value* step,
                                          int line) {
    int64_t st = step ? step->IntVal() : 1;
    if (st == 0) Fail(line, "slice step cannot be zero");
    auto norm = [&](const Value* v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = v->IntVal();
      if (x < 0) x += n;
      if (st > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    int64_t b = norm(start, st > 0 ? 0 : n - 1), e = norm(stop, st > 0 ? n : -1);
    std::vector<size_t> idx;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(static_cast<size_t>(i));
    return idx;
  }

  Value EvalSlice(const Node* n) {
    Value obj = Eval(n->kids[0].get());
    Value parts[3];
    const Value* p[3] = {nullptr, nullptr, nullptr};
    for (int i = 0; i < 3; ++i) {
      if (!n->kids[i + 1]) continue;
      parts[i] = Eval(n->kids[i + 1].get());
      if (parts[i].k == Value::kNone) continue;
      if (parts[i].k != Value::kInt && parts[i].k != Value::kBool)
        Fail(n->line, "slice indices must be integers or None");
      p[i] = &parts[i];
    }
    if (obj.k == Value::kUndef) FailUndefined(obj, n->line);
    if (obj.k == Value::kList) {
      List r;
      for (size_t i : SliceIndices(static_cast<int64_t>(obj.l->size()), p[0], p[1], p[2], n->line))
        r.push_back((*obj.l)[i]);
      return Value::MakeList(std::move(r));
    }
    if (IsStr(obj)) {
      auto starts = CodePointStarts(obj.s->s);
      Str r;
      for (size_t i : SliceIndices(static_cast<int64_t>(starts.size()), p[0], p[1], p[2], n->line)) {
        size_t e = i + 1 < starts.size() ? starts[i + 1] : obj.s->s.size();
        r.Append(obj.s->Sub(starts[i], e - starts[i]));
      }
      return Value::String(std::move(r));
    }
    Fail(n->line, std::string("'") + TypeName(obj) + "' object is not subscriptable");
  }

  static bool IsMethod(const Value& v, const std::string& name) {
    static const char* kStr[] = {"strip",    "lstrip",       "rstrip",      "split",   "rsplit",     "startswith",
                                 "endswith", "replace",      "upper",       "lower",   "title",      "capitalize",
                                 "find",     "rfind",        "count",       "join",    "splitlines", "isdigit",
                                 "isalpha",  "isspace",      "isalnum",     "isupper", "islower",    "index",
                                 "format",   "removeprefix", "removesuffix"};
    static const char* kDict[] = {"items", "keys",   "values",     "get",   "copy",
                                  "pop",   "update", "setdefault", "clear", "popitem"};
    static const char* kList[] = {"index",  "count",  "copy",    "append", "extend", "pop",
                                  "insert", "remove", "reverse", "sort",   "clear"};
    auto in = [&](auto& arr) {
      return std::any_of(std::begin(arr), std::end(arr), [&](const char* m) { return name == m; });
    };
    if (IsStr(v)) return in(kStr);
    if (v.k == Value::kDict && !v.d->is_namespace) return in(kDict);
    if (v.k == Value::kList) return in(kList);
    return false;
  }

  Value Bind(const Value& self, const std::string& name) {
    Callable c;
    c.name = name;
    c.self = std::make_shared<Value>(self);
    return Value::Func(std::move(c));
  }

  Value GetAttr(const Value& obj, const std::string& name, int line) {
    if (obj.k == Value::kUndef) FailUndefined(obj, line);
    if (IsMethod(obj, name)) return Bind(obj, name);
    if (obj.k == Value::kDict) {
      if (const Value* v = obj.d->Find(Value::Text(name))) return *v;
    }
    return Value::Undef(StrRepr(ObjectTypeRepr(obj)) + " has no attribute " + StrRepr(name));
  }

  Value GetItem(const Value& obj, const Value& key, int line) {
    if (obj.k == Value::kUndef) FailUndefined(obj, line);
    if (obj.k == Value::kDict) {
      if (const Value* v = obj.d->Find(key)) return *v;
    } else if (obj.generator_used) {
      Fail(line, "'generator' object is not subscriptable");
    } else if ((obj.k == Value::kList || IsStr(obj)) && (key.k == Value::kInt || key.k == Value::kBool)) {
      int64_t i = key.IntVal();
      if (obj.k == Value::kList) {
        int64_t n = static_cast<int64_t>(obj.l->size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return (*obj.l)[i];
      } else {
        auto starts = CodePointStarts(obj.s->s);
        int64_t n = static_cast<int64_t>(starts.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          size_t e = i + 1 < n ? starts[i + 1] : obj.s->s.size();
          return Value::String(obj.s->Sub(starts[i], e - starts[i]));
        }
      }
    }
    if (IsStr(key)) return GetAttr(obj, key.s->s, line);
    std::string k;
    bool unused = false;
    Repr(key, k, unused, 0);
    return Value::Undef(StrRepr(ObjectTypeRepr(obj)) + " has no element " + k);
  }

  // ---- calls ----

  struct ArgReader {
    const Args& args;
    const Kwargs& kwargs;
    const std::string& fname;
    int line;
    std::vector<bool> used_kw = std::vector<bool>(kwargs.size());
    // The i-th parameter, passed by position or as name=.
    const Value* Get(size_t i, const char* name) {
      if (i < args.size()) return &args[i];
      for (size_t k = 0; k < kwargs.size(); ++k)
        if (kwargs[k].first == name) {
          used_kw[k] = true;
          return &kwargs[k].second;
        }
      return nullptr;
    }
    void Done(size_t max_positional) {
      if (args.size() > max_positional)
        Fail(line, fname + "() takes at most " + std::to_string(max_positional) + " positional arguments");
      for (size_t k = 0; k < kwargs.size(); ++k)
        if (!used_kw[k]) Fail(line, fname + "() got an unexpected keyword argument '" + kwargs[k].first + "'");
    }
  };

  static const Str& NeedStr(const Value* v, const std::string& what, int line) {
    if (!v || !IsStr(*v)) Fail(line, what + " must be a string");
    return *v->s;
  }
  static int64_t NeedInt(const Value* v, const std::string& what, int line) {
    if (!v || (v->k != Value::kInt && v->k != Value::kBool)) Fail(line, what + " must be an integer");
    return v->IntVal();
  }

  Value CallValue(const Value& callee, const Args& args, const Kwargs& kwargs, int line) {
    if (callee.k == Value::kUndef) FailUndefined(callee, line);
    if (callee.k != Value::kFunc) Fail(line, std::string("'") + TypeName(callee) + "' object is not callable");
    const Callable& c = *callee.fn;
    if (c.macro) return CallMacro(c.macro, args, kwargs, line);
    if (c.caller_body) {
      DepthGuard guard(this, line);
      if (!args.empty() || !kwargs.empty()) Fail(line, "caller() arguments are not supported");
      size_t saved_base = base_;
      base_ = std::min(base_, c.caller_frame);
      Str r = Capture(c.caller_body);
      base_ = saved_base;
      return Value::String(std::move(r));
    }
    if (c.self) return CallMethod(*c.self, c.name, args, kwargs, line);
    return CallGlobal(c.name, args, kwargs, line);
  }

  Value CallMacro(const Node* m, const Args& args, const Kwargs& kwargs, int line) {
    DepthGuard guard(this, line);
    if (args.size() > m->params.size())
      Fail(line, "macro '" + m->name + "' takes not more than " + std::to_string(m->params.size()) + " argument(s)");
    size_t saved_base = base_;
    frames_.emplace_back();
    base_ = frames_.size() - 1;
    std::vector<bool> used(kwargs.size());
    for (size_t i = 0; i < m->params.size(); ++i) {
      const std::string& p = m->params[i];
      Value v;
      bool have = false;
      if (i < args.size()) {
        v = args[i];
        have = true;
      }
      for (size_t k = 0; k < kwargs.size(); ++k) {
        if (kwargs[k].first != p) continue;
        if (have) Fail(line, "macro '" + m->name + "' got multiple values for argument '" + p + "'");
        v = kwargs[k].second;
        used[k] = have = true;
      }
      if (!have)
        v = m->kids[i + 1] ? Eval(m->kids[i + 1].get()) : Value::Undef("parameter '" + p + "' was not provided");
      frames_.back()[p] = v;
    }
    for (size_t k = 0; k < kwargs.size(); ++k) {
      if (used[k]) continue;
      if (kwargs[k].first == "caller") {
        frames_.back()["caller"] = kwargs[k].second;
        continue;
      }
      Fail(line, "macro '" + m->name + "' takes no keyword argument '" + kwargs[k].first + "'");
    }
    Str r = Capture(m->kids[0].get());
    frames_.pop_back();
    base_ = saved_base;
    return Value::String(std::move(r));
  }

  std::string StrftimeNow(const std::string& fmt, int line) const {
    std::tm tm{};
    if (opts_.now_date.empty()) {
      std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    } else {
      int y = 0, mo = 0, d = 0;
      if (std::sscanf(opts_.now_date.c_str(), "%d-%d-%d", &y, &mo, &d) != 3)
        Fail(line, "Options::now_date must be YYYY-MM-DD, got '" + opts_.now_date + "'");
      tm.tm_year = y - 1900;
      tm.tm_mon = mo - 1;
      tm.tm_mday = d;
      std::time_t t = timegm(&tm);  // fills in the weekday and day of the year
      gmtime_r(&t, &tm);
    }
    char buf[512];
    size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) Fail(line, "strftime_now: unsupported or too long format");
    return std::string(buf, n);
  }

  Value CallGlobal(const std::string& name, const Args& args, const Kwargs& kwargs, int line) {
    ArgReader r{args, kwargs, name, line};
    if (name == "raise_exception") {
      const Value* msg = r.Get(0, "message");
      Fail(line, msg ? ToStr(*msg).s : std::string("raise_exception"));
    }
    if (name == "strftime_now") {
      std::string fmt = NeedStr(r.Get(0, "format"), "strftime_now format", line).s;
      r.Done(1);
      return Value::Text(StrftimeNow(fmt, line));
    }
    if (name == "range") {
      if (!kwargs.empty() || args.empty() || args.size() > 3) Fail(line, "range() takes 1 to 3 integer arguments");
      int64_t start = 0, stop, step = 1;
      if (args.size() == 1) {
        stop = NeedInt(&args[0], "range() argument", line);
      } else {
        start = NeedInt(&args[0], "range() argument", line);
        stop = NeedInt(&args[1], "range() argument", line);
        if (args.size() == 3) step = NeedInt(&args[2], "range() argument", line);
      }
      if (step == 0) Fail(line, "range() arg 3 must not be zero");
      List l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        Step(line);
        l.push_back(Value::Int(i));
      }
      return Value::MakeList(std::move(l));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      if (!args.empty()) {
        if (args.size() > 1 || args[0].k != Value::kDict) Fail(line, name + "() takes a mapping or keyword arguments");
        d.items = args[0].d->items;
      }
      for (const auto& [k, v] : kwargs) d.Set(Value::Text(k), v);
      d.is_namespace = name == "namespace";
      Value made = MakeDict(std::move(d));
      if (made.d->is_namespace) {
        // The only mutable objects, so every reference cycle (ns.x = ns, ns.x = [ns], ...) runs
        // through one: ~Renderer empties them all, or the cycle would outlive the render.
        if (namespaces_.size() >= kMaxNamespaces) Fail(line, "too many namespace() objects");
        namespaces_.push_back(made.d);
      }
      return made;
    }
    Fail(line, "unknown function '" + name + "'");
  }

  Value CallMethod(const Value& self, const std::string& name, const Args& args, const Kwargs& kwargs, int line) {
    ArgReader r{args, kwargs, name, line};
    if (self.k == Value::kDict) {
      const Dict& d = *self.d;
      if (name == "items" || name == "keys" || name == "values") {
        r.Done(0);
        List l;
        for (const auto& [k, v] : d.items) {
          if (name == "items") {
            l.push_back(Value::MakeList({k, v}));
            l.back().tuple = true;
          } else
            l.push_back(name == "keys" ? k : v);
        }
        return Value::MakeList(std::move(l));
      }
      if (name == "get") {
        const Value* key = r.Get(0, "key");
        const Value* dflt = r.Get(1, "default");
        r.Done(2);
        if (!key) Fail(line, "get() needs a key");
        const Value* v = d.Find(*key);
        return v ? *v : dflt ? *dflt : Value::None();
      }
      if (name == "copy") {
        r.Done(0);
        Dict c;
        c.items = d.items;
        return MakeDict(std::move(c));
      }
      Fail(line, "access to attribute '" + name + "' of 'dict' object is unsafe.");
    }
    if (self.k == Value::kList) {
      if (name == "index" || name == "count") {
        const Value* x = r.Get(0, "value");
        r.Done(1);
        if (!x) Fail(line, name + "() takes exactly one argument");
        int64_t count = 0;
        for (size_t i = 0; i < self.l->size(); ++i) {
          if (!Equal((*self.l)[i], *x)) continue;
          if (name == "index") return Value::Int(static_cast<int64_t>(i));
          ++count;
        }
        if (name == "index") Fail(line, "list.index(x): x not in list");
        return Value::Int(count);
      }
      if (name == "copy") return Value::MakeList(*self.l);
      Fail(line, "access to attribute '" + name + "' of 'list' object is unsafe.");
    }
    return StrMethod(*self.s, name, r, line);
  }

  Value StrMethod(const Str& s, const std::string& name, ArgReader& r, int line) {
    auto opt_str = [&](size_t i, const char* pname) -> const Str* {
      const Value* v = r.Get(i, pname);
      if (!v || v->k == Value::kNone) return nullptr;
      return &NeedStr(v, name + "() argument", line);
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Str* chars = opt_str(0, "chars");
      r.Done(1);
      return Value::String(StripStr(s, chars ? &chars->s : nullptr, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      const Str* sep = opt_str(0, "sep");
      const Value* max = r.Get(1, "maxsplit");
      r.Done(2);
      if (sep && sep->s.empty()) Fail(line, "empty separator");
      List l;
      for (auto& part : Split(s, sep, max ? NeedInt(max, "maxsplit", line) : -1, name == "rsplit"))
        l.push_back(Value::String(std::move(part)));
      return Value::MakeList(std::move(l));
    }
    if (name == "splitlines") {
      r.Done(0);
      List l;
      size_t pos = 0;
      while (pos < s.s.size()) {
        size_t e = s.s.find_first_of("\n\r", pos);
        if (e == std::string::npos) e = s.s.size();
        l.push_back(Value::String(s.Sub(pos, e - pos)));
        pos = e + ((e + 1 < s.s.size() && s.s[e] == '\r' && s.s[e + 1] == '\n') ? 2 : 1);
      }
      return Value::MakeList(std::move(l));
    }
    if (name == "startswith" || name == "endswith") {
      const Value* p = r.Get(0, "prefix");
      r.Done(1);
      if (!p) Fail(line, name + "() takes at least 1 argument");
      std::vector<const Str*> options;
      if (p->k == Value::kList) {
        for (const auto& e : *p->l) options.push_back(&NeedStr(&e, name + "() argument", line));
      } else {
        options.push_back(&NeedStr(p, name + "() argument", line));
      }
      for (const Str* o : options) {
        if (o->s.size() > s.s.size()) continue;
        if (name == "startswith" ? s.s.compare(0, o->s.size(), o->s) == 0
                                 : s.s.compare(s.s.size() - o->s.size(), o->s.size(), o->s) == 0)
          return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "replace") {
      const Str& old = NeedStr(r.Get(0, "old"), "replace() argument", line);
      const Str& rep = NeedStr(r.Get(1, "new"), "replace() argument", line);
      const Value* count = r.Get(2, "count");
      r.Done(3);
      Str out = Replace(s, old, rep, count ? NeedInt(count, "count", line) : -1);
      CheckSize(out.s.size(), line);
      return Value::String(std::move(out));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const Str& a = NeedStr(r.Get(0, "prefix"), name + "() argument", line);
      r.Done(1);
      if (a.s.size() <= s.s.size()) {
        if (name == "removeprefix" && s.s.compare(0, a.s.size(), a.s) == 0)
          return Value::String(s.Sub(a.s.size(), std::string::npos));
        if (name == "removesuffix" && s.s.compare(s.s.size() - a.s.size(), a.s.size(), a.s) == 0)
          return Value::String(s.Sub(0, s.s.size() - a.s.size()));
      }
      return Value::String(s);
    }
    if (name == "upper" || name == "lower") {
      r.Done(0);
      return Value::String(MapCase(s, [&](char c, size_t) { return name == "upper" ? Up(c) : Low(c); }));
    }
    if (name == "title" || name == "capitalize") {
      r.Done(0);
      return Value::String(name == "title" ? PyTitle(s) : Capitalize(s));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
      const Str& sub = NeedStr(r.Get(0, "sub"), name + "() argument", line);
      r.Done(1);
      if (name == "count") {
        if (sub.s.empty()) return Value::Int(static_cast<int64_t>(CodePointStarts(s.s).size()) + 1);
        int64_t c = 0;
        for (size_t p = s.s.find(sub.s); p != std::string::npos; p = s.s.find(sub.s, p + sub.s.size())) ++c;
        return Value::Int(c);
      }
      size_t p = name == "rfind" ? s.s.rfind(sub.s) : s.s.find(sub.s);
      if (p == std::string::npos) {
        if (name == "index") Fail(line, "substring not found");
        return Value::Int(-1);
      }
      // Python reports code point offsets.
      int64_t cp = 0;
      for (size_t i = 0; i < p; ++i) cp += (static_cast<unsigned char>(s.s[i]) & 0xC0) != 0x80;
      return Value::Int(cp);
    }
    if (name == "join") {
      const Value* it = r.Get(0, "iterable");
      r.Done(1);
      if (!it) Fail(line, "join() takes exactly one argument");
      Str out;
      bool first = true;
      for (const auto& e : Iterate(*it, line)) {
        if (!IsStr(e)) Fail(line, std::string("sequence item: expected str instance, ") + TypeName(e) + " found");
        if (!first) out.Append(s);
        first = false;
        out.Append(*e.s);
        CheckSize(out.s.size(), line);
      }
      return Value::String(std::move(out));
    }
    if (name == "format") {
      // "{}", "{0}" and "{name}" fields; format specs and conversions are not supported.
      Str out;
      size_t auto_index = 0;
      for (size_t i = 0; i < s.s.size(); ++i) {
        char c = s.s[i];
        if ((c == '{' || c == '}') && i + 1 < s.s.size() && s.s[i + 1] == c) {
          out.Append(s.Sub(i, 1));
          ++i;
          continue;
        }
        if (c == '}') Fail(line, "Single '}' encountered in format string");
        if (c != '{') {
          out.Append(s.Sub(i, 1));
          continue;
        }
        size_t e = s.s.find('}', i);
        if (e == std::string::npos) Fail(line, "Single '{' encountered in format string");
        std::string field = s.s.substr(i + 1, e - i - 1);
        if (field.find_first_of(":!.[") != std::string::npos)
          Fail(line, "str.format() field '" + field + "' is not supported");
        const Value* v = nullptr;
        if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
          size_t idx = field.empty() ? auto_index++ : std::stoul(field);
          if (idx < r.args.size()) v = &r.args[idx];
        } else {
          for (const auto& [k, kv] : r.kwargs)
            if (k == field) v = &kv;
        }
        if (!v) Fail(line, "str.format(): no argument for field '{" + field + "}'");
        out.Append(ToStr(*v));
        CheckSize(out.s.size(), line);
        i = e;
      }
      return Value::String(std::move(out));
    }
    if (name.rfind("is", 0) == 0) {
      r.Done(0);
      if (s.s.empty()) return Value::Bool(false);
      auto all = [&](auto pred) {
        return std::all_of(s.s.begin(), s.s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); });
      };
      if (name == "isdigit") return Value::Bool(all([](int c) { return std::isdigit(c); }));
      if (name == "isalpha") return Value::Bool(all([](int c) { return std::isalpha(c); }));
      if (name == "isalnum") return Value::Bool(all([](int c) { return std::isalnum(c); }));
      if (name == "isspace") return Value::Bool(all([](int c) { return IsSpace(c); }));
      bool has_cased =
          std::any_of(s.s.begin(), s.s.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
      if (name == "isupper") return Value::Bool(has_cased && all([](int c) { return !std::islower(c); }));
      return Value::Bool(has_cased && all([](int c) { return !std::isupper(c); }));
    }
    Fail(line, "str." + name + "() is not supported");
  }

  static Str PyTitle(const Str& s) {
    bool prev_cased = false;
    return MapCase(s, [&](char c, size_t) {
      char r = prev_cased ? Low(c) : Up(c);
      prev_cased = IsAlpha(c);
      return r;
    });
  }
  static Str Capitalize(const Str& s) {
    return MapCase(s, [](char c, size_t i) { return i == 0 ? Up(c) : Low(c); });
  }

  // ---- filters and tests ----

  Value Filter(const std::string& name, const Value& in, const Args& args, const Kwargs& kwargs, int line) {
    ArgReader r{args, kwargs, name, line};
    if (name == "default" || name == "d") {
      const Value* dflt = r.Get(0, "default_value");
      const Value* boolean = r.Get(1, "boolean");
      r.Done(2);
      bool use = in.k == Value::kUndef || (boolean && Truthy(*boolean) && !Truthy(in));
      return use ? (dflt ? *dflt : Value::Text("")) : in;
    }
    if (name == "safe") {
      r.Done(0);
      return in;
    }
    if (name == "tojson") {
      JsonOptions o;
      const Value* ascii = r.Get(0, "ensure_ascii");
      const Value* indent = r.Get(1, "indent");
      const Value* seps = r.Get(2, "separators");
      const Value* sort = r.Get(3, "sort_keys");
      r.Done(4);
      o.ensure_ascii = ascii && Truthy(*ascii);
      if (indent && indent->k != Value::kNone) {
        if (IsStr(*indent)) Fail(line, "tojson: string indent is not supported");
        o.indent = static_cast<int>(std::clamp<int64_t>(NeedInt(indent, "indent", line), 0, 64));
        o.item_sep = ",";
      }
      if (seps && seps->k != Value::kNone) {
        if (seps->k != Value::kList || seps->l->size() != 2) Fail(line, "tojson: separators must be a pair of strings");
        o.item_sep = NeedStr(&(*seps->l)[0], "separator", line).s;
        o.key_sep = NeedStr(&(*seps->l)[1], "separator", line).s;
      }
      o.sort_keys = sort && Truthy(*sort);
      if (in.k == Value::kUndef) Fail(line, "Object of type Undefined is not JSON serializable");
      Str out;
      ToJson(in, o, 0, out, line);
      CheckSize(out.s.size(), line);
      return Value::String(std::move(out));
    }
    if (name == "string") {
      r.Done(0);
      return Value::String(ToStr(in));
    }
    if (name == "trim") {
      const Value* chars = r.Get(0, "chars");
      r.Done(1);
      const std::string* c = chars && chars->k != Value::kNone ? &NeedStr(chars, "trim chars", line).s : nullptr;
      return Value::String(StripStr(ToStr(in), c, true, true));
    }
    if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
      r.Done(0);
      Str s = ToStr(in);
      if (name == "upper") return Value::String(MapCase(s, [](char c, size_t) { return Up(c); }));
      if (name == "lower") return Value::String(MapCase(s, [](char c, size_t) { return Low(c); }));
      if (name == "capitalize") return Value::String(Capitalize(s));
      // jinja2's title capitalises after spaces, dashes and opening brackets.
      bool start = true;
      return Value::String(MapCase(s, [&](char c, size_t) {
        bool sep = IsSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        char out = sep ? c : start ? Up(c) : Low(c);
        start = sep;
        return out;
      }));
    }
    if (name == "replace") {
      const Str old = ToStr(*NeedArg(r.Get(0, "old"), name, line));
      const Str rep = ToStr(*NeedArg(r.Get(1, "new"), name, line));
      const Value* count = r.Get(2, "count");
      r.Done(3);
      Str out = Replace(ToStr(in), old, rep, count && count->k != Value::kNone ? NeedInt(count, "count", line) : -1);
      CheckSize(out.s.size(), line);
      return Value::String(std::move(out));
    }
    if (name == "length" || name == "count") {
      r.Done(0);
      switch (in.k) {
        case Value::kUndef:
          return Value::Int(0);
        case Value::kStr:
          return Value::Int(static_cast<int64_t>(CodePointStarts(in.s->s).size()));
        case Value::kDict:
          return Value::Int(static_cast<int64_t>(in.d->items.size()));
        case Value::kList:
          if (!in.generator_used) return Value::Int(static_cast<int64_t>(in.l->size()));
          [[fallthrough]];
        default:
          Fail(line, std::string("object of type '") + TypeName(in) + "' has no len()");
      }
    }
    if (name == "first" || name == "last") {
      r.Done(0);
      auto items = Iterate(in, line);
      if (items.empty()) return Value::Undef("No " + name + " item, sequence was empty.");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      r.Done(0);
      return Value::MakeList(Iterate(in, line));
    }
    if (name == "reverse") {
      r.Done(0);
      if (IsStr(in)) {
        auto items = Iterate(in, line);
        Str out;
        for (auto it = items.rbegin(); it != items.rend(); ++it) out.Append(*it->s);
        return Value::String(std::move(out));
      }
      auto items = Iterate(in, line);
      std::reverse(items.begin(), items.end());
      return Value::Generator(std::move(items));
    }
    if (name == "join") {
      const Value* sep = r.Get(0, "d");
      const Value* attr = r.Get(1, "attribute");
      r.Done(2);
      Str sep_s = sep ? ToStr(*sep) : Str{};
      Str out;
      bool first = true;
      for (auto& e : Iterate(in, line)) {
        if (!first) out.Append(sep_s);
        first = false;
        out.Append(ToStr(attr ? GetPath(e, *attr, line) : e));
        CheckSize(out.s.size(), line);
      }
      return Value::String(std::move(out));
    }
    if (name == "items") {
      r.Done(0);
      if (in.k == Value::kUndef) return Value::Generator({});
      if (in.k != Value::kDict) Fail(line, "Can only get item pairs from a mapping.");
      return Value::Generator(*CallMethod(in, "items", {}, {}, line).l);
    }
    if (name == "dictsort") {
      const Value* cs = r.Get(0, "case_sensitive");
      const Value* by = r.Get(1, "by");
      const Value* rev = r.Get(2, "reverse");
      r.Done(3);
      if (in.k != Value::kDict) Fail(line, "dictsort: expected a mapping");
      List items = *CallMethod(in, "items", {}, {}, line).l;
      size_t pos = by && IsStr(*by) && by->s->s == "value" ? 1 : 0;
      SortValues(
          items, [&](const Value& v) { return (*v.l)[pos]; }, cs && Truthy(*cs), rev && Truthy(*rev), line);
      return Value::MakeList(std::move(items));
    }
    if (name == "sort") {
      const Value* rev = r.Get(0, "reverse");
      const Value* cs = r.Get(1, "case_sensitive");
      const Value* attr = r.Get(2, "attribute");
      r.Done(3);
      auto items = Iterate(in, line);
      SortValues(
          items, [&](const Value& v) { return attr ? GetPath(v, *attr, line) : v; }, cs && Truthy(*cs),
          rev && Truthy(*rev), line);
      return Value::MakeList(std::move(items));
    }
    if (name == "unique") {
      const Value* cs = r.Get(0, "case_sensitive");
      const Value* attr = r.Get(1, "attribute");
      r.Done(2);
      List out, seen;
      for (auto& e : Iterate(in, line)) {
        Value key = SortKey(attr ? GetPath(e, *attr, line) : e, cs && Truthy(*cs));
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) continue;
        seen.push_back(key);
        out.push_back(e);
      }
      return Value::Generator(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      bool by_attr = name == "selectattr" || name == "rejectattr";
      bool keep = name == "selectattr" || name == "select";
      if (by_attr && args.empty()) Fail(line, name + " needs an attribute name");
      if (!kwargs.empty()) Fail(line, name + "() takes no keyword arguments");
      size_t t = by_attr ? 1 : 0;
      std::string test = args.size() > t ? NeedStr(&args[t], "test name", line).s : "";
      Args test_args(args.begin() + std::min(args.size(), t + 1), args.end());
      List out;
      for (auto& e : Truthy(in) ? Iterate(in, line) : List{}) {
        Step(line);
        Value subject = by_attr ? GetPath(e, args[0], line) : e;
        bool ok = test.empty() ? Truthy(subject) : Test(test, subject, test_args, line);
        if (ok == keep) out.push_back(e);
      }
      return Value::Generator(std::move(out));
    }
    if (name == "map") {
      List out;
      const Value* attr = nullptr;
      const Value* dflt = nullptr;
      for (const auto& [k, v] : kwargs) {
        if (k == "attribute")
          attr = &v;
        else if (k == "default")
          dflt = &v;
        else if (!args.empty())
          Fail(line, "map(): unexpected keyword argument '" + k + "'");
      }
      if (!attr && args.empty()) Fail(line, "map() needs a filter name or attribute=");
      for (auto& e : Truthy(in) ? Iterate(in, line) : List{}) {
        Step(line);
        if (attr) {
          Value v = GetPath(e, *attr, line);
          out.push_back(v.k == Value::kUndef && dflt ? *dflt : v);
        } else {
          Kwargs fk;
          for (const auto& kv : kwargs) fk.push_back(kv);
          out.push_back(
              Filter(NeedStr(&args[0], "filter name", line).s, e, Args(args.begin() + 1, args.end()), fk, line));
        }
      }
      return Value::Generator(std::move(out));
    }
    if (name == "int") {
      const Value* dflt = r.Get(0, "default");
      r.Done(2);
      Value fallback = dflt ? *dflt : Value::Int(0);
      if (in.k == Value::kInt) return in;
      if (in.IsNum()) return Value::Int(static_cast<int64_t>(in.Num()), in.data);
      if (IsStr(in)) {
        std::string t = StripStr(*in.s, nullptr, true, true).s;
        int64_t v = 0;
        auto res = std::from_chars(t.data(), t.data() + t.size(), v);
        if (res.ec == std::errc() && res.ptr == t.data() + t.size()) return Value::Int(v, in.s->AnyData());
        char* end = nullptr;
        double f = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size() && std::isfinite(f) && std::fabs(f) < 9e18)
          return Value::Int(static_cast<int64_t>(f), in.s->AnyData());
      }
      return fallback;
    }
    if (name == "float") {
      const Value* dflt = r.Get(0, "default");
      r.Done(1);
      if (in.IsNum()) return Value::Float(in.Num(), in.data);
      if (IsStr(in)) {
        std::string t = StripStr(*in.s, nullptr, true, true).s;
        char* end = nullptr;
        double f = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size()) return Value::Float(f, in.s->AnyData());
      }
      return dflt ? *dflt : Value::Float(0);
    }
    if (name == "abs") {
      r.Done(0);
      if (in.k == Value::kFloat) return Value::Float(std::fabs(in.f), in.data);
      if (!in.IsNum()) Fail(line, std::string("bad operand type for abs(): '") + TypeName(in) + "'");
      return Value::Int(std::llabs(in.IntVal()), in.data);
    }
    if (name == "round") {
      const Value* prec = r.Get(0, "precision");
      const Value* method = r.Get(1, "method");
      r.Done(2);
      if (!in.IsNum()) Fail(line, "round: expected a number");
      double p = std::pow(10.0, prec ? static_cast<double>(NeedInt(prec, "precision", line)) : 0.0);
      std::string m = method ? NeedStr(method, "method", line).s : "common";
      double x = in.Num() * p;
      double v = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::round(x);
      return Value::Float(v / p, in.data);
    }
    if (name == "sum" || name == "min" || name == "max") {
      const Value* attr = name == "sum" ? r.Get(0, "attribute") : r.Get(1, "attribute");
      r.Done(name == "sum" ? 2 : 2);
      auto items = Iterate(in, line);
      if (name == "sum") {
        Value acc = Value::Int(0);
        for (auto& e : items) acc = Binary("+", acc, attr ? GetPath(e, *attr, line) : e, line);
        return acc;
      }
      if (items.empty()) return Value::Undef("No aggregated item, sequence was empty.");
      Value best = items[0];
      for (auto& e : items) {
        int c = Order(attr ? GetPath(e, *attr, line) : e, attr ? GetPath(best, *attr, line) : best, "<", line);
        if (name == "min" ? c < 0 : c > 0) best = e;
      }
      return best;
    }
    if (name == "indent") {
      const Value* width = r.Get(0, "width");
      const Value* first = r.Get(1, "first");
      const Value* blank = r.Get(2, "blank");
      r.Done(3);
      Str pad = width && IsStr(*width) ? *width->s
                                       : MakeStr(std::string(width ? NeedInt(width, "width", line) : 4, ' '), false);
      Str s = ToStr(in);
      Str out;
      size_t pos = 0;
      bool first_line = true;
      while (pos <= s.s.size()) {
        size_t e = s.s.find('\n', pos);
        size_t end = e == std::string::npos ? s.s.size() : e;
        Str ln = s.Sub(pos, end - pos);
        bool add = first_line ? (first && Truthy(*first)) : (!ln.s.empty() || (blank && Truthy(*blank)));
        if (add) out.Append(pad);
        out.Append(ln);
        if (e == std::string::npos) break;
        out.Append(s.Sub(e, 1));
        pos = e + 1;
        first_line = false;
      }
      CheckSize(out.s.size(), line);
      return Value::String(std::move(out));
    }
    if (name == "wordcount") {
      r.Done(0);
      return Value::Int(static_cast<int64_t>(Split(ToStr(in), nullptr, -1, false).size()));
    }
    if (name == "escape" || name == "e") {
      r.Done(0);
      Str s = ToStr(in), out;
      for (size_t i = 0; i < s.s.size(); ++i) {
        const char* rep = nullptr;
        switch (s.s[i]) {
          case '&':
            rep = "&amp;";
            break;
          case '<':
            rep = "&lt;";
            break;
          case '>':
            rep = "&gt;";
            break;
          case '"':
            rep = "&#34;";
            break;
          case '\'':
            rep = "&#39;";
            break;
        }
        if (rep)
          out.Append(rep, s.m[i] != 0);
        else
          out.Append(s.Sub(i, 1));
      }
      return Value::String(std::move(out));
    }
    Fail(line, "unsupported filter '" + name + "'");
  }

  static const Value* NeedArg(const Value* v, const std::string& fname, int line) {
    if (!v) Fail(line, fname + "() is missing an argument");
    return v;
  }

  // Attribute lookup for filters' attribute= arguments: "a.b" and integer indexes as jinja2 does.
  Value GetPath(const Value& v, const Value& path, int line) {
    if (path.k == Value::kInt) return GetItem(v, path, line);
    std::string p = NeedStr(&path, "attribute", line).s;
    Value cur = v;
    size_t pos = 0;
    while (true) {
      size_t dot = p.find('.', pos);
      std::string part = p.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      int64_t idx = 0;
      auto res = std::from_chars(part.data(), part.data() + part.size(), idx);
      if (cur.k == Value::kUndef) return cur;
      cur = res.ec == std::errc() && res.ptr == part.data() + part.size() ? GetItem(cur, Value::Int(idx), line)
                                                                          : GetItem(cur, Value::Text(part), line);
      if (dot == std::string::npos) return cur;
      pos = dot + 1;
    }
  }

  static Value SortKey(const Value& v, bool case_sensitive) {
    if (!case_sensitive && IsStr(v)) return Value::String(MapCase(*v.s, [](char c, size_t) { return Low(c); }));
    return v;
  }

  void SortValues(List& items, const std::function<Value(const Value&)>& key, bool case_sensitive, bool reverse,
                  int line) {
    std::vector<std::pair<Value, size_t>> keyed;
    for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(SortKey(key(items[i]), case_sensitive), i);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      int c = Order(a.first, b.first, "<", line);
      return reverse ? c > 0 : c < 0;
    });
    List out;
    for (auto& [k, i] : keyed) out.push_back(items[i]);
    items = std::move(out);
  }

  bool Test(const std::string& name, const Value& v, const Args& args, int line) {
    auto arg = [&]() -> const Value& {
      if (args.empty()) Fail(line, "test '" + name + "' needs an argument");
      return args[0];
    };
    if (name == "defined") return v.k != Value::kUndef;
    if (name == "undefined") return v.k == Value::kUndef;
    if (name == "none") return v.k == Value::kNone;
    if (name == "string") return IsStr(v);
    if (name == "mapping") return v.k == Value::kDict && !v.d->is_namespace;
    if (name == "iterable")
      return v.k == Value::kStr || v.k == Value::kList || v.k == Value::kDict || v.k == Value::kUndef;
    if (name == "sequence")
      return v.k == Value::kStr || v.k == Value::kList || v.k == Value::kDict || v.k == Value::kUndef;
    if (name == "number") return v.IsNum();
    if (name == "integer") return v.k == Value::kInt;
    if (name == "float") return v.k == Value::kFloat;
    if (name == "boolean") return v.k == Value::kBool;
    if (name == "true") return v.k == Value::kBool && v.b;
    if (name == "false") return v.k == Value::kBool && !v.b;
    if (name == "callable") return v.k == Value::kFunc;
    if (name == "in") return Contains(arg(), v, line);
    if (name == "equalto" || name == "eq" || name == "==") return Equal(v, arg());
    if (name == "ne" || name == "!=") return !Equal(v, arg());
    if (name == "sameas") {
      const Value& o = arg();
      if (v.k != o.k) return false;
      if (v.k == Value::kNone || v.k == Value::kUndef) return true;
      if (v.k == Value::kBool) return v.b == o.b;
      return Equal(v, o) && (v.k == Value::kInt || (v.s == o.s && v.l == o.l && v.d == o.d));
    }
    if (name == "lt" || name == "<") return Order(v, arg(), "<", line) < 0;
    if (name == "le" || name == "<=") return Order(v, arg(), "<=", line) <= 0;
    if (name == "gt" || name == ">") return Order(v, arg(), ">", line) > 0;
    if (name == "ge" || name == ">=") return Order(v, arg(), ">=", line) >= 0;
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.k != Value::kInt && v.k != Value::kBool) Fail(line, "test '" + name + "' needs an integer");
      int64_t x = v.IntVal();
      if (name == "odd") return x % 2 != 0;
      if (name == "even") return x % 2 == 0;
      int64_t d = NeedInt(&arg(), "divisibleby argument", line);
      if (d == 0) Fail(line, "integer division or modulo by zero");
      return x % d == 0;
    }
    if (name == "lower" || name == "upper") {
      Str s = ToStr(v);
      bool has =
          std::any_of(s.s.begin(), s.s.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
      return has && std::none_of(s.s.begin(), s.s.end(), [&](char c) {
               return name == "lower" ? std::isupper(static_cast<unsigned char>(c))
                                      : std::islower(static_cast<unsigned char>(c));
             });
    }
    Fail(line, "unsupported test '" + name + "'");
  }

  static constexpr size_t kMaxNamespaces = 100000;  // real templates make one or two

  const Options& opts_;
  std::vector<std::shared_ptr<Dict>> namespaces_;
  int64_t steps_ = 0;
  int depth_ = 0;
  // frames_[0]: globals, [1]: the context and top-level variables; then loop and macro frames.
  std::vector<std::unordered_map<std::string, Value>> frames_;
  size_t base_ = 0;  // first frame visible from the current macro (0: not in a macro)
  Str* out_ = nullptr;
};

}  // namespace

Result<Template> Template::Parse(std::string_view source) {
  try {
    Template t;
    t.root_ = Parser(Lexer(source).Run()).ParseTemplate();
    return t;
  } catch (const Error& e) {
    return InvalidArgument("[jinja] line " + std::to_string(e.line) + ": " + e.message);
  }
}

Result<Output> Template::Render(const nlohmann::ordered_json& context, const Options& opts) const {
  try {
    return Renderer(opts).Run(root_.get(), context);
  } catch (const Error& e) {
    return InvalidArgument("[jinja] line " + std::to_string(e.line) + ": " + e.message);
  } catch (const std::bad_alloc&) {
    return InvalidArgument("[jinja] out of memory while rendering");
  }
}

}  // namespace mr::jinja
