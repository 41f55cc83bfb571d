// Grammar matching, JSON Schema grammars, token masks and constrained generation.
//
// Oracles: nlohmann's JSON parser and hand-checked schema properties for random sentences of the
// grammar; the per-token check (a byte-by-byte advance, no trie) for the trie masks; and the real
// SmolLM2 model sampling at temperature 1 under the constraint.
#include "runtime/grammar.h"

#include <gtest/gtest.h>

#include <random>

#include "model/test_models.h"
#include "runtime/constraint.h"
#include "runtime/generator.h"
#include "runtime/json_grammar.h"
#include "runtime/test_grammars.h"

namespace mr {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> SchemaGrammar(const Json& schema, bool strict = false) {
  GrammarBuilder b;
  Result<GrammarBuilder::Expr> e = JsonSchemaExpr(b, schema, {strict});
  EXPECT_TRUE(e.ok()) << e.status().message();
  return b.Build(*e);
}

bool Matches(const Grammar& g, std::string_view text) {
  GrammarState s = g.Start();
  return s.AdvanceAll(text) && s.accepting();
}

// The compile error of a schema ("" when it compiles).
std::string SchemaError(const char* schema, bool strict) {
  GrammarBuilder b;
  Result<GrammarBuilder::Expr> e = JsonSchemaExpr(b, Json::parse(schema), {strict});
  return e.ok() ? std::string() : e.status().message();
}

TEST(Grammar, LiteralsAlternativesAndRepetition) {
  GrammarBuilder b;
  const auto g = b.Build(b.Seq({b.Literal("ab"), b.Alt({b.Literal("c"), b.Literal("cd")}), b.Star(b.Literal("x")),
                                b.Repeat(b.Range('0', '9'), 1, 3)}));
  for (const char* ok : {"abc1", "abcd12", "abcxxx123", "abcdx9"}) EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad : {"ab1", "abc", "abc1234", "abcy1", "abdd1", ""}) EXPECT_FALSE(Matches(*g, bad)) << bad;
  GrammarState s = g->Start();
  EXPECT_FALSE(s.Advance('b'));
  EXPECT_TRUE(s.dead());
}

TEST(Grammar, RecursionThroughDeclaredRules) {
  GrammarBuilder b;
  const uint32_t r = b.DeclareRule();  // r -> "(" r* ")"
  b.DefineRule(r, b.Seq({b.Literal("("), b.Star(b.Ref(r)), b.Literal(")")}));
  const auto g = b.Build(b.Ref(r));
  EXPECT_TRUE(Matches(*g, "()"));
  EXPECT_TRUE(Matches(*g, "(()(()))"));
  EXPECT_FALSE(Matches(*g, "(()"));
  EXPECT_FALSE(Matches(*g, "())"));
  GrammarState s = g->Start();
  ASSERT_TRUE(s.AdvanceAll("(()())"));
  EXPECT_TRUE(s.finished());
}

TEST(JsonGrammar, StringsNumbersAndLiterals) {
  const auto g = SchemaGrammar(Json::parse(R"({"type": ["string", "number", "boolean", "null"]})"));
  for (const char* ok : {R"("")", R"("a \"q\" \\ \/ \n \u00e9 é")", "0", "-12.5e+3", "1E9", "true", "null", "3.25"})
    EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "-", R"("\x")", "\"a\nb\"", "\"\\u12\"", "nul", "True", "+1"})
    EXPECT_FALSE(Matches(*g, bad)) << bad;
  const auto bounded = SchemaGrammar(Json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  for (const char* ok : {R"("ab")", R"("a\n")", R"("éé")", R"("abc")"}) EXPECT_TRUE(Matches(*bounded, ok)) << ok;
  for (const char* bad : {R"("a")", R"("abcd")", R"("")"}) EXPECT_FALSE(Matches(*bounded, bad)) << bad;
  const auto i = SchemaGrammar(Json::parse(R"({"type": "integer"})"));
  EXPECT_TRUE(Matches(*i, "-40"));
  EXPECT_FALSE(Matches(*i, "4.0"));
}

