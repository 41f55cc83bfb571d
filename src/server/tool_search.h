// Anthropic's tool search server tools over `defer_loading` tools: tool_search_tool_regex_20251119
// (an RE2 pattern, at most 200 bytes, searched in each tool's name, description and parameter
// names and descriptions) and tool_search_tool_bm25_20251119 (a natural-language query ranked
// with BM25 over the same text). The model calls the search tool like any tool; the server runs
// it within the same generation (server_tool_use + tool_search_tool_result blocks) and the
// found tools' definitions enter the prompt in the search's result, so they can be called from
// then on. tool_reference blocks (in a replayed tool_search_tool_result, or in a client's own
// tool_result) expand the same way.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/chat_format.h"

namespace mr::server {

enum class ToolSearchKind { kNone, kRegex, kBm25 };

struct ToolSearchConfig {
  ToolSearchKind kind = ToolSearchKind::kNone;
  std::string name;                // the search tool's name (what the model calls)
  std::vector<ChatTool> deferred;  // every defer_loading tool (searchable, callable once found)
  // The search tool as the model sees it (name, a description listing the deferred tools' names,
  // {"query": string}).
  ChatTool AsTool() const;
  const ChatTool* Find(const std::string& name) const;
};

struct ToolSearchOutcome {
  std::vector<std::string> names;  // found tools, best first (at most kMaxResults)
  std::string error_code;          // "invalid_tool_input" when the query is unusable
  std::string error_message;
};
inline constexpr size_t kMaxToolSearchResults = 5;

// Runs the search with the model's input ({"query": ...}; "pattern" is accepted too).
ToolSearchOutcome RunToolSearch(const ToolSearchConfig& config, const nlohmann::ordered_json& input);

// The text a search result (or tool_reference blocks) puts in the prompt: the found tools'
// definitions, one per line as the tools section lists them, or why nothing was found.
std::string ToolReferencesText(const ToolSearchConfig& config, const std::vector<std::string>& names);
std::string ToolSearchErrorText(const ToolSearchOutcome& outcome);

// The tool_search_tool_result content block's "content" for an outcome.
nlohmann::ordered_json ToolSearchResultContent(const ToolSearchOutcome& outcome);

}  // namespace mr::server
