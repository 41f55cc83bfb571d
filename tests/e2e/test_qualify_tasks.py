"""`mererun qualify tasks`: the frozen task cohort through the official Anthropic SDK against
servers the command starts. A short smoke run on SmolLM2 (the full cohorts on the Qwen models
are in docs/qualification.md), the per-fixture bar, and bad input: no server, no model, a
fixture that cannot be graded, an interrupted run."""
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "tasks"))
import qualify_tasks as qt  # noqa: E402

MODEL = "smollm2-135m-instruct"


def test_the_cohort_is_frozen_and_well_formed():
    fixtures = qt.load_fixtures(REPO / "bench" / "tasks" / "fixtures", "")
    assert len(fixtures) == 20 and not any("broken" in f for f in fixtures)
    kinds = {f["check"]["kind"] for f in fixtures}
    assert {"tool_call", "json_answer", "usage_agreement", "stream_consistency", "error_acknowledged"} <= kinds
    for f in fixtures:  # every request is a valid Messages body once the runner fills it in
        req = qt.build_request(f, 2048, "high")
        assert req["messages"] and req["max_tokens"] >= 1


def test_graders_are_exact():
    assert qt.same_json({"a": [1, True, "x"]}, {"a": [1, True, "x"]})
    assert not qt.same_json(3, 3.0) and not qt.same_json(True, 1) and not qt.same_json({"a": 1}, {"a": 1, "b": 2})
    assert qt.extract_json('Sure:\n```json\n["Bo", "Ana"]\n```') == ["Bo", "Ana"]
    assert qt.extract_json('The answer is {"path": "C:\\\\x"} ok') == {"path": "C:\\x"}
    with pytest.raises(ValueError):
        qt.extract_json("no json here")
    fx = qt.load_fixtures(REPO / "bench" / "tasks" / "fixtures", "01")[0]
    req = qt.build_request(fx, 2048, "none")
    good = {"customer": {"name": "Dana Reyes", "vip": True}, "priority": "express",
            "items": [{"sku": "A-100", "quantity": 3, "gift_wrap": True},
                      {"sku": "B-7", "quantity": 1, "gift_wrap": False}]}
    resp = {"text": "", "tool_calls": [{"name": "create_order", "input": good}], "stop_reason": "tool_use",
            "thinking_chars": 0, "stop_sequence": None, "usage": {}}
    assert qt.grade(fx, req, resp) == ""
    bad = json.loads(json.dumps(good))
    bad["items"][0]["quantity"] = 3.0  # a float where the schema says integer
    assert "quantity" in qt.grade(fx, req, {**resp, "tool_calls": [{"name": "create_order", "input": bad}]})
    exhausted = {**resp, "tool_calls": [], "stop_reason": "max_tokens", "thinking_chars": 900}
    assert "ran out in the reasoning" in qt.grade(fx, req, exhausted)


def test_per_fixture_bar():
    def cohort(role, fails):
        return {"role": role, "complete": True,
                "results": [{"fixture": f, "ok": f not in fails, "resource_ok": True} for f in ("a", "b")]}
    rep = {"cohorts_each": 2, "cohorts": [cohort("reference", {"a"}), cohort("candidate", {"a"}),
                                          cohort("reference", set()), cohort("candidate", {"b"})]}
    qt.verdict(rep)
    assert rep["verdict"] == "fail" and rep["fixtures_worse"] == ["b"]
    rep["cohorts"][2] = cohort("reference", {"b"})
    qt.verdict(rep)
    assert rep["verdict"] == "pass"
    rep["cohorts"][3]["results"][0]["resource_ok"] = False
    qt.verdict(rep)
    assert rep["verdict"] == "fail" and rep["resource_failures"] == 1
    rep["cohorts"].pop()
    qt.verdict(rep)
    assert rep["verdict"] == "incomplete"


