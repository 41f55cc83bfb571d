#include "runtime/json_grammar.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "runtime/gbnf.h"

namespace mr {

namespace {

using Json = nlohmann::ordered_json;
using Expr = GrammarBuilder::Expr;

constexpr int kMaxSchemaDepth = 64;
constexpr int64_t kMaxUnrolledItems = 64;
constexpr int64_t kMaxUnrolledChars = 256;
constexpr int64_t kMaxInteger = 999999999999999999;  // the 18 integer digits Integer() writes

const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {"title",
                                          "description",
                                          "default",
                                          "examples",
                                          "$schema",
                                          "$id",
                                          "$comment",
                                          "deprecated",
                                          "readOnly",
                                          "writeOnly",
                                          "$defs",
                                          "definitions",
                                          "nullable",
                                          "type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "strict",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum"};
  return k;
}

// Value constraints the grammar does not enforce.
const std::set<std::string>& Unenforced() {
  static const std::set<std::string> k = {"multipleOf",    "uniqueItems",     "minProperties",
                                          "maxProperties", "contentEncoding", "contentMediaType"};
  return k;
}

// The patterns of the string formats OpenAI's structured outputs support (RFC 3339 date-time,
// date, time; ISO 8601 duration; a practical email; RFC 1123 hostname; dotted-quad IPv4; IPv6 in
// full or compressed form (no embedded IPv4); RFC 4122 UUID); null for any other format.
const char* FormatPattern(const std::string& format) {
  static const std::map<std::string, std::string> kPatterns = [] {
    const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
    const std::string time = R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
    const std::string t = R"(T(\d+H(\d+M)?(\d+(\.\d+)?S)?|\d+M(\d+(\.\d+)?S)?|\d+(\.\d+)?S))";
    const std::string h4 = "[0-9a-fA-F]{1,4}";
    const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    const std::string octet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
    std::string ipv6 = "(" + h4 + ":){7}" + h4 + "|(" + h4 + ":){1,7}:";
    for (int k = 1; k <= 6; ++k)
      ipv6 += "|(" + h4 + ":){1," + std::to_string(7 - k) + "}(:" + h4 + "){" + std::to_string(k) + "}";
    ipv6 += "|:(:" + h4 + "){1,7}|::";
    return std::map<std::string, std::string>{
        {"date", "^" + date + "$"},
        {"time", "^" + time + "$"},
        {"date-time", "^" + date + "T" + time + "$"},
        {"duration",
         "^P(\\d+W|\\d+Y(\\d+M)?(\\d+D)?(" + t + ")?|\\d+M(\\d+D)?(" + t + ")?|\\d+D(" + t + ")?|" + t + ")$"},
        {"email", R"(^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$)"},
        {"hostname", "^" + label + "(\\." + label + ")*$"},
        {"ipv4", "^(" + octet + "\\.){3}" + octet + "$"},
        {"ipv6", "^(" + ipv6 + ")$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    };
  }();
  auto it = kPatterns.find(format);
  return it == kPatterns.end() ? nullptr : it->second.c_str();
}

class Compiler {
 public:
  Compiler(GrammarBuilder& b, const Json& root, const JsonGrammarOptions& opts) : b_(b), root_(root), opts_(opts) {}

  Result<Expr> Value(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) return InvalidArgument(path + ": the schema is nested too deeply");
    if (s.is_boolean()) {
      if (!s.get<bool>()) return InvalidArgument(path + ": the schema `false` matches nothing");
      return AnyValue();
    }
    if (!s.is_object()) return InvalidArgument(path + ": expected a schema object");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (Annotations().count(k)) continue;
      if (Unenforced().count(k)) {
        if (opts_.strict)
          return InvalidArgument(path + "." + k + ": the keyword \"" + k +
                                 "\" is not supported in strict mode (constrained decoding does not enforce it)");
        continue;
      }
      if (k.rfind("x-", 0) == 0) continue;  // vendor extensions
      return InvalidArgument(path + "." + k + ": the keyword \"" + k + "\" is not supported for constrained decoding");
    }
    Result<Expr> e = Core(s, path, depth);
    if (!e.ok()) return e;
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>())
      return b_.Alt({*e, b_.Literal("null")});
    return e;
  }

