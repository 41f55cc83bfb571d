"""The seven advanced API phases of the reference qualification report
(../shared/reference/000_73b05fb3bed93684.txt), end to end with the official `anthropic` SDK on
Qwen2.5-Coder-0.5B (greedy), one server with one sequence slot and a short queue:

1-2. Regex search and BM25 search, each in one conversation combining zero-output warming with
     cache-marker boundaries (a 1h system breakpoint, a 5m message breakpoint), deferred-tool
     discovery run on the server, the discovered client tool returned for the client to run,
     nested PDF tool-result errors (400s naming the field) and a PDF tool result, signed
     reasoning replayed inside the tool loop (a forged signature is refused), and context edits.
3.   Two-page PDFs in original and reversed file order: the codes come back in page order, with
     cache write then read counts.
4.   Image capability errors: a clear 400 naming the model and its capability.
5.   Active disconnect recovery: an SDK stream closed mid-answer; the server returns to idle and
     answers the next request as before.
6.   Queued disconnect recovery: a stream waiting for the busy slot is closed; it leaves the queue,
     the running stream is unaffected, the next request completes.
7.   Cancellation during prefill: a long prompt's stream closed before any token; nothing was
     generated for it and the server is idle at once.
Every phase ends with nothing active or queued."""
import json
import threading
import time
import urllib.request

import anthropic
import pytest

from mererun_server import ServerProcess
from test_server_documents import make_pdf, pdf_block
from test_server_tool_search import BM25, EMAIL, EVENTS, REGEX, WEATHER, check_search_protocol

GREEDY = {"temperature": 0}
SYSTEM = ("You are an assistant with tools. Some tools are deferred: search for them with the tool "
          "search tool before you call them. Answer briefly.")
