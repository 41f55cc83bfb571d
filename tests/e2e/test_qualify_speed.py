"""Smoke run of `mererun qualify speed`: tiny N, SmolLM2, the short workload, a few tokens.
Checks the structure of the report (every sample kept, three blocks, configuration, verdict),
not the speed: performance is measured by the program, never asserted."""
import json


def test_qualify_speed_smoke(run_mererun, model_path, tmp_path):
    model_path("smollm2-135m-instruct")  # skips when not pulled
    out = tmp_path / "q.json"
    r = run_mererun("qualify", "speed", "-m", "smollm2-135m-instruct", "-w", "short", "-n", "1",
                    "--max-tokens", "8", "--seed", "3", "--reference", "draft=0",
                    "--candidate", "draft=ngram,k=3", "--json", out, timeout=300)
    assert "verdict:" in r.stdout
    rep = json.loads(out.read_text())
    # Exit status: 0 on PASS, 3 on FAIL (the check ran and did not pass).
    assert r.returncode == (0 if rep["verdict"] == "pass" else 3), (r.returncode, rep["verdict"], r.stderr)
    assert rep["reference"]["k"] == 0 and rep["candidate"] == {
        "spec": "draft=ngram,k=3", "drafter": "ngram", "ngram": True, "draft_model": "", "k": 3, "adaptive": False}
    assert rep["cpu"] and "commit" in rep and rep["threads"] >= 1
    (w,) = rep["workloads"]
    assert w["name"] == "short" and 60 <= w["prompt_tokens"] <= 140
    assert [b["role"] for b in w["blocks"]] == ["reference", "candidate", "reference"]
    for b in w["blocks"]:
        (s,) = b["samples"]  # the warm-up request is dropped, N = 1 kept
        assert 1 <= s["generated"] <= 8 and s["decode_tok_s"] > 0 and s["prefill_s"] > 0
    assert "spec" in w["blocks"][1]["samples"][0]
    assert rep["verdict"] in ("pass", "fail")


def test_qualify_speed_rejects_bad_configuration(run_mererun):
    r = run_mererun("qualify", "speed", "-m", "smollm2-135m-instruct", "--candidate", "draft=magic")
    assert r.returncode == 2
    assert "unknown drafter 'magic'" in r.stderr
    r = run_mererun("qualify", "nonsense")
    assert r.returncode == 2


def test_qualify_speed_over_http(run_mererun, model_path, tmp_path):
    """--http: a server per configuration, started from the same binary; the samples come from
    the server's x-mererun-* headers, with warm-ups kept (marked) and peak RSS per request. A
    1 MiB RSS bound cannot hold, so resource monitoring must fail the run (exit 3) and keep the
    samples."""
    model_path("smollm2-135m-instruct")
    out = tmp_path / "q.json"
    r = run_mererun("qualify", "speed", "--http", "-m", "smollm2-135m-instruct", "-w", "code_edit", "-n", "1",
                    "--max-tokens", "24", "--reference", "draft=0", "--candidate", "draft=ngram,k=auto",
                    "--server-ctx", "4096", "--max-rss-mb", "1", "--json", out, timeout=600)
    rep = json.loads(out.read_text())
    assert r.returncode == 3 and rep["verdict"] == "fail", (r.returncode, r.stderr[-2000:])
    assert rep["transport"] == "http" and rep["resource"]["failures"] == 6
    assert "over --max-rss-mb" in r.stderr
    (w,) = rep["workloads"]
    assert w["prompt_tokens"] > 1000
    for b in w["blocks"]:
        (s,) = b["samples"]
        (warm,) = b["warmup_samples"]
        for x in (s, warm):
            assert 1 <= x["generated"] <= 24 and x["decode_tok_s"] > 0 and x["wall_s"] > 0
            assert x["peak_rss_bytes"] > 50 << 20 and x["resource_ok"] is False
            # The server's figures: its RSS while the request ran, and the KV the prompt held.
            assert 50 << 20 < x["server_peak_rss_bytes"] <= x["peak_rss_bytes"] + (8 << 20)
            assert x["kv_peak_bytes"] >= x["prompt_tokens"] * 23040  # SmolLM2: 30 x 3 x 64 x 2 x 2
        # The prompt is cached after the warm-up: the kept sample reads it from the cache.
        assert s["reused_tokens"] > 1000
    cand = w["blocks"][1]["samples"][0]["spec"]
    assert cand["drafted"] >= cand["accepted"] >= 0
    assert "spec" not in w["blocks"][0]["samples"][0]