// \u escapes: what the grammar accepts, a JSON parser must accept too (a sampled model once
// wrote a lone surrogate, and the forced tool call it was in fell back to text).
TEST(JsonGrammar, UnicodeEscapesAreScalarValuesOrSurrogatePairs) {
  const auto g = SchemaGrammar(Json::parse(R"({"type": "string"})"));
  for (const char* ok : {R"("\u0000")", R"("\uD7FF")", R"("\ue000")", R"("\uFFFF")", R"("\ud83d\ude00")",
                         R"("\uDBFF\uDFFF x")", R"("\uabcd\uD800\uDC00")"}) {
    EXPECT_TRUE(Matches(*g, ok)) << ok;
    EXPECT_FALSE(Json::parse(ok, nullptr, false).is_discarded()) << ok;
  }
  for (const char* bad : {R"("\ud800")", R"("\uDC00")", R"("\ud800x")", R"("\ud800\u0041")", R"("\udc00\ud800")",
                          R"("\ud800\ud800")", R"("\uDFFF")"}) {
    EXPECT_FALSE(Matches(*g, bad)) << bad;
    EXPECT_TRUE(Json::parse(bad, nullptr, false).is_discarded()) << bad;
  }
}

TEST(JsonGrammar, ObjectsKeepSchemaOrderAndRequiredProperties) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
      "required": ["city"]})");
  const auto g = SchemaGrammar(schema);
  for (const char* ok : {R"({"city": "Oslo"})", R"({"city":"Oslo","days":3})", R"({"city": "", "unit": "f"})",
                         R"({"city": "x", "days": -1, "unit": "c"})"})
    EXPECT_TRUE(Matches(*g, ok)) << ok;
  for (const char* bad :
       {"{}", R"({"days": 3})", R"({"days": 3, "city": "x"})", R"({"city": "x", "unit": "k"})", R"({"city": "x",})",
        R"({"city": "x", "other": 1})", R"({ "city": "x"})", R"({"city": "x", "days": 1.5})"})
    EXPECT_FALSE(Matches(*g, bad)) << bad;
}

TEST(JsonGrammar, RandomSentencesParseAndSatisfyTheSchema) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"},
      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
      "size": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
      "meta": {"type": "object"},
      "tree": {"$ref": "#/$defs/node"}},
      "required": ["name", "tags"],
      "$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                         "required": ["kids"]}}})");
  const auto g = SchemaGrammar(schema);
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    const std::string s = RandomSentence(*g, rng, 40);
    const Json v = Json::parse(s, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(v.is_discarded()) << s;
    ASSERT_TRUE(v.is_object()) << s;
    ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << s;
    ASSERT_TRUE(v["tags"].is_array() && v["tags"].size() >= 1 && v["tags"].size() <= 3) << s;
    for (const Json& t : v["tags"]) {
      ASSERT_TRUE(t.is_string()) << s;
    }
    if (v.contains("size")) {
      ASSERT_TRUE(v["size"].is_null() || v["size"].is_number_integer()) << s;
    }
    if (v.contains("meta")) {
      ASSERT_TRUE(v["meta"].is_object()) << s;
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      ASSERT_TRUE(schema["properties"].contains(it.key())) << "undeclared " << it.key() << " in " << s;
    }
    std::vector<const Json*> nodes;
    if (v.contains("tree")) nodes.push_back(&v["tree"]);
    while (!nodes.empty()) {
      const Json* n = nodes.back();
      nodes.pop_back();
      ASSERT_TRUE(n->is_object() && n->contains("kids") && (*n)["kids"].is_array()) << s;
      for (const Json& k : (*n)["kids"]) nodes.push_back(&k);
    }
  }
}

TEST(JsonGrammar, AFailedCompileLeavesTheBuilderUsable) {
  // A $ref whose target has an unknown keyword fails; the caller falls back to any object in
  // the same builder (what a lazy tool grammar does), and the grammar builds and matches.
  GrammarBuilder b;
  const Json bad = Json::parse(R"({"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"prpoerties": {}}}})");
  EXPECT_FALSE(JsonSchemaExpr(b, bad).ok());
  const auto g = b.Build(b.Alt({b.Literal("x"), JsonAnyObject(b)}));
  EXPECT_TRUE(Matches(*g, R"({"a": [1, {"b": null}]})"));
  EXPECT_TRUE(Matches(*g, "x"));
  // An undefined rule matches nothing.
  GrammarBuilder c;
  const uint32_t r = c.DeclareRule();
  const auto h = c.Build(c.Alt({c.Ref(r), c.Literal("y")}));
  EXPECT_TRUE(Matches(*h, "y"));
  EXPECT_FALSE(Matches(*h, ""));
}

