"""Anthropic Messages API end to end: the official `anthropic` SDK against `mererun serve` on
smollm2-135m-instruct (greedy, small max_tokens), plus raw HTTP for what the SDK hides."""
import json
import socket
import time

import anthropic
import pytest
import requests

from mererun_server import ServerProcess

KEY = "test-key"
MAX_BODY = 1_000_000
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path("smollm2-135m-instruct")  # skips when not pulled
    s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "2048", "--api-key", KEY,
                      "--max-body-bytes", MAX_BODY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def ask(client, text="Name the capital city of France.", **kw):
    # Not "What is the capital of France?": SmolLM2's exact arithmetic prefers "The" over "L'" there by
    # 0.11 logits, so a change of rounding may flip the greedy answer (tests/e2e/test_cli_run.py).
    # anthropic 2.10 has no typed temperature/top_p/top_k: they travel in extra_body.
    kw.setdefault("max_tokens", 24)
    kw["extra_body"] = {"temperature": 0, **kw.get("extra_body", {})}
    return client.messages.create(model="claude-opus-5-5", messages=[{"role": "user", "content": text}], **kw)


def sse_events(resp):
    """(event, data) pairs of a raw SSE response."""
    out, name = [], None
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


def headers(**extra):
    h = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    h.update(extra)
    return h


def test_models_list_and_retrieve(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m-instruct"]
    m = client.models.retrieve("claude-opus-5-5")
    assert m.id == "smollm2-135m-instruct"
    # The context window (-c 2048) and the output limit, as Anthropic's ModelInfo names them.
    assert m.max_input_tokens == 2047 and 1 <= m.max_tokens <= 2047 and m.lifecycle == "active"


def test_message_shape_and_count_tokens(client):
    msg = ask(client)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "claude-opus-5-5"
    assert msg.id.startswith("msg_")
    assert msg.content and msg.content[0].type == "text" and "Paris" in msg.content[0].text
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    count = client.messages.count_tokens(model="x", messages=[{"role": "user", "content": "Name the capital city of France."}])
    # Reused KV (an earlier test asked the same) shows as cache reads: the three input counts
    # together are the prompt.
    u = msg.usage
    assert count.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > 10
    assert 0 < msg.usage.output_tokens <= 24


def test_streaming_matches_non_streaming(client):
    plain = ask(client, "Name three colors.", max_tokens=20)
    with client.messages.stream(model="m", max_tokens=20, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "Name three colors."}]) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == plain.content[0].text
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    # The second run reads more from the cache; the prompt they split is the same.
    def prompt(u):
        return u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert prompt(final.usage) == prompt(plain.usage)


