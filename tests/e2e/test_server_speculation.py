"""Speculative decoding in `mererun serve`, over HTTP (issue 13): at temperature 0 the output of
every drafter and draft length is the plain output, alone and with other sequences in the same
batched steps; sampled requests draft too; the drafted and accepted counts reach /metrics and the
configuration /health; bad draft configurations are start-up errors that name the problem."""
import concurrent.futures
import re
import subprocess

import pytest
import requests

from mererun_server import ServerProcess

MODEL = "smollm2-135m-instruct"

# Code edits repeat their input, so n-gram lookup has something to find; the last one is prose.
PROMPTS = [
    "Repeat this code exactly, with the function renamed to g:\n"
    "def f(x):\n    total = 0\n    for i in range(x):\n        total += i * i\n    return total\n\nprint(f(10))",
    "Add a docstring to this function and return the whole function:\n"
    "def area(w, h):\n    if w < 0 or h < 0:\n        raise ValueError('negative')\n    return w * h",
    "Convert this list to a Python dict literal: name=Ada, born=1815, field=mathematics, city=London.",
    "Write two sentences about the sea.",
]


def generate(server, prompt, temperature=0.0, max_tokens=96):
    r = requests.post(server.base_url + "/v1/messages", timeout=300, json={
        "model": "m", "max_tokens": max_tokens, "temperature": temperature,
        "messages": [{"role": "user", "content": prompt}]})
    assert r.status_code == 200, r.text
    return "".join(b.get("text", "") for b in r.json()["content"])


def spec_counts(server):
    text = requests.get(server.base_url + "/metrics", timeout=10).text
    get = lambda name: int(float(re.search(rf"^{name} (\S+)$", text, re.M).group(1)))
    return get("mererun_spec_draft_tokens_total"), get("mererun_spec_accepted_tokens_total")


