// GBNF grammars (gbnf.h): syntax, Unicode classes, repetition, the refusals, and token masks.
//
// Oracles: nlohmann's JSON parser for the sentences of a JSON grammar written in GBNF (and its
// serializer for documents the grammar must accept); a direct membership test of each code point
// for the classes; hand-checked sentences for the rest. The token masks are compared with
// llama.cpp's own grammar sampler in tests/e2e/test_grammar_parity.py.
#include "runtime/gbnf.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "model/test_models.h"
#include "runtime/test_grammars.h"

namespace mr {
namespace {

std::shared_ptr<const Grammar> Compile(std::string_view text) {
  GrammarBuilder b;
  Result<GrammarBuilder::Expr> e = GbnfExpr(b, text);
  EXPECT_TRUE(e.ok()) << e.status().message() << "\n" << text;
  if (!e.ok()) return nullptr;
  return b.Build(*e);
}

std::string CompileError(std::string_view text) {
  GrammarBuilder b;
  Result<GrammarBuilder::Expr> e = GbnfExpr(b, text);
  EXPECT_FALSE(e.ok()) << text;
  return e.ok() ? "" : e.status().message();
}

bool Matches(const Grammar& g, std::string_view text) {
  GrammarState s = g.Start();
  return s.AdvanceAll(text) && s.accepting();
}

std::string Utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// JSON in GBNF, written for this test in llama.cpp's style (newlines inside parentheses and after
// '|', comments, classes with escapes, bounded and unbounded repetition).
constexpr const char* kJsonGbnf = R"(# a JSON value, compact or spaced
root   ::= ws value ws
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws (
             member
             ("," ws member)*
           )? "}"
member ::= string ws ":" ws value ws
array  ::= "[" ws (
             value ws
             ("," ws value ws)*
           )? "]"
string ::= "\"" (
             [^"\\\x7F\x00-\x1F] |
             "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
           )* "\""
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,2})?
ws     ::= |
           [ \t\n] ws
)";

TEST(Gbnf, JsonGrammarSentencesAreJsonAndJsonIsASentence) {
  const auto g = Compile(kJsonGbnf);
  ASSERT_NE(g, nullptr);
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    const std::string s = RandomSentence(*g, rng, 30);
    ASSERT_FALSE(nlohmann::json::parse(s, nullptr, false).is_discarded()) << s;
  }
  for (const char* doc : {R"({"a": [1, 2.5, -3e10, true, null], "b\u00e9": {"c": "x\"y\\z\n"}})", "[]", "{}",
                          R"(  "ünïcode ✓ 😀"  )", "0", "-0.5E+3"}) {
    const nlohmann::json v = nlohmann::json::parse(doc);
    EXPECT_TRUE(Matches(*g, doc)) << doc;
    EXPECT_TRUE(Matches(*g, v.dump())) << v.dump();
    EXPECT_TRUE(Matches(*g, v.dump(2))) << v.dump(2);
  }
  for (const char* bad : {"{", "[1,]", "01", "\"a\nb\"", "{\"a\" 1}", "tru", "1.", "\"\\x\""})
    EXPECT_FALSE(Matches(*g, bad)) << bad;
}

TEST(Gbnf, LiteralsEscapesGroupsAndRepetition) {
  const auto g =
      Compile(R"(root ::= "\x41\u00e9\U0001F600\t\"\\\[\]\-" x "ab"{2} ("c" | "d"){1,3} "e"? "f"* "g"+ [0-9]{2,}
x ::= "x")");
  ASSERT_NE(g, nullptr);
  const std::string head = "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\[]-x";
  for (const std::string tail : {"ababcgg00", "ababcdcefffg123", "ababdeg99"})
    EXPECT_TRUE(Matches(*g, head + tail)) << tail;
  for (const std::string tail : {"abcg00", "ababcdcdg00", "ababcg0", "ababceeg00", "ababc00"})
    EXPECT_FALSE(Matches(*g, head + tail)) << tail;
  // A postfix applies to the whole literal, and postfixes stack.
  const auto h = Compile("root ::= \"ab\"*? \"c\"");
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(Matches(*h, "ababc"));
  EXPECT_TRUE(Matches(*h, "c"));
  EXPECT_FALSE(Matches(*h, "abbc"));
}

