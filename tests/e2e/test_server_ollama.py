"""Ollama's API end to end: the official `ollama` Python client against `mererun serve` on
qwen2.5-coder-0.5b-instruct.

Expected values come from the other endpoints of the same server (the OpenAI chat and text
completions give the same greedy texts and token counts), from the model file itself, and from
the client's own parsing of every response."""
import json
import os

import ollama
import pytest
import requests

MSGS = [{"role": "user", "content": "Name three colors, one per line."}]


@pytest.fixture(scope="module")
def server(coder_server):
    return coder_server


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base_url, timeout=300)


def oai(server, path, body):
    r = requests.post(server.base_url + path, json={"model": "m", **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_model_listing(client, server, model_path):
    models = client.list().models
    assert len(models) == 1
    m = models[0]
    assert m.model == "qwen2.5-coder-0.5b-instruct" and m.details.format == "gguf"
    assert m.details.family == "qwen2" and m.details.quantization_level == "Q4_K_M"  # the catalog's file
    assert m.size == os.path.getsize(model_path("qwen2.5-coder-0.5b-instruct"))
    show = client.show("any-name")
    assert "insert" in show.capabilities and "thinking" not in show.capabilities  # FIM markers, no reasoning
    assert client.ps().models[0].model == m.model
    assert requests.get(server.base_url + "/api/version", timeout=30).json()["version"]


def test_chat_is_the_openai_chat_greedy_answer(client, server):
    want = oai(server, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 24, "temperature": 0})
    r = client.chat(model="m", messages=MSGS, options={"temperature": 0, "num_predict": 24})
    assert r.done and r.message.role == "assistant"
    assert r.message.content == want["choices"][0]["message"]["content"]
    assert r.eval_count == want["usage"]["completion_tokens"]
    assert r.done_reason == ("length" if want["choices"][0]["finish_reason"] == "length" else "stop")
    assert 0 <= r.prompt_eval_count <= want["usage"]["prompt_tokens"] and r.eval_duration > 0
    parts = list(client.chat(model="m", messages=MSGS, stream=True, options={"temperature": 0, "num_predict": 24}))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].eval_count == r.eval_count
    assert "".join(p.message.content for p in parts) == r.message.content
    raw = requests.post(server.base_url + "/api/chat", json={"model": "m", "messages": MSGS,
                                                              "options": {"num_predict": 2}}, stream=True, timeout=60)
    assert raw.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line)["done"] for line in raw.iter_lines() if line][-1] is True


def test_generate_templated_raw_and_fill_in_the_middle(client, server):
    opts = {"temperature": 0, "num_predict": 16}
    chat = client.chat(model="m", messages=[{"role": "user", "content": "Say hello."}], options=opts)
    assert client.generate(model="m", prompt="Say hello.", options=opts).response == chat.message.content
    prompt = "def add(a, b):\n"
    want = oai(server, "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0})
    g = client.generate(model="m", prompt=prompt, raw=True, options=opts)
    assert g.response == want["choices"][0]["text"] and g.done_reason == "length"
    want = oai(server, "/v1/completions", {"prompt": prompt, "suffix": "\nprint(add(1, 2))\n", "max_tokens": 16,
                                           "temperature": 0})
    g = client.generate(model="m", prompt=prompt, suffix="\nprint(add(1, 2))\n", options=opts)
    assert g.response == want["choices"][0]["text"]
    streamed = list(client.generate(model="m", prompt=prompt, raw=True, stream=True, options=opts))
    assert "".join(p.response for p in streamed) == client.generate(model="m", prompt=prompt, raw=True,
                                                                     options=opts).response


def test_tools_and_formats(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    r = client.chat(model="m", messages=[{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
                    tools=tools, options={"temperature": 0})
    calls = r.message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and isinstance(calls[0].function.arguments["city"], str)
    # The result goes back as Ollama's clients send it: the assistant's call, then a tool message.
    follow = client.chat(model="m", options={"temperature": 0, "num_predict": 30}, tools=tools, messages=[
        {"role": "user", "content": "What is the weather in Paris? Use the tool."},
        {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "content": "18 C and sunny", "tool_name": "get_weather"}])
    assert follow.done
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat(model="m", messages=[{"role": "user", "content": "A person as JSON."}], format=schema,
                    options={"temperature": 1.0})
    d = json.loads(r.message.content)
    assert set(d) == {"name", "age"} and isinstance(d["age"], int)
    r = client.generate(model="m", prompt="A list of two fruits as a JSON object.", format="json",
                        options={"temperature": 1.0, "num_predict": 60})
    assert isinstance(json.loads(r.response), dict)


def test_load_requests_and_errors(client, server):
    assert client.chat(model="m", messages=[]).done_reason == "load"
    assert client.generate(model="m", prompt="").done_reason == "load"
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="m", messages=MSGS, think=True)
    assert e.value.status_code == 400 and "does not support thinking" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="m", messages=[{"role": "user", "content": "x", "images": ["aGk="]}])
    assert "text-only" in e.value.error
    for body in ({"messages": MSGS, "options": {"mirostat": 2}}, {"messages": "x"}, {"messages": MSGS, "format": 3},
                 {"messages": MSGS, "options": {"num_predict": "many"}}):
        r = requests.post(server.base_url + "/api/chat", json={"model": "m", **body}, timeout=30)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), r.text
    r = requests.post(server.base_url + "/api/chat", data="{", headers={"Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