  Expr AnyValue() {
    if (!any_value_) {
      const uint32_t value = b_.DeclareRule();
      any_value_ = value;
      const Expr v = b_.Ref(value);
      const Expr member = b_.Seq({String(), Colon(), v});
      const Expr object =
          b_.Seq({b_.Literal("{"), b_.Opt(b_.Seq({member, b_.Star(b_.Seq({Comma(), member}))})), b_.Literal("}")});
      const Expr array = b_.Seq({b_.Literal("["), b_.Opt(b_.Seq({v, b_.Star(b_.Seq({Comma(), v}))})), b_.Literal("]")});
      const uint32_t obj = b_.DeclareRule();
      b_.DefineRule(obj, object);
      any_object_ = obj;
      b_.DefineRule(value, b_.Alt({b_.Ref(obj), array, String(), Number(), b_.Literal("true"), b_.Literal("false"),
                                   b_.Literal("null")}));
    }
    return b_.Ref(*any_value_);
  }

  Expr AnyObject() {
    AnyValue();
    return b_.Ref(*any_object_);
  }

 private:
  Expr Colon() { return b_.Seq({b_.Literal(":"), b_.Opt(b_.Literal(" "))}); }
  Expr Comma() { return b_.Seq({b_.Literal(","), b_.Opt(b_.Literal(" "))}); }
  Expr String() {
    if (!string_) {
      string_ = b_.DeclareRule();
      b_.DefineRule(*string_, b_.Seq({b_.Literal("\""), b_.JsonStringBody(), b_.Literal("\"")}));
    }
    return b_.Ref(*string_);
  }
  // Integers of at most 18 digits, fractions of at most 18 and exponents of at most 2: values a
  // double holds, at most 1e117 (a JSON parser refuses 1e999 as out of range), and no endless
  // run of digits from a sampled model.
  Expr Integer() {
    if (!integer_) {
      integer_ = b_.DeclareRule();
      b_.DefineRule(*integer_,
                    b_.Seq({b_.Opt(b_.Literal("-")),
                            b_.Alt({b_.Literal("0"), b_.Seq({b_.Range('1', '9'), b_.Repeat(Digit(), 0, 17)})})}));
    }
    return b_.Ref(*integer_);
  }
  Expr Digit() { return b_.Range('0', '9'); }