TEST(JsonGrammar, UnsupportedKeywordsAreNamed) {
  auto err = SchemaError;
  EXPECT_NE(err(R"({"type": "array", "prefixItems": [{}]})", false).find("$.prefixItems"), std::string::npos);
  EXPECT_NE(err(R"({"properties": {"a": {"not": {}}}})", false).find("$.properties.a.not"), std::string::npos);
  EXPECT_NE(err(R"({"allOf": [{}, {}]})", false).find("allOf"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "https://x/y"})", false).find("$ref"), std::string::npos);
  // Value bounds: refused in strict mode, not enforced otherwise.
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": 2})", true).find("$.multipleOf"), std::string::npos);
  EXPECT_EQ(err(R"({"type": "integer", "multipleOf": 2})", false), "");
  EXPECT_NE(err(R"j({"type": "string", "pattern": "(?=a)"})j", true).find("$.pattern"), std::string::npos);
  EXPECT_NE(err(R"j({"type": "string", "pattern": "(^a)"})j", false).find("$.pattern"), std::string::npos);
  EXPECT_NE(err(R"({"type": "string", "pattern": "^a", "maxLength": 3})", true).find("maxLength"), std::string::npos);
  EXPECT_NE(err(R"({"type": "string", "format": "iri"})", true).find("$.format"), std::string::npos);
  EXPECT_EQ(err(R"({"type": "string", "format": "iri"})", false), "");
  EXPECT_EQ(err(R"({"type": "object", "properties": {"a": {"type": "string", "description": "d"}},
                    "additionalProperties": false, "title": "t"})",
                true),
            "");
}

// `pattern` and the formats: strings (as JSON writes them) whose text matches, and not others.
TEST(JsonGrammar, PatternsAndFormatsConstrainTheStringsText) {
  struct Case {
    const char* schema;
    std::vector<const char*> ok, bad;  // string values (JSON-encoded here)
  };
  const Case cases[] = {
      {R"({"type": "string", "pattern": "^@[a-z]+$"})", {"@abc", "@z"}, {"abc", "@", "@ab1", "x@ab"}},
      {R"({"type": "string", "pattern": "ab"})", {"ab", "xxabyy", "a\"ab\n"}, {"a", "ba", "a b"}},
      {R"({"type": "string", "pattern": "^[^,]*\"$"})", {"say \"hi\"", "\""}, {"a,\"", "no quote"}},
      {R"({"type": "string", "format": "date"})", {"2024-02-29", "1999-12-31"}, {"2024-13-01", "2024-1-01", "x"}},
      {R"({"type": "string", "format": "time"})", {"12:30:00Z", "23:59:60.5+01:00"}, {"24:00:00Z", "12:30:00"}},
      {R"({"type": "string", "format": "date-time"})",
       {"2024-01-01T00:00:00Z", "2024-01-01T10:20:30.123-05:30"},
       {"2024-01-01 00:00:00Z", "2024-01-01T00:00Z"}},
      {R"({"type": "string", "format": "duration"})", {"P3Y6M4DT12H30M5S", "PT0.5S", "P2W", "P1D"}, {"P", "PT", "3Y"}},
      {R"({"type": "string", "format": "email"})", {"a.b+c@ex-ample.co.uk"}, {"a@b", "@b.com", "a b@c.com"}},
      {R"({"type": "string", "format": "hostname"})", {"localhost", "a-b.example.org"}, {"-ab.com", "a..b", "a_b"}},
      {R"({"type": "string", "format": "ipv4"})",
       {"192.168.0.1", "0.0.0.0", "255.255.255.255"},
       {"256.1.1.1", "1.2.3", "01.2.3.4"}},
      {R"({"type": "string", "format": "ipv6"})",
       {"::1", "::", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "fe80::"},
       {"1::2::3", "1:2:3:4:5:6:7:8:9", "12345::", ":1"}},
      {R"({"type": "string", "format": "uuid"})",
       {"123e4567-e89b-12d3-a456-426614174000"},
       {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
  };
  for (const Case& c : cases) {
    const auto g = SchemaGrammar(Json::parse(c.schema), true);
    ASSERT_NE(g, nullptr) << c.schema;
    for (const char* v : c.ok) EXPECT_TRUE(Matches(*g, Json(v).dump())) << c.schema << " " << Json(v).dump();
    for (const char* v : c.bad) EXPECT_FALSE(Matches(*g, Json(v).dump())) << c.schema << " " << Json(v).dump();
  }
}

