"""Tool search (tool_search_tool_regex_20251119 / tool_search_tool_bm25_20251119) over
defer_loading tools, through the official Anthropic SDK: the server runs the search the model
calls within the same response (server_tool_use + tool_search_tool_result), the found tool can
then be called; replayed results and client-side tool_reference blocks load tools into the
prompt; bad references and bad search tool definitions are 400s."""
import anthropic
import pytest

from mererun_server import ServerProcess

WEATHER = {"name": "get_weather", "description": "Get the current weather for a city.", "defer_loading": True,
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                            "required": ["city"]}}
EMAIL = {"name": "send_email", "description": "Send an email to a recipient.", "defer_loading": True,
         "input_schema": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                          "required": ["to", "body"]}}
EVENTS = {"name": "list_calendar_events", "description": "List calendar events for a day.", "defer_loading": True,
          "input_schema": {"type": "object", "properties": {"date": {"type": "string"}}, "required": ["date"]}}
REGEX = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
BM25 = {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"}
DEFERRED = {"get_weather", "send_email", "list_calendar_events"}
QUESTION = "What is the weather in Paris? Search for a weather tool first, then call it."


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path("qwen2.5-coder-0.5b-instruct")
    s = ServerProcess(mererun_bin, "qwen2.5-coder-0.5b-instruct", "-c", "4096")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def check_search_protocol(msg, search_name):
    """Every server_tool_use is followed by its result; references name deferred tools; a later
    tool_use names a tool some search found."""
    found = set()
    blocks = msg.content
    for i, b in enumerate(blocks):
        if b.type == "server_tool_use":
            assert b.name == search_name and b.id.startswith("srvtoolu_")
            assert isinstance(b.input.get("query"), str) and 1 <= len(b.input["query"]) <= 200
            r = blocks[i + 1]
            assert r.type == "tool_search_tool_result" and r.tool_use_id == b.id
            assert r.content.type == "tool_search_tool_search_result"
            names = {ref.tool_name for ref in r.content.tool_references}
            assert names <= DEFERRED
            found |= names
        elif b.type == "tool_use":
            assert b.name in found, (b.name, found)
    return found


@pytest.mark.parametrize("search", [REGEX, BM25], ids=["regex", "bm25"])
def test_forced_search_runs_on_the_server(client, search):
    # The search tool is the only tool the model sees: `any` makes it search.
    for stream in (False, True):
        kw = dict(model="m", max_tokens=150, tools=[search, WEATHER, EMAIL, EVENTS], tool_choice={"type": "any"},
                  messages=[{"role": "user", "content": QUESTION}], extra_body={"temperature": 0})
        if stream:
            with client.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kw)
        assert msg.content[0].type == "server_tool_use", msg
        check_search_protocol(msg, search["name"])
        assert msg.stop_reason in ("tool_use", "end_turn", "max_tokens")
        if msg.stop_reason == "tool_use":
            assert msg.content[-1].type == "tool_use"


def test_replayed_search_loads_the_tool(client):
    """A history with the search's blocks: the found tool's definition is in the prompt (more
    tokens) and the tool is callable (a forced call to it is accepted and valid)."""
    call = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_regex", "input": {"query": "weather"}}
    result = {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1",
              "content": {"type": "tool_search_tool_search_result",
                          "tool_references": [{"type": "tool_reference", "tool_name": "get_weather"}]}}
    empty = dict(result, content={"type": "tool_search_tool_search_result", "tool_references": []})
    tools = [REGEX, WEATHER, EMAIL, EVENTS]
    q = {"role": "user", "content": "Weather in Paris?"}
    loaded = [q, {"role": "assistant", "content": [call, result]}]
    unloaded = [q, {"role": "assistant", "content": [call, empty]}]
    n_loaded = client.messages.count_tokens(model="m", tools=tools, messages=loaded).input_tokens
    n_unloaded = client.messages.count_tokens(model="m", tools=tools, messages=unloaded).input_tokens
    assert n_loaded > n_unloaded + 20  # get_weather's definition entered the prompt
    msg = client.messages.create(model="m", max_tokens=60, tools=tools, messages=loaded,
                                 tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str)
    # Not loaded: a forced call to a deferred tool is refused.
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=5, tools=tools, messages=unloaded,
                               tool_choice={"type": "tool", "name": "get_weather"})
    assert "get_weather" in str(e.value)


def test_client_side_tool_reference_in_tool_result(client):
    """Client-side search: a custom search tool returns tool_reference blocks in its tool_result."""
    finder = {"name": "find_tools", "description": "Find tools.",
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}
    msgs = [{"role": "user", "content": "Send an email to bob@example.com saying hi."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_f", "name": "find_tools", "input": {"q": "email"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_f",
                                          "content": [{"type": "tool_reference", "tool_name": "send_email"}]}]}]
    msg = client.messages.create(model="m", max_tokens=80, tools=[finder, WEATHER, EMAIL, EVENTS], messages=msgs,
                                 tool_choice={"type": "tool", "name": "send_email"}, extra_body={"temperature": 0})
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and uses[0].name == "send_email" and set(uses[0].input) == {"to", "body"}


def test_bad_references_and_definitions_are_400(client):
    q = [{"role": "user", "content": "hi"}]
    cases = [
        ([REGEX, dict(REGEX)], q, "only one tool search"),
        ([dict(REGEX, defer_loading=True), WEATHER], q, "cannot be deferred"),
        ([REGEX, WEATHER], [q[0], {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "s", "name": "tool_search_tool_regex", "input": {"query": "x"}},
            {"type": "tool_search_tool_result", "tool_use_id": "s", "content": {
                "type": "tool_search_tool_search_result",
                "tool_references": [{"type": "tool_reference", "tool_name": "no_such_tool"}]}}]}], "no_such_tool"),
        ([WEATHER], [q[0], {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "s", "name": "tool_search_tool_regex", "input": {"query": "x"}}]}],
         "tool search tool"),
    ]
    for tools, msgs, text in cases:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="m", max_tokens=5, tools=tools, messages=msgs)
        assert text in str(e.value), (text, str(e.value))
