// The Responses API's pieces without a model: the store's bounds, the translation of input items
// into chat messages, and the writer's event sequence and response object.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/responses_api.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

ServedModel Served() {
  ServedModel sm;
  sm.id = "test-model";
  sm.n_ctx = 1024;
  return sm;
}

StoredResponse Stored(const std::string& id, size_t pad = 0) {
  return {Json{{"id", id}, {"output", Json::array()}, {"pad", std::string(pad, 'x')}}, Json::array()};
}

TEST(ResponseStore, DropsTheOldestByCountAndBytes) {
  ResponseStore by_count(2, 1 << 20);
  by_count.Put(Stored("a"));
  by_count.Put(Stored("b"));
  by_count.Put(Stored("c"));
  EXPECT_FALSE(by_count.Get("a"));
  EXPECT_TRUE(by_count.Get("b") && by_count.Get("c"));
  by_count.Put(Stored("b"));  // stored again: now the newest
  by_count.Put(Stored("d"));
  EXPECT_FALSE(by_count.Get("c"));
  EXPECT_TRUE(by_count.Get("b") && by_count.Get("d"));
  EXPECT_EQ(by_count.size(), 2u);

  ResponseStore by_bytes(100, 2500);
  by_bytes.Put(Stored("a", 1000));
  by_bytes.Put(Stored("b", 1000));
  EXPECT_EQ(by_bytes.size(), 2u);
  by_bytes.Put(Stored("c", 1000));
  EXPECT_FALSE(by_bytes.Get("a"));
  EXPECT_LE(by_bytes.bytes(), 2500u);
  by_bytes.Put(Stored("huge", 5000));  // larger than the whole store: not kept, nothing else lost
  EXPECT_FALSE(by_bytes.Get("huge"));
  EXPECT_TRUE(by_bytes.Get("b") && by_bytes.Get("c"));
  EXPECT_TRUE(by_bytes.Delete("b"));
  EXPECT_FALSE(by_bytes.Delete("b"));
  EXPECT_EQ(by_bytes.size(), 1u);

  ResponseStore none(100, 0);
  none.Put(Stored("a"));
  EXPECT_EQ(none.size(), 0u);
}

std::optional<ApiError> Parse(const std::string& body, ChatRequest* req, ResponsesOptions* o,
                              const ResponseStore* store = nullptr) {
  return ParseResponsesRequest(Json::parse(body), Served(), store, req, o);
}

TEST(ResponsesParse, ItemsBecomeChatMessages) {
  ChatRequest req;
  ResponsesOptions o;
  auto e = Parse(R"({"instructions": "Be brief.", "input": [
      {"role": "user", "content": "Weather in Paris?"},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "20 C"}]}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    "max_output_tokens": 50, "temperature": 0.5})",
                 &req, &o);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(req.messages.size(), 5u);
  EXPECT_EQ(req.messages[0].role, "system");
  EXPECT_EQ(req.messages[0].content, "Be brief.");
  EXPECT_EQ(req.messages[1].role, "user");
  EXPECT_EQ(req.messages[2].role, "assistant");
  EXPECT_EQ(req.messages[2].content, "Checking.");
  EXPECT_EQ(req.messages[2].reasoning, "Use the tool.");
  ASSERT_EQ(req.messages[2].tool_calls.size(), 2u);
  EXPECT_EQ(req.messages[2].tool_calls[1].id, "c2");
  EXPECT_EQ(req.messages[2].tool_calls[1].arguments["city"], "Lyon");
  EXPECT_EQ(req.messages[3].role, "tool");
  EXPECT_EQ(req.messages[4].tool_call_id, "c2");
  EXPECT_EQ(req.messages[4].content, "20 C");
  EXPECT_EQ(req.max_tokens, 50);
  ASSERT_EQ(req.render.tools.size(), 1u);
  EXPECT_EQ(o.echo["max_output_tokens"], 50);
  EXPECT_EQ(o.echo["tools"][0]["name"], "get_weather");
  // Stored items get ids; the string input of another request becomes one user message.
  ASSERT_EQ(o.input_items.size(), 7u);
  for (const Json& it : o.input_items) EXPECT_TRUE(it["id"].is_string());
  EXPECT_EQ(o.input_items[1]["id"], "rs_1");
  ChatRequest r2;
  ResponsesOptions o2;
  ASSERT_FALSE(Parse(R"({"input": "hi"})", &r2, &o2));
  ASSERT_EQ(o2.input_items.size(), 1u);
  EXPECT_EQ(o2.input_items[0]["role"], "user");
  EXPECT_EQ(r2.messages.back().content, "hi");
  // Reasoning followed by a user turn is dropped, not carried to a later assistant turn.
  ChatRequest r3;
  ResponsesOptions o3;
  ASSERT_FALSE(Parse(R"({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "old"}]},
      {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]})",
                     &r3, &o3));
  ASSERT_EQ(r3.messages.size(), 3u);
  EXPECT_EQ(r3.messages[1].reasoning, "");
}

