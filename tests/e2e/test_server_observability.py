"""/health, /metrics and Anthropic prompt caching (cache_control, usage) end to end: the
official SDKs against `mererun serve` on smollm2-135m-instruct, a few greedy tokens each."""
import math
import re
import time

import anthropic
import openai
import pytest
import requests

from mererun_server import ServerProcess

KEY = "test-key"
MODEL = "smollm2-135m-instruct"
N_CTX = 2048
SYSTEM = "You are a terse assistant. Answer in a few words."


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path(MODEL)  # skips when not pulled
    s = ServerProcess(mererun_bin, MODEL, "-c", N_CTX, "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def cached_request(question="Name a color.", ttl=None):
    """A request with breakpoints on the system prompt and the first user turn."""
    cc = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return dict(
        model="claude-opus-5-5",
        system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=7;"},
                {"type": "text", "text": SYSTEM, "cache_control": cc}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello.", "cache_control": {"type": "ephemeral"}}]},
                  {"role": "assistant", "content": "Hi."},
                  {"role": "user", "content": [{"type": "text", "text": question}]}],
    )


def ask(client, req, max_tokens=4):
    return client.messages.create(max_tokens=max_tokens, extra_body={"temperature": 0}, **req)


def ask_streamed(client, req, max_tokens=4):
    with client.messages.stream(max_tokens=max_tokens, extra_body={"temperature": 0}, **req) as stream:
        return stream.get_final_message()


def parse_metrics(text):
    """{(name, frozenset(labels)): value} plus {family: type}; every sample must have a TYPE."""
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("#") or not line:
            continue
        else:
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)', line)
            assert m, f"unparsable metrics line: {line!r}"
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            family = name if name in types else re.sub(r"_(bucket|sum|count)$", "", name)
            assert family in types, f"sample without a TYPE: {line!r}"
            lab = frozenset(re.findall(r'([a-zA-Z_]\w*)="([^"]*)"', labels))
            samples[(name, lab)] = math.inf if value == "+Inf" else float(value)
    return types, samples


def metrics(server):
    r = requests.get(server.base_url + "/metrics", timeout=10)  # no API key needed
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse_metrics(r.text)


def requests_total(samples, api, outcome):
    return samples[("mererun_requests_total", frozenset({("api", api), ("outcome", outcome)}))]


def test_health_reports_the_engine(server):
    r = requests.get(server.base_url + "/health", timeout=10)  # no API key needed
    assert r.status_code == 200
    h = r.json()
    assert h["status"] == "ok"
    assert h["model"] == MODEL
    assert h["n_ctx"] == N_CTX
    assert h["active"] == 0 and h["queued"] == 0
    assert h["max_active"] >= 1 and h["max_queued"] >= 1
    # Everything else still needs the key.
    assert requests.get(server.base_url + "/v1/models", timeout=10).status_code == 401


def test_metrics_parse_and_request_counters_move(server, client):
    types, before = metrics(server)
    assert types["mererun_requests_total"] == "counter"
    assert types["mererun_time_to_first_token_seconds"] == "histogram"
    assert before[("mererun_ready", frozenset())] == 1
    assert before[("mererun_resident_memory_bytes", frozenset())] > 10e6
    ask(client, cached_request())
    ask_streamed(client, cached_request(), max_tokens=3)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": 5}])
    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    oa.chat.completions.create(model="m", max_tokens=2, temperature=0, messages=[{"role": "user", "content": "Hi"}])
    # A stream is counted when the server lets go of it, which may be just after the client has
    # read its last event.
    want_ok = requests_total(before, "anthropic", "ok") + 2
    assert wait_for_count(server, "anthropic", "ok", want_ok) == want_ok
    _, after = metrics(server)
    assert requests_total(after, "anthropic", "ok") == want_ok
    assert requests_total(after, "anthropic", "invalid") == requests_total(before, "anthropic", "invalid") + 1
    assert requests_total(after, "openai", "ok") == requests_total(before, "openai", "ok") + 1
    # Histograms stay cumulative with +Inf == _count.
    for name in ("mererun_time_to_first_token_seconds", "mererun_queue_wait_seconds"):
        buckets = sorted(((float(dict(lab)["le"]), v) for (n, lab), v in after.items() if n == name + "_bucket"))
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
        assert buckets[-1] == (math.inf, after[(name + "_count", frozenset())])


def wait_for_count(server, api, outcome, at_least, timeout=30.0):
    deadline = time.time() + timeout
    while True:
        n = requests_total(metrics(server)[1], api, outcome)
        if n >= at_least or time.time() > deadline:
            return n
        time.sleep(0.1)


def test_client_that_leaves_counts_as_cancelled(server, client):
    before = requests_total(metrics(server)[1], "anthropic", "cancelled")
    r = requests.post(server.base_url + "/v1/messages", stream=True, timeout=60,
                      headers={"x-api-key": KEY, "content-type": "application/json"},
                      json={"model": "m", "max_tokens": 1500, "temperature": 0, "stream": True,
                            "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]})
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and "text_delta" in line:
            break
    r.close()
    assert wait_for_count(server, "anthropic", "cancelled", before + 1) == before + 1
    ok = requests_total(metrics(server)[1], "anthropic", "ok")
    ask(client, cached_request())  # the server serves on, and counts it
    assert requests_total(metrics(server)[1], "anthropic", "ok") == ok + 1


def test_metrics_token_counters_move(server, client):
    _, before = metrics(server)
    out = ask(client, cached_request("Name a fruit."), max_tokens=3)
    _, after = metrics(server)
    gen = ("mererun_generated_tokens_total", frozenset())
    assert after[gen] >= before[gen] + out.usage.output_tokens
    prompt = ("mererun_prompt_tokens_total", frozenset())
    assert after[prompt] > before[prompt]


def test_too_many_cache_breakpoints_is_a_400(client):
    cc = {"type": "ephemeral"}
    content = [{"type": "text", "text": f"part {i}", "cache_control": cc} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": content}])
    assert "A maximum of 4 blocks with cache_control may be provided. Found 5." in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}])
    assert "ttl" in str(e.value)