QUESTION = ('What is the weather in Paris? First search the tools with the query "weather", then call the '
            'tool you find with the city Paris.')


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path("qwen2.5-coder-0.5b-instruct")
    s = ServerProcess(mererun_bin, "qwen2.5-coder-0.5b-instruct", "-c", "8192", "--max-active", "1",
                      "--max-queue", "2", env={"MERERUN_LOG": "debug"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def health(server):
    with urllib.request.urlopen(server.base_url + "/health", timeout=10) as r:
        return json.loads(r.read())


def metric(server, name):
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def wait_for(server, pred, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        h = health(server)
        if pred(h):
            return h
        time.sleep(0.05)
    raise AssertionError(f"server state not reached in {timeout}s: {health(server)}")


def assert_idle(server):
    h = wait_for(server, lambda h: h["active"] == 0 and h["queued"] == 0)
    assert h["status"] == "ok", h


def total(u):
    return u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def as_params(blocks):
    """Response blocks as request content (what a client sends back)."""
    return [b.model_dump(exclude_none=True, exclude={"citations", "caller"}) for b in blocks]


def ready_request(client):
    r = client.messages.create(model="m", max_tokens=6, messages=[{"role": "user", "content": "Say OK."}],
                               extra_body=GREEDY)
    assert r.stop_reason in ("end_turn", "max_tokens") and r.content, r
    return r


@pytest.mark.parametrize("search", [REGEX, BM25], ids=["regex", "bm25"])
def test_phase_tool_search(client, server, search):
    tools = [search, WEATHER, EMAIL, EVENTS]
    system = [{"type": "text", "text": SYSTEM + f" (session {search['name']})",
               "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    q = {"role": "user", "content": [{"type": "text", "text": QUESTION, "cache_control": {"type": "ephemeral"}}]}

    # Zero-output warming: usage only; the two markers split the write into 1h and 5m parts.
    warm = client.messages.create(model="m", max_tokens=0, system=system, tools=tools, messages=[q])
    assert warm.content == [] and warm.usage.output_tokens == 0 and warm.stop_reason == "max_tokens"
    n_prompt = client.messages.count_tokens(model="m", system=system, tools=tools, messages=[q]).input_tokens
    assert total(warm.usage) == n_prompt
    cc = warm.usage.cache_creation
    assert cc.ephemeral_1h_input_tokens > 0 and cc.ephemeral_5m_input_tokens > 0, warm.usage
    assert cc.ephemeral_1h_input_tokens + cc.ephemeral_5m_input_tokens == warm.usage.cache_creation_input_tokens

    # Discovery on the server: the model sees only the search tool and must use it.
    turn1 = client.messages.create(model="m", max_tokens=150, system=system, tools=tools, tool_choice={"type": "any"},
                                   messages=[q], extra_body=GREEDY)
    assert turn1.usage.cache_read_input_tokens > 0, turn1.usage  # the warmed prefix
    assert turn1.content[0].type == "server_tool_use"
    found = check_search_protocol(turn1, search["name"])
    assert "get_weather" in found, (found, turn1.content)
    history = [q, {"role": "assistant", "content": as_params(turn1.content)}]
    uses = [b for b in turn1.content if b.type == "tool_use"]
    if not uses:  # the model stopped after the search: the found tool is callable now
        turn1b = client.messages.create(model="m", max_tokens=60, system=system, tools=tools, messages=history,
                                        tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
        uses = [b for b in turn1b.content if b.type == "tool_use"]
        history[-1]["content"] += as_params(turn1b.content)
    # The discovered tool is a client tool: returned for the client to run, not run here.
    assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input.get("city"), str), uses

    # Nested PDF tool-result errors: actionable 400s that name where the document was.
    def result_with(doc):
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": [doc]}]}
    url_doc = {"type": "document", "source": {"type": "url", "url": "https://example.com/w.pdf"}}
    bad_pdf = pdf_block(b"%PDF-1.4\nnot really a pdf")
    for doc, words in ((url_doc, "url"), (bad_pdf, "pdf")):
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="m", max_tokens=8, system=system, tools=tools,
                                   messages=history + [result_with(doc)])
        where = f"messages[{len(history)}].content[0].content[0]"  # the document inside the tool_result
        assert where in str(e.value) and words in str(e.value).lower(), str(e.value)
    assert_idle(server)

    # A PDF tool result, answered with signed reasoning.
    report = pdf_block(make_pdf(["Paris weather report: sunny, 21 degrees C."]))
    history.append(result_with(report))
    turn2 = client.messages.create(model="m", max_tokens=120, system=system, tools=tools, messages=history,
                                   thinking={"type": "enabled", "budget_tokens": 32}, extra_body=GREEDY)
    thinking = [b for b in turn2.content if b.type == "thinking"]
    assert thinking and thinking[0].signature, turn2.content
    assert turn2.usage.cache_read_input_tokens > 0, turn2.usage
    history.append({"role": "assistant", "content": as_params(turn2.content)})

    # Replayed inside the tool loop with its signature; a forged one is refused.
    follow = {"role": "user", "content": "Thanks. Is that warm?"}
    edits = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 50},
                        "keep": {"type": "tool_uses", "value": 0}}]}
    turn3 = client.beta.messages.create(model="m", max_tokens=40, system=system, tools=tools,
                                        messages=history + [follow], context_management=edits,
                                        thinking={"type": "enabled", "budget_tokens": 16}, extra_body=GREEDY)
    applied = turn3.context_management.applied_edits
    assert applied and applied[0].type == "clear_tool_uses_20250919" and applied[0].cleared_tool_uses >= 1, applied
    assert applied[0].cleared_input_tokens > 0
    forged = json.loads(json.dumps(history))
    for block in forged[-1]["content"]:
        if block["type"] == "thinking":
            block["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=8, system=system, tools=tools, messages=forged + [follow],
                               thinking={"type": "enabled", "budget_tokens": 16})
    assert "signature" in str(e.value).lower()
    assert_idle(server)


@pytest.mark.parametrize("reverse", [False, True], ids=["original", "reversed"])
def test_phase_pdf_page_order_and_cache(client, server, reverse):
    codes = ["ALPHA-7", "BRAVO-9"] if not reverse else ["CHARLIE-3", "DELTA-5"]
    pdf = make_pdf([f"Code word: {codes[0]}", f"Code word: {codes[1]}"], reverse_objects=reverse)
    msgs = [{"role": "user", "content": [pdf_block(pdf, cache_control={"type": "ephemeral"}), {
        "type": "text", "text": "List the code words of the document's pages, in page order, separated by commas."}]}]
    first = client.messages.create(model="m", max_tokens=30, messages=msgs, extra_body=GREEDY)
    text = "".join(b.text for b in first.content if b.type == "text")
    assert codes[0] in text and codes[1] in text and text.index(codes[0]) < text.index(codes[1]), text
    # Written by this request up to the breakpoint (what an earlier prompt shared is read), then read.
    marked = first.usage.cache_creation_input_tokens + first.usage.cache_read_input_tokens
    assert first.usage.cache_creation_input_tokens > 0 and marked > 40, first.usage
    again = client.messages.create(model="m", max_tokens=30, messages=msgs, extra_body=GREEDY)
    assert again.usage.cache_read_input_tokens >= marked and again.usage.cache_creation_input_tokens == 0, again.usage
    assert again.usage.cache_read_input_tokens > 0
    assert "".join(b.text for b in again.content if b.type == "text") == text
    assert_idle(server)