// Integer bounds: exactly the integers in range, written without leading zeros, whatever the
// mix of inclusive, exclusive, fractional, negative and one-sided bounds.
TEST(JsonGrammar, IntegerBoundsAdmitExactlyTheIntegersInRange) {
  struct Case {
    const char* bounds;
    int64_t lo, hi;  // the integers admitted
  };
  constexpr int64_t kMax = 999999999999999999;
  const Case cases[] = {
      {R"("minimum": 1, "maximum": 100)", 1, 100},
      {R"("minimum": -37, "maximum": 1205)", -37, 1205},
      {R"("minimum": -950, "maximum": -8)", -950, -8},
      {R"("exclusiveMinimum": 0, "exclusiveMaximum": 10)", 1, 9},
      {R"("minimum": 2.5, "maximum": 99.9)", 3, 99},
      {R"("exclusiveMinimum": -1.5, "maximum": 0)", -1, 0},
      {R"("minimum": 17)", 17, kMax},
      {R"("maximum": -3)", -kMax, -3},
      {R"("minimum": 0)", 0, kMax},
      {R"("minimum": 400, "maximum": 400)", 400, 400},
      {R"("minimum": 1999, "maximum": 30001)", 1999, 30001},
  };
  std::mt19937 rng(3);
  for (const Case& c : cases) {
    const std::string schema = std::string(R"({"type": "integer", )") + c.bounds + "}";
    const auto g = SchemaGrammar(Json::parse(schema), true);
    ASSERT_NE(g, nullptr) << schema;
    std::vector<int64_t> values;
    for (int64_t v = -1300; v <= 1300; ++v) values.push_back(v);
    for (int64_t v : {c.lo, c.hi}) {
      for (int64_t d = -3; d <= 3; ++d)
        if (std::abs(v) < kMax - 3) values.push_back(v + d);
    }
    for (int i = 0; i < 2000; ++i) {
      const int64_t mag = static_cast<int64_t>(rng() % 1000000000ULL) * static_cast<int64_t>(rng() % 1000000000ULL);
      values.push_back(rng() % 2 ? mag : -mag);
    }
    values.push_back(kMax);
    values.push_back(-kMax);
    for (int64_t v : values) {
      ASSERT_EQ(Matches(*g, std::to_string(v)), v >= c.lo && v <= c.hi) << schema << " on " << v;
    }
    EXPECT_FALSE(Matches(*g, "-0")) << schema;
    if (c.lo <= 7 && 7 <= c.hi) {
      EXPECT_FALSE(Matches(*g, "007")) << schema;
    }
  }
  EXPECT_NE(SchemaError(R"({"type": "integer", "minimum": 5, "exclusiveMaximum": 5})", true).find("no integer"),
            std::string::npos);
}