def test_usage_splits_the_prompt(client):
    req = cached_request("Name an animal.", ttl="1h")
    n_prompt = client.messages.count_tokens(**req).input_tokens
    for msg in (ask(client, req), ask_streamed(client, req)):
        u = msg.usage
        for v in (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens):
            assert v is not None and v >= 0
        assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == n_prompt
    u = ask(client, req).usage
    assert u.cache_creation is not None
    assert u.cache_creation.ephemeral_5m_input_tokens + u.cache_creation.ephemeral_1h_input_tokens == \
        u.cache_creation_input_tokens


def test_message_start_counts_the_whole_prompt(client):
    req = cached_request("Name a planet.")
    n_prompt = client.messages.count_tokens(**req).input_tokens
    with client.messages.stream(max_tokens=3, extra_body={"temperature": 0}, **req) as stream:
        first = next(iter(stream))
        assert first.type == "message_start"
        # message_start waits for the engine to start the request: its counts are the real ones
        # (the official SDKs keep message_start's cache counts), splitting the whole prompt.
        s = first.message.usage
        assert s.input_tokens + s.cache_read_input_tokens + s.cache_creation_input_tokens == n_prompt
        final = stream.get_final_message()
    u = final.usage
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == n_prompt
    assert (s.input_tokens, s.cache_read_input_tokens, s.cache_creation_input_tokens) == \
        (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens)


def test_openai_usage_has_cached_tokens(server):
    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    r = oa.chat.completions.create(model="m", max_tokens=2, temperature=0, messages=[{"role": "user", "content": "Hi"}])
    assert r.usage.prompt_tokens_details is not None
    assert 0 <= r.usage.prompt_tokens_details.cached_tokens <= r.usage.prompt_tokens


def test_repeated_prefix_is_read_from_the_cache(client):
    # A system prompt no earlier test used, so the first request starts cold.
    first_req = cached_request("Name a country.", ttl="1h")
    first_req["system"][1]["text"] = f"Session {time.time_ns()}. {SYSTEM}"
    u1 = ask(client, first_req).usage
    n1 = client.messages.count_tokens(**first_req).input_tokens
    assert u1.input_tokens + u1.cache_read_input_tokens + u1.cache_creation_input_tokens == n1
    # Cold: the prefix up to the 1h system breakpoint, then up to the 5m message one, is written.
    assert u1.cache_creation.ephemeral_1h_input_tokens > 0
    assert u1.cache_creation.ephemeral_5m_input_tokens > 0
    assert u1.cache_read_input_tokens < u1.cache_creation_input_tokens

    second_req = dict(first_req, messages=first_req["messages"][:2] + [{"role": "user", "content": "Name a river."}])
    u2 = ask(client, second_req).usage  # same prefix up to the breakpoints
    n2 = client.messages.count_tokens(**second_req).input_tokens
    assert u2.cache_read_input_tokens > 0
    assert u2.input_tokens + u2.cache_read_input_tokens + u2.cache_creation_input_tokens == n2


def kv_bytes_per_token(run_mererun):
    """From the model's own metadata (`mererun info`): layers x KV heads x head size x (K, V) x
    2 bytes (BF16 cache)."""
    info = run_mererun("info", "-m", MODEL).stdout
    val = {k: int(re.search(rf"^{re.escape(k)}:\s+(\d+)", info, re.M).group(1))
           for k in ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv")}
    head = val["embedding_length"] // val["attention.head_count"]
    return val["block_count"] * val["attention.head_count_kv"] * head * 2 * 2


def test_resource_headers_and_metrics(server, client, run_mererun):
    """Per request: peak resident memory, the KV bytes its sequence held at most, and the
    process's high-water mark (x-mererun-* headers); /metrics keeps the maxima and VmHWM."""
    per_token = kv_bytes_per_token(run_mererun)
    raw = client.messages.with_raw_response.create(
        model="m", max_tokens=24, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Count from one to twenty in words: " + "one two three " * 20}])
    msg = raw.parse()
    h = raw.headers
    rss, kv, hwm = (int(h[f"x-mererun-{k}"]) for k in ("peak-rss-bytes", "kv-peak-bytes", "process-peak-rss-bytes"))
    n = msg.usage.input_tokens + msg.usage.cache_read_input_tokens + msg.usage.output_tokens
    # The last generated token is not fed back; drafts verified past the end may add a few rows.
    # The avx512bf16 attention also keeps a pair-word copy of every full block of 32 rows
    # (docs/architecture.md), as many bytes again for those rows.
    def held(rows, copies):
        return rows * per_token + (rows // 32 * 32 * per_token if copies else 0)
    assert any(held(n - 1, c) <= kv <= held(n + 16, c) for c in (False, True)), (kv, n, per_token)
    assert 30e6 < rss <= hwm, (rss, hwm)  # the weights alone are ~100 MB in the file
    _, m = metrics(server)
    assert m[("mererun_request_kv_peak_bytes_max", frozenset())] >= kv
    assert m[("mererun_request_resident_peak_bytes_max", frozenset())] >= rss
    assert m[("mererun_resident_memory_peak_bytes", frozenset())] >= m[("mererun_resident_memory_bytes", frozenset())]
