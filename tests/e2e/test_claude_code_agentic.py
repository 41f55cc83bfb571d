"""Claude Code's whole prompt (its default tools, not --bare) on Qwen2.5-Coder-1.5B: the pinned
CLI (tools/claude-code) in print mode against `mererun serve`.

- Deferred tools: an MCP server (fixtures/mcp_weather.py) gives Claude Code one tool, which it
  defers (ENABLE_TOOL_SEARCH=true): only its name is in the prompt. The model finds it with
  Claude Code's ToolSearch tool (whose result carries tool_reference blocks), then calls it; the
  MCP server records the call.
- A real fix: a one-line bug makes a pytest fail; Claude Code (Read, Edit, Bash) fixes it and the
  test passes afterwards (checked here by running pytest). MERERUN_CLAUDE_CODE_RUNS (default 1)
  repeats it (with MERERUN_CLAUDE_CODE_TEMP=default, so that runs differ); each run's pass,
  turns and time are printed.

Each first request is ~11.6k tokens (about 330 s of prefill for the 1.5B on 2 Zen 4 cores), so
the tests share one server and one prefix-cache directory (under MERERUN_HOME, kept across
runs: the disk tier makes later runs start in seconds) and a fixed working directory (the
prompt names it). They take several minutes even warm and the outcome depends on a 1.5B model's
choices, so they run only with MERERUN_CLAUDE_CODE_FULL=1 (not in CI); the figures are in
docs/performance.md."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import model_cache_dir
from mererun_server import ServerProcess

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("MERERUN_CLAUDE_CODE_FULL") != "1",
                                 reason="MERERUN_CLAUDE_CODE_FULL=1 runs Claude Code's full prompt (minutes)")]

MODEL = "qwen2.5-coder-1.5b-instruct"
WORK = Path("/tmp/mererun-claude-code-work")


@pytest.fixture(scope="module")
def claude(repo_root):
    path = repo_root / "tools" / "claude-code" / "node_modules" / ".bin" / "claude"
    if not path.exists():
        pytest.fail(f"{path} is missing; run scripts/setup.sh (npm ci in tools/claude-code)")
    return path


@pytest.fixture(scope="module")
def server(mererun_bin, model_path):
    model_path(MODEL)
    cache_dir = model_cache_dir().parent / "kv-cache-claude-code-tests"
    # Greedy unless MERERUN_CLAUDE_CODE_TEMP says otherwise ("default": the model's own sampling,
    # so that repeated runs differ).
    temp = os.environ.get("MERERUN_CLAUDE_CODE_TEMP", "0")
    s = ServerProcess(mererun_bin, MODEL, "-c", "32768", *([] if temp == "default" else ["--temp", temp]),
                      "--max-output-tokens", "600",
                      "--cache-dir", cache_dir, env={"MERERUN_LOG": "debug"}, startup_timeout=300)
    yield s
    s.stop()


def run_claude(claude, server, tmp_path, prompt, *args, env_extra=None, timeout=3000):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = dict(os.environ, HOME=str(home), ANTHROPIC_BASE_URL=server.base_url, ANTHROPIC_API_KEY="k",
               DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", API_TIMEOUT_MS="3000000",
               **(env_extra or {}))
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    t0 = time.time()
    proc = subprocess.run([str(claude), "-p", prompt, "--output-format", "json", *args], cwd=WORK, env=env,
                          capture_output=True, text=True, timeout=timeout)
    elapsed = time.time() - t0
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        out = {"is_error": True, "raw": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}
    return proc, out, elapsed


def fresh_work():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)


def test_claude_code_finds_a_deferred_tool_and_calls_it(claude, server, tmp_path, repo_root):
    fresh_work()
    calls = tmp_path / "calls.log"
    mcp = {"mcpServers": {"weather": {"command": sys.executable,
                                      "args": [str(repo_root / "tests" / "e2e" / "fixtures" / "mcp_weather.py")],
                                      "env": {"MCP_WEATHER_LOG": str(calls)}}}}
    (tmp_path / "mcp.json").write_text(json.dumps(mcp))
    proc, out, elapsed = run_claude(
        claude, server, tmp_path,
        'What is the weather in Paris? Call ToolSearch with the query "weather" to load the weather tool, '
        "then call that tool for Paris.",
        "--mcp-config", str(tmp_path / "mcp.json"), "--allowedTools", "ToolSearch,mcp__weather__get_weather",
        "--max-turns", "6", env_extra={"ENABLE_TOOL_SEARCH": "true"})
    log = server.log()
    print(f"deferred tool: exit {proc.returncode}, {out.get('num_turns')} turns, {elapsed:.0f} s")
    assert proc.returncode == 0, f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}\nserver: {log[-3000:]}"
    # The tool was deferred: the first request lists it by name only.
    assert "mcp__weather__get_weather" in log
    assert calls.exists(), f"the MCP tool was never called; Claude Code said: {out.get('result')!r}\n{log[-4000:]}"
    made = [json.loads(l) for l in calls.read_text().splitlines()]
    assert made[0]["tool"] == "get_weather" and "paris" in made[0]["city"].lower(), made


CALC = '''def average(values):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(values) / (len(values) - 1)


def clamp(x, lo, hi):
    """x limited to the range [lo, hi]."""
    return max(lo, min(x, hi))
'''
TEST_CALC = '''from calc import average, clamp


def test_average():
    assert average([2, 4, 6]) == 4
    assert average([5]) == 5


def test_clamp():
    assert clamp(5, 0, 3) == 3
'''


def pytest_passes():
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=WORK,
                       capture_output=True, text=True, timeout=120)
    return r.returncode == 0, r.stdout[-1500:]


def test_claude_code_fixes_a_one_line_bug(claude, server, tmp_path):
    runs = int(os.environ.get("MERERUN_CLAUDE_CODE_RUNS", "1"))
    results = []
    for i in range(runs):
        fresh_work()
        (WORK / "calc.py").write_text(CALC)
        (WORK / "test_calc.py").write_text(TEST_CALC)
        assert not pytest_passes()[0]
        proc, out, elapsed = run_claude(
            claude, server, tmp_path,
            "Running `python3 -m pytest -q` in this directory fails. Find the bug in calc.py and fix it so that "
            "the tests pass. Do not change test_calc.py.",
            "--allowedTools", "Read,Edit,Bash,Glob,Grep", "--max-turns", "12")
        ok, tail = pytest_passes()
        results.append({"run": i + 1, "passed": ok, "exit": proc.returncode, "turns": out.get("num_turns"),
                        "seconds": round(elapsed, 1), "test_untouched": (WORK / "test_calc.py").read_text() == TEST_CALC})
        print(json.dumps(results[-1]), flush=True)
        if not ok:
            print(tail, (WORK / "calc.py").read_text(), out.get("result"), sep="\n")
    print(json.dumps({"claude_code_fix_runs": results}))
    assert all(r["test_untouched"] for r in results)
    assert sum(r["passed"] for r in results) >= (runs + 1) // 2, results