// Number bounds: exactly the decimals (no exponent) in range, against strtod on random decimals
// around each bound; no "-0".
TEST(JsonGrammar, NumberBoundsAdmitExactlyTheDecimalsInRange) {
  const char* cases[] = {
      R"("minimum": 0, "maximum": 1)",
      R"("minimum": 0.5, "maximum": 2.25)",
      R"("exclusiveMinimum": 0, "exclusiveMaximum": 1)",
      R"("minimum": -1.5, "maximum": 0.75)",
      R"("minimum": -10.125, "exclusiveMaximum": -0.5)",
      R"("exclusiveMinimum": 2.5, "maximum": 2.75)",
      R"("minimum": 3.14)",
      R"("exclusiveMaximum": -2)",
      R"("minimum": 0.001, "maximum": 0.0015)",
      R"("minimum": 12, "maximum": 345.6)",
      R"("exclusiveMinimum": -0.0, "maximum": 0.5)",
      R"("minimum": 1, "exclusiveMinimum": 1, "maximum": 2, "exclusiveMaximum": 3)",
  };
  std::mt19937 rng(11);
  const char* digits = "0123456789";
  for (const char* bounds : cases) {
    const Json schema = Json::parse(std::string(R"({"type": "number", )") + bounds + "}");
    const auto g = SchemaGrammar(schema, true);
    ASSERT_NE(g, nullptr) << schema.dump();
    auto in_range = [&](double v) {
      if (schema.contains("minimum") && v < schema["minimum"].get<double>()) return false;
      if (schema.contains("exclusiveMinimum") && v <= schema["exclusiveMinimum"].get<double>()) return false;
      if (schema.contains("maximum") && v > schema["maximum"].get<double>()) return false;
      if (schema.contains("exclusiveMaximum") && v >= schema["exclusiveMaximum"].get<double>()) return false;
      return true;
    };
    for (int i = 0; i < 6000; ++i) {
      std::string t = rng() % 2 ? "-" : "";
      const size_t int_digits = 1 + rng() % 3;
      if (rng() % 2) {
        t += "0";
      } else {
        t += digits[1 + rng() % 9];
        for (size_t k = 1; k < int_digits; ++k) t += digits[rng() % 10];
      }
      if (rng() % 4 != 0) {
        t += ".";
        const size_t frac = 1 + rng() % 5;
        for (size_t k = 0; k < frac; ++k) t += digits[rng() % 10];
      }
      const double v = std::strtod(t.c_str(), nullptr);
      if (t[0] == '-' && v == 0) {  // "-0", "-0.00": never written
        EXPECT_FALSE(Matches(*g, t)) << schema.dump() << " on " << t;
        continue;
      }
      ASSERT_EQ(Matches(*g, t), in_range(v)) << schema.dump() << " on " << t;
    }
    // The bounds themselves, also spelled with trailing zeros.
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!schema.contains(k)) continue;
      const std::string t = schema[k].dump();
      const std::string padded = t.find('.') == std::string::npos ? t + ".000" : t + "00";
      for (const std::string& x : {t, padded}) {
        const double v = std::strtod(x.c_str(), nullptr);
        if (x[0] == '-' && v == 0) continue;
        EXPECT_EQ(Matches(*g, x), in_range(v)) << schema.dump() << " on " << x;
      }
    }
    EXPECT_FALSE(Matches(*g, "1e0")) << schema.dump();
  }
  EXPECT_NE(SchemaError(R"({"type": "number", "minimum": 2, "exclusiveMaximum": 2})", true).find("no number"),
            std::string::npos);
  EXPECT_NE(SchemaError(R"({"type": "number", "minimum": 1e-9})", true).find("$.minimum"), std::string::npos);
  EXPECT_EQ(SchemaError(R"({"type": "number", "minimum": 1e-9})", false), "");
}

// ---- Token masks on a real vocabulary ----

class TokenMaskTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = LoadPulledModel(kSmolLM2File);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(*m);
    if (model_) masker_ = std::make_shared<const TokenMasker>(model_->tokenizer(), model_->config().n_vocab);
  }
  static void TearDownTestSuite() {
    masker_.reset();
    model_.reset();
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "SmolLM2 not pulled (mererun pull smollm2-135m-instruct)";
  }
  static std::unique_ptr<Model> model_;
  static std::shared_ptr<const TokenMasker> masker_;
};
std::unique_ptr<Model> TokenMaskTest::model_;
std::shared_ptr<const TokenMasker> TokenMaskTest::masker_;

TEST_F(TokenMaskTest, TrieMaskEqualsPerTokenCheck) {
  const auto g = SchemaGrammar(Json::parse(R"({"type": "object", "properties": {
      "path": {"type": "string"}, "n": {"type": "number"}, "mode": {"enum": ["read", "write"]}},
      "required": ["path", "mode"]})"));
  // States along a valid sentence: every prefix; twice, the second time from the mask cache.
  const std::string text = R"({"path": "a/b \"c\" \\ é\n", "n": -1.5e3, "mode": "write"})";
  std::vector<uint8_t> mask;
  int free_string_states = 0;
  for (int pass = 0; pass < 2; ++pass) {
    GrammarState s = g->Start();
    for (size_t i = 0; i <= text.size(); ++i) {
      masker_->Mask(s, &mask);
      free_string_states += s.in_free_string() ? 1 : 0;
      int64_t allowed = 0;
      for (TokenId t = 0; t < masker_->n_vocab(); ++t) {
        ASSERT_EQ(mask[t] != 0, masker_->Allows(s, t))
            << "token " << t << " \"" << masker_->piece(t) << "\" after " << text.substr(0, i);
        allowed += mask[t];
      }
      EXPECT_GT(allowed, 0) << text.substr(0, i);
      if (i < text.size()) {
        ASSERT_TRUE(s.Advance(static_cast<uint8_t>(text[i]))) << text.substr(0, i + 1);
      }
    }
    EXPECT_TRUE(s.finished());
  }
  EXPECT_GT(free_string_states, 10);  // the fast path was exercised
  // A dead state and a state of no grammar allow nothing.
  GrammarState dead = g->Start();
  EXPECT_FALSE(dead.Advance('x'));
  for (const GrammarState& st : {dead, GrammarState()}) {
    masker_->Mask(st, &mask);
    EXPECT_EQ(std::count(mask.begin(), mask.end(), 0), masker_->n_vocab());
  }
}