  // An integer schema's minimum / maximum / exclusiveMinimum / exclusiveMaximum as a grammar of
  // the integers in range (the plain integer grammar without bounds). Bounds beyond the 18 digits
  // the integer grammar writes are clamped to them.
  Result<Expr> BoundedInteger(const Json& s, const std::string& path) {
    int64_t lo = -kMaxInteger, hi = kMaxInteger;
    bool bounded = false;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      const auto it = s.find(k);
      if (it == s.end()) continue;
      if (!it->is_number())
        return InvalidArgument(path + "." + k + ": expected a number" +
                               (it->is_boolean() ? " (draft-4 boolean exclusive bounds are not supported)" : ""));
      bounded = true;
      const double v = it->get<double>();
      const std::string key = k;
      if (key == "minimum" || key == "exclusiveMinimum") {
        double b = key == "minimum" ? std::ceil(v) : std::floor(v) + 1;
        b = std::clamp(b, static_cast<double>(-kMaxInteger), static_cast<double>(kMaxInteger) + 1);
        lo = std::max(lo, static_cast<int64_t>(b));
      } else {
        double b = key == "maximum" ? std::floor(v) : std::ceil(v) - 1;
        b = std::clamp(b, static_cast<double>(-kMaxInteger) - 1, static_cast<double>(kMaxInteger));
        hi = std::min(hi, static_cast<int64_t>(b));
      }
    }
    if (!bounded) return Integer();
    if (lo > hi) return InvalidArgument(path + ": no integer lies within its minimum / maximum bounds");
    std::vector<Expr> options;
    if (lo < 0) {  // the negatives' magnitudes
      const int64_t top = std::min<int64_t>(hi, -1);
      options.push_back(b_.Seq({b_.Literal("-"), NonNegativeRange(-top, -lo)}));
    }
    if (hi >= 0) options.push_back(NonNegativeRange(std::max<int64_t>(lo, 0), hi));
    return b_.Alt(options);
  }

  // ---- Bounded numbers: decimals without an exponent, digit by digit against the bounds.

  // A bound as written in decimal: sign, integer digits, fraction digits without trailing zeros.
  struct Decimal {
    bool negative = false;
    std::string ip = "0", fp;
    bool strict = false;  // exclusive
    double value = 0;
  };
  // A bound on the fraction digits still to come (their value as 0.ddd): none, or >= / > 0.s
  // (lower), <= / < 0.s (upper).
  struct FracBound {
    bool on = false;
    std::string s;
    bool strict = false;
  };

  // The bound `v` (a JSON number) in decimal, from its shortest text; nullopt when that text has an
  // exponent (|v| below 1e-5 or of 16 integer digits or more).
  static std::optional<Decimal> ToDecimal(const Json& v, bool strict) {
    Decimal d;
    d.strict = strict;
    d.value = v.get<double>();
    std::string t = v.dump();
    if (t.find_first_of("eE") != std::string::npos) return std::nullopt;
    if (!t.empty() && t[0] == '-') {
      d.negative = true;
      t.erase(0, 1);
    }
    const size_t dot = t.find('.');
    d.ip = t.substr(0, dot);
    if (dot != std::string::npos) d.fp = t.substr(dot + 1);
    while (!d.fp.empty() && d.fp.back() == '0') d.fp.pop_back();
    if (d.ip.empty() || d.ip.size() > 18) return std::nullopt;
    if (d.ip == "0" && d.fp.empty()) d.negative = false;
    return d;
  }

  // A number schema's bounds as a grammar of the decimals in range (no exponent); the plain
  // number grammar without bounds.
  Result<Expr> BoundedNumber(const Json& s, const std::string& path) {
    std::optional<Decimal> lo, hi;
    bool bounded = false;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      const auto it = s.find(k);
      if (it == s.end()) continue;
      if (!it->is_number()) return InvalidArgument(path + "." + k + ": expected a number");
      bounded = true;
      const std::string key = k;
      const bool lower = key == "minimum" || key == "exclusiveMinimum";
      std::optional<Decimal> d = ToDecimal(*it, key.rfind("exclusive", 0) == 0);
      if (!d) {
        if (opts_.strict)
          return InvalidArgument(path + "." + k +
                                 ": bounds that need an exponent (below 1e-5 or of 16 digits and more) "
                                 "are not supported in strict mode");
        continue;  // not enforced
      }
      std::optional<Decimal>& b = lower ? lo : hi;
      const bool tighter =
          !b || (lower ? d->value > b->value : d->value < b->value) || (d->value == b->value && d->strict);
      if (tighter) b = d;
    }
    if (!bounded) return Number();
    if (lo && hi && (lo->value > hi->value || (lo->value == hi->value && (lo->strict || hi->strict))))
      return InvalidArgument(path + ": no number lies within its minimum / maximum bounds");
    std::vector<Expr> options;
    // v >= 0: magnitudes from max(lo, 0) to hi.
    if (!hi || hi->value > 0 || (hi->value == 0 && !hi->strict)) {
      Decimal from = lo && lo->value >= 0 ? *lo : Decimal{};
      if (std::optional<Expr> m = Magnitude(from, hi && !hi->negative ? hi : std::nullopt)) options.push_back(*m);
    }
    // v < 0: "-" and magnitudes from |hi| (or above 0) to |lo|.
    if (!lo || lo->value < 0) {
      Decimal from;
      from.strict = true;  // above 0: no "-0"
      if (hi && hi->value < 0) from = *hi;
      if (std::optional<Expr> m = Magnitude(from, lo)) options.push_back(b_.Seq({b_.Literal("-"), *m}));
    }
    if (options.empty()) return InvalidArgument(path + ": no number lies within its minimum / maximum bounds");
    return b_.Alt(options);
  }

  // The unsigned decimals x (integer part up to 18 digits, no exponent) with x >= lo (x > lo when
  // lo.strict) and x <= hi (or <), no upper bound without hi; nullopt when there are none.
  std::optional<Expr> Magnitude(const Decimal& lo, const std::optional<Decimal>& hi) {
    const int64_t a = std::stoll(lo.ip);
    const int64_t z = hi ? std::stoll(hi->ip) : kMaxInteger;
    if (a > z) return std::nullopt;
    const FracBound flo{true, lo.fp, lo.strict};
    const FracBound fhi = hi ? FracBound{true, hi->fp, hi->strict} : FracBound{};
    std::vector<Expr> options;
    auto with = [&](int64_t ip, const FracBound& l, const FracBound& u) {
      if (std::optional<Expr> f = Fraction(l, u)) options.push_back(b_.Seq({b_.Literal(std::to_string(ip)), *f}));
    };
    if (a == z) {
      with(a, flo, fhi);
    } else {
      with(a, flo, {});
      if (z - a >= 2) options.push_back(b_.Seq({NonNegativeRange(a + 1, z - 1), *Fraction({}, {})}));
      with(z, {}, fhi);
    }
    if (options.empty()) return std::nullopt;
    return b_.Alt(options);
  }

  // What follows an integer part whose fraction must lie within lo and hi: nothing (a fraction
  // of 0) or "." and 1-18 digits.
  std::optional<Expr> Fraction(const FracBound& lo, const FracBound& hi) {
    std::vector<Expr> options;
    const bool zero_ok = (!lo.on || (lo.s.empty() && !lo.strict)) && (!hi.on || !(hi.s.empty() && hi.strict));
    if (zero_ok) options.push_back(b_.Literal(""));
    if (std::optional<Expr> d = FracDigits(lo, hi, false)) options.push_back(b_.Seq({b_.Literal("."), *d}));
    if (options.empty()) return std::nullopt;
    return b_.Alt(options);
  }

  // Digit strings t (empty only when allow_empty) whose value 0.t lies within lo and hi.
  std::optional<Expr> FracDigits(FracBound lo, FracBound hi, bool allow_empty) {
    if (lo.on && lo.s.empty() && !lo.strict) lo = {};  // >= 0: always
    const int min_len = allow_empty ? 0 : 1;
    if (!lo.on && !hi.on) return b_.Repeat(Digit(), min_len, 18);
    if (hi.on && hi.s.empty()) {  // <= 0 (all zeros) or < 0 (none); a lower bound still on wants more than 0
      if (hi.strict || lo.on) return std::nullopt;
      return b_.Repeat(b_.Literal("0"), min_len, 18);
    }
    if (lo.on && lo.s.empty() && !hi.on)  // > 0: a nonzero digit somewhere
      return b_.Seq({b_.Repeat(b_.Literal("0"), 0, 17), b_.Range('1', '9'), b_.Repeat(Digit(), 0, 17)});
    std::vector<Expr> options;
    if (allow_empty && !lo.on) options.push_back(b_.Literal(""));  // 0 is below any upper 0.s (s nonzero)
    const int lo_d = lo.on && !lo.s.empty() ? lo.s[0] - '0' : 0;
    const int hi_d = hi.on ? hi.s[0] - '0' : 9;
    auto next = [&](int c) {
      FracBound l, u;
      if (lo.on && c == lo_d) l = lo.s.empty() ? lo : FracBound{true, lo.s.substr(1), lo.strict};
      if (hi.on && c == hi_d) u = FracBound{true, hi.s.substr(1), hi.strict};
      return std::pair{l, u};
    };
    // The first digit at a bound keeps that bound on the digits after it; digits strictly
    // between the bounds free the rest.
    auto at_bound = [&](int c) {
      const auto [l, u] = next(c);
      if (std::optional<Expr> rest = FracDigits(l, u, true))
        options.push_back(b_.Seq({b_.Literal(std::string(1, static_cast<char>('0' + c))), *rest}));
    };
    if (lo_d <= hi_d) at_bound(lo_d);
    if (lo_d < hi_d) at_bound(hi_d);
    if (hi_d - lo_d >= 2)
      options.push_back(b_.Seq({b_.Range(static_cast<uint8_t>('0' + lo_d + 1), static_cast<uint8_t>('0' + hi_d - 1)),
                                b_.Repeat(Digit(), 0, 17)}));
    if (options.empty()) return std::nullopt;
    return b_.Alt(options);
  }

  // The decimal strings (no leading zeros) of the integers in [lo, hi], 0 <= lo <= hi.
  Expr NonNegativeRange(int64_t lo, int64_t hi) {
    const std::string a = std::to_string(lo), z = std::to_string(hi);
    if (a.size() == z.size()) return SameLength(a, z);
    std::vector<Expr> options = {SameLength(a, std::string(a.size(), '9'))};
    for (size_t len = a.size() + 1; len < z.size(); ++len)
      options.push_back(
          b_.Seq({b_.Range('1', '9'), b_.Repeat(Digit(), static_cast<int>(len - 1), static_cast<int>(len - 1))}));
    options.push_back(SameLength("1" + std::string(z.size() - 1, '0'), z));
    return b_.Alt(options);
  }

  // The digit strings d with lo <= d <= hi, all three of one length.
  Expr SameLength(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return b_.Literal("");
    const int rest = static_cast<int>(lo.size()) - 1;
    const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
    if (lo[0] == hi[0]) return b_.Seq({b_.Literal(lo.substr(0, 1)), SameLength(lo_rest, hi_rest)});
    if (lo_rest == std::string(rest, '0') && hi_rest == std::string(rest, '9'))
      return b_.Seq(
          {b_.Range(static_cast<uint8_t>(lo[0]), static_cast<uint8_t>(hi[0])), b_.Repeat(Digit(), rest, rest)});
    std::vector<Expr> options = {b_.Seq({b_.Literal(lo.substr(0, 1)), SameLength(lo_rest, std::string(rest, '9'))})};
    if (lo[0] + 1 <= hi[0] - 1)
      options.push_back(b_.Seq({b_.Range(static_cast<uint8_t>(lo[0] + 1), static_cast<uint8_t>(hi[0] - 1)),
                                b_.Repeat(Digit(), rest, rest)}));
    options.push_back(b_.Seq({b_.Literal(hi.substr(0, 1)), SameLength(std::string(rest, '0'), hi_rest)}));
    return b_.Alt(options);
  }
  Expr Number() {
    if (!number_) {
      number_ = b_.DeclareRule();
      ByteSet e;
      e.set('e');
      e.set('E');
      ByteSet sign;
      sign.set('+');
      sign.set('-');
      b_.DefineRule(*number_,
                    b_.Seq({Integer(), b_.Opt(b_.Seq({b_.Literal("."), b_.Repeat(Digit(), 1, 18)})),
                            b_.Opt(b_.Seq({b_.Bytes(e), b_.Opt(b_.Bytes(sign)), b_.Repeat(Digit(), 1, 2)}))}));
    }
    return b_.Ref(*number_);
  }
  Expr JsonLiteral(const Json& v) { return b_.Literal(v.dump(-1, ' ', false, Json::error_handler_t::replace)); }

  Result<Expr> Core(const Json& s, const std::string& path, int depth) {
    if (auto it = s.find("$ref"); it != s.end()) return Ref(*it, path + ".$ref", depth);
    if (auto it = s.find("const"); it != s.end()) return JsonLiteral(*it);
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return InvalidArgument(path + ".enum: expected a non-empty array");
      std::vector<Expr> options;
      for (const Json& v : *it) options.push_back(JsonLiteral(v));
      return b_.Alt(options);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) {
        if (!it->is_array() || it->empty()) return InvalidArgument(path + "." + key + ": expected a non-empty array");
        std::vector<Expr> options;
        for (size_t i = 0; i < it->size(); ++i) {
          Result<Expr> e = Value((*it)[i], path + "." + key + "[" + std::to_string(i) + "]", depth + 1);
          if (!e.ok()) return e;
          options.push_back(*e);
        }
        return b_.Alt(options);
      }
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1)
        return InvalidArgument(path + ".allOf: only allOf with a single schema is supported for constrained decoding");
      return Value((*it)[0], path + ".allOf[0]", depth + 1);
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array()) {
        for (const Json& t : *it) {
          if (!t.is_string()) return InvalidArgument(path + ".type: expected a string or an array of strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return InvalidArgument(path + ".type: expected a string or an array of strings");
      }
    } else if (s.contains("properties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else {
      return AnyValue();
    }
    std::vector<Expr> options;
    for (const std::string& t : types) {
      Result<Expr> e = Typed(s, t, path, depth);
      if (!e.ok()) return e;
      options.push_back(*e);
    }
    if (options.empty()) return InvalidArgument(path + ".type: expected at least one type");
    return b_.Alt(options);
  }

  // A string schema's `pattern`, or the pattern of its `format`: the string's body as
  // JsonPatternExpr matches it; nullopt when neither applies.
  Result<std::optional<Expr>> PatternString(const Json& s, const std::string& path) {
    std::string pattern, where;
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return InvalidArgument(path + ".pattern: expected a string");
      pattern = it->get<std::string>();
      where = path + ".pattern";
    } else if (auto f = s.find("format"); f != s.end()) {
      if (!f->is_string()) return InvalidArgument(path + ".format: expected a string");
      const char* p = FormatPattern(f->get<std::string>());
      if (p == nullptr) {
        if (opts_.strict)
          return InvalidArgument(path + ".format: the format \"" + f->get<std::string>() +
                                 "\" is not supported in strict mode (supported: date-time, date, time, duration, "
                                 "email, hostname, ipv4, ipv6, uuid)");
        return std::optional<Expr>();
      }
      pattern = p;
      where = path + ".format";
    } else {
      return std::optional<Expr>();
    }
    if ((s.contains("minLength") || s.contains("maxLength")) && opts_.strict)
      return InvalidArgument(where +
                             ": minLength / maxLength together with a pattern or format are not supported "
                             "in strict mode");
    Result<Expr> body = JsonPatternExpr(b_, pattern);
    if (!body.ok()) return InvalidArgument(where + ": " + body.status().message());
    return std::optional<Expr>(b_.Seq({b_.Literal("\""), *body, b_.Literal("\"")}));
  }

  Result<Expr> Typed(const Json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "string") {
      Result<std::optional<Expr>> patterned = PatternString(s, path);
      if (!patterned.ok()) return patterned.status();
      if (*patterned) return **patterned;
      // Length bounds up to kMaxUnrolledChars are enforced (in characters, an escape counting as
      // one); beyond that they are a value bound the grammar does not enforce.
      int64_t lo = 0, hi = -1;
      if (auto it = s.find("minLength"); it != s.end() && it->is_number_integer()) lo = it->get<int64_t>();
      if (auto it = s.find("maxLength"); it != s.end() && it->is_number_integer()) hi = it->get<int64_t>();
      if (lo == 0 && hi < 0) return String();
      if (lo < 0 || lo > kMaxUnrolledChars || (hi >= 0 && hi < lo) || hi > kMaxUnrolledChars) {
        if (opts_.strict)
          return InvalidArgument(path + ".maxLength: length bounds above " + std::to_string(kMaxUnrolledChars) +
                                 " are not supported in strict mode");
        return String();
      }
      const Expr ch =
          b_.Alt({b_.StringChar(),
                  b_.Seq({b_.Literal("\\"), b_.Bytes(JsonSimpleEscapes()) /* no \\uXXXX in bounded strings */}),
                  b_.Utf8NonAscii()});
      const Expr body = hi < 0 ? b_.Seq({b_.Repeat(ch, static_cast<int>(lo), static_cast<int>(lo)), b_.Star(ch)})
                               : b_.Repeat(ch, static_cast<int>(lo), static_cast<int>(hi));
      return b_.Seq({b_.Literal("\""), body, b_.Literal("\"")});
    }
    if (t == "number") return BoundedNumber(s, path);
    if (t == "integer") return BoundedInteger(s, path);
    if (t == "boolean") return b_.Alt({b_.Literal("true"), b_.Literal("false")});
    if (t == "null") return b_.Literal("null");
    if (t == "object") return Object(s, path, depth);
    if (t == "array") return Array(s, path, depth);
    return InvalidArgument(path + ".type: unknown type \"" + t + "\"");
  }

  Result<Expr> Object(const Json& s, const std::string& path, int depth) {
    const auto props = s.find("properties");
    if (props == s.end() || !props->is_object() || props->empty()) {
      // No declared properties: any members, or members of the additionalProperties schema.
      const auto extra = s.find("additionalProperties");
      if (extra != s.end() && extra->is_boolean() && !extra->get<bool>()) return b_.Literal("{}");
      if (extra == s.end() || !extra->is_object()) return AnyObject();
      Result<Expr> v = Value(*extra, path + ".additionalProperties", depth + 1);
      if (!v.ok()) return v;
      const Expr member = b_.Seq({String(), Colon(), *v});
      return b_.Seq({b_.Literal("{"), b_.Opt(b_.Seq({member, b_.Star(b_.Seq({Comma(), member}))})), b_.Literal("}")});
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return InvalidArgument(path + ".required: expected an array of names");
      for (const Json& r : *it) {
        if (!r.is_string()) return InvalidArgument(path + ".required: expected an array of names");
        if (!props->contains(r.get<std::string>()))
          return InvalidArgument(path + ".required: \"" + r.get<std::string>() + "\" is not in properties");
        required.insert(r.get<std::string>());
      }
    }
    struct Prop {
      Expr kv;
      bool required;
    };
    std::vector<Prop> list;
    for (auto it = props->begin(); it != props->end(); ++it) {
      Result<Expr> v = Value(it.value(), path + ".properties." + it.key(), depth + 1);
      if (!v.ok()) return v;
      list.push_back({b_.Seq({JsonLiteral(Json(it.key())), Colon(), *v}), required.count(it.key()) > 0});
    }
    // tail[i][first]: properties i.. in order, `first` when none has been written yet.
    const size_t n = list.size();
    std::vector<std::array<Expr, 2>> tail(n + 1, {b_.Empty(), b_.Empty()});
    for (size_t i = n; i-- > 0;) {
      for (int first = 0; first < 2; ++first) {
        const Expr with = first ? b_.Seq({list[i].kv, tail[i + 1][0]}) : b_.Seq({Comma(), list[i].kv, tail[i + 1][0]});
        Expr e = list[i].required ? with : b_.Alt({with, tail[i + 1][first]});
        // A rule per suffix keeps the expression linear in the number of properties.
        const uint32_t r = b_.DeclareRule();
        b_.DefineRule(r, e);
        tail[i][first] = b_.Ref(r);
      }
    }
    return b_.Seq({b_.Literal("{"), tail[0][1], b_.Literal("}")});
  }

  Result<Expr> Array(const Json& s, const std::string& path, int depth) {
    Expr item = AnyValue();
    if (auto it = s.find("items"); it != s.end()) {
      Result<Expr> e = Value(*it, path + ".items", depth + 1);
      if (!e.ok()) return e;
      item = *e;
    }
    int64_t lo = 0;
    std::optional<int64_t> hi;
    if (auto it = s.find("minItems"); it != s.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0)
        return InvalidArgument(path + ".minItems: expected an integer >= 0");
      lo = it->get<int64_t>();
      if (lo > kMaxUnrolledItems)
        return InvalidArgument(path + ".minItems: at most " + std::to_string(kMaxUnrolledItems) +
                               " is supported for constrained decoding");
    }
    if (auto it = s.find("maxItems"); it != s.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < lo)
        return InvalidArgument(path + ".maxItems: expected an integer >= minItems");
      if (it->get<int64_t>() <= kMaxUnrolledItems) {
        hi = it->get<int64_t>();
      } else if (opts_.strict) {
        return InvalidArgument(path + ".maxItems: at most " + std::to_string(kMaxUnrolledItems) +
                               " is supported in strict mode");
      }
    }
    const uint32_t r = b_.DeclareRule();  // one rule for the item, shared by the unrolled copies
    b_.DefineRule(r, item);
    const Expr one = b_.Ref(r);
    const Expr more = b_.Seq({Comma(), one});
    Expr body;
    if (hi && *hi == 0) {
      body = b_.Empty();
    } else {
      const int first_lo = lo > 0 ? 1 : 0;
      Expr rest = hi ? b_.Repeat(more, static_cast<int>(std::max<int64_t>(lo - 1, 0)), static_cast<int>(*hi - 1))
                     : b_.Seq({b_.Repeat(more, static_cast<int>(std::max<int64_t>(lo - 1, 0)),
                                         static_cast<int>(std::max<int64_t>(lo - 1, 0))),
                               b_.Star(more)});
      body = b_.Seq({one, rest});
      if (first_lo == 0) body = b_.Opt(body);
    }
    return b_.Seq({b_.Literal("["), body, b_.Literal("]")});
  }

  Result<Expr> Ref(const Json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return InvalidArgument(path + ": expected a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return b_.Ref(it->second);
    const Json* target = nullptr;
    if (r == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (r.rfind(p, 0) != 0) continue;
        const std::string container = p.substr(2, p.size() - 3);
        const std::string name = r.substr(p.size());
        if (root_.is_object() && root_.contains(container) && root_[container].is_object() &&
            root_[container].contains(name))
          target = &root_[container][name];
      }
    }
    if (target == nullptr)
      return InvalidArgument(path +
                             ": only references to \"#\", \"#/$defs/NAME\" or \"#/definitions/NAME\" "
                             "within the schema are supported; \"" +
                             r + "\" is not found");
    const uint32_t rule = b_.DeclareRule();
    refs_[r] = rule;  // before compiling the target, so that recursion refers back to the rule
    Result<Expr> e = Value(*target, path + "(" + r + ")", depth + 1);
    if (!e.ok()) {
      b_.DefineRule(rule, Expr{});  // no alternatives: the builder stays whole for a fallback
      return e;
    }
    b_.DefineRule(rule, *e);
    return b_.Ref(rule);
  }

  GrammarBuilder& b_;
  const Json& root_;
  JsonGrammarOptions opts_;
  std::optional<uint32_t> any_value_, any_object_, string_, number_, integer_;
  std::map<std::string, uint32_t> refs_;
};

}  // namespace

Result<GrammarBuilder::Expr> JsonSchemaExpr(GrammarBuilder& b, const nlohmann::ordered_json& schema,
                                            const JsonGrammarOptions& opts) {
  Compiler c(b, schema, opts);
  return c.Value(schema, "$", 0);
}

GrammarBuilder::Expr JsonAnyValue(GrammarBuilder& b) {
  Compiler c(b, nlohmann::ordered_json(), {});
  return c.AnyValue();
}

GrammarBuilder::Expr JsonAnyObject(GrammarBuilder& b) {
  Compiler c(b, nlohmann::ordered_json(), {});
  return c.AnyObject();
}

}  // namespace mr