TEST(Gbnf, LinesCommentsAndRuleOrder) {
  // A rule ends at its line's end, unless inside parentheses or after '|'; rules may be used
  // before they are defined; CRLF line ends work.
  const auto g =
      Compile("# leading comment\r\n\r\nroot ::= a |\r\n  b # trailing\r\na ::= (\n \"x\"\n \"y\" )\nb ::= \"z\"");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(*g, "xy"));
  EXPECT_TRUE(Matches(*g, "z"));
  EXPECT_FALSE(Matches(*g, "x"));
  // An empty alternative.
  const auto w = Compile("root ::= \"a\" ws \"b\"\nws ::= | \" \" ws");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(Matches(*w, "ab"));
  EXPECT_TRUE(Matches(*w, "a   b"));
}

TEST(Gbnf, ClassesAreSetsOfCodePointsInWellFormedUtf8) {
  struct Case {
    const char* cls;
    bool (*in)(uint32_t);
  };
  const Case cases[] = {
      {"[a-zA-Z_]", [](uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }},
      {"[^\"\\\\\\x00-\\x1F]", [](uint32_t c) { return c != '"' && c != '\\' && c >= 0x20; }},
      {"[а-яё]", [](uint32_t c) { return (c >= 0x430 && c <= 0x44F) || c == 0x451; }},
      {"[\\u07FF-\\u0800\\uFFFF-\\U00010000]",
       [](uint32_t c) { return c == 0x7FF || c == 0x800 || c == 0xFFFF || c == 0x10000; }},
      {"[^a-z\\u00e9]", [](uint32_t c) { return !(c >= 'a' && c <= 'z') && c != 0xE9; }},
      {"[\\U0001F600-\\U0001F64F]", [](uint32_t c) { return c >= 0x1F600 && c <= 0x1F64F; }},
      {"[\\x80-\\xFF]", [](uint32_t c) { return c >= 0x80 && c <= 0xFF; }},
      {".", [](uint32_t) { return true; }},
      {"[^]", [](uint32_t) { return true; }},
      {"[]", [](uint32_t) { return false; }},
  };
  for (const Case& k : cases) {
    const auto g = Compile(std::string("root ::= ") + k.cls);
    ASSERT_NE(g, nullptr) << k.cls;
    // Every code point below U+3000, then a stride with the encoding boundaries.
    std::vector<uint32_t> cps;
    for (uint32_t c = 0; c < 0x3000; ++c) cps.push_back(c);
    for (uint32_t c = 0x3000; c <= 0x10FFFF; c += 61) cps.push_back(c);
    for (uint32_t c : {0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x1F600u, 0x1F64Fu, 0x1F650u, 0x10FFFFu}) cps.push_back(c);
    for (uint32_t c : cps) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      ASSERT_EQ(Matches(*g, Utf8(c)), k.in(c)) << k.cls << " U+" << std::hex << c;
    }
    // Ill-formed UTF-8 never matches: overlong forms, surrogates, above U+10FFFF, stray bytes.
    for (const char* bad : {"\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xed\xa0\x80", "\xf0\x80\x80\x80",
                            "\xf4\x90\x80\x80", "\x80", "\xff", "\xc3"})
      EXPECT_FALSE(Matches(*g, bad)) << k.cls;
  }
}

TEST(Gbnf, ChoiceQuotesEveryOption) {
  const std::vector<std::string> options = {"yes", "no \"way\"", "back\\slash", "line\nbreak", "caf\xc3\xa9", ""};
  const auto g = Compile(GbnfChoice(options));
  ASSERT_NE(g, nullptr);
  for (const std::string& o : options) EXPECT_TRUE(Matches(*g, o)) << o;
  for (const char* bad : {"ye", "no", "no \\\"way\\\"", "line\\nbreak", "back\\\\slash"})
    EXPECT_FALSE(Matches(*g, bad)) << bad;
}