TEST_F(TokenMaskTest, LazyConstraintStartsAtTheTriggerAndRepeats) {
  GrammarBuilder b;
  const auto g = b.Build(b.Seq({b.Literal("<x>{\"a\": "), b.Plus(b.Range('0', '9')), b.Literal("}</x>")}));
  TokenConstraint c(g, masker_, {{"<x>"}, {}, /*repeat=*/true});
  const Tokenizer& tok = model_->tokenizer();
  auto feed = [&](const std::string& s) {
    for (TokenId t : tok.Encode(s, false, false)) c.Accept(t);
  };
  feed("some text <");
  EXPECT_FALSE(c.active());
  feed("x>");
  EXPECT_TRUE(c.active());
  std::vector<float> logits(static_cast<size_t>(masker_->n_vocab()), 0.0f);
  std::vector<uint8_t> scratch;
  c.Apply(logits.data(), &scratch);
  for (TokenId t = 0; t < masker_->n_vocab(); ++t) {
    if (std::isfinite(logits[t])) {
      ASSERT_EQ(masker_->piece(t)[0], '{') << masker_->piece(t);
    }
  }
  feed("{\"a\": 12}</x>");
  EXPECT_FALSE(c.active());  // complete: free text again
  feed(" more <x>{\"a\": ");
  EXPECT_TRUE(c.active());
  EXPECT_FALSE(c.Allows(tok.Encode("}", false, false)[0]));  // a digit must come first
}

// Sampled at temperature 1 (every token possible), the output is valid for the schema, with and
// without speculative decoding; greedy constrained output is identical with speculation.
TEST_F(TokenMaskTest, ConstrainedGenerationIsValidSampledAndSpeculative) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
      "required": ["city", "days", "unit"], "additionalProperties": false})");
  const auto g = SchemaGrammar(schema);
  const Tokenizer& tok = model_->tokenizer();
  const std::vector<TokenId> prompt =
      tok.Encode("<|im_start|>user\nWeather in Paris for 3 days?<|im_end|>\n<|im_start|>assistant\n", true, true);
  Generator gen(*model_, 512);
  NgramDrafter ngram;
  int completed = 0;
  for (int run = 0; run < 12; ++run) {
    GenerateParams p;
    p.sampling.temperature = 1.0f;
    p.seed = 100 + run;
    p.seeded = true;
    p.max_tokens = 120;
    p.constraint = std::make_shared<TokenConstraint>(g, masker_, TokenConstraint::Options{});
    if (run % 2 == 1) p.spec.drafter = &ngram;
    std::vector<TokenId> out;
    auto st = gen.Generate(prompt, p, [&](TokenId t) {
      out.push_back(t);
      return true;
    });
    ASSERT_TRUE(st.ok()) << st.status().message();
    const std::string text = tok.Decode(out, false);
    if (st->stop == StopCause::kMaxTokens) continue;  // a long string: valid so far, not complete
    EXPECT_EQ(st->stop, StopCause::kEndOfGeneration) << text;
    const Json v = Json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    EXPECT_TRUE(v["city"].is_string() && v["days"].is_number_integer()) << text;
    EXPECT_TRUE(v["unit"] == "celsius" || v["unit"] == "fahrenheit") << text;
    EXPECT_EQ(v.size(), 3u) << text;
    ++completed;
  }
  EXPECT_GE(completed, 6);
  // Greedy: the same tokens with and without drafts.
  std::vector<std::vector<TokenId>> outs;
  for (Drafter* d : {static_cast<Drafter*>(nullptr), static_cast<Drafter*>(&ngram)}) {
    GenerateParams p;
    p.sampling.temperature = 0.0f;
    p.max_tokens = 60;
    p.constraint = std::make_shared<TokenConstraint>(g, masker_, TokenConstraint::Options{});
    p.spec.drafter = d;
    p.spec.draft_tokens = 4;
    p.spec.adaptive = false;
    outs.emplace_back();
    auto st = gen.Generate(prompt, p, [&](TokenId t) {
      outs.back().push_back(t);
      return true;
    });
    ASSERT_TRUE(st.ok());
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_TRUE(Matches(*g, tok.Decode(outs[0], false)) || outs[0].size() == 60u) << tok.Decode(outs[0], false);
}

}  // namespace
}  // namespace mr