@pytest.mark.slow
def test_smoke_run_against_real_servers(run_mererun, model_path, tmp_path):
    model_path(MODEL)
    out = tmp_path / "tasks.json"
    r = run_mererun("qualify", "tasks", "-m", MODEL, "--cohorts", "1", "--only", "10,13,16,18", "--effort", "none",
                    "--max-tokens", "96", "--max-kv-mb", "0.001", "--json", out, timeout=600)
    rep = json.loads(out.read_text())
    assert [c["role"] for c in rep["cohorts"]] == ["reference", "candidate"]
    assert rep["reference"]["environment"] == {"MERERUN_DRAFT": "off"}
    by = {(c["role"], x["fixture"]): x for c in rep["cohorts"] for x in c["results"]}
    for role in ("reference", "candidate"):
        # API-level fixtures: usage agrees with count_tokens, max_tokens is a hard stop, a stream
        # is well formed, a forced tool call is that call (constrained decoding).
        for fid in ("10_count_tokens_agrees_with_usage", "16_max_tokens_respected", "18_stream_matches_message",
                    "13_forced_tool_choice"):
            assert by[(role, fid)]["ok"], (role, fid, by[(role, fid)]["reason"])
        # A 1 KiB KV bound cannot hold: every non-streamed request fails resource monitoring and
        # is kept, with its figures.
        rec = by[(role, "10_count_tokens_agrees_with_usage")]
        assert rec["resource_ok"] is False and rec["resources"]["kv_peak_bytes"] > 1024
    assert rep["resource_failures"] == 6 and rep["verdict"] == "fail" and r.returncode == 3, r.stderr[-2000:]
    assert "verdict: FAIL" in r.stdout


def test_bad_input(run_mererun, model_path, tmp_path):
    r = run_mererun("qualify", "tasks", "--reference", "url=http://127.0.0.1:1", "--candidate",
                    "url=http://127.0.0.1:1")
    assert r.returncode == 1 and "no server at http://127.0.0.1:1" in r.stderr, r.stderr
    r = run_mererun("qualify", "tasks", "-m", "no-such-model", "--cohorts", "1", timeout=120)
    assert r.returncode == 1 and "exited" in r.stderr and "no-such-model" in r.stderr, r.stderr
    r = run_mererun("qualify", "tasks", "-m", MODEL, "--reference", "speed=fast")
    assert r.returncode == 1 and "unknown key 'speed'" in r.stderr, r.stderr


@pytest.mark.slow
def test_ungradeable_fixture_fails_and_an_interrupted_run_keeps_its_results(mererun_bin, model_path, tmp_path):
    model_path(MODEL)
    fx = tmp_path / "fixtures"
    fx.mkdir()
    for name in ("16_max_tokens_respected", "18_stream_matches_message"):
        shutil.copy(REPO / "bench" / "tasks" / "fixtures" / f"{name}.json", fx)
    (fx / "17_broken.json").write_text('{"id": "17_broken", "request": ')  # not JSON
    weird = json.loads((fx / "16_max_tokens_respected.json").read_text())
    weird.update(id="19_unknown_check", check={"kind": "telepathy"})
    (fx / "19_unknown_check.json").write_text(json.dumps(weird))
    out = tmp_path / "t.json"
    p = subprocess.Popen([str(mererun_bin), "qualify", "tasks", "-m", MODEL, "--cohorts", "50", "--effort", "none",
                          "--max-tokens", "64", "--fixtures", str(fx), "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:  # let at least one cohort finish, then interrupt
        if out.exists() and len(json.loads(out.read_text())["cohorts"]) >= 2:
            break
        time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    rep = json.loads(out.read_text())
    assert rep["interrupted"] is True and rep["verdict"] == "incomplete"
    first = {x["fixture"]: x for x in rep["cohorts"][0]["results"]}
    assert first["17_broken"]["ok"] is False and "could not be graded" in first["17_broken"]["reason"]
    assert first["19_unknown_check"]["ok"] is False and "could not be graded" in first["19_unknown_check"]["reason"]
    assert first["16_max_tokens_respected"]["ok"] is True