TEST(ResponsesParse, NamespacesFlattenAndHostedToolsAreLeftOut) {
  ChatRequest req;
  ResponsesOptions o;
  auto e = Parse(R"({"input": "x", "tools": [{"type": "function", "name": "exec"},
      {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]},
      {"type": "web_search", "external_web_access": false}]})",
                 &req, &o);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(req.render.tools.size(), 2u);
  EXPECT_EQ(req.render.tools[1].name, "spawn");
  EXPECT_EQ(o.tool_namespace.at("spawn"), "agents");
  EXPECT_EQ(o.tool_namespace.count("exec"), 0u);
  EXPECT_EQ(o.echo["tools"].size(), 3u);  // echoed as sent
  ResponsesOptions wo;
  wo.tool_namespace = o.tool_namespace;
  ResponsesWriter w(wo, 1, nullptr);
  StreamEvent call;
  call.kind = StreamEvent::Kind::kToolCall;
  call.call.name = "spawn";
  call.call.arguments = Json::object();
  w.Event(call);
  call.call.name = "exec";
  w.Event(call);
  EXPECT_EQ(w.Response()["output"][0]["namespace"], "agents");
  EXPECT_FALSE(w.Response()["output"][1].contains("namespace"));
}

TEST(ResponsesParse, PreviousResponseContinuesItsConversation) {
  ResponseStore store(10, 1 << 20);
  StoredResponse prev;
  prev.input_items =
      Json::array({{{"type", "message"}, {"role", "user"}, {"content", "My name is Ada."}, {"id", "m1"}}});
  prev.response = {{"id", "resp_1"},
                   {"output", Json::array({{{"type", "message"},
                                            {"id", "m2"},
                                            {"role", "assistant"},
                                            {"content", Json::array({{{"type", "output_text"}, {"text", "OK"}}})}}})}};
  store.Put(prev);
  ChatRequest req;
  ResponsesOptions o;
  ASSERT_FALSE(Parse(R"({"previous_response_id": "resp_1", "input": "Who am I?"})", &req, &o, &store));
  ASSERT_EQ(req.messages.size(), 3u);
  EXPECT_EQ(req.messages[1].content, "OK");
  EXPECT_EQ(req.messages[2].content, "Who am I?");
  ASSERT_EQ(o.input_items.size(), 3u);  // the chain's items, then this input
  EXPECT_EQ(o.input_items[1]["id"], "m2");
  EXPECT_EQ(o.echo["previous_response_id"], "resp_1");
  ChatRequest r2;
  ResponsesOptions o2;
  auto e = Parse(R"({"previous_response_id": "resp_2", "input": "x"})", &r2, &o2, &store);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("previous_response_id"), std::string::npos);
}

TEST(ResponsesParse, RefusalsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]})", "tools[0].type"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f"}, {"type": "namespace", "name": "n",
          "tools": [{"type": "function", "name": "f"}]}]})",
       "tools[1].tools[0].name"},
      {R"({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}})", "tool_choice"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})", "text-only"},
      {R"({"input": [{"role": "tool", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"type": "function_call_output", "output": "x"}]})", "input[0].call_id"},
      {R"({"input": [{"type": "item_reference", "id": "x"}]})", "item_reference"},
      {R"({"input": "x", "truncation": "auto"})", "truncation"},
      {R"({"input": "x", "text": {"format": {"type": "grammar"}}})", "text.format.type"},
      {R"({"input": "x", "include": "all"})", "include"},
      {R"({"input": "x", "max_output_tokens": -1})", "max_output_tokens"},
      {R"({"input": "x", "top_logprobs": 21})", "top_logprobs"},
      {R"({"input": "x", "reasoning": "high"})", "reasoning"},
      {R"({"input": "x", "reasoning": {"effort": "ultra"}})", "reasoning.effort"},
      {R"({"input": "x", "previous_response_id": "r"})", "previous_response_id"},
      {R"([])", "JSON object"},
  };
  for (const auto& [body, field] : cases) {
    ChatRequest req;
    ResponsesOptions o;
    auto e = Parse(body, &req, &o);
    ASSERT_TRUE(e) << body;
    EXPECT_NE(e->message.find(field), std::string::npos) << body << " -> " << e->message;
  }
}

