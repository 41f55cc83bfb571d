#include "server/tool_search.h"

#include <re2/re2.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxPatternBytes = 200;
constexpr size_t kListedNames = 64;

// The searchable text of a tool: name, description, parameter names and their descriptions.
std::string SearchText(const ChatTool& t) {
  std::string s = t.name + "\n" + t.description;
  if (t.parameters.is_object() && t.parameters.contains("properties") && t.parameters["properties"].is_object()) {
    for (auto it = t.parameters["properties"].begin(); it != t.parameters["properties"].end(); ++it) {
      s += "\n" + it.key();
      if (it.value().is_object() && it.value().contains("description") && it.value()["description"].is_string())
        s += " " + it.value()["description"].get<std::string>();
    }
  }
  return s;
}

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      w.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    } else if (!w.empty()) {
      out.push_back(std::move(w));
      w.clear();
    }
  }
  if (!w.empty()) out.push_back(std::move(w));
  return out;
}

std::vector<std::string> Bm25(const std::vector<ChatTool>& tools, const std::string& query) {
  const double k1 = 1.2, b = 0.75;
  std::vector<std::vector<std::string>> docs;
  double avg = 0;
  std::map<std::string, int> df;
  for (const ChatTool& t : tools) {
    docs.push_back(Words(SearchText(t)));
    avg += static_cast<double>(docs.back().size());
    std::vector<std::string> u = docs.back();
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    for (const std::string& w : u) ++df[w];
  }
  if (docs.empty()) return {};
  avg /= static_cast<double>(docs.size());
  std::vector<std::string> q = Words(query);
  std::sort(q.begin(), q.end());
  q.erase(std::unique(q.begin(), q.end()), q.end());
  std::vector<std::pair<double, size_t>> scored;
  const double n = static_cast<double>(docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    double score = 0;
    for (const std::string& term : q) {
      const double tf = static_cast<double>(std::count(docs[d].begin(), docs[d].end(), term));
      if (tf == 0) continue;
      const double idf = std::log(1.0 + (n - df[term] + 0.5) / (df[term] + 0.5));
      score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * static_cast<double>(docs[d].size()) / std::max(avg, 1.0)));
    }
    if (score > 0) scored.push_back({-score, d});
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (const auto& [s, d] : scored) {
    if (out.size() == kMaxToolSearchResults) break;
    out.push_back(tools[d].name);
  }
  return out;
}

}  // namespace

ChatTool ToolSearchConfig::AsTool() const {
  ChatTool t;
  t.name = name;
  const std::string what = kind == ToolSearchKind::kRegex
                               ? "A regular expression (RE2 syntax; (?i) for case-insensitive) searched in the "
                                 "tools' names, descriptions and parameter names"
                               : "Words describing the capability you need";
  // The deferred tools' names (not their definitions) are listed, so that a small model knows
  // what to search for; the definitions enter the prompt only once found.
  std::string names;
  for (size_t i = 0; i < deferred.size() && i < kListedNames; ++i) names += (i ? ", " : "") + deferred[i].name;
  if (deferred.size() > kListedNames) names += ", ...";
  t.description = "Search for more tools. " + std::to_string(deferred.size()) +
                  " more tools are available but not loaded (" + names +
                  "); call this to find the ones you need. The tools found are loaded and can then be called.";
  t.parameters = Json::parse(
      R"({"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}}, "required": ["query"]})");
  t.parameters["properties"]["query"]["description"] = what;
  return t;
}

const ChatTool* ToolSearchConfig::Find(const std::string& n) const {
  for (const ChatTool& t : deferred)
    if (t.name == n) return &t;
  return nullptr;
}

ToolSearchOutcome RunToolSearch(const ToolSearchConfig& config, const Json& input) {
  ToolSearchOutcome out;
  const Json* q = nullptr;
  for (const char* key : {"query", "pattern"})
    if (input.is_object() && input.contains(key) && input[key].is_string()) {
      q = &input[key];
      break;
    }
  if (q == nullptr) {
    out.error_code = "invalid_tool_input";
    out.error_message = "the input needs a \"query\" string";
    return out;
  }
  const std::string query = q->get<std::string>();
  if (config.kind == ToolSearchKind::kBm25) {
    out.names = Bm25(config.deferred, query);
    return out;
  }
  if (query.size() > kMaxPatternBytes) {
    out.error_code = "invalid_tool_input";
    out.error_message = "the pattern is longer than 200 bytes";
    return out;
  }
  RE2::Options opts;
  opts.set_log_errors(false);
  opts.set_max_mem(8 << 20);
  const RE2 re(query, opts);
  if (!re.ok()) {
    out.error_code = "invalid_tool_input";
    out.error_message = "invalid regular expression: " + re.error();
    return out;
  }
  for (const ChatTool& t : config.deferred) {
    if (out.names.size() == kMaxToolSearchResults) break;
    if (RE2::PartialMatch(SearchText(t), re)) out.names.push_back(t.name);
  }
  return out;
}

std::string ToolReferencesText(const ToolSearchConfig& config, const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) {
    const ChatTool* t = config.Find(n);
    if (t == nullptr) continue;
    s += (s.empty() ? "" : "\n") + ToolDefinitionJson(*t);
  }
  if (s.empty())
    return "No tool matched. Search for a word that the tool's name or description contains (names are listed in "
           "the search tool's description).";
  return "These tools are now loaded and can be called:\n<tools>\n" + s + "\n</tools>";
}

std::string ToolSearchErrorText(const ToolSearchOutcome& outcome) {
  return "Error (" + outcome.error_code + "): " + outcome.error_message;
}

Json ToolSearchResultContent(const ToolSearchOutcome& outcome) {
  if (!outcome.error_code.empty())
    return {{"type", "tool_search_tool_result_error"}, {"error_code", outcome.error_code}};
  Json refs = Json::array();
  for (const std::string& n : outcome.names) refs.push_back({{"type", "tool_reference"}, {"tool_name", n}});
  return {{"type", "tool_search_tool_search_result"}, {"tool_references", std::move(refs)}};
}

}  // namespace mr::server
