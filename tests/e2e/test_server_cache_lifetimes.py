"""Prompt-cache lifetimes and the disk tier, end to end with the official `anthropic` SDK on
smollm2-135m-instruct: a "5m" prefix expires after its lifetime unless used (each hit refreshes
it), a "1h" one outlives it, and KV blocks written to --cache-dir are read back by the next
server, which then answers exactly as a cold prefill does. Lifetimes are shortened with
--cache-ttl-5m / --cache-ttl-1h so the test takes seconds."""
import re
import time
import urllib.request

import anthropic
import pytest

from mererun_server import ServerProcess

GREEDY = {"temperature": 0}
SYSTEM_TEXT = "You are a terse assistant who answers questions about rivers, lakes and mountains. " * 30


def client_of(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="k", max_retries=0, timeout=120)


def ask(client, ttl=None, question="Which river flows through Cairo?", max_tokens=8, system=SYSTEM_TEXT):
    cc = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return client.messages.create(model="m", max_tokens=max_tokens, extra_body=GREEDY,
                                  system=[{"type": "text", "text": system, "cache_control": cc}],
                                  messages=[{"role": "user", "content": question}])


def metric(server, name):
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^" + name + r" (\S+)$", text, re.M)
    return float(m.group(1))


@pytest.fixture(scope="module")
def short_lived(mererun_bin, model_path):
    model_path("smollm2-135m-instruct")
    s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "2048", "--cache-ttl-5m", "4",
                      "--cache-ttl-1h", "12", "--cache-disk-mb", "0")
    yield s
    s.stop()


def test_a_5m_prefix_expires_unless_used(short_lived):
    c = client_of(short_lived)
    first = ask(c)
    assert first.usage.cache_creation_input_tokens > 400, first.usage
    time.sleep(2)
    hit = ask(c)  # within the lifetime: read, and refreshed
    assert hit.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens - 128, hit.usage
    time.sleep(2.5)  # past the lifetime since the first write, 2.5 s after the refresh
    again = ask(c)
    assert again.usage.cache_read_input_tokens > 0, again.usage
    time.sleep(6)  # past the lifetime since the last use
    cold = ask(c)
    assert cold.usage.cache_read_input_tokens == 0, cold.usage
    assert cold.usage.cache_creation_input_tokens == first.usage.cache_creation_input_tokens, cold.usage
    assert cold.content[0].text == first.content[0].text  # recomputed, same answer


def test_a_1h_prefix_outlives_the_short_lifetime(short_lived):
    c = client_of(short_lived)
    q = "Which lake is the deepest?"
    system = "Answer in one short sentence. " + SYSTEM_TEXT  # not cached by the test before
    first = ask(c, ttl="1h", question=q, system=system)
    assert first.usage.cache_creation.ephemeral_1h_input_tokens > 400, first.usage
    time.sleep(6)  # past "5m" (4 s), within "1h" (12 s)
    hit = ask(c, ttl="1h", question=q, system=system)
    assert hit.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens - 128, hit.usage
    # Expired memory is returned, not just hidden: idle, the cache drops to nothing.
    time.sleep(15)  # 12 s after the last use, plus the once-a-second idle check
    assert metric(short_lived, "mererun_prefix_cache_blocks") == 0
    cold = ask(c, ttl="1h", question=q, system=system)
    assert cold.usage.cache_read_input_tokens == 0, cold.usage


def test_the_disk_tier_survives_a_restart(mererun_bin, model_path, tmp_path):
    model_path("smollm2-135m-instruct")
    cache_dir = tmp_path / "kv"
    question = "Name the longest river in South America."
    answers = []
    for run in range(2):
        s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "2048", "--cache-dir", cache_dir,
                          "--no-warmup")
        try:
            msg = ask(client_of(s), question=question, max_tokens=24)
            answers.append(msg)
            if run == 0:
                assert msg.usage.cache_read_input_tokens == 0, msg.usage
                # Written behind the request: wait for the files.
                deadline = time.time() + 30
                while metric(s, "mererun_disk_cache_files") < 2 and time.time() < deadline:
                    time.sleep(0.2)
                assert metric(s, "mererun_disk_cache_files") >= 2
                assert metric(s, "mererun_disk_cache_bytes") > 0
        finally:
            s.stop()
    cold, warm = answers
    prompt = cold.usage.input_tokens + cold.usage.cache_creation_input_tokens
    # The new process read every whole 128-token block of the prompt from disk.
    assert warm.usage.cache_read_input_tokens >= (prompt - 1) // 128 * 128 - 128, warm.usage
    assert warm.usage.cache_read_input_tokens > 0
    assert [b.text for b in warm.content] == [b.text for b in cold.content]
    files = list(cache_dir.rglob("*.kvb"))
    assert files and all(f.stat().st_size > 1000 for f in files)

    # Damaged files are refused and recomputed: same answer, nothing read from them.
    for f in files:
        f.write_bytes(f.read_bytes()[:-7] + b"garbage")
    s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "2048", "--cache-dir", cache_dir,
                      "--no-warmup")
    try:
        again = ask(client_of(s), question=question, max_tokens=24)
        assert again.usage.cache_read_input_tokens == 0, again.usage
        assert [b.text for b in again.content] == [b.text for b in cold.content]
        assert s.wait_for_log(r"checksum mismatch", timeout=5)
    finally:
        s.stop()


def test_numerics_controls_never_share_a_cached_prefix(mererun_bin, model_path, tmp_path):
    """The disk tier outlives a process, so it is where another configuration could read KV that
    this one did not compute. Every control that changes the arithmetic (docs/configuration.md)
    is part of the cache key: with one of them changed nothing is read; with only the thread
    count changed (same arithmetic) the blocks are read and the answer is the same."""
    model_path("smollm2-135m-instruct")
    cache_dir = tmp_path / "kv"
    question = "Name the highest mountain in Africa."

    def run(env, wait_written=False):
        s = ServerProcess(mererun_bin, "smollm2-135m-instruct", "-c", "2048", "--cache-dir", cache_dir,
                          "--no-warmup", env=env)
        try:
            msg = ask(client_of(s), question=question, max_tokens=12)
            if wait_written:
                deadline = time.time() + 30
                while metric(s, "mererun_disk_cache_files") < 2 and time.time() < deadline:
                    time.sleep(0.2)
            return msg
        finally:
            s.stop()

    flags = open("/proc/cpuinfo").read()
    other_cpu = "avx2" if " avx512vnni" in flags or " avx512_vnni" in flags else "scalar"
    first = run({"MERERUN_THREADS": "2"}, wait_written=True)
    assert first.usage.cache_read_input_tokens == 0
    for env in ({"MERERUN_WEIGHTS": "q8g64"}, {"MERERUN_CPU": other_cpu}, {"MERERUN_PATH": "ref"},
                {"MERERUN_ACTS": "fine"}):
        msg = run({"MERERUN_THREADS": "2", **env})
        assert msg.usage.cache_read_input_tokens == 0, (env, msg.usage)
    same = run({"MERERUN_THREADS": "1"})
    assert same.usage.cache_read_input_tokens > 0, same.usage
    assert [b.text for b in same.content] == [b.text for b in first.content]