TEST(Gbnf, ErrorsNameTheLineColumnAndCause) {
  struct Case {
    const char* grammar;
    const char* expect;
  };
  const Case cases[] = {
      {"root ::= x", "line 1, column 10: undefined rule 'x'"},
      {"a ::= \"x\"", "no rule named 'root'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice (first at line 1, column 1)"},
      {"root ::= root \"x\"", "rule 'root' is left-recursive (root -> root)"},
      {"root ::= a\na ::= b \"x\"\nb ::= \"y\"? a", "is left-recursive"},
      {"root ::= (\"a\"?)*", "line 1, column 10: an unbounded repetition"},
      {"root ::= \"a\"{2001}", "repetition count 2001 is above 2000"},
      {"root ::= \"a\"{3,1}", "maximum is below its minimum"},
      {"root ::= \"abc", "line 1, column 10: unterminated string literal"},
      {"root ::= [abc", "unterminated character class"},
      {"root ::= \"\\q\"", "unknown escape '\\q'"},
      {"root ::= [z-a]", "the range's end comes before its start"},
      {"root ::= <think> \"x\"", "token matches"},
      {"root ::= (\"a\"", "expected ')'"},
      {"root ::= \"a\" )", "unexpected ')' in rule 'root'"},
      {"root ::= \"a\"\n  | \"b\"", "line 2, column 3: expected a rule name"},
      {"root \"a\"", "expected '::='"},
      {"root ::= * \"a\"", "'*' must follow an item"},
      {"root ::= \"\xff\"", "invalid UTF-8"},
      {"root ::= \"\\uD800\"", "surrogate"},
      {"root ::= \"\\U00110000\"", "above U+10FFFF"},
      {"root ::= \"a\"{x}", "expected an integer"},
  };
  for (const Case& c : cases) {
    const std::string m = CompileError(c.grammar);
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.grammar << "\n  got: " << m;
  }
  // Hostile sizes: deep nesting, and repetitions that would unroll past the element bound.
  std::string deep = "root ::= " + std::string(5000, '(') + "\"a\"" + std::string(5000, ')');
  EXPECT_NE(CompileError(deep).find("nested deeper than"), std::string::npos);
  std::string wide = "root ::=";
  for (int i = 0; i < 600; ++i) wide += " \"ab\"{2000}";
  EXPECT_NE(CompileError(wide).find("too large"), std::string::npos);
  // Nested repetitions stay small: each level repeats one reference.
  EXPECT_NE(Compile("root ::= (((\"ab\"{2000}){2000}){2000})"), nullptr);
}

std::shared_ptr<const Grammar> CompileRegex(std::string_view pattern) {
  GrammarBuilder b;
  Result<GrammarBuilder::Expr> e = RegexExpr(b, pattern);
  EXPECT_TRUE(e.ok()) << e.status().message() << "\n" << pattern;
  if (!e.ok()) return nullptr;
  return b.Build(*e);
}

// Regular expressions against std::regex (ECMAScript, an independent matcher) on random strings
// over each pattern's alphabet (which holds characters on both sides of every class).
TEST(Regex, MatchesWhatStdRegexMatches) {
  struct Case {
    const char* pattern;
    const char* alphabet;
  };
  const Case cases[] = {
      {R"(^\d{3}-\d{2,4}$)", "0123456789-a"},
      {R"([A-Z][a-z]*( [A-Z][a-z]*)?)", "Aab Z"},
      {R"((?:ab|a)(c|bc)*d?)", "abcd"},
      {R"(\w+@\w+\.(com|org))", "ab_1@.comrg"},
      {R"([^\s,]+(,\s?[^\s,]+){0,3})", "ab, \t"},
      {R"(x{2,}y{0,2}z{1}\{)", "xyz{"},
      {R"((?P<year>19|20)\d\d[-/.](0[1-9]|1[012]))", "0129-/."},
      {R"([\]a-c\-]+|\.\*\?)", "]ab-.*?c"},
      {R"(a.c|\W\S\D)", "a\nc 1-"},
      {R"((yes|no)+?)", "yesno"},
  };
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    const auto g = CompileRegex(c.pattern);
    ASSERT_NE(g, nullptr) << c.pattern;
    const std::regex re(c.pattern[0] == '(' && c.pattern[1] == '?' && c.pattern[2] == 'P'
                            ? std::string(c.pattern).replace(1, 8, "")  // std::regex has no named groups
                            : std::string(c.pattern));
    const std::string alphabet = c.alphabet;
    int matched = 0;
    for (int i = 0; i < 4000; ++i) {
      std::string s;
      const size_t len = rng() % 10;
      for (size_t k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
      const bool want = std::regex_match(s, re);
      matched += want;
      ASSERT_EQ(Matches(*g, s), want) << c.pattern << " on \"" << s << "\"";
    }
    // Sentences of the grammar (random allowed bytes, ending at random where complete).
    for (int i = 0; i < 300; ++i) {
      GrammarState st = g->Start();
      std::string s;
      bool done = false;
      for (int k = 0; k < 40 && !done; ++k) {
        const ByteSet next = st.NextBytes();
        if (st.accepting() && (next.none() || rng() % 3 == 0)) {
          done = true;
          break;
        }
        std::vector<int> options;
        for (int b = 0; b < 128; ++b)  // ASCII: std::regex works on bytes
          if (next.test(static_cast<size_t>(b))) options.push_back(b);
        if (options.empty()) break;
        const int b = options[rng() % options.size()];
        s += static_cast<char>(b);
        ASSERT_TRUE(st.Advance(static_cast<uint8_t>(b)));
      }
      if (!done) continue;
      ++matched;
      ASSERT_TRUE(std::regex_match(s, re)) << c.pattern << " generated \"" << s << "\"";
    }
    EXPECT_GT(matched, 20) << c.pattern;
  }
  // Non-ASCII: classes and escapes of code points.
  const auto u = CompileRegex(R"([à-ÿ]\u00e9\x41.)");
  ASSERT_NE(u, nullptr);
  EXPECT_TRUE(Matches(*u,
                      "\xc3\xa0\xc3\xa9"
                      "A\xe2\x9c\x93"));
  EXPECT_FALSE(Matches(*u,
                       "a\xc3\xa9"
                       "Ax"));
  EXPECT_FALSE(Matches(*u,
                       "\xc3\xa0\xc3\xa9"
                       "A\n"));
}

