"""`mererun qualify claude-code`: the grader on the fixture repo (a correct fix passes, the
shipped bugs fail, edited tests fail whatever the code does), and a short smoke session of the
pinned Claude Code against a server (SmolLM2, `--bare`, a few turns: the mechanics, not the
model's skill; the Qwen figures are in docs/qualification.md)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CC = REPO / "bench" / "claude_code"
sys.path.insert(0, str(CC))
import qualify_claude_code as qcc  # noqa: E402


def copy_fixture(tmp_path) -> Path:
    work = tmp_path / "repo"
    shutil.copytree(CC / "fixture", work)
    return work


def test_grader(tmp_path):
    work = copy_fixture(tmp_path)
    g = qcc.grade(work, CC / "fixture", CC / "holdout")
    assert g["pass"] is False and g["holdout_passed"] == 0 and g["holdout_total"] == 3
    assert g["visible_total"] == 10 and g["visible_passed"] == 4
    for f in (CC / "solution" / "textstats").glob("*.py"):
        shutil.copy(f, work / "textstats" / f.name)
    g = qcc.grade(work, CC / "fixture", CC / "holdout")
    assert g["pass"] is True and g["holdout_passed"] == 3 and g["visible_passed"] == 10, g
    # The holdout tests are never in the session's directory.
    assert not any(p.name == "test_holdout.py" for p in work.rglob("*.py"))
    # Editing a test (here: deleting an assertion) fails the run even with correct code.
    t = work / "tests" / "test_money.py"
    t.write_text(t.read_text().replace('assert format_cents(1205) == "$12.05"', "pass"))
    g = qcc.grade(work, CC / "fixture", CC / "holdout")
    assert g["pass"] is False and g["protected_changed"] == ["tests/test_money.py"]
    # A fix that special-cases the visible tests passes them but not the holdout.
    work2 = copy_fixture(tmp_path / "b")
    m = work2 / "textstats" / "money.py"
    m.write_text(m.read_text() + "\n_orig = format_cents\n\ndef format_cents(c):\n"
                 "    return {123450: '$1,234.50', 1205: '$12.05'}.get(c) or _orig(c)\n")
    g = qcc.grade(work2, CC / "fixture", CC / "holdout")
    assert g["pass"] is False and g["holdout_passed"] < 3


def test_trace_reading(tmp_path):
    trace = tmp_path / "t.jsonl"
    ev = [{"type": "system", "subtype": "init"},
          {"type": "assistant", "message": {"id": "m1", "stop_reason": None,
                                            "content": [{"type": "tool_use", "name": "Read", "input": {}}]}},
          {"type": "assistant", "message": {"id": "m1", "stop_reason": "tool_use",
                                            "content": [{"type": "tool_use", "name": "Bash", "input": {}}]}},
          {"type": "user", "message": {"content": [{"type": "tool_result"}]}},
          {"type": "assistant", "message": {"id": "m2", "stop_reason": "max_tokens",
                                            "content": [{"type": "text", "text": "..."}]}},
          {"type": "result", "subtype": "success", "num_turns": 2, "is_error": False, "result": "done"}]
    trace.write_text("\n".join(json.dumps(e) for e in ev) + "\nnot json\n")
    t = qcc.read_trace(trace)
    assert t["tool_calls"] == 2 and t["tools"] == ["Read", "Bash"] and t["assistant_messages"] == 2
    assert t["output_limit_stops"] == 1 and t["num_turns"] == 2 and t["final_text"] == "done"


@pytest.mark.slow
def test_smoke_session(run_mererun, model_path, tmp_path):
    model_path("smollm2-135m-instruct")
    out = tmp_path / "cc.json"
    r = run_mererun("qualify", "claude-code", "-m", "smollm2-135m-instruct", "--ctx", "8192", "--only", "reference",
                    "--max-turns", "3", "--workdir", tmp_path / "session" / "repo", "--trace-dir", tmp_path / "traces",
                    "--cache-dir", tmp_path / "kv", "--serve-arg=--max-output-tokens", "--serve-arg=200",
                    "--claude-arg=--bare", "--claude-arg=--tools", "--claude-arg=Read,Edit,Bash",
                    "--claude-arg=--system-prompt",
                    "--claude-arg=You are a coding assistant. Use the Read, Edit and Bash tools.", "--max-rss-mb", "1",
                    "--json", out, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    (run,) = rep["runs"]
    assert rep["verdict"] == "single" and run["role"] == "reference"
    assert run["wall_s"] > 0 and run["holdout_total"] == 3 and run["visible_total"] == 10
    # A 1 MiB bound cannot hold: the session fails resource monitoring, and is kept.
    assert run["resource_ok"] is False and "MiB > 1.0 MiB" in run["resource_problem"] and run["pass"] is False
    assert run["assistant_messages"] >= 1, run
    assert Path(run["trace"]).exists() and '"type": "result"' in Path(run["trace"]).read_text().replace('":"', '": "')
    assert rep["reference"]["environment"] == {"MERERUN_DRAFT": "off"}
    res = run["server_after"]
    assert res["process_peak_rss_bytes"] >= res["request_peak_rss_bytes_max"] > 50 << 20, res
    assert res["request_kv_peak_bytes_max"] > 0, res
