"""OpenAI's Responses API end to end: the official `openai` SDK (client.responses, its stream helper,
its structured-output parser) against `mererun serve` on qwen2.5-coder-0.5b-instruct.

Expected values come from the same server's Chat Completions endpoint (a Responses request is the
chat request it translates to: the same greedy text, the same prompt and output token counts),
from the SDK's own parsing and stream accumulation, and from the JSON schemas asked for."""
import json

import openai
import pydantic
import pytest
import requests

QWEN_END = {"151643": -100, "151645": -100}  # <|endoftext|>, <|im_end|>: no end of turn
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(coder_openai):
    return coder_openai


def chat(client, messages, **kw):
    return client.chat.completions.create(model="m", messages=messages, temperature=0, **kw)


def test_text_is_the_chat_greedy_answer(client):
    r = client.responses.create(model="qwen", input="Name three colors, one per line.", max_output_tokens=24,
                                temperature=0, instructions="You are terse.")
    want = chat(client, [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "Name three colors, one per line."}], max_tokens=24)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "qwen"
    assert r.output_text == want.choices[0].message.content
    assert r.usage.input_tokens == want.usage.prompt_tokens
    assert r.usage.output_tokens == want.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "You are terse." and r.max_output_tokens == 24 and r.temperature == 0
    msg = [o for o in r.output if o.type == "message"]
    assert len(msg) == 1 and msg[0].role == "assistant" and msg[0].content[0].type == "output_text"
    # Cut by max_output_tokens: incomplete, with the reason.
    cut = client.responses.create(model="m", input="Write a long poem about the sea.", max_output_tokens=5,
                                  temperature=0, extra_body={"logit_bias": QWEN_END})
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 5 and cut.output[0].status == "incomplete"
    count = client.responses.input_tokens.count(model="m", input="Name three colors, one per line.",
                                                instructions="You are terse.")
    assert count.input_tokens == r.usage.input_tokens


def test_stream_events_rebuild_the_response(client):
    kw = dict(model="m", input="Count from one to five in words.", max_output_tokens=30, temperature=0)
    plain = client.responses.create(**kw)
    with client.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types.index("response.output_item.added") < types.index("response.content_part.added") < \
        types.index("response.output_text.delta") < types.index("response.output_text.done") < \
        types.index("response.content_part.done") < types.index("response.output_item.done")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == plain.output_text
    assert final.usage.output_tokens == plain.usage.output_tokens and final.status == plain.status
    raw = requests.post(client.base_url.__str__().rstrip("/") + "/responses", json={**kw, "stream": True},
                        stream=True, timeout=60)
    assert raw.headers["content-type"].startswith("text/event-stream")
    lines = [x for x in raw.iter_lines(decode_unicode=True) if x]
    assert lines[0] == "event: response.created" and json.loads(lines[1][6:])["type"] == "response.created"