// JSON Schema's `pattern`: JSON string bodies (nlohmann's escapes, the ones JSON writers use)
// whose decoded text std::regex_search (ECMAScript, unanchored) finds the pattern in, on random
// strings over alphabets holding '"', '\\' and control characters; and the grammar's own
// sentences decode to matching text.
TEST(Regex, JsonPatternMatchesWhatStdRegexSearches) {
  struct Case {
    const char* pattern;
    const char* alphabet;
  };
  const Case cases[] = {
      {R"(^a"b)", "ab\"\\"},     {R"([^a]+$)", "ab\"\\\n"}, {R"(\\d|x\n)", "x\\d1\n"},   {R"(^ab|cd$)", "abcd"},
      {R"(q[\s"]z)", "qz \"\t"}, {R"(.)", "\n\x01"},        {R"(^(?:a|"){2}$)", "a\"b"},
  };
  std::mt19937 rng(9);
  for (const Case& c : cases) {
    GrammarBuilder b;
    Result<GrammarBuilder::Expr> e = JsonPatternExpr(b, c.pattern);
    ASSERT_TRUE(e.ok()) << c.pattern << ": " << e.status().message();
    const auto g = b.Build(*e);
    const std::regex re(c.pattern);
    const std::string alphabet = c.alphabet;
    int matched = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const size_t len = rng() % 8;
      for (size_t k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
      const std::string quoted = nlohmann::json(s).dump();
      const bool want = std::regex_search(s, re);
      matched += want;
      ASSERT_EQ(Matches(*g, quoted.substr(1, quoted.size() - 2)), want) << c.pattern << " on " << quoted;
    }
    EXPECT_GT(matched, 20) << c.pattern;
    for (int i = 0; i < 200; ++i) {
      GrammarState st = g->Start();
      std::string body;
      for (int k = 0; k < 30; ++k) {
        const ByteSet next = st.NextBytes();
        if (st.accepting() && (next.none() || rng() % 3 == 0)) break;
        std::vector<int> options;
        for (int ch = 0; ch < 128; ++ch)
          if (next.test(static_cast<size_t>(ch))) options.push_back(ch);
        if (options.empty()) break;
        const int ch = options[rng() % options.size()];
        body += static_cast<char>(ch);
        ASSERT_TRUE(st.Advance(static_cast<uint8_t>(ch)));
      }
      if (!st.accepting()) continue;
      const auto text = nlohmann::json::parse("\"" + body + "\"", nullptr, false);
      ASSERT_TRUE(text.is_string()) << c.pattern << " generated an invalid JSON string body: " << body;
      ASSERT_TRUE(std::regex_search(text.get<std::string>(), re)) << c.pattern << " generated " << body;
    }
  }
  GrammarBuilder b;
  EXPECT_FALSE(JsonPatternExpr(b, "(^a)").ok());
  EXPECT_FALSE(JsonPatternExpr(b, "a(?=b)").ok());
}