def test_max_tokens_zero_warms_the_cache(client):
    """max_tokens 0: the prompt is evaluated and cached under its breakpoint, the answer has no
    content; the same prompt then reads it from the cache."""
    system = [{"type": "text", "text": "You are a terse assistant who answers about geography. " * 8,
               "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "Which river flows through Cairo?"}]
    warm = client.messages.create(model="m", max_tokens=0, system=system, messages=messages, extra_body=GREEDY)
    assert warm.content == [] and warm.stop_reason == "max_tokens"
    assert warm.usage.output_tokens == 0
    assert warm.usage.cache_creation_input_tokens > 50, warm.usage
    hot = client.messages.create(model="m", max_tokens=8, system=system, messages=messages, extra_body=GREEDY)
    assert hot.usage.cache_read_input_tokens >= warm.usage.cache_creation_input_tokens, (warm.usage, hot.usage)
    assert hot.content and hot.usage.output_tokens > 0


def test_stream_message_start_carries_the_cache_counts(server, client):
    """message_start's usage already has the request's cache counts (the official SDKs keep
    message_start's values), the same as message_delta's."""
    system = [{"type": "text", "text": "You answer questions about the history of mathematics. " * 8,
               "cache_control": {"type": "ephemeral"}}]
    body = {"model": "m", "max_tokens": 6, "temperature": 0, "system": system,
            "messages": [{"role": "user", "content": "Who proved Fermat's last theorem?"}]}
    client.messages.create(**{k: v for k, v in body.items() if k != "temperature"}, extra_body=GREEDY)  # warm
    r = requests.post(server.base_url + "/v1/messages", headers=headers(), stream=True, timeout=60,
                      json={**body, "stream": True})
    assert r.status_code == 200
    ev = sse_events(r)
    start = next(d for n, d in ev if n == "message_start")["message"]["usage"]
    delta = next(d for n, d in ev if n == "message_delta")["usage"]
    assert start["cache_read_input_tokens"] > 50, start
    for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert start[k] == delta[k], (k, start, delta)


def test_raw_sse_event_sequence(server):
    r = requests.post(server.base_url + "/v1/messages?beta=true", headers=headers(), stream=True, timeout=60,
                      json={"model": "m", "max_tokens": 5, "temperature": 0, "stream": True,
                            "messages": [{"role": "user", "content": "Count from one to ten."}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers.get("request-id", "").startswith("req_")
    ev = sse_events(r)
    names = [n for n, _ in ev if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    assert set(names[2:-3]) == {"content_block_delta"}
    assert ev[0][1]["message"]["usage"]["input_tokens"] > 0
    delta = [d for n, d in ev if n == "message_delta"][0]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 5


def test_max_tokens_and_huge_max_tokens(client):
    msg = ask(client, "Write a long poem about the sea.", max_tokens=3)
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3
    # Far beyond the 2048-token context: clamped, not refused.
    msg = ask(client, max_tokens=128000)
    assert msg.stop_reason == "end_turn"


def test_stop_sequences(client):
    prompt = "Count from one to ten."
    full = ask(client, prompt, max_tokens=40).content[0].text
    words = full.split()
    assert len(words) >= 4, full
    stop = words[2]
    msg = ask(client, prompt, max_tokens=40, stop_sequences=["never-produced", stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == full[:full.index(stop)].rstrip()


def test_system_multiturn_and_unknown_fields(client):
    msg = client.messages.create(
        model="anything", max_tokens=8,
        system=[{"type": "text", "text": "You answer in one word.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                  {"role": "user", "content": [{"type": "text", "text": "Capital of Italy?"}]},
                  {"role": "system", "content": "Remember: one word."}],
        metadata={"user_id": "u1"},
        extra_body={"some_future_field": {"x": 1}, "context_management": {"edits": []}, "temperature": 0},
        extra_headers={"anthropic-beta": "made-up-feature-2099-01-01,claude-code-20250219"})
    assert msg.content and msg.content[0].type == "text"


def test_thinking_signature_and_replay(client):
    msg = client.messages.create(model="m", max_tokens=40, extra_body=GREEDY,
                                 thinking={"type": "enabled", "budget_tokens": 8},
                                 messages=[{"role": "user", "content": "Is 7 prime?"}])
    kinds = [b.type for b in msg.content]
    assert kinds[0] == "thinking", kinds
    assert msg.content[0].signature and msg.content[0].thinking
    history = [{"role": "user", "content": "Is 7 prime?"},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
               {"role": "user", "content": "Thanks."}]
    ok = client.messages.create(model="m", max_tokens=5, messages=history, extra_body=GREEDY)
    assert ok.content is not None
    history[1]["content"][0]["signature"] = "AAAA" + history[1]["content"][0]["signature"][4:]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=5, messages=history)
    assert "signature" in str(e.value)
    # redacted_thinking is accepted (and dropped).
    history[1]["content"][0] = {"type": "redacted_thinking", "data": "opaque"}
    assert client.messages.create(model="m", max_tokens=3, messages=history).usage.input_tokens > 0


def test_thinking_streams_signature_delta(client):
    with client.messages.stream(model="m", max_tokens=30, extra_body=GREEDY, thinking={"type": "enabled", "budget_tokens": 6},
                                messages=[{"role": "user", "content": "Is 9 prime?"}]) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_message()
    assert "thinking" in types and "signature" in types
    assert final.content[0].type == "thinking" and final.content[0].signature
    # adaptive thinking with too few max_tokens to reason in, and disabled thinking: no block.
    for thinking in ({"type": "adaptive", "display": "omitted"}, {"type": "disabled"}):
        msg = ask(client, max_tokens=5, thinking=thinking, extra_body={"output_config": {"effort": "medium"}})
        assert all(b.type != "thinking" for b in msg.content)


SHOWN_REASONING = [
    {"role": "user", "content": "Is 12 even?"},
    {"role": "assistant", "content": "<think>\n12 divided by 2 is 6 with no remainder, so it is even.\n</think>\n\nYes, 12 is even."},
    {"role": "user", "content": "Is 35 even?"},
    {"role": "assistant", "content": "<think>\n35 divided by 2 leaves a remainder of 1, so it is odd.\n</think>\n\nNo, 35 is odd."},
    {"role": "user", "content": "Is 7 even? Start with <think> as before."}]


@pytest.mark.parametrize("effort,budget", [("low", 128), ("medium", 256), ("high", 1024)])
def test_adaptive_thinking_budget_per_effort(client, effort, budget):
    """Adaptive thinking: the model decides. Nothing is prompted, so with a plain question these
    models answer directly; a model that opens <think> itself (here SmolLM2 imitating the
    history's answers) gets a thinking block within the effort's budget. The cap itself (the
    server closes the section when the budget is spent) is the one `enabled` thinking uses,
    tested with small budget_tokens above; the budgets of xhigh (2048) and max (4096) are
    checked at parse level (server_test.cpp)."""
    plain = ask(client, "Name the capital city of France.", max_tokens=40, thinking={"type": "adaptive"},
                extra_body={"output_config": {"effort": effort}})
    assert all(b.type != "thinking" for b in plain.content) and plain.content, plain.content
    msg = client.messages.create(model="m", max_tokens=2 * budget + 64, messages=SHOWN_REASONING,
                                 thinking={"type": "adaptive"}, extra_body={"output_config": {"effort": effort}, **GREEDY})
    thinking = [b for b in msg.content if b.type == "thinking"]
    assert thinking and thinking[0].signature and thinking[0].thinking, msg.content
    base = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x"}]).input_tokens
    n = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x" + thinking[0].thinking}]).input_tokens - base
    assert n <= budget + 2, (effort, n)
    assert msg.usage.output_tokens <= 2 * budget + 64
    print(f"adaptive {effort}: {n} reasoning tokens (budget {budget}), {msg.usage.output_tokens} output tokens")


def test_errors_400(client, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert "text-only" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}, "citations": {"enabled": True}}]}])
    assert "citations" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        ask(client, extra_body={"output_config": {"format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}}}})
    assert "$.properties.a.multipleOf" in str(e.value)  # a keyword constrained decoding does not enforce
    with pytest.raises(anthropic.BadRequestError) as e:
        ask(client, "word " * 3000)
    assert e.value.status_code == 400
    assert "prompt is too long" in str(e.value) and "> 2047 maximum" in str(e.value)
    r = requests.post(server.base_url + "/v1/messages", headers=headers(), data="{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.post(server.base_url + "/v1/messages", headers=headers(), json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


def test_errors_401_403_404_413(server):
    bad = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.models.list()
    r = requests.get(server.base_url + "/v1/models", headers={"Authorization": "Bearer " + KEY})
    assert r.status_code == 200
    r = requests.get(server.base_url + "/v1/models", headers=headers(Host="attacker.example"))
    assert r.status_code == 403 and r.json() == {"type": "error", "error": {"type": "permission_error", "message": r.json()["error"]["message"]}}
    r = requests.get(server.base_url + "/v1/nothing-here", headers=headers())
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = requests.post(server.base_url + "/v1/messages", headers=headers(), data=b"x" * (MAX_BODY + 10))
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = requests.head(server.base_url + "/any/path/at/all")
    assert r.status_code == 200


def test_client_disconnect_mid_stream_then_normal_request(client, server):
    r = requests.post(server.base_url + "/v1/messages", headers=headers(), stream=True, timeout=60,
                      json={"model": "m", "max_tokens": 1500, "temperature": 0, "stream": True,
                            "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]})
    lines = r.iter_lines(decode_unicode=True)
    got = 0
    for line in lines:
        if line.startswith("data: ") and "text_delta" in line:
            got += 1
            if got == 3:
                break
    r.close()
    assert server.wait_for_log(r"client went away during a stream", timeout=30), server.log()[-2000:]
    msg = ask(client, max_tokens=8)
    assert msg.content[0].text


def test_client_disconnect_non_streaming(client, server):
    body = json.dumps({"model": "m", "max_tokens": 1500, "temperature": 0,
                       "messages": [{"role": "user", "content": "Write a very long story about a cat."}]}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: " + KEY.encode() +
              b"\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(1.0)
    s.close()
    assert server.wait_for_log(r"client went away; cancelling", timeout=30), server.log()[-2000:]
    assert ask(client, max_tokens=4).usage.output_tokens > 0
