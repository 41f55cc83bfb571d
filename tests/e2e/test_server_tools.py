"""Tool use end to end on qwen2.5-coder-0.5b-instruct (Qwen2.5's <tool_call> convention), with
the anthropic and openai SDKs: forced and automatic calls, nested input schemas, tool_result
round trips, streaming input_json_delta accumulation."""
import json

import anthropic
import openai
import pytest

from mererun_server import ServerProcess

GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a location.",
    "input_schema": {
        "type": "object",
        "properties": {
            "location": {"type": "object", "description": "Where",
                         "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                         "required": ["city"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["location"],
    },
}
QUESTION = "What is the weather in Paris, France right now? Use the get_weather tool."


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path("qwen2.5-coder-0.5b-instruct")
    s = ServerProcess(mererun_bin, "qwen2.5-coder-0.5b-instruct", "-c", "4096")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def check_weather_input(inp):
    assert isinstance(inp["location"], dict) and isinstance(inp["location"]["city"], str)
    assert inp.get("unit", "celsius") in ("celsius", "fahrenheit")


def test_forced_tool_call_then_tool_result_round_trip(client):
    msg = client.messages.create(model="claude-opus-5-5", max_tokens=60, tools=[WEATHER],
                                 tool_choice={"type": "tool", "name": "get_weather"},
                                 messages=[{"role": "user", "content": QUESTION}], extra_body=GREEDY)
    assert msg.stop_reason == "tool_use", msg
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    check_weather_input(uses[0].input)
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                             "content": [{"type": "text", "text": "Sunny, 21 degrees celsius."}]}]}]
    answer = client.messages.create(model="m", max_tokens=40, tools=[WEATHER], messages=history, extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.content
    count = client.messages.count_tokens(model="m", tools=[WEATHER], messages=history)
    u = answer.usage  # the history's prefix is read from the cache
    assert count.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    # An error result (is_error) is accepted too.
    history[2]["content"][0]["is_error"] = True
    assert client.messages.create(model="m", max_tokens=5, tools=[WEATHER], messages=history, extra_body=GREEDY).content is not None


def test_auto_tool_call_shape(client):
    msg = client.messages.create(model="m", max_tokens=80, tools=[WEATHER],
                                 messages=[{"role": "user", "content": QUESTION}], extra_body=GREEDY)
    uses = [b for b in msg.content if b.type == "tool_use"]
    if uses:  # a small model may answer in text instead; when it calls, the protocol must hold
        assert msg.stop_reason == "tool_use"
        check_weather_input(uses[0].input)
    else:
        assert msg.stop_reason in ("end_turn", "max_tokens")


def test_streamed_tool_call_accumulates(client):
    with client.messages.stream(model="m", max_tokens=60, tools=[WEATHER], tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": QUESTION}], extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1
    check_weather_input(uses[0].input)


def test_openai_forced_tool_call_round_trip(server):
    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                             "parameters": WEATHER["input_schema"]}}
    r = oa.chat.completions.create(model="gpt-x", max_tokens=60, temperature=0, tools=[tool],
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   messages=[{"role": "user", "content": QUESTION}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    check_weather_input(json.loads(call.function.arguments))
    r2 = oa.chat.completions.create(model="gpt-x", max_tokens=30, temperature=0, tools=[tool], messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees celsius."}])
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_claude_code_request_is_accepted(server):
    """The request Claude Code 2.1.328 really sent (captured at MERERUN_LOG=debug, ~49 KB, 12 tools,
    adaptive thinking, context_management, billing header, a role:system message) is accepted
    whole; count_tokens runs the same parsing, rendering and tokenization as a generation."""
    import pathlib
    import requests
    body = json.loads((pathlib.Path(__file__).parent / "fixtures" / "claude_code_2.1.328_request.json").read_text())
    hdr = {"anthropic-version": "2023-06-01", "x-api-key": "unused",
           "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
                             "advanced-tool-use-2025-11-20,effort-2025-11-24"}
    r = requests.post(server.base_url + "/v1/messages/count_tokens?beta=true", headers=hdr, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert 9000 < r.json()["input_tokens"] < 4096 * 4  # ~11.6k tokens with the Qwen tokenizer
    # The same body as a generation: refused only for its size against this 4096-token server,
    # with the Anthropic wording; nothing in it is rejected as a field.
    r = requests.post(server.base_url + "/v1/messages?beta=true", headers=hdr, json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt is too long:"), r.text