def test_phase_image_capability_errors(client, server):
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    cases = [
        [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}],
        [{"role": "user", "content": "Look."},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_i", "name": "shot", "input": {}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_i", "content": [image]}]}],
    ]
    tool = {"name": "shot", "description": "Take a screenshot.", "input_schema": {"type": "object"}}
    for msgs in cases:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="m", max_tokens=8, tools=[tool], messages=msgs)
        msg = str(e.value)
        assert "image" in msg and "text-only" in msg and "qwen2.5-coder-0.5b-instruct" in msg.lower(), msg
    assert_idle(server)
    ready_request(client)


LONG_ANSWER = "Write a long story about a lighthouse keeper and the sea, at least five paragraphs."


def test_phase_active_disconnect_recovery(client, server):
    before = metric(server, "mererun_cancellations_total")
    baseline = ready_request(client)
    with client.messages.stream(model="m", max_tokens=800, messages=[{"role": "user", "content": LONG_ANSWER}],
                                extra_body=GREEDY) as s:
        deltas = 0
        for ev in s:
            if ev.type == "content_block_delta":
                deltas += 1
                if deltas == 5:
                    break  # leaving the block closes the connection mid-answer
    assert deltas == 5
    assert_idle(server)
    assert metric(server, "mererun_cancellations_total") >= before + 1
    again = ready_request(client)
    assert [b.text for b in again.content] == [b.text for b in baseline.content]


def test_phase_queued_disconnect_recovery(client, server):
    before = metric(server, "mererun_cancellations_total")
    holder_deltas = []
    stop_holder = threading.Event()

    def hold():
        with client.messages.stream(model="m", max_tokens=800, messages=[{"role": "user", "content": LONG_ANSWER}],
                                    extra_body=GREEDY) as s:
            for ev in s:
                if ev.type == "content_block_delta":
                    holder_deltas.append(time.time())
                    if stop_holder.is_set():
                        break

    t = threading.Thread(target=hold)
    t.start()
    try:
        wait_for(server, lambda h: h["active"] == 1)
        # A client that gives up while it waits for the busy slot: the SDK's timeout closes the
        # connection.
        impatient = client.with_options(timeout=3.0, max_retries=0)
        outcome = {}

        def queued():
            try:
                impatient.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "Hi"}])
                outcome["r"] = "answered"
            except anthropic.APITimeoutError:
                outcome["r"] = "timeout"

        q = threading.Thread(target=queued)
        q.start()
        wait_for(server, lambda h: h["queued"] == 1, timeout=3)
        q.join(timeout=30)
        assert outcome.get("r") == "timeout", outcome
        wait_for(server, lambda h: h["queued"] == 0, timeout=5)
        assert health(server)["active"] == 1
        n = len(holder_deltas)
        time.sleep(1.0)
        assert len(holder_deltas) > n, "the running stream stopped when the queued client left"
    finally:
        stop_holder.set()
        t.join(timeout=120)
    assert_idle(server)
    assert metric(server, "mererun_cancellations_total") >= before + 2
    ready_request(client)


def test_phase_cancel_during_prefill(client, server):
    words = ("The keeper climbed the stairs of the lighthouse every evening and watched the grey sea "
             "for ships that never came. ")
    prompt = words * 180 + "\nSummarize the text above in one sentence."
    n = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": prompt}]).input_tokens
    assert n > 3000, n
    before_gen = metric(server, "mererun_generated_tokens_total")
    before_cancel = metric(server, "mererun_cancellations_total")
    seen_active = []
    watching = threading.Event()

    def watch():
        while not watching.is_set():
            seen_active.append(health(server)["active"])
            time.sleep(0.05)

    w = threading.Thread(target=watch)
    w.start()
    t0 = time.time()
    try:
        # The SDK gives up during the prefill (several seconds at this length) and closes.
        with pytest.raises(anthropic.APITimeoutError):
            client.with_options(timeout=2.0, max_retries=0).messages.create(
                model="m", max_tokens=64, messages=[{"role": "user", "content": prompt}])
        t_close = time.time()
        assert_idle(server)
        released = time.time() - t_close
    finally:
        watching.set()
        w.join()
    assert 1 in seen_active
    assert metric(server, "mererun_cancellations_total") >= before_cancel + 1
    assert metric(server, "mererun_generated_tokens_total") == before_gen  # no token was generated
    assert released < 2, released
    print(f"prefill cancel: {n} prompt tokens, closed after {t_close - t0:.2f}s, idle {released:.2f}s later")
    ready_request(client)
