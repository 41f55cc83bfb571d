// Tool search: regex (RE2) and BM25 over names, descriptions and parameters; bad patterns give
// an error outcome (never an exception); the result text and block content.
#include "server/tool_search.h"

#include <gtest/gtest.h>

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

ToolSearchConfig Catalog(ToolSearchKind kind) {
  ToolSearchConfig c;
  c.kind = kind;
  c.name = kind == ToolSearchKind::kRegex ? "tool_search_tool_regex" : "tool_search_tool_bm25";
  auto tool = [](const char* name, const char* desc, const char* params) {
    return ChatTool{name, desc, Json::parse(params), false};
  };
  c.deferred = {
      tool("get_weather", "Current weather for a city.",
           R"({"type": "object", "properties": {"city": {"type": "string"}}})"),
      tool("send_email", "Send an email message.",
           R"({"type": "object", "properties": {"to": {"type": "string", "description": "recipient address"}}})"),
      tool("list_events", "Calendar events of one day.",
           R"({"type": "object", "properties": {"date": {"type": "string"}}})"),
      tool("forecast", "Weather forecast for the coming days.", R"({"type": "object"})"),
  };
  return c;
}

std::vector<std::string> Search(const ToolSearchConfig& c, const std::string& q) {
  ToolSearchOutcome o = RunToolSearch(c, Json{{"query", q}});
  EXPECT_EQ(o.error_code, "") << q;
  return o.names;
}

TEST(ToolSearch, RegexMatchesNamesDescriptionsAndParameters) {
  const ToolSearchConfig c = Catalog(ToolSearchKind::kRegex);
  EXPECT_EQ(Search(c, "weather"), (std::vector<std::string>{"get_weather"}));  // case-sensitive, like re.search
  EXPECT_EQ(Search(c, "(?i)weather"), (std::vector<std::string>{"get_weather", "forecast"}));
  EXPECT_EQ(Search(c, "recipient"), (std::vector<std::string>{"send_email"}));  // a parameter's description
  EXPECT_EQ(Search(c, "^list_"), (std::vector<std::string>{"list_events"}));
  EXPECT_TRUE(Search(c, "nothing-like-this").empty());
  // The model may name the field "pattern".
  EXPECT_EQ(RunToolSearch(c, Json{{"pattern", "email"}}).names, (std::vector<std::string>{"send_email"}));
}

TEST(ToolSearch, BadInputIsAnErrorOutcome) {
  const ToolSearchConfig c = Catalog(ToolSearchKind::kRegex);
  for (const Json& input : {Json{{"query", "(unclosed"}}, Json{{"query", std::string(201, 'a')}}, Json{{"q", "x"}},
                            Json::array(), Json{{"query", 3}}}) {
    const ToolSearchOutcome o = RunToolSearch(c, input);
    EXPECT_EQ(o.error_code, "invalid_tool_input") << input.dump();
    EXPECT_TRUE(o.names.empty());
    EXPECT_EQ(ToolSearchResultContent(o)["type"], "tool_search_tool_result_error");
  }
  // RE2 runs in linear time: a pattern that backtracking engines explode on is just a pattern.
  EXPECT_TRUE(Search(c, "(a+)+$").empty());
}

TEST(ToolSearch, Bm25RanksByRelevance) {
  const ToolSearchConfig c = Catalog(ToolSearchKind::kBm25);
  const std::vector<std::string> w = Search(c, "weather forecast for the next days");
  ASSERT_GE(w.size(), 2u);
  EXPECT_EQ(w[0], "forecast");  // matches more of the query's words
  EXPECT_EQ(w[1], "get_weather");
  EXPECT_EQ(Search(c, "email someone"), (std::vector<std::string>{"send_email"}));
  EXPECT_TRUE(Search(c, "zzz").empty());
}

TEST(ToolSearch, ResultTextAndContent) {
  const ToolSearchConfig c = Catalog(ToolSearchKind::kRegex);
  const std::string text = ToolReferencesText(c, {"get_weather"});
  EXPECT_NE(text.find("\"name\": \"get_weather\""), std::string::npos);
  EXPECT_NE(text.find("\"city\""), std::string::npos);
  EXPECT_EQ(text.find("send_email"), std::string::npos);
  ToolSearchOutcome o;
  o.names = {"get_weather"};
  const Json content = ToolSearchResultContent(o);
  EXPECT_EQ(content["type"], "tool_search_tool_search_result");
  EXPECT_EQ(content["tool_references"][0]["tool_name"], "get_weather");
  // The model sees the catalog's names, not their definitions.
  const ChatTool t = c.AsTool();
  EXPECT_NE(t.description.find("send_email"), std::string::npos);
  EXPECT_EQ(t.description.find("recipient"), std::string::npos);
}

}  // namespace
}  // namespace mr::server
