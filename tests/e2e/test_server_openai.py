"""OpenAI Chat Completions end to end: the official `openai` SDK against `mererun serve` on
smollm2-135m-instruct."""
import json
import math
import subprocess

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
        client.chat.completions.create(model="m", messages=MSGS, n=0)
    assert "n:" in e.value.body["message"]
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=MSGS)
    r = requests.post(server.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer " + KEY},
                      json={"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and "text-only" in r.json()["error"]["message"]


def token_ids(mererun_bin, text):
    out = subprocess.run([str(mererun_bin), "tokenize", "-m", "smollm2-135m-instruct", "--no-add-special"],
                         input=text, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_logprobs_plain_and_streamed(client):
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(e.token for e in content).strip() == r.choices[0].message.content.strip()
    for e in content:
        assert e.logprob <= 0 and bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert len(e.top_logprobs) == 3
        assert [a.logprob for a in e.top_logprobs] == sorted((a.logprob for a in e.top_logprobs), reverse=True)
        # Greedy: the token is the row's most likely one.
        assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
    assert sum(math.exp(a.logprob) for a in content[0].top_logprobs) <= 1 + 1e-4
    chunks = list(client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=0, logprobs=True,
                                                 top_logprobs=3, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(abs(a.logprob - b.logprob) < 0.02 for a, b in zip(streamed, content))
    # Off by default; top_logprobs without logprobs is refused.
    assert client.chat.completions.create(model="m", messages=MSGS, max_tokens=2).choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=2, top_logprobs=2)
    assert "top_logprobs" in e.value.body["message"]


def test_logit_bias(client, mererun_bin):
    plain = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=0).choices[0].message.content
    assert "Paris" in plain
    paris = token_ids(mererun_bin, " Paris") + token_ids(mererun_bin, "Paris")
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=0,
                                       logit_bias={str(t): -100 for t in paris})
    assert "Paris" not in r.choices[0].message.content
    [banana] = token_ids(mererun_bin, " banana")
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=5, temperature=1.0,
                                       logit_bias={str(banana): 100})
    assert r.choices[0].message.content.strip() == " ".join(["banana"] * 5)
    for bad, word in (({"x": 1}, "token id"), ({"5": 101}, "between"), ({"99999999": 1}, "outside the vocabulary")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=MSGS, max_tokens=2, logit_bias=bad)
        assert word in e.value.body["message"]


def test_frequency_and_presence_penalties(client):
    """Greedy with penalties, checked through the raw log-probabilities the server reports: at each
    step the chosen token beats every listed alternative once each one's penalty for its count so far
    is subtracted (an independent reading of OpenAI's formula), and the output differs from the
    unpenalized one."""
    msgs = [{"role": "user", "content": "Write the word 'hello' ten times."}]
    plain = client.chat.completions.create(model="m", messages=msgs, max_tokens=30, temperature=0)
    freq, pres = 1.0, 0.5
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=30, temperature=0, logprobs=True,
                                       top_logprobs=20, frequency_penalty=freq, presence_penalty=pres)
    assert r.choices[0].message.content != plain.choices[0].message.content
    counts = {}
    adjusted = lambda tok, lp: lp - freq * counts.get(tok, 0) - (pres if counts.get(tok, 0) else 0)
    for e in r.choices[0].logprobs.content:
        best = max(adjusted(a.token, a.logprob) for a in e.top_logprobs)
        assert adjusted(e.token, e.logprob) >= best - 1e-4, (e.token, [(a.token, a.logprob) for a in e.top_logprobs])
        counts[e.token] = counts.get(e.token, 0) + 1


def test_text_completions_without_fim_tokens(client):
    r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens >= 1
    # SmolLM2's vocabulary has no fill-in-the-middle markers: a suffix is refused, not ignored.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="def f(", suffix=")", max_tokens=4)
    assert "fill-in-the-middle" in e.value.body["message"]


