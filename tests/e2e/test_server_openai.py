"""OpenAI Chat Completions end to end: the official `openai` SDK against `mererun serve` on
smollm2-135m-instruct."""
import openai
import pytest
import requests

from mererun_server import ServerProcess

KEY = "sk-test"


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path("smollm2-135m-instruct")
    s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "2048", "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)


MSGS = [{"role": "system", "content": "You are concise."}, {"role": "user", "content": "What is the capital of France?"}]


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct"]


def test_completion_shape_and_stream_with_usage(client):
    r = client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=20, temperature=0)
    assert r.object == "chat.completion" and r.model == "gpt-4o"
    assert "Paris" in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens and not chunks[-1].choices


def test_max_tokens_stop_seed(client):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Write a long poem."}],
                                       max_completion_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    full = client.chat.completions.create(model="m", messages=MSGS, max_tokens=20, temperature=0).choices[0].message.content
    stop = full.split()[2]
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].message.content == full[:full.index(stop)].rstrip()
    a = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=1.0, seed=1234)
    b = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=1.0, seed=1234)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_error_envelope(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MSGS, n=2)
    assert "n:" in e.value.body["message"]
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=MSGS)
    r = requests.post(server.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer " + KEY},
                      json={"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and "text-only" in r.json()["error"]["message"]