StreamEvent Ev(StreamEvent::Kind kind, const std::string& text = "") {
  StreamEvent e;
  e.kind = kind;
  e.text = text;
  return e;
}

// The SSE text's events, in order.
std::vector<Json> Events(const std::string& sse) {
  std::vector<Json> out;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    out.push_back(Json::parse(sse.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  return out;
}

TEST(ResponsesWriter, ItemsOpenAndCloseInOrder) {
  ResponseStore store(10, 1 << 20);
  ResponsesOptions o;
  o.stream = true;
  o.model = "m";
  ResponsesWriter w(o, 7, &store);
  std::string s = w.Start();
  s += w.KeepAlive();  // idle before the first token: in_progress again
  s += w.Event(Ev(StreamEvent::Kind::kReasoning, "think"));
  s += w.Event(Ev(StreamEvent::Kind::kReasoning, "ing"));
  s += w.Event(Ev(StreamEvent::Kind::kText, "Hel"));
  s += w.Event(Ev(StreamEvent::Kind::kText, "lo"));
  StreamEvent call = Ev(StreamEvent::Kind::kToolCall);
  call.call.name = "f";
  call.call.arguments = {{"a", 1}};
  s += w.Event(call);
  StreamEvent done = Ev(StreamEvent::Kind::kDone);
  done.finish = FinishReason::kToolUse;
  done.output_tokens = 9;
  done.cache_read_tokens = 3;
  s += w.Event(done);
  const std::vector<Json> ev = Events(s);
  std::vector<std::string> types;
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i]["sequence_number"], i);
    types.push_back(ev[i]["type"]);
  }
  const std::vector<std::string> want = {"response.created",
                                         "response.in_progress",
                                         "response.in_progress",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done",
                                         "response.completed"};
  EXPECT_EQ(types, want);
  const Json r = w.Response();
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "thinking");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hello");
  EXPECT_EQ(r["output"][1]["status"], "completed");
  EXPECT_EQ(r["output"][2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(r["usage"]["input_tokens"], 7);
  EXPECT_EQ(r["usage"]["output_tokens"], 9);
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 3);
  EXPECT_EQ(ev.back()["response"], r);
  EXPECT_EQ(w.KeepAlive(), "");  // ended: nothing more
  // Every event of an item names the item the added event announced, at its index.
  for (const Json& e : ev) {
    if (e.contains("item_id")) {
      EXPECT_EQ(e["item_id"], r["output"][e["output_index"].get<size_t>()]["id"]) << e;
    }
  }
  auto stored = store.Get(w.id());
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->response, r);
}

TEST(ResponsesWriter, MaxTokensIsIncompleteAndErrorsFail) {
  ResponsesOptions o;
  o.store = false;
  ResponseStore store(10, 1 << 20);
  ResponsesWriter w(o, 1, &store);
  EXPECT_EQ(w.Start(), "");  // not streamed: no events
  EXPECT_EQ(w.Event(Ev(StreamEvent::Kind::kText, "abc")), "");
  StreamEvent done = Ev(StreamEvent::Kind::kDone);
  done.finish = FinishReason::kMaxTokens;
  w.Event(done);
  const Json r = w.Response();
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(store.size(), 0u);  // store: false

  o.stream = true;
  ResponsesWriter f(o, 1, nullptr);
  f.Start();
  StreamEvent err = Ev(StreamEvent::Kind::kError);
  err.error = {ApiErrorType::kApi, "boom"};
  const std::vector<Json> ev = Events(f.Event(err));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["type"], "response.failed");
  EXPECT_EQ(ev[0]["response"]["error"]["message"], "boom");
}

TEST(ResponsesInputItems, OrderLimitAndAfter) {
  StoredResponse r;
  for (const char* id : {"a", "b", "c"}) r.input_items.push_back({{"id", id}});
  Json out;
  ASSERT_FALSE(ResponseInputItemList(r, "desc", 2, "", &out));
  EXPECT_EQ(out["data"].size(), 2u);
  EXPECT_EQ(out["first_id"], "c");
  EXPECT_EQ(out["has_more"], true);
  ASSERT_FALSE(ResponseInputItemList(r, "asc", 20, "a", &out));
  EXPECT_EQ(out["first_id"], "b");
  EXPECT_EQ(out["last_id"], "c");
  EXPECT_EQ(out["has_more"], false);
  EXPECT_TRUE(ResponseInputItemList(r, "up", 20, "", &out));
  EXPECT_TRUE(ResponseInputItemList(r, "asc", 0, "", &out));
  EXPECT_TRUE(ResponseInputItemList(r, "asc", 5, "zz", &out));
}

}  // namespace
}  // namespace mr::server