def outputs(server):
    """Each prompt alone, then all of them at once (their steps share batched forward passes)."""
    alone = [generate(server, p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as ex:
        together = list(ex.map(lambda p: generate(server, p), PROMPTS))
    return alone, together


@pytest.fixture(scope="module")
def plain(mererun_bin, model_path):
    model_path(MODEL)
    s = ServerProcess(mererun_bin, MODEL, "-c", "2048", "--draft", "off")
    try:
        assert requests.get(s.base_url + "/health", timeout=10).json()["speculation"]["drafter"] == "off"
        alone, together = outputs(s)
        assert spec_counts(s) == (0, 0)
        yield alone, together
    finally:
        s.stop()


@pytest.mark.parametrize("args,drafter", [
    (["--draft", "ngram", "--draft-tokens", "3"], "ngram"),
    (["--draft", "ngram", "--draft-tokens", "7"], "ngram"),
    (["--draft-model", MODEL, "--draft-tokens", "auto"], "ngram+model:" + MODEL),
    (["--draft", "model", "--draft-model", MODEL, "--draft-tokens", "3"], "model:" + MODEL),
])
def test_greedy_output_over_http_is_the_plain_output(mererun_bin, plain, args, drafter):
    s = ServerProcess(mererun_bin, MODEL, "-c", "2048", *args)
    try:
        health = requests.get(s.base_url + "/health", timeout=10).json()
        assert health["speculation"]["drafter"] == drafter
        alone, together = outputs(s)
        drafted, accepted = spec_counts(s)
        print(f"{' '.join(args)}: drafted {drafted}, accepted {accepted}")
        assert alone == plain[0]
        assert together == plain[1]
        assert drafted > 0 and accepted > 0
    finally:
        s.stop()


def test_sampled_requests_draft_and_stream(mererun_bin, model_path):
    model_path(MODEL)
    s = ServerProcess(mererun_bin, MODEL, "-c", "2048", env={"MERERUN_WEIGHTS": "native"})  # default drafting
    try:
        health = requests.get(s.base_url + "/health", timeout=10).json()
        assert health["speculation"] == {"drafter": "ngram", "draft_tokens": "auto"}
        assert health["environment"].get("MERERUN_WEIGHTS") == "native"
        before = spec_counts(s)
        for _ in range(3):
            assert generate(s, PROMPTS[0], temperature=1.0, max_tokens=64)
        drafted, accepted = spec_counts(s)
        assert drafted > before[0]
        assert 0 <= accepted - before[1] <= drafted - before[0]
        # A streamed request under speculation delivers the same text as its deltas.
        with requests.post(s.base_url + "/v1/messages", stream=True, timeout=300, json={
                "model": "m", "max_tokens": 64, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": PROMPTS[0]}]}) as r:
            deltas = "".join(re.findall(r'"text_delta","text":"((?:[^"\\]|\\.)*)"', r.text))
        assert deltas and deltas.encode().decode("unicode_escape") in generate(s, PROMPTS[0], max_tokens=64) + "\n"
    finally:
        s.stop()


@pytest.mark.parametrize("args,env,needle", [
    (["--draft-model", "gemma3-270m"], {}, "gemma3-270m"),
    (["--draft-model", "no-such-model-xyz"], {}, "no-such-model-xyz"),
    (["--draft", "model"], {}, "--draft-model"),
    ([], {"MERERUN_DRAFT": "bogus"}, "MERERUN_DRAFT"),
    ([], {"MERERUN_DRAFT_TOKENS": "99"}, "MERERUN_DRAFT_TOKENS"),
    (["--draft-tokens", "x"], {}, "--draft-tokens"),
    # Every MERERUN_* control is validated at start-up, by name, with its allowed values.
    ([], {"MERERUN_WEIGHTS": "q4"}, "MERERUN_WEIGHTS='q4' is not valid; allowed: native, q8g64"),
    ([], {"MERERUN_THREADS": "0"}, "MERERUN_THREADS"),
    ([], {"MERERUN_CPU": "neon"}, "scalar, avx2, avx512, avx512bf16, amx"),
    ([], {"MERERUN_LOG": "loud"}, "MERERUN_LOG"),
])
def test_bad_draft_configuration_is_a_startup_error(mererun_bin, model_path, args, env, needle):
    model_path(MODEL)
    if "gemma3-270m" in args:
        model_path("gemma3-270m")
    import os
    r = subprocess.run([str(mererun_bin), "serve", "-m", MODEL, "--port", "0", "--no-warmup", *args],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stderr
    assert needle in r.stderr, r.stderr
    if "gemma3-270m" in args:
        assert "vocabulary" in r.stderr and MODEL in r.stderr, r.stderr
    if "no-such-model-xyz" in args:
        assert "mererun pull" in r.stderr or "catalog" in r.stderr, r.stderr


@pytest.mark.slow
def test_warm_up_is_loading_then_ready_and_sigterm_cuts_it_short(mererun_bin, model_path):
    """The port opens before the (sampled, drafting) warm-up ends: /health says loading (529) and
    requests get 529 with retry-after until it is done. Qwen 1.5B's warm-up takes seconds here,
    so the window is observable. A SIGTERM during the warm-up ends it early."""
    model_path("qwen2.5-coder-1.5b-instruct")
    import signal
    import time
    s = ServerProcess(mererun_bin, "qwen2.5-coder-1.5b-instruct", "-c", "2048", wait_ready=False,
                      env={"MERERUN_LOG": "info"})
    try:
        r = requests.get(s.base_url + "/health", timeout=10)
        assert r.status_code == 529 and r.json()["status"] == "loading", r.text
        r = requests.post(s.base_url + "/v1/messages", timeout=30, json={
            "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 529 and int(r.headers["retry-after"]) >= 1, r.text
        s.wait_ready(300)
        assert requests.get(s.base_url + "/health", timeout=10).json()["status"] == "ok"
        assert re.search(r"warm-up: \d+ tokens in [\d.]+ s \((\d+) drafted", s.log())
    finally:
        s.stop()
    s = ServerProcess(mererun_bin, "qwen2.5-coder-1.5b-instruct", "-c", "2048", wait_ready=False,
                      env={"MERERUN_LOG": "info"})
    try:
        assert requests.get(s.base_url + "/health", timeout=10).json()["status"] == "loading"
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(timeout=60)
        took = time.time() - t0
        print(f"SIGTERM during the warm-up: exited in {took:.2f} s")
        assert took < 10, took
        assert "cut short" in s.log() or "warm-up" not in s.log(), s.log()[-2000:]
    finally:
        s.stop()