TEST(Regex, UnsupportedConstructsAreNamed) {
  struct Case {
    const char* pattern;
    const char* expect;
  };
  const Case cases[] = {
      {R"((a)\1)", "column 4: backreferences are not supported"},
      {R"(a(?=b))", "lookaround"},
      {R"((?i)abc)", "lookaround, flags"},
      {R"(\bword\b)", "the anchor \\b is not supported"},
      {R"(a^b)", "'^' is supported only at the start"},
      {R"(a$b)", "'$' is supported only at the start / end"},
      {R"((ab)", "unterminated group"},
      {R"(ab))", "unbalanced ')'"},
      {R"([a-)", "unterminated character class"},
      {R"(a{3,1})", "maximum is below its minimum"},
      {R"(a{2001})", "repetition count above 2000"},
      {R"(\q)", "unknown escape \\q"},
      {R"((a?)*)", "an unbounded repetition"},
      {R"(*a)", "'*' must follow an item"},
  };
  for (const Case& c : cases) {
    GrammarBuilder b;
    Result<GrammarBuilder::Expr> e = RegexExpr(b, c.pattern);
    ASSERT_FALSE(e.ok()) << c.pattern;
    EXPECT_NE(e.status().message().find(c.expect), std::string::npos)
        << c.pattern << "\n  got: " << e.status().message();
  }
  // A brace that does not start a quantifier is a literal, as in Python; {,n} is Python's {0,n}.
  const auto g = CompileRegex(R"(a{b}{x,y}z{,2})");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(*g, "a{b}{x,y}"));
  EXPECT_TRUE(Matches(*g, "a{b}{x,y}zz"));
  EXPECT_FALSE(Matches(*g, "a{b}{x,y}zzz"));
}

// Character loops (GrammarBuilder::CharLoop) let the mask skip walking the tokens made of the
// loop's characters; on a real vocabulary the mask must still equal the per-token check, for
// classes that exclude ASCII and non-ASCII characters alike.
TEST(GbnfMasks, LoopMasksEqualThePerTokenCheck) {
  auto m = LoadPulledModel(kSmolLM2File);
  ASSERT_TRUE(m.ok()) << m.status().message();
  if (*m == nullptr) GTEST_SKIP() << "SmolLM2 not pulled (mererun pull smollm2-135m-instruct)";
  const TokenMasker masker((*m)->tokenizer(), (*m)->config().n_vocab);
  struct Case {
    const char* grammar;
    std::string text;
  };
  const Case cases[] = {
      {R"(root ::= ("- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n")+)", "- caf\xc3\xa9 \xe2\x80\x94 ok\n- b\n"},
      {R"(root ::= "\"" ([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\"")",
       "\"say \\\"hi\\\" \xf0\x9f\x98\x80 \\u00e9\""},
      {R"(root ::= [a-zA-Z0-9 ,.;:!?'()-]* "." )", "Hello, world (again)."},
  };
  std::vector<uint8_t> mask;
  int loop_states = 0;
  for (const Case& c : cases) {
    const auto g = Compile(c.grammar);
    ASSERT_NE(g, nullptr);
    for (int pass = 0; pass < 2; ++pass) {  // the second time from the mask cache
      GrammarState s = g->Start();
      for (size_t i = 0; i <= c.text.size(); ++i) {
        masker.Mask(s, &mask);
        loop_states += s.loop() >= 0 ? 1 : 0;
        for (TokenId t = 0; t < masker.n_vocab(); ++t) {
          ASSERT_EQ(mask[t] != 0, masker.Allows(s, t))
              << c.grammar << ": token " << t << " \"" << masker.piece(t) << "\" after " << c.text.substr(0, i);
        }
        if (i < c.text.size()) {
          ASSERT_TRUE(s.Advance(static_cast<uint8_t>(c.text[i]))) << c.text.substr(0, i + 1);
        }
      }
      EXPECT_TRUE(s.accepting()) << c.grammar;
    }
  }
  EXPECT_GT(loop_states, 40);
}

}  // namespace
}  // namespace mr