def test_vllm_sampling_extensions(client, server):
    """top_k, min_p and repetition_penalty (vLLM's and llama.cpp's extensions) act: top_k=1 and
    min_p=1 leave only the most likely token, so hot sampling gives the greedy text whatever the
    seed; a repetition penalty changes a repetitive answer."""
    greedy = client.chat.completions.create(model="m", messages=MSGS, max_tokens=20, temperature=0)
    hot = dict(model="m", messages=MSGS, max_tokens=20, temperature=1.5)
    sampled = {client.chat.completions.create(**hot, seed=s).choices[0].message.content for s in (1, 2, 3)}
    assert sampled != {greedy.choices[0].message.content}  # hot sampling alone is not greedy
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        for s in (1, 2):
            r = client.chat.completions.create(**hot, seed=s, extra_body=extra)
            assert r.choices[0].message.content == greedy.choices[0].message.content, extra
    msgs = [{"role": "user", "content": "Write the word 'hello' ten times."}]
    plain = client.chat.completions.create(model="m", messages=msgs, max_tokens=30, temperature=0).choices[0].message.content
    for key in ("repetition_penalty", "repeat_penalty"):
        r = client.chat.completions.create(model="m", messages=msgs, max_tokens=30, temperature=0, extra_body={key: 2.0})
        text = r.choices[0].message.content
        assert text != plain and text.lower().count("hello") < plain.lower().count("hello"), (plain, text)
    for bad in ({"top_k": -2}, {"min_p": 1.5}, {"repetition_penalty": 0}, {"top_k": "1"}):
        resp = requests.post(server.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer " + KEY},
                             json={"model": "m", "messages": MSGS, **bad})
        assert resp.status_code == 400 and list(bad)[0] in resp.json()["error"]["message"]


def test_seeded_sampling_does_not_draft(server):
    """A seed must give the same text under any load: speculative draft lengths follow timing, so a
    seeded sampled request decodes plainly (x-mererun-draft-tokens 0) while an unseeded one drafts."""
    body = {"model": "m", "max_tokens": 48, "temperature": 1.0,
            "messages": [{"role": "user", "content": "Repeat exactly: a b c d e f g h a b c d e f g h a b c d e f g h"}]}
    headers = {"Authorization": "Bearer " + KEY}
    url = server.base_url + "/v1/chat/completions"
    seeded = requests.post(url, headers=headers, json={**body, "seed": 7})
    assert seeded.status_code == 200 and seeded.headers["x-mererun-draft-tokens"] == "0"
    drafted = sum(int(requests.post(url, headers=headers, json=body).headers["x-mererun-draft-tokens"]) for _ in range(3))
    assert drafted > 0


def test_n_choices_plain_and_streamed(client):
    """n: independent samples of one prompt, one response id; choice i of a seeded request is the
    single request seeded seed + i, streamed or not; usage counts every choice's tokens."""
    kw = dict(model="m", messages=MSGS, max_tokens=24, temperature=1.0, top_p=1.0, seed=11, logprobs=True)
    r = client.chat.completions.create(n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(**{**kw, "seed": 11 + i}).choices[0] for i in range(3)]
    assert [c.message.content for c in r.choices] == [s.message.content for s in singles]
    assert [c.finish_reason for c in r.choices] == [s.finish_reason for s in singles]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kw))
    assert len({c.id for c in chunks}) == 1
    texts = ["", "", ""]
    finishes = [None, None, None]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            finishes[ch.index] = ch.finish_reason or finishes[ch.index]
    assert texts == [s.message.content for s in singles] and None not in finishes
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and chunks[-1].usage is not None
    assert usage[0].completion_tokens == r.usage.completion_tokens
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(n=17, **kw)


def test_n_choices_each_keep_their_constraint(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=40, temperature=1.0, n=3,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "c", "schema": schema}})
    assert len(r.choices) == 3
    for c in r.choices:
        assert set(json.loads(c.message.content)) == {"city"}


def test_n_on_text_completions(client):
    r = client.completions.create(model="m", prompt="The sky is", max_tokens=8, temperature=1.0, n=2, best_of=2,
                                  seed=3)
    assert [c.index for c in r.choices] == [0, 1]
    single = client.completions.create(model="m", prompt="The sky is", max_tokens=8, temperature=1.0, seed=4)
    assert r.choices[1].text == single.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="x", max_tokens=2, n=2, best_of=3)


def test_n_choices_are_all_cancelled_when_the_client_leaves(server):
    """Every choice's sequence stops when the client goes, streamed or not."""
    # No end of turn (SmolLM2's <|endoftext|> 0 and <|im_end|> 2): 400 tokens per choice.
    body = {"model": "m", "messages": MSGS, "max_tokens": 400, "temperature": 1.0, "n": 3, "stream": True,
            "logit_bias": {"0": -100, "2": -100}}
    h = {"Authorization": "Bearer " + KEY}
    r = requests.post(server.base_url + "/v1/chat/completions", json=body, headers=h, stream=True, timeout=60)
    lines = r.iter_lines()
    for _ in range(4):
        next(lines)
    r.close()
    with pytest.raises(requests.exceptions.Timeout):
        requests.post(server.base_url + "/v1/chat/completions", json={**body, "stream": False}, headers=h, timeout=1.5)
    server.wait_idle(5)  # well under what 3 x 400 tokens take here