def test_stored_responses_chain_get_list_and_delete(client):
    first = client.responses.create(model="m", input="My name is Ada. Reply with one word: OK.",
                                    max_output_tokens=8, temperature=0)
    second = client.responses.create(model="m", previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=16, temperature=0)
    # The chain is the conversation so far: the same prompt as the chat request with both turns.
    want = chat(client, [{"role": "user", "content": "My name is Ada. Reply with one word: OK."},
                         {"role": "assistant", "content": first.output_text},
                         {"role": "user", "content": "What is my name?"}], max_tokens=16)
    assert second.usage.input_tokens == want.usage.prompt_tokens
    assert second.output_text == want.choices[0].message.content
    assert second.previous_response_id == first.id
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.status == first.status
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in items] == ["message", "message", "message"]
    assert [i.role for i in items] == ["user", "assistant", "user"] and all(i.id for i in items)
    assert items[0].content[0].text == "My name is Ada. Reply with one word: OK."
    newest = client.responses.input_items.list(second.id, limit=1)  # default order: newest first
    assert [i.id for i in newest.data] == [items[-1].id] and newest.has_more
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", previous_response_id=first.id, input="Hi", max_output_tokens=4)
    assert "previous_response_id" in str(e.value)
    unstored = client.responses.create(model="m", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_function_call_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = client.responses.create(model="m", input=ask, tools=[WEATHER], tool_choice="required", temperature=1.0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id and r.status == "completed", r
    args = json.loads(calls[0].arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    # The call and its output go back as items; the prompt is the chat request's with the same turns.
    follow_input = ask + [calls[0].model_dump(exclude_none=True),
                          {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"}]
    follow = client.responses.create(model="m", input=follow_input, tools=[WEATHER], max_output_tokens=30,
                                     temperature=0)
    chat_tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    want = chat(client, ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0].call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "18 C and sunny"}],
        tools=[chat_tool], max_tokens=30)
    assert follow.usage.input_tokens == want.usage.prompt_tokens
    assert follow.output_text == (want.choices[0].message.content or "")
    # Streamed: the call's events, and the SDK's accumulated item.
    with client.responses.stream(model="m", input=ask, tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"}) as s:
        events = list(s)
        final = s.get_final_response()
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and set(json.loads(done[0].arguments)) == {"city"}
    fc = [o for o in final.output if o.type == "function_call"]
    assert len(fc) == 1 and fc[0].arguments == done[0].arguments and fc[0].status == "completed"


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_structured_output(client):
    for _ in range(3):  # sampled: every run must match the schema
        r = client.responses.parse(model="m", input="Invent a person.", text_format=Person, temperature=1.0)
        assert isinstance(r.output_parsed, Person), r.output_text
    r = client.responses.create(model="m", input="Two fruits as a JSON object.", temperature=1.0,
                                max_output_tokens=60, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)
    assert r.text.format.type == "json_object"


def test_logprobs_are_the_chat_endpoints(client):
    ask = [{"role": "user", "content": "Say hello."}]
    r = client.responses.create(model="m", input=ask, max_output_tokens=6, temperature=0, top_logprobs=2,
                                include=["message.output_text.logprobs"], extra_body={"logit_bias": QWEN_END})
    lps = r.output[0].content[0].logprobs
    want = chat(client, ask, max_tokens=6, logprobs=True, top_logprobs=2, logit_bias=QWEN_END)
    assert [x.token for x in lps] == [x.token for x in want.choices[0].logprobs.content]
    assert all(len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob for x in lps)
    assert client.responses.create(model="m", input=ask, max_output_tokens=3, temperature=0,
                                   top_logprobs=2).output[0].content[0].logprobs in (None, [])


def test_errors_name_the_field(client, coder_server):
    server = coder_server
    url = server.base_url + "/v1/responses"
    bad = [({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "custom"),
           ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "text-only"),
           ({"input": "x", "truncation": "auto"}, "truncation"),
           ({"input": "x", "background": True}, "background"),
           ({}, "input"), ({"input": 5}, "input"), ({"input": []}, "input"),
           ({"input": [{"type": "computer_call_output"}]}, "computer_call_output"),
           ({"input": [{"type": "function_call", "name": "f", "call_id": "c", "arguments": "[1"}]}, "arguments"),
           ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
           ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
           ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
           ({"input": [[]]}, "input[0]")]
    for body, word in bad:
        r = requests.post(url, json={"model": "m", **body}, timeout=30)
        assert r.status_code == 400 and word in r.json()["error"]["message"], (body, r.text)
    assert requests.get(url + "/resp_nope", timeout=30).status_code == 404
    assert requests.delete(url + "/resp_nope", timeout=30).status_code == 404
    assert requests.delete(url + "/resp_nope/input_items", timeout=30).status_code == 405
    assert requests.get(url + "/resp_nope/other", timeout=30).status_code == 404
    assert requests.get(url, timeout=30).status_code == 405
    assert requests.get(server.base_url + "/health", timeout=30).json()["status"] == "ok"


def test_stream_is_cancelled_when_the_client_leaves(coder_server):
    server = coder_server
    body = {"model": "m", "input": "Write a very long story.", "max_output_tokens": 1500, "temperature": 1.0,
            "stream": True, "logit_bias": QWEN_END}
    r = requests.post(server.base_url + "/v1/responses", json=body, stream=True, timeout=60)
    lines = r.iter_lines()
    for _ in range(12):
        next(lines)
    r.close()
    server.wait_idle(10)  # well under what 1,500 tokens take here


def test_a_queued_stream_keeps_the_client_waiting(mererun_bin, model_path):
    """While a streamed response waits (here queued behind another request on a one-sequence
    server), response.in_progress repeats every few seconds, so a client that times out an idle
    stream (Codex CLI) keeps waiting; the SDK's accumulator takes them."""
    import threading

    from mererun_server import ServerProcess
    server = ServerProcess(mererun_bin, "qwen2.5-coder-0.5b-instruct", "-c", "2048", "--max-active", "1",
                           "--no-warmup")
    try:
        c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        long = threading.Thread(target=lambda: c.responses.create(
            model="m", input="Write a long story.", max_output_tokens=600, extra_body={"logit_bias": QWEN_END}))
        long.start()
        server.wait_for_log(r"POST /v1/responses", timeout=30)
        with c.responses.stream(model="m", input="Say hi.", max_output_tokens=60, temperature=0) as s:
            events = list(s)
            final = s.get_final_response()
        long.join()
    finally:
        server.stop()
    types = [e.type for e in events]
    first_item = types.index("response.output_item.added")
    assert types[:first_item].count("response.in_progress") >= 2, types[:first_item]
    assert types[-1] in ("response.completed", "response.incomplete") and final.output_text, types
    assert [e.sequence_number for e in events] == list(range(len(events)))
